"""The console's JSON API and its security, against a real `spoolmq ui` process on a store
with no broker: passwords and tokens stored hashed, the bearer token, the login, CSRF on
every session POST, read-only, and inputs checked as the CLI checks them."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from ui_helpers import PASSWORD, Client, UIProcess, spoolmq

from spoolmq import Store
from spoolmq.broker.dead_letter import DeadLetterHeader
from spoolmq.store import Message
from spoolmq.types import TopicPartition


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ui_api") / "queue_data"
    with Store(root) as store:
        store.create_topic("orders", partitions=2)
        store.append_batch("orders", [
            Message(value={"n": i, "customer": {"id": i % 3}}, key=f"k{i}",
                    headers=[("trace", f"t{i}")], tags=("vip",) if i % 5 == 0 else (), partition=0)
            for i in range(40)
        ])  # fmt: skip
        store.append("orders", b"\x00\xffraw", key=b"\x01", partition=1)
        store.state.commit_offsets("billing", {TopicPartition("orders", 0): 10})
    write_events(root)
    result = spoolmq("ui", "--set-password", "--data", str(root), stdin=PASSWORD + "\n")
    assert result.returncode == 0, result.stderr
    return root


def write_events(root: Path) -> None:
    """Both shapes of docs/FORMAT.md in one file: frame lines (``runs``) and message lines
    (``offset``), a lag snapshot, a line older than the hour, and a torn last line."""
    now = int(time.time() * 1000)
    day = dt.datetime.fromtimestamp(now / 1000, dt.UTC).date().isoformat()
    folder = root / "events" / f"date={day}"
    folder.mkdir(parents=True)
    lines = [
        {"ts": now - 2 * 3600_000, "type": "delivered", "group": "billing", "consumer": "c1-7#1",
         "runs": [["orders", 0, 0, 100, 1]]},
        {"ts": now - 1000, "type": "delivered", "group": "billing", "consumer": "c1-7#1",
         "runs": [["orders", 0, 0, 6, 1], ["orders", 0, 8, 4, 1]]},
        {"ts": now - 900, "type": "acked", "group": "billing", "consumer": "c1-7#1",
         "runs": [["orders", 0, 0, 6, 1]], "processing_ms": [1, 1, 1, 1, 1, 1]},
        {"ts": now - 800, "type": "acked", "group": "billing", "topic": "orders", "partition": 0,
         "offset": 8, "consumer": "c2-9#1", "attempt": 1},
        {"ts": now - 700, "type": "nacked", "group": "billing", "topic": "orders", "partition": 0,
         "offset": 9, "consumer": "c2-9#1", "attempt": 1, "reason": "boom"},
        {"ts": now - 600, "type": "lag", "group": "billing", "topic": "orders", "partition": 0,
         "offset": None, "committed": 10, "log_end_offset": 40, "lag": 30},
    ]  # fmt: skip
    text = b"".join(orjson.dumps(line) + b"\n" for line in lines) + b'{"ts": 17'
    (folder / f"{now - 3 * 3600_000}-1.jsonl").write_bytes(text)


@pytest.fixture(scope="module")
def ui(data: Path) -> Iterator[UIProcess]:
    with UIProcess(data) as process:
        yield process


@pytest.fixture(scope="module")
def token(data: Path) -> str:
    result = spoolmq("ui", "token", "create", "tests", "--data", str(data))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_the_password_is_stored_hashed_and_private(data: Path) -> None:
    path = data / "ui_password"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = orjson.loads(path.read_bytes())
    assert stored["scheme"] == "scrypt" and PASSWORD not in path.read_text()


def test_a_short_password_is_refused_and_nothing_changes(data: Path) -> None:
    before = (data / "ui_password").read_bytes()
    result = spoolmq("ui", "--set-password", "--data", str(data), stdin="short\n")
    assert result.returncode == 2 and "at least 8" in result.stderr
    assert (data / "ui_password").read_bytes() == before


def test_the_console_will_not_serve_without_a_password(tmp_path: Path) -> None:
    with Store(tmp_path / "q"):
        pass
    result = spoolmq("ui", "--data", str(tmp_path / "q"), "--listen", "127.0.0.1:0")
    assert result.returncode == 2 and "--set-password" in result.stderr


def test_a_token_is_printed_once_and_stored_hashed(data: Path, token: str) -> None:
    tokens = data / "ui_tokens.json"
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    assert token.startswith("smq_") and token not in tokens.read_text()
    listing = spoolmq("ui", "token", "list", "--json", "--data", str(data))
    assert [t["name"] for t in orjson.loads(listing.stdout)] == ["tests"]
    assert token not in listing.stdout


def test_the_api_needs_a_valid_token(ui: UIProcess, token: str) -> None:
    status, _, headers = Client(ui.url).request("/api/topics")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert Client(ui.url, "smq_wrong").json("/api/topics")[0] == 401
    status, topics = Client(ui.url, token).json("/api/topics")
    assert status == 200
    assert [(t["name"], t["messages"]) for t in topics] == [("orders", 41)]


def test_a_revoked_token_stops_working_at_once(ui: UIProcess, data: Path) -> None:
    created = spoolmq("ui", "token", "create", "short-lived", "--data", str(data))
    second = created.stdout.strip().splitlines()[-1]
    assert Client(ui.url, second).json("/api/topics")[0] == 200
    listing = orjson.loads(spoolmq("ui", "token", "list", "--json", "--data", str(data)).stdout)
    token_id = next(t["id"] for t in listing if t["name"] == "short-lived")
    assert spoolmq("ui", "token", "revoke", token_id, "--data", str(data)).returncode == 0
    assert Client(ui.url, second).json("/api/topics")[0] == 401
    assert spoolmq("ui", "token", "revoke", token_id, "--data", str(data)).returncode == 2


def test_a_wrong_password_gets_no_session(ui: UIProcess) -> None:
    client = Client(ui.url)
    assert client.login("not the password") == 401
    assert not [c for c in client.cookies if c.name == "spoolmq_session"]
    assert client.json("/api/topics")[0] == 401
    status, _, headers = client.request("/topics")
    assert status == 303 and headers["location"] == "/login"


def test_a_login_form_from_elsewhere_is_refused(ui: UIProcess) -> None:
    # No nonce cookie from our own login page: what another site's form would send.
    status, page, _ = Client(ui.url).request(
        "/login", method="POST", form={"nonce": "guess", "password": PASSWORD}
    )
    assert status == 401 and b"expired" in page


def test_every_session_post_needs_the_csrf_token(ui: UIProcess) -> None:
    client = Client(ui.url)
    assert client.login() == 303
    assert client.json("/api/topics")[0] == 200  # a GET needs none
    reset = {"topic": "orders", "to": "earliest"}
    path = "/api/groups/billing/reset"
    assert client.json(path, method="POST", body=reset)[0] == 403
    assert client.json(path, method="POST", body=reset, headers={"X-CSRF-Token": "x"})[0] == 403
    status, plan = client.json(path, method="POST", body=reset,
                               headers={"X-CSRF-Token": client.csrf})  # fmt: skip
    assert status == 200 and plan["executed"] is False
    assert plan["changes"][0] == {"topic": "orders", "partition": 0, "from": 10, "to": 0}


def test_pages_and_api_say_what_they_are(ui: UIProcess) -> None:
    client = Client(ui.url)
    assert client.login() == 303
    status, page, headers = client.request("/topics/orders")
    assert status == 200 and b'data-page="topic"' in page and b'data-arg="orders"' in page
    assert "default-src 'self'" in headers["content-security-policy"]
    assert client.request("/api/nothing")[0] == 404


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/topics/orders/messages?offset=-1", 400, "offset must be at least 0"),
        ("/api/topics/orders/messages?offset=1e3", 400, "whole number"),
        ("/api/topics/orders/messages?limit=100000", 400, "limit must be 1 to 500"),
        ("/api/topics/orders/messages?partition=7", 404, "no partition 7"),
        ("/api/topics/orders/messages?time=yesterday", 400, "ISO 8601"),
        ("/api/topics/bad%20name!/messages", 400, "invalid topic name"),
        ("/api/topics/nope/messages", 404, "does not exist"),
        ("/api/topics/orders/messages?direction=sideways", 400, "'back' or 'forward'"),
        ("/api/topics/orders/search?partition=7", 404, "no partition 7"),
        ("/api/topics/orders/search?header=novalue", 400, "NAME=VALUE"),
        ("/api/topics/orders/search?max_scan=0", 400, "max_scan must be 1 to"),
        ("/api/topics/orders/search?field=a..b=1", 400, "names joined by dots"),
        ("/api/topics/orders/search?time=2026-13-01", 400, "ISO 8601"),
        ("/api/dlq/nope", 404, "does not exist"),
        ("/api/live?view=secrets", 400, "view must be one of"),
        ("/api/live?view=dlq", 400, "invalid topic name"),
        ("/api/live?view=dlq&topic=nope", 404, "does not exist"),
    ],
)
def test_inputs_are_checked_as_the_cli_checks_them(
    ui: UIProcess, token: str, path: str, status: int, says: str
) -> None:
    got, answer = Client(ui.url, token).json(path)
    assert got == status and says in answer["error"], answer


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"topic": "orders", "to": "sideways"}, "earliest, latest, offset or time"),
        ({"topic": "orders", "to": "offset", "value": -3}, "offset must be at least 0"),
        ({"topic": "orders", "to": "offset", "value": True}, "whole number"),
        ({"topic": "../etc", "to": "earliest"}, "invalid topic name"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_action_bodies_are_checked(ui: UIProcess, token: str, body: object, says: str) -> None:
    status, answer = Client(ui.url, token).json(
        "/api/groups/billing/reset", method="POST", body=body
    )
    assert status == 400 and says in answer["error"]


def test_a_body_that_is_not_json_is_refused(ui: UIProcess, token: str) -> None:
    status, answer = Client(ui.url, token).json(
        "/api/groups/billing/reset", method="POST", raw=b"{nope"
    )
    assert status == 400 and "not JSON" in answer["error"]


def test_pages_of_a_partition_go_forwards_and_back(ui: UIProcess, token: str) -> None:
    client = Client(ui.url, token)
    _, newest = client.json("/api/topics/orders/messages?partition=0&limit=15")
    assert [m["offset"] for m in newest["messages"]] == list(range(25, 40))
    _, older = client.json(
        "/api/topics/orders/messages?partition=0&limit=15&offset=25&direction=back"
    )
    assert [m["offset"] for m in older["messages"]] == list(range(10, 25))
    _, first = client.json("/api/topics/orders/messages?partition=0&limit=3&offset=0")
    assert first["messages"][0]["value"] == {"n": 0, "customer": {"id": 0}}
    assert first["messages"][0]["headers"] == [["trace", "t0"]]
    _, raw = client.json("/api/topics/orders/messages?partition=1")
    assert raw["messages"][0]["value"] == {"hex": "00ff726177"}
    assert raw["messages"][0]["key"] == {"hex": "01"}


def test_a_search_streams_matches_then_its_count(ui: UIProcess, token: str) -> None:
    client = Client(ui.url, token)
    status, content, headers = client.request(
        "/api/topics/orders/search?field=customer.id=2&tag=vip"
    )
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    lines = [orjson.loads(line) for line in content.splitlines()]
    assert [line["match"]["offset"] for line in lines[:-1]] == [5, 20, 35]
    assert lines[-1]["done"] and lines[-1]["matches"] == 3 and lines[-1]["scanned"] == 41


def test_a_search_stops_at_its_bound_and_says_so(ui: UIProcess, token: str) -> None:
    content = Client(ui.url, token).request("/api/topics/orders/search?key=k39&max_scan=20")[1]
    done = orjson.loads(content.splitlines()[-1])
    assert done == {"done": True, "scanned": 20, "matches": 0, "bounded": True}
    found = Client(ui.url, token).request("/api/topics/orders/search?key=k39&header=trace=t39")[1]
    assert orjson.loads(found.splitlines()[0])["match"]["offset"] == 39


def test_the_history_counts_the_last_hour_from_logs_and_events(ui: UIProcess, token: str) -> None:
    status, history = Client(ui.url, token).json("/api/history?minutes=60")
    assert status == 200 and len(history["minutes"]) == 60
    totals = {name: sum(counts) for name, counts in history["series"].items()}
    assert totals == {"published": 41, "delivered": 10, "acked": 7, "nacked": 1,
                      "dead_lettered": 0, "expired": 0}  # fmt: skip
    assert [v for v in history["lag"]["billing"] if v is not None] == [30]
    assert set(history["last_seen"]) == {"c1-7#1", "c2-9#1"}


def test_the_overview_shows_the_files_when_no_broker_runs(ui: UIProcess, token: str) -> None:
    status, overview = Client(ui.url, token).json("/api/overview")
    assert status == 200
    assert overview["broker"] == {"running": False}
    assert overview["messages"] == 41 and overview["topics"] == 1


def test_read_only_refuses_every_action(data: Path, token: str) -> None:
    with UIProcess(data, "--read-only") as ui:
        client = Client(ui.url, token)
        assert client.json("/api/topics")[0] == 200
        for path, body in [
            ("/api/groups/billing/reset", {"topic": "orders", "to": "earliest", "execute": True}),
            ("/api/dlq/orders/redrive", {"all": True}),
            ("/api/dlq/orders/purge", {"confirm": True}),
        ]:
            status, answer = client.json(path, method="POST", body=body)
            assert status == 403 and "read-only" in answer["error"]
    with Store(data) as store:
        assert store.state.committed_offsets("billing") == {("orders", 0): 10}


def _dead_letter(n: int, reason: str) -> Message:
    return Message(
        value={"job": n},
        key=f"job-{n}",
        headers=[
            (DeadLetterHeader.REASON, reason), (DeadLetterHeader.ATTEMPTS, "3"),
            (DeadLetterHeader.GROUP, "workers"), (DeadLetterHeader.TOPIC, "jobs"),
            (DeadLetterHeader.PARTITION, "0"), (DeadLetterHeader.OFFSET, str(n)),
        ],
    )  # fmt: skip


def test_dead_letters_are_redriven_and_purged_by_pick_and_by_search(
    letters: tuple[Path, Client],
) -> None:
    data, client = letters
    status, listing = client.json("/api/dlq/jobs")
    assert status == 200 and len(listing["dead_letters"]) == 4
    assert listing["dead_letters"][1]["origin"] == {
        "topic": "jobs",
        "partition": 0,
        "offset": 1,
    }
    assert listing["dead_letters"][1]["attempts"] == 3
    status, found = client.json("/api/dlq/jobs?key=job-2")
    assert [d["dlq_offset"] for d in found["dead_letters"]] == [2]

    status, done = client.json("/api/dlq/jobs/redrive", method="POST", body={"letters": [[0, 1]]})
    assert status == 200 and done == {"replayed": 1, "already_replayed": 0, "tasks_queued": 0}
    body = {"all": True, "filter": {"key": "job-3"}, "to_group": "workers"}
    assert client.json("/api/dlq/jobs/redrive", method="POST", body=body)[1]["replayed"] == 1
    body = {"all": True, "to_group": "wrokers"}  # a typo: no group of that name reads jobs
    status, answer = client.json("/api/dlq/jobs/redrive", method="POST", body=body)
    assert status == 400 and "no group of that name reads 'jobs'" in answer["error"]
    status, answer = client.json("/api/dlq/jobs/redrive", method="POST", body={"letters": [[0, 9]]})
    assert status == 400 and "no dead letter" in answer["error"]
    assert client.json("/api/dlq/jobs/redrive", method="POST", body={})[0] == 400

    assert client.json("/api/dlq/jobs/purge", method="POST", body={"all": True})[0] == 400
    body = {"confirm": True, "all": True, "filter": {"key": "job-0"}}
    assert client.json("/api/dlq/jobs/purge", method="POST", body=body)[1] == {"purged": 1}
    left = client.json("/api/dlq/jobs")[1]["dead_letters"]
    assert [d["dlq_offset"] for d in left] == [1, 2, 3]
    with Store(data) as store:
        replayed = list(store.reader("jobs", 0))
    assert [r.value for r in replayed] == [{"job": 1}, {"job": 3}]
    assert ("x-spoolmq-only-group", "workers") in replayed[1].headers
    assert not any(h.startswith("x-dlq-") for h, _ in replayed[0].headers)


@pytest.mark.parametrize(
    "listen", ["8080", "localhost:http", "127.0.0.1:70000", ":8080", "127.0.0.1:²", "127.0.0.1:٣"]
)
def test_a_bad_listen_address_is_one_line(data: Path, listen: str) -> None:
    result = spoolmq("ui", "--data", str(data), "--listen", listen)
    assert result.returncode == 2
    assert (
        result.stderr.startswith("spoolmq: --listen takes HOST:PORT")
        and "Traceback" not in result.stderr
    )


def test_a_search_over_every_partition_labels_each_match(ui: UIProcess, token: str) -> None:
    content = Client(ui.url, token).request("/api/topics/orders/search?max_scan=100")[1]
    lines = [orjson.loads(line) for line in content.splitlines()]
    matches = [line["match"] for line in lines[:-1]]
    assert len(matches) == 41 and lines[-1]["matches"] == 41 and not lines[-1]["bounded"]
    raw = [m for m in matches if m["value"] == {"hex": "00ff726177"}]
    assert len(raw) == 1 and raw[0]["partition"] == 1
    assert {m["partition"] for m in matches if m is not raw[0]} == {0}


def test_a_damaged_record_ends_a_streamed_search_with_an_error(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    with Store(data) as store:
        for n in range(3):
            store.append("events", {"n": n, "note": "intact"})
    segment = next((data / "logs" / "events" / "0").glob("*.jsonl"))
    lines = segment.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"intact", b"broken")  # same length, wrong CRC
    segment.write_bytes(b"".join(lines))
    spoolmq("ui", "--set-password", "--data", str(data), stdin=PASSWORD + "\n")
    token = spoolmq("ui", "token", "create", "t", "--data", str(data)).stdout.split()[-1]
    with UIProcess(data) as ui:
        status, content, _ = Client(ui.url, token).request("/api/topics/events/search")
    items = [orjson.loads(line) for line in content.splitlines()]
    assert status == 200 and items[0]["match"]["offset"] == 0
    assert "error" in items[-1] and not any("done" in item for item in items)


def test_metrics_are_served_behind_the_login(ui: UIProcess, token: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    assert Client(ui.url).request("/metrics")[0] == 401
    status, content, headers = Client(ui.url, token).request("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(content.decode())
        for s in family.samples
    }
    assert samples[("spoolmq_broker_up", ())] == 0
    assert samples[("spoolmq_log_end_offset", (("partition", "0"), ("topic", "orders")))] == 40
    lag = (
        "spoolmq_group_lag_messages",
        (("group", "billing"), ("partition", "0"), ("topic", "orders")),
    )
    assert samples[lag] == 30


def test_without_the_ui_extra_the_command_says_what_to_install(data: Path, tmp_path: Path) -> None:
    # A sitecustomize that makes starlette look uninstalled, in the child process only.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'starlette':\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "spoolmq", "ui", "--data", str(data), "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "spoolmq: spoolmq ui needs the 'ui' extra (starlette is not installed): "
        "pip install 'spoolmq[ui]' (or uv add 'spoolmq[ui]')"
    ]


def test_live_updates_are_server_sent_events(ui: UIProcess, token: str) -> None:
    import urllib.request

    request = urllib.request.Request(
        ui.url + "/api/live?view=groups", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as stream:  # it never ends: read two
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = []
        while len(events) < 2:
            event, data = stream.readline(), stream.readline()
            assert stream.readline() == b"\n"
            events.append((event, orjson.loads(data.removeprefix(b"data: "))))
    assert [event for event, _ in events] == [b"event: groups\n"] * 2
    assert events[0][1]["billing"]["partitions"][0]["committed"] == 10


def test_a_cancelled_delayed_message_is_not_pending(tmp_path: Path) -> None:
    """``/api/pending``'s ``delayed`` (views.pending): a message cancelled while it waits
    for its time will never be delivered, so it is not listed as waiting."""
    from spoolmq.ui.views import pending

    root = tmp_path / "queue_data"
    due = int(time.time() * 1000) + 3_600_000
    with Store(root) as store:
        store.create_topic("later", partitions=1)
        kept = store.append("later", {"n": 1}, deliver_at=due)
        cancelled = store.append("later", {"n": 2}, deliver_at=due)
        store.cancel_message("later", 0, cancelled.offset, "not needed")
    assert [d["offset"] for d in pending(root)["delayed"]] == [kept.offset]


def test_a_delivery_back_from_a_lost_consumer_is_waiting_not_in_flight(tmp_path: Path) -> None:
    """``/api/pending`` (views.pending) from the checkpoint's rows: one with a lease is in
    flight; one the broker saved with none came back from its consumer and waits for the
    next (it showed as in flight with its lost consumer for good)."""
    from spoolmq.store.state import DeliveryRow, ScheduledRow
    from spoolmq.ui.views import pending

    root = tmp_path / "queue_data"
    with Store(root) as store:
        store.create_topic("jobs", partitions=1)
        store.state.checkpoint(
            committed={},
            deliveries=[
                DeliveryRow("g", "jobs", 0, 1, "c1-1#1", 1, 1000, 31_000),
                DeliveryRow("g", "jobs", 0, 2, "", 2, 1000, 0),  # back, due now
                DeliveryRow("g", "jobs", 0, 3, "", 1, 1000, 0),  # back, retry scheduled
            ],
            scheduled=[ScheduledRow("g", "jobs", 0, 3, 9_000, 1, "busy")],
            finished=[],
        )
    seen = pending(root)
    assert [(d["offset"], d["consumer"]) for d in seen["in_flight"]] == [(1, "c1-1#1")]
    assert [(r["offset"], r["due_at"], r["attempt"]) for r in seen["scheduled"]] == [
        (2, 0, 2),
        (3, 9_000, 1),
    ]


@pytest.fixture
def letters(tmp_path: Path) -> Iterator[tuple[Path, Client]]:
    """A topic ``jobs`` with 4 dead letters (keys job-0 .. job-3), and a console on it."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("jobs")
        store.append_batch("jobs.dlq", [_dead_letter(n, f"boom {n}") for n in range(4)])
    token = spoolmq("ui", "token", "create", "t", "--data", str(data)).stdout.split()[-1]
    spoolmq("ui", "--set-password", "--data", str(data), stdin=PASSWORD + "\n")
    with UIProcess(data) as ui:
        yield data, Client(ui.url, token)


