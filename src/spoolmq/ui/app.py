"""The console as a Starlette application: pages, the JSON API under ``/api/``, live
updates by server-sent events.

Every page and API route needs a login: a browser session (cookie, set by ``/login``) or
an API token (``Authorization: Bearer ...``). A POST from a session must carry the
session's CSRF token in ``X-CSRF-Token`` (the page reads it from its own HTML; another site
cannot); a token request needs none, since a browser never attaches a bearer token on its
own. With ``read_only`` every action (a POST under ``/api/``) is refused and the pages
hide the buttons; a method a route does not take is a 405 either way.
Blocking work (files, ``state.db``, the admin socket) runs in Starlette's thread pool.
"""

from __future__ import annotations

import asyncio
import html
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from spoolmq import operations
from spoolmq.errors import (
    AuthenticationError,
    GroupActiveError,
    InvalidArgumentError,
    SpoolError,
    UnknownPartitionError,
    UnknownTopicError,
)
from spoolmq.store import Store
from spoolmq.ui import actions, auth, history, inputs, views

STATIC = Path(__file__).parent / "static"
SESSION_COOKIE = "spoolmq_session"
LOGIN_COOKIE = "spoolmq_login"
LIVE_SECONDS = 2.0
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Console:
    """What every request handler needs: where the data is and how the console runs."""

    data: Path
    read_only: bool = False
    sessions: auth.Sessions = field(default_factory=auth.Sessions)


