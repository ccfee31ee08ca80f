"""SASL authentication of the Kafka front: SaslHandshake v1 (v0 advertised, refused) and
SaslAuthenticate v0 with SCRAM-SHA-256, at the versions docs/KAFKA.md lists.

The client names its mechanism in SaslHandshake, then sends each SCRAM message in a
SaslAuthenticate frame and gets the server's answer in the response's ``auth_bytes``
(KIP-152). A handler that accepts the client sets ``ctx.authenticated`` and
``ctx.principal``; the server then serves every other API on that connection. A failed
exchange is answered with SASL_AUTHENTICATION_FAILED and the connection is closed
after that answer, as Kafka does. The step of the exchange lives in ``ctx.conn``.

Credentials come from the data directory's ``users`` file (``spoolmq users``), read at
each authentication, so a user added or removed takes effect on the next connection.
"""

from __future__ import annotations

import functools
from typing import Any

from spoolmq.errors import SpoolError
from spoolmq.kafka.api import ApiHandler, ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.scram import MECHANISM, ScramError, ScramServer, load_users, server_secret
from spoolmq.kafka.wire import Reader, Writer

_STATE = "sasl"  # ctx.conn key: "handshake" done, then the ScramServer, then "done"


@functools.cache
def _secret() -> bytes:
    """One secret per Kafka child for the decoy salts of unknown users."""
    return server_secret()


async def handle_sasl_handshake(ctx: RequestContext, version: int, r: Reader) -> bytes:
    mechanism = r.string()
    w = Writer()
    if version == 0:
        # v0 is advertised because older librdkafka (2.0.2: Debian's kcat is built with it)
        # looks for it in the table before it uses SASL at all, and then speaks v1. A v0
        # exchange itself (raw SASL tokens after it, clients older than Kafka 1.0) is
        # not served: said so, and the connection closed after the answer.
        error = ErrorCode.UNSUPPORTED_VERSION
        ctx.close_after_response = True
    elif ctx.authenticated or _STATE in ctx.conn:
        error = ErrorCode.ILLEGAL_SASL_STATE
        ctx.close_after_response = True
    elif mechanism != MECHANISM:
        error = ErrorCode.UNSUPPORTED_SASL_MECHANISM
    else:
        error = ErrorCode.NONE
        ctx.conn[_STATE] = "handshake"
    return w.int16(error).array([MECHANISM], Writer.string).getvalue()


def _answer(error: int, message: str | None, auth: bytes) -> bytes:
    return Writer().int16(error).nullable_string(message).bytes_(auth).getvalue()


def _fail(ctx: RequestContext, error: int, message: str) -> bytes:
    ctx.close_after_response = True
    ctx.conn[_STATE] = "failed"
    return _answer(error, message, b"")


async def handle_sasl_authenticate(ctx: RequestContext, version: int, r: Reader) -> bytes:
    token = r.bytes_()
    state: Any = ctx.conn.get(_STATE)
    try:
        if state == "handshake":
            try:
                users = load_users(ctx.data_dir)
            except SpoolError as exc:
                return _fail(ctx, ErrorCode.SASL_AUTHENTICATION_FAILED, f"no credentials: {exc}")
            server = ScramServer(users, _secret())
            answer = server.first(token)
            ctx.conn[_STATE] = server
            return _answer(ErrorCode.NONE, None, answer)
        if isinstance(state, ScramServer):
            answer = state.final(token)
            ctx.authenticated = True
            ctx.principal = state.user
            ctx.conn[_STATE] = "done"
            return _answer(ErrorCode.NONE, None, answer)
    except ScramError as exc:
        # The reason stays vague on purpose for a wrong password or an unknown user.
        return _fail(ctx, ErrorCode.SASL_AUTHENTICATION_FAILED, f"SCRAM-SHA-256: {exc}")
    return _fail(ctx, ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate outside an exchange")


APIS: list[ApiHandler] = [
    ApiHandler(ApiKey.SASL_HANDSHAKE, 0, 1, handle_sasl_handshake, name="SaslHandshake"),
    ApiHandler(ApiKey.SASL_AUTHENTICATE, 0, 0, handle_sasl_authenticate, name="SaslAuthenticate"),
]