@pytest.mark.parametrize(
    ("filter_", "says"),
    [
        ({"partition": 3}, "not 'partition'"),
        ({"offset": 0}, "not 'offset'"),
        ({"time": "2026-01-01"}, "not 'time'"),
        ({"keys": "x"}, "not 'keys'"),
        ({"key": "job-1", "tags": "vip"}, "not 'tags'"),
        ("x", "a JSON object"),
        ([["key", "job-1"]], "a JSON object"),
        ({"key": ""}, "key is empty"),  # narrows nothing: "all matching" would be all
        ({"tag": None}, "tag is empty"),
    ],
)
@pytest.mark.parametrize("action", ["redrive", "purge"])
def test_a_dead_letter_filter_it_does_not_know_acts_on_nothing(
    letters: tuple[Path, Client], action: str, filter_: object, says: str
) -> None:
    data, client = letters
    body = {"confirm": True, "all": True, "filter": filter_}
    status, answer = client.json(f"/api/dlq/jobs/{action}", method="POST", body=body)
    assert status == 400 and says in answer["error"], answer
    assert len(client.json("/api/dlq/jobs")[1]["dead_letters"]) == 4
    with Store(data) as store:
        assert store.log_end_offset("jobs", 0) == 0  # nothing redriven


def test_a_dead_letter_filter_that_matches_nothing_picks_nothing(
    letters: tuple[Path, Client],
) -> None:
    client = letters[1]
    status, listing = client.json("/api/dlq/jobs?key=nomatch")
    assert status == 200 and listing["dead_letters"] == []
    status, answer = client.json("/api/dlq/jobs?keys=nomatch")
    assert status == 400 and "not 'keys'" in answer["error"]
    status, answer = client.json("/api/dlq/jobs?partition=0")
    assert status == 400 and "not 'partition'" in answer["error"]
    body = {"confirm": True, "all": True, "filter": {"key": "nomatch"}}
    assert client.json("/api/dlq/jobs/purge", method="POST", body=body) == (200, {"purged": 0})
    assert client.json("/api/dlq/jobs/redrive", method="POST", body=body)[1]["replayed"] == 0
    assert len(client.json("/api/dlq/jobs")[1]["dead_letters"]) == 4