class Refused(Exception):
    """A request turned away before it did anything: an HTTP status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status, media_type="application/json", headers=_HEADERS)


def _status_of(exc: SpoolError) -> int:
    if isinstance(exc, UnknownTopicError | UnknownPartitionError):
        return 404
    if isinstance(exc, AuthenticationError):
        return 403
    if isinstance(exc, GroupActiveError):
        return 409
    return 400


Handler = Callable[[Request, Console], Awaitable[Response]]


def api(handler: Handler, *, action: bool = False) -> Callable[[Request], Awaitable[Response]]:
    """A JSON API route: authenticated (session or bearer token), a POST from a session
    checked for its CSRF token, an action refused when read-only, and a :class:`SpoolError`
    answered as ``{"error": message}`` with a fitting status instead of a 500."""

    async def endpoint(request: Request) -> Response:
        console: Console = request.app.state.console
        try:
            await _authenticate(request, console, action=action)
            return await handler(request, console)
        except Refused as exc:
            answer = _json({"error": str(exc)}, exc.status)
            if exc.status == 401:
                answer.headers["WWW-Authenticate"] = 'Bearer realm="spoolmq"'
            return answer
        except SpoolError as exc:
            return _json({"error": str(exc)}, _status_of(exc))

    return endpoint


async def _authenticate(request: Request, console: Console, *, action: bool) -> None:
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "send Authorization: Bearer TOKEN (`spoolmq ui token create`)")
        try:
            known = await run_in_threadpool(auth.check_token, console.data, token.strip())
        except auth.TokensDamagedError:
            # No token can be checked; said without the file's path to whoever asks, and
            # sessions go on working.
            raise Refused(
                401, f"the console's API tokens cannot be read ({auth.TOKENS_FILE} is damaged)"
            ) from None
        if not known:
            raise Refused(401, "unknown or revoked API token")
    else:
        session = console.sessions.get(request.cookies.get(SESSION_COOKIE))
        if session is None:
            raise Refused(401, "log in first (or send Authorization: Bearer TOKEN)")
        if request.method == "POST":
            try:
                auth.require_csrf(session, request.headers.get("x-csrf-token"))
            except AuthenticationError as exc:
                raise Refused(403, str(exc)) from None
    if action and console.read_only:
        raise Refused(403, "the console runs --read-only: actions are refused")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > 1_000_000:
        raise InvalidArgumentError("the request body is over 1 MB")
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise InvalidArgumentError("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    return body


# -- API: reading --------------------------------------------------------------------------------


async def api_overview(request: Request, console: Console) -> Response:
    return _json(await run_in_threadpool(_overview, console.data))


def _overview(data: Path) -> dict[str, Any]:
    topics = views.topics(data)
    return {
        "broker": views.broker(data),
        "topics": len(topics),
        "messages": sum(t["messages"] for t in topics),
        "bytes": sum(t["bytes"] for t in topics),
    }


async def api_history(request: Request, console: Console) -> Response:
    minutes = inputs.whole(request.query_params.get("minutes") or 60, "minutes", low=1, high=1440)
    return _json(await run_in_threadpool(history.last_hour, console.data, minutes=minutes))


async def api_topics(request: Request, console: Console) -> Response:
    return _json(await run_in_threadpool(views.topics, console.data))


async def api_messages(request: Request, console: Console) -> Response:
    q = request.query_params
    topic = inputs.check_topic(request.path_params["topic"])
    result = await run_in_threadpool(
        views.page,
        console.data,
        topic,
        inputs.whole(q.get("partition") or 0, "partition", high=100_000),
        offset=inputs.optional_whole(q.get("offset"), "offset"),
        timestamp=inputs.moment(q.get("time")),
        limit=inputs.whole(q.get("limit") or 50, "limit", low=1, high=inputs.MAX_PAGE),
        backwards=inputs.direction(q.get("direction")),
    )
    return _json(result)


async def api_search(request: Request, console: Console) -> Response:
    """NDJSON, one line per match as it is found, then a ``done`` line with the count: a
    search over a big topic shows its first results at once and never sits in memory."""
    topic = inputs.check_topic(request.path_params["topic"])
    query = inputs.Search.parse(request.query_params)
    # Before the 200 goes out: an unknown topic or partition is a 404, not an error line.
    await run_in_threadpool(_check_topic_exists, console.data, topic, query.partition)
    lines = (orjson.dumps(item) + b"\n" for item in _searched(console.data, topic, query))
    return StreamingResponse(
        iterate_in_threadpool(lines), media_type="application/x-ndjson", headers=_HEADERS
    )


def _searched(data: Path, topic: str, query: inputs.Search) -> Iterator[dict[str, Any]]:
    """The search's items; a store error met after the answer began (a damaged record
    halfway through) ends the stream with an ``{"error": ...}`` line, since the status
    line has already gone out as 200."""
    try:
        yield from views.search(data, topic, query)
    except SpoolError as exc:
        yield {"error": str(exc)}


def _check_topic_exists(data: Path, topic: str, partition: int | None = None) -> None:
    with Store(data) as store:
        if partition is None:
            store.topic_config(topic)
        else:
            views.existing(store, topic, partition)


def _check_has_dead_letters(data: Path, topic: str) -> None:
    """UnknownTopicError unless ``topic`` or its DLQ exists (a deleted topic's DLQ stays)."""
    with Store(data) as store:
        operations.dead_letter_topic(store, topic)


async def api_groups(request: Request, console: Console) -> Response:
    return _json(await run_in_threadpool(views.groups, console.data))


async def api_dlq(request: Request, console: Console) -> Response:
    topic = inputs.check_topic(request.path_params["topic"])
    query = inputs.Search.dead_letters(request.query_params)
    return _json(await run_in_threadpool(views.dead_letters, console.data, topic, query))


async def api_pending(request: Request, console: Console) -> Response:
    return _json(await run_in_threadpool(views.pending, console.data))


async def metrics(request: Request, console: Console) -> Response:
    """Prometheus' text format, behind the console's login like everything else (a
    Prometheus job sends the token: ``authorization: {credentials: TOKEN}``)."""
    text = await run_in_threadpool(views.metrics, console.data)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def api_broker(request: Request, console: Console) -> Response:
    return _json(await run_in_threadpool(views.broker, console.data))


def _live_views() -> dict[str, Callable[[Path], Any]]:
    return {
        "overview": _overview,
        "topics": views.topics,
        "groups": views.groups,
        "pending": views.pending,
        "broker": views.broker,
    }


async def api_live(request: Request, console: Console) -> Response:
    """Server-sent events: the view a page shows (``?view=overview``, ``groups``, ...)
    every :data:`LIVE_SECONDS` while the page is open; the overview page turns counter
    differences into rates."""
    name = request.query_params.get("view") or "overview"
    view = _live_views().get(name)
    if name == "dlq":  # one topic's dead letters, with the page's filter
        topic = inputs.check_topic(request.query_params.get("topic"))
        query = inputs.Search.dead_letters(
            {k: v for k, v in request.query_params.items() if k not in ("view", "topic")}
        )
        await run_in_threadpool(_check_has_dead_letters, console.data, topic)

        def view(data: Path) -> Any:
            return views.dead_letters(data, topic, query)

    if view is None:
        raise InvalidArgumentError(f"view must be one of {', '.join(_live_views())}, dlq")

    async def events() -> AsyncIterator[bytes]:
        while not await request.is_disconnected():
            # The login is checked again each time, so that a revoked token or an ended
            # session stops the stream at once, as it stops every other request: the last
            # event says why (a browser's EventSource then asks again, and gets a 401).
            try:
                await _authenticate(request, console, action=False)
            except Refused as exc:
                yield _event(name, {"error": str(exc)})
                return
            try:
                snapshot = await run_in_threadpool(view, console.data)
            except SpoolError as exc:
                snapshot = {"error": str(exc)}
            yield _event(name, snapshot)
            await asyncio.sleep(LIVE_SECONDS)

    headers = {**_HEADERS, "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _event(name: str, value: Any) -> bytes:
    return f"event: {name}\ndata: ".encode() + orjson.dumps(value) + b"\n\n"


# -- API: actions --------------------------------------------------------------------------------


def _reset_target(body: dict[str, Any]) -> operations.ResetTo:
    kind = body.get("to")
    if kind in ("earliest", "latest"):
        return operations.ResetTo(kind)
    if kind == "offset":
        return operations.ResetTo("offset", inputs.whole(body.get("value"), "offset"))
    if kind == "time":
        when = inputs.moment(body.get("value"))
        if when is None:
            raise InvalidArgumentError("a reset to a time needs a value (ISO date-time)")
        return operations.ResetTo("time", when)
    raise InvalidArgumentError("to must be earliest, latest, offset or time")


async def api_reset(request: Request, console: Console) -> Response:
    """Plan a group reset (``execute`` false: the preview) or apply it (``execute`` true:
    the page sends that only after its confirm). Refused by the broker while the group
    has live consumers (409)."""
    group = inputs.group_name(request.path_params["group"])
    body = await _body(request)
    topic = inputs.check_topic(body.get("topic"))
    to = _reset_target(body)
    execute = body.get("execute") is True
    return _json(await run_in_threadpool(_reset, console.data, group, topic, to, execute))


def _reset(
    data: Path, group: str, topic: str, to: operations.ResetTo, execute: bool
) -> dict[str, Any]:
    with Store(data) as store:
        changes = operations.plan_reset(store, group, topic, to)
    if execute:
        operations.apply_reset(data, group, changes)
    return {
        "group": group,
        "executed": execute,
        "changes": [
            {"topic": c.topic, "partition": c.partition, "from": c.current, "to": c.target}
            for c in changes
        ],
    }


def _letter_ids(body: dict[str, Any]) -> list[tuple[int, int]] | None:
    """The dead letters picked, as ``[[dlq partition, dlq offset], ...]``; None: all."""
    picked = body.get("letters")
    if picked is None:
        if body.get("all") is not True:
            raise InvalidArgumentError("pick letters ([[partition, offset], ...]) or all: true")
        return None
    if body.get("all") is True:
        raise InvalidArgumentError("pick letters or all: true, not both")
    if not isinstance(picked, list) or not picked or len(picked) > 100_000:
        raise InvalidArgumentError("letters must be a non-empty list of [partition, offset]")
    ids = []
    for item in picked:
        if not isinstance(item, list) or len(item) != 2:
            raise InvalidArgumentError("each letter is [partition, offset]")
        ids.append((inputs.whole(item[0], "partition"), inputs.whole(item[1], "offset")))
    return ids


def _letter_filter(body: dict[str, Any]) -> inputs.Search:
    """The ``filter`` of a redrive or a purge (none: every letter picked)."""
    given = body.get("filter")
    return inputs.Search.dead_letters({} if given is None else given)


async def api_redrive(request: Request, console: Console) -> Response:
    topic = inputs.check_topic(request.path_params["topic"])
    body = await _body(request)
    ids = _letter_ids(body)
    to_group = None if body.get("to_group") in (None, "") else inputs.group_name(body["to_group"])
    query = _letter_filter(body)
    return _json(
        await run_in_threadpool(actions.redrive, console.data, topic, ids, query, to_group)
    )


async def api_purge(request: Request, console: Console) -> Response:
    topic = inputs.check_topic(request.path_params["topic"])
    body = await _body(request)
    if body.get("confirm") is not True:
        raise InvalidArgumentError("a purge needs confirm: true")
    ids = _letter_ids(body)
    query = _letter_filter(body)
    return _json(await run_in_threadpool(actions.purge, console.data, topic, ids, query))


# -- pages ---------------------------------------------------------------------------------------


def _page_html(name: str, console: Console, csrf: str, arg: str = "") -> str:
    shell = (STATIC / "page.html").read_text()
    values = {
        "page": name,
        "csrf": csrf,
        "arg": arg,
        "readonly": "true" if console.read_only else "false",
    }
    for key, value in values.items():
        shell = shell.replace("{{" + key + "}}", html.escape(value, quote=True))
    return shell


def page(name: str, param: str | None = None) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        console: Console = request.app.state.console
        session = console.sessions.get(request.cookies.get(SESSION_COOKIE))
        if session is None:
            return RedirectResponse("/login", 303)
        arg = ""
        if param is not None:
            try:
                raw = request.path_params[param]
                arg = inputs.check_topic(raw) if param == "topic" else inputs.group_name(raw)
            except SpoolError as exc:
                return HTMLResponse(html.escape(str(exc)), 400, headers=_HEADERS)
        return HTMLResponse(_page_html(name, console, session.csrf, arg), headers=_HEADERS)

    return endpoint


async def login_form(request: Request, *, error: str = "") -> Response:
    nonce = secrets.token_urlsafe(24)
    shell = (STATIC / "login.html").read_text()
    shell = shell.replace("{{nonce}}", nonce).replace("{{error}}", html.escape(error))
    response = HTMLResponse(shell, 401 if error else 200, headers=_HEADERS)
    response.set_cookie(LOGIN_COOKIE, nonce, httponly=True, samesite="strict", path="/login")
    return response


async def login(request: Request) -> Response:
    """Check the password; a form from another site fails the nonce check (the form's
    hidden field must equal this browser's cookie, which another site cannot read)."""
    console: Console = request.app.state.console
    form = await request.form()
    nonce, password = form.get("nonce"), form.get("password")
    cookie = request.cookies.get(LOGIN_COOKIE)
    if not isinstance(nonce, str) or not cookie or not auth.same_secret(nonce, cookie):
        return await login_form(request, error="The login form expired; try again.")
    if not isinstance(password, str) or not await run_in_threadpool(
        auth.check_password, console.data, password
    ):
        await asyncio.sleep(0.5)  # slows a guesser a little more than scrypt already does
        return await login_form(request, error="Wrong password.")
    session = console.sessions.create()
    response = RedirectResponse("/", 303)
    response.set_cookie(
        SESSION_COOKIE, session.id, max_age=auth.SESSION_SECONDS, httponly=True, samesite="strict"
    )
    return response


async def logout(request: Request) -> Response:
    console: Console = request.app.state.console
    session = console.sessions.get(request.cookies.get(SESSION_COOKIE))
    form = await request.form()
    token = form.get("csrf")
    if session is not None and isinstance(token, str) and auth.same_secret(token, session.csrf):
        console.sessions.drop(session.id)
    response = RedirectResponse("/login", 303)
    response.delete_cookie(SESSION_COOKIE)
    return response


async def not_found(request: Request, exc: Exception) -> Response:
    if request.url.path.startswith("/api/"):
        return _json({"error": "no such API route"}, 404)
    return HTMLResponse("not found", 404, headers=_HEADERS)


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    """A method the route does not take (``POST /api/overview``, ``GET .../redrive``): in
    the API, ``{"error"}`` as every other refusal, whatever ``--read-only`` says (the
    route does nothing with that method in either mode)."""
    methods = ", ".join(sorted(_allowed(request)))
    if request.url.path.startswith("/api/") or request.url.path == "/metrics":
        answer = _json({"error": f"{request.url.path} takes {methods}, not {request.method}"}, 405)
    else:
        answer = HTMLResponse("method not allowed", 405, headers=_HEADERS)
    answer.headers["Allow"] = methods
    return answer


def _allowed(request: Request) -> set[str]:
    """Every method some route takes at the request's path (a path may have a route per
    method, as ``/login`` has; the static files take GET and HEAD)."""
    path = request.url.path
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods and route.path_regex.fullmatch(path):
            methods |= route.methods
        elif isinstance(route, Mount) and path.startswith(route.path + "/"):
            methods |= {"GET", "HEAD"}
    return methods


def create_app(data: Path, *, read_only: bool = False) -> Starlette:
    """The console for the data directory ``data``."""
    console = Console(Path(data), read_only)
    routes = [
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", page("overview")),
        Route("/topics", page("topics")),
        Route("/topics/{topic}", page("topic", "topic")),
        Route("/groups", page("groups")),
        Route("/dlq/{topic}", page("dlq", "topic")),
        Route("/pending", page("pending")),
        Route("/broker", page("broker")),
        Route("/api/overview", api(api_overview)),
        Route("/api/history", api(api_history)),
        Route("/api/live", api(api_live)),
        Route("/api/topics", api(api_topics)),
        Route("/api/topics/{topic}/messages", api(api_messages)),
        Route("/api/topics/{topic}/search", api(api_search)),
        Route("/api/groups", api(api_groups)),
        Route("/api/groups/{group}/reset", api(api_reset, action=True), methods=["POST"]),
        Route("/api/dlq/{topic}", api(api_dlq)),
        Route("/api/dlq/{topic}/redrive", api(api_redrive, action=True), methods=["POST"]),
        Route("/api/dlq/{topic}/purge", api(api_purge, action=True), methods=["POST"]),
        Route("/api/pending", api(api_pending)),
        Route("/api/broker", api(api_broker)),
        Route("/metrics", api(metrics)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: method_not_allowed})
    app.state.console = console
    return app