@pytest.mark.parametrize("action", ["redrive", "purge"])
def test_letters_given_with_a_filter_are_those_it_matches(
    letters: tuple[Path, Client], action: str
) -> None:
    """Picked letters and a filter: only the picked ones the filter matches are acted on
    (the filter is not passed over); picked letters and ``all`` is a 400."""
    data, client = letters
    picked = {"confirm": True, "letters": [[0, 1], [0, 2]]}
    both = {**picked, "all": True}
    status, answer = client.json(f"/api/dlq/jobs/{action}", method="POST", body=both)
    assert status == 400 and "not both" in answer["error"], answer
    body = {**picked, "all": False, "filter": {"key": "job-2"}}
    status, answer = client.json(f"/api/dlq/jobs/{action}", method="POST", body=body)
    assert status == 200, answer
    left = [d["dlq_offset"] for d in client.json("/api/dlq/jobs")[1]["dead_letters"]]
    with Store(data) as store:
        redriven = [r.value for r in store.reader("jobs", 0)]
    if action == "purge":
        assert (answer, left, redriven) == ({"purged": 1}, [0, 1, 3], [])
    else:
        assert answer["replayed"] == 1 and redriven == [{"job": 2}] and left == [0, 1, 2, 3]


def test_a_live_dead_letter_view_refuses_a_filter_it_does_not_know(
    letters: tuple[Path, Client],
) -> None:
    status, answer = _opened(letters[1], "/api/live?view=dlq&topic=jobs&keys=x")
    assert status == 400 and "not 'keys'" in answer["error"]


def _opened(client: Client, path: str) -> tuple[int, Any]:
    """The status and JSON error of a request whose success is an endless stream: a 200
    is answered with its first line, never read to its end."""
    request = urllib.request.Request(
        client.url + path, headers={"Authorization": f"Bearer {client.token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as stream:
            return stream.status, stream.readline()
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def test_a_search_refuses_a_parameter_it_does_not_know(ui: UIProcess, token: str) -> None:
    status, answer = Client(ui.url, token).json("/api/topics/orders/search?keys=k1")
    assert status == 400 and "not 'keys'" in answer["error"]


@pytest.mark.parametrize(
    ("args", "stdin", "kept_out"),
    [
        (["--set-password"], PASSWORD + "\n", "ui_password"),
        (["token", "create", "t"], "", "ui_tokens.json"),
        (["token", "list"], "", None),
        (["--listen", "127.0.0.1:0"], "", None),  # it would serve: refused before
    ],
)
def test_a_data_directory_others_can_write_is_refused(
    tmp_path: Path, args: list[str], stdin: str, kept_out: str | None
) -> None:
    data = tmp_path / "shared"
    with Store(data):
        pass
    if kept_out != "ui_password":  # the console refuses to serve without one
        spoolmq("ui", "--set-password", "--data", str(data), stdin=PASSWORD + "\n")
    os.chmod(data, 0o777)
    result = spoolmq("ui", *args, "--data", str(data), stdin=stdin, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"spoolmq: {data} can be written by other users (mode drwxrwxrwx); "
        f"run `chmod 700 {data}` so that nobody else can alter the queue"
    ]
    if kept_out is not None:
        assert not (data / kept_out).exists()


def test_a_password_set_before_the_first_broker_makes_its_directories_private(
    tmp_path: Path,
) -> None:
    data = tmp_path / "new" / "queue_data"
    result = spoolmq("ui", "--set-password", "--data", str(data), stdin=PASSWORD + "\n")
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE(data.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "ui_password").stat().st_mode) == 0o600


@pytest.mark.parametrize("nonce", ["é", "ü" * 40])
def test_a_login_with_a_non_ascii_nonce_is_refused_not_an_error(ui: UIProcess, nonce: str) -> None:
    client = Client(ui.url)
    assert client.request("/login")[0] == 200  # the nonce cookie, which is ASCII
    status, page, _ = client.request(
        "/login", method="POST", form={"nonce": nonce, "password": PASSWORD}
    )
    assert status == 401 and b"expired" in page
    status, page, _ = client.request(
        "/login", method="POST", raw=b"nonce=%ff&password=x",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert status == 401 and b"expired" in page
    status, page, _ = Client(ui.url).request(
        "/login", method="POST", form={"nonce": "abc", "password": PASSWORD},
        headers={"Cookie": "spoolmq_login=\xe9"},
    )  # fmt: skip
    assert status == 401 and b"expired" in page


def test_a_non_ascii_csrf_token_is_refused_not_an_error(ui: UIProcess) -> None:
    client = Client(ui.url)
    assert client.login() == 303
    reset = {"topic": "orders", "to": "earliest"}
    status, answer = client.json(
        "/api/groups/billing/reset", method="POST", body=reset, headers={"X-CSRF-Token": "é"}
    )
    assert status == 403 and "CSRF" in answer["error"]
    session = next(c.value for c in client.cookies if c.name == "spoolmq_session")
    status, _, headers = client.request("/logout", method="POST", form={"csrf": "é"})
    assert status == 303 and headers["location"] == "/login"
    # The browser forgets its cookie, but a wrong token ended no session on the server.
    cookie = {"Cookie": f"spoolmq_session={session}"}
    assert Client(ui.url).json("/api/topics", headers=cookie)[0] == 200


def _live(url: str, headers: dict[str, str]) -> Iterator[tuple[bytes, Any]]:
    """The events of ``GET /api/live?view=topics`` as (``event:`` line, data) until the
    stream ends."""
    request = urllib.request.Request(url + "/api/live?view=topics", headers=headers)
    with urllib.request.urlopen(request, timeout=60) as stream:
        while event := stream.readline():
            data = stream.readline()
            assert stream.readline() == b"\n"
            yield event, orjson.loads(data.removeprefix(b"data: "))


def test_a_revoked_token_ends_its_live_stream(ui: UIProcess, data: Path) -> None:
    created = spoolmq("ui", "token", "create", "streaming", "--data", str(data)).stdout
    token_id, token = created.split()[2], created.strip().splitlines()[-1]
    events = _live(ui.url, {"Authorization": f"Bearer {token}"})
    event, topics = next(events)
    assert event == b"event: topics\n" and topics[0]["name"] == "orders"
    assert spoolmq("ui", "token", "revoke", token_id, "--data", str(data)).returncode == 0
    # At most 3 more (the stream never ends by itself): the one that says why, then its end.
    assert list(itertools.islice(events, 3)) == [
        (b"event: topics\n", {"error": "unknown or revoked API token"})
    ]


def test_a_logout_ends_the_sessions_live_stream(ui: UIProcess) -> None:
    client = Client(ui.url)
    assert client.login() == 303
    session = next(c.value for c in client.cookies if c.name == "spoolmq_session")
    events = _live(ui.url, {"Cookie": f"spoolmq_session={session}"})
    assert next(events)[0] == b"event: topics\n"
    assert client.request("/logout", method="POST", form={"csrf": client.csrf})[0] == 303
    assert list(itertools.islice(events, 3)) == [
        (b"event: topics\n", {"error": "log in first (or send Authorization: Bearer TOKEN)"})
    ]


def test_a_damaged_record_hides_only_its_partition_from_pending(tmp_path: Path) -> None:
    from spoolmq.store.state import ScheduledRow

    data = tmp_path / "queue_data"
    due = int(time.time() * 1000) + 3_600_000
    with Store(data) as store:
        for n in range(3):
            store.append("events", {"n": n, "note": "intact"}, deliver_at=due)
        later = store.append("later", {"n": 1}, deliver_at=due)
        store.state.checkpoint(
            committed={},
            deliveries=[],
            scheduled=[ScheduledRow("g", "later", 0, later.offset, due, 1, "busy")],
            finished=[],
        )
    segment = next((data / "logs" / "events" / "0").glob("*.jsonl"))
    lines = segment.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"intact", b"broken")  # same length, wrong CRC
    segment.write_bytes(b"".join(lines))
    spoolmq("ui", "--set-password", "--data", str(data), stdin=PASSWORD + "\n")
    token = spoolmq("ui", "token", "create", "t", "--data", str(data)).stdout.split()[-1]
    with UIProcess(data) as ui:
        status, pending = Client(ui.url, token).json("/api/pending")
    assert status == 200, pending
    assert [(m["topic"], m["offset"]) for m in pending["delayed"]] == [
        ("events", 0),
        ("later", later.offset),
    ]
    assert [(r["topic"], r["offset"]) for r in pending["scheduled"]] == [("later", later.offset)]
    [damaged] = pending["damaged"]
    assert (damaged["topic"], damaged["partition"]) == ("events", 0)
    assert "CRC" in damaged["error"] or "checksum" in damaged["error"], damaged


@pytest.mark.parametrize(
    "content",
    [b"{bad", b'[{"id": "a"}]', b'{"id": "a"}', b'[{"id": "a", "name": "n", "created_ms": true, '
     b'"sha256": "00"}]', b'[{"id": "a", "name": "n", "created_ms": 1, "sha256": "\xc3\xa9"}]'],
)  # fmt: skip
def test_a_damaged_tokens_file_is_one_line_and_left_as_it_is(
    tmp_path: Path, content: bytes
) -> None:
    data = tmp_path / "queue_data"
    with Store(data):
        pass
    spoolmq("ui", "--set-password", "--data", str(data), stdin=PASSWORD + "\n")
    tokens = data / "ui_tokens.json"
    tokens.write_bytes(content)
    for args in (["list"], ["create", "t"], ["revoke", "a"]):
        result = spoolmq("ui", "token", *args, "--data", str(data))
        assert result.returncode == 2, result
        [line] = result.stderr.splitlines()
        assert line.startswith(f"spoolmq: {tokens} is damaged"), line
    assert tokens.read_bytes() == content
    with UIProcess(data) as ui:
        status, answer = Client(ui.url, "smq_anything").json("/api/topics")
        assert status == 401 and "ui_tokens.json is damaged" in answer["error"]
        browser = Client(ui.url)
        assert browser.login() == 303
        assert browser.json("/api/topics")[0] == 200


def test_a_search_whose_topic_is_deleted_meanwhile_ends_with_an_error(tmp_path: Path) -> None:
    """The NDJSON lines of ``/api/topics/T/search`` (app._searched over views.search), with
    the topic deleted by another process after the first match: the scan stopped short,
    so it ends with an error line, never ``done`` (which would claim a whole scan)."""
    from spoolmq.ui.app import _searched
    from spoolmq.ui.inputs import Search

    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("big", partitions=2, segment_bytes=4096)  # many segments
        for batch in range(100):
            store.append_batch("big", [
                Message(value={"n": n}, partition=n % 2, tags=("x",) if n in (0, 4999) else ())
                for n in range(batch * 50, batch * 50 + 50)
            ])  # fmt: skip
    lines = _searched(data, "big", Search.parse({"tag": "x", "max_scan": "100000"}))
    assert next(lines)["match"]["value"] == {"n": 0}
    with Store(data) as other:
        other.delete_topic("big")
    rest = list(lines)
    assert not any("done" in line for line in rest), rest
    assert "'big' was deleted during the search" in rest[-1]["error"]


def test_a_deleted_topics_dead_letters_are_reached_as_the_cli_reaches_them(
    letters: tuple[Path, Client],
) -> None:
    data, client = letters
    deleted = spoolmq("topics", "delete", "jobs", "--data", str(data))
    assert deleted.returncode == 0, deleted.stderr
    status, listing = client.json("/api/dlq/jobs")
    assert status == 200 and [d["dlq_offset"] for d in listing["dead_letters"]] == [0, 1, 2, 3]
    status, first = _opened(client, "/api/live?view=dlq&topic=jobs")
    assert status == 200 and first == b"event: dlq\n"
    body = {"confirm": True, "all": True, "filter": {"key": "job-0"}}
    assert client.json("/api/dlq/jobs/purge", method="POST", body=body) == (200, {"purged": 1})
    assert client.json(
        "/api/dlq/jobs/purge", method="POST", body={"confirm": True, "letters": [[0, 1]]}
    ) == (200, {"purged": 1})
    cli = spoolmq("dlq", "list", "jobs", "--json", "--data", str(data))
    assert [d["dlq_offset"] for d in orjson.loads(cli.stdout)] == [2, 3]
    # As `spoolmq dlq replay` does: republished to the topic, made again.
    redrive = client.json("/api/dlq/jobs/redrive", method="POST", body={"letters": [[0, 2]]})
    assert redrive == (200, {"replayed": 1, "already_replayed": 0, "tasks_queued": 0})
    assert client.json("/api/dlq/nope")[0] == 404


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/api/overview", "GET"),
        ("DELETE", "/api/topics", "GET"),
        ("GET", "/api/dlq/orders/redrive", "POST"),
        ("PUT", "/api/groups/billing/reset", "POST"),
        ("POST", "/metrics", "GET"),
    ],
)
def test_a_method_a_route_does_not_take_is_a_json_405(
    ui: UIProcess, token: str, method: str, path: str, allowed: str
) -> None:
    status, content, headers = Client(ui.url, token).request(path, method=method, raw=b"{}")
    assert status == 405 and allowed in headers["allow"]
    assert headers["content-type"] == "application/json"
    assert orjson.loads(content) == {"error": f"{path} takes {headers['allow']}, not {method}"}


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("PUT", "/login", "GET, HEAD, POST"), ("POST", "/static/app.js", "GET, HEAD")],
)
def test_a_405_names_every_method_of_its_path(
    ui: UIProcess, token: str, method: str, path: str, allowed: str
) -> None:
    """``/login`` has a route for GET and one for POST: its Allow names both (it named the
    one route that matched first); a static file takes GET and HEAD."""
    status, _, headers = Client(ui.url, token).request(path, method=method, raw=b"{}")
    assert (status, headers["allow"]) == (405, allowed)


def test_read_only_answers_a_post_to_a_reading_route_as_without_it(data: Path, token: str) -> None:
    with UIProcess(data, "--read-only") as ui:
        status, answer = Client(ui.url, token).json("/api/overview", method="POST", body={})
    assert status == 405 and "takes GET" in answer["error"]


def test_a_search_from_an_offset_and_a_time_is_refused(ui: UIProcess, token: str) -> None:
    """One start or the other: the offset used to win without a word."""
    status, answer = Client(ui.url, token).json(
        "/api/topics/orders/search?offset=0&time=2026-01-01T00:00:00Z"
    )
    assert status == 400 and "an offset or a time, not both" in answer["error"]
