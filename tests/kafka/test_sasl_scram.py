"""SCRAM-SHA-256 on the server's side: RFC 7677's example exchange, refusals, the users
file, and the SaslHandshake/SaslAuthenticate handlers driven frame by frame."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spoolmq.errors import ConfigError, KafkaDecodeError
from spoolmq.kafka.api import ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.sasl import handle_sasl_authenticate, handle_sasl_handshake
from spoolmq.kafka.scram import (
    Credential,
    ScramError,
    ScramServer,
    load_users,
    save_users,
    users_path,
)
from spoolmq.kafka.wire import Reader, Writer

# RFC 7677, section 3: user "user", password "pencil".
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_server(password: str = "pencil") -> ScramServer:
    users = {"user": Credential.derive(password, salt=RFC_SALT, iterations=4096)}
    return ScramServer(users, b"secret", server_nonce=RFC_SERVER_NONCE)


def test_rfc7677_example_exchange() -> None:
    server = rfc_server()
    assert server.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.user == "user"


def _final_with_nonce(nonce: bytes, password: str = "pencil") -> bytes:
    """A client-final message with ``nonce`` and the proof a client computes over it."""
    without_proof = b"c=biws,r=" + nonce
    auth = RFC_CLIENT_FIRST[3:] + b"," + RFC_SERVER_FIRST + b"," + without_proof
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), RFC_SALT, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    return without_proof + b",p=" + proof


def test_older_librdkafkas_nonce_is_taken_and_no_other() -> None:
    """librdkafka before 2.6.1 (Debian's kcat: 2.0.2) sends its own nonce again in front
    of the server's (confluentinc/librdkafka#4895): taken, as Kafka 3.x takes it. Any
    other nonce is still refused, a proof over it or not."""
    client_nonce, full = b"rOprNGfwEbeRWgbNEkqO", RFC_SERVER_FIRST[2:].split(b",")[0]
    server = rfc_server()
    server.first(RFC_CLIENT_FIRST)
    assert server.final(_final_with_nonce(client_nonce + full)).startswith(b"v=")
    for nonce in (b"x" + full, full + client_nonce, client_nonce + client_nonce + full):
        server = rfc_server()
        server.first(RFC_CLIENT_FIRST)
        with pytest.raises(ScramError, match="nonce differs"):
            server.final(_final_with_nonce(nonce))


def test_wrong_password_and_unknown_user_fail_alike() -> None:
    server = rfc_server("not-pencil")
    server.first(RFC_CLIENT_FIRST)
    with pytest.raises(ScramError, match="authentication failed"):
        server.final(RFC_CLIENT_FINAL)
    nobody = ScramServer({}, b"secret", server_nonce=RFC_SERVER_NONCE)
    first = nobody.first(RFC_CLIENT_FIRST)
    assert first.startswith(b"r=rOprNGfwEbeRWgbNEkqO%hvYD") and b",i=" in first
    assert first == ScramServer({}, b"secret", server_nonce=RFC_SERVER_NONCE).first(
        RFC_CLIENT_FIRST
    ), "an unknown user's salt is stable, so it does not betray the name"
    with pytest.raises(ScramError, match="authentication failed"):
        nobody.final(RFC_CLIENT_FINAL)


@pytest.mark.parametrize(
    "final",
    [
        RFC_CLIENT_FINAL.replace(b"r=rOpr", b"r=XOpr"),  # another nonce (a replay)
        RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"),  # channel binding flag changed
        RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=dHzc"),  # altered proof
        RFC_CLIENT_FINAL.split(b",p=")[0],  # no proof
        b"c=biws,r=x,p=!!!",
        b"\xff\xfe",
    ],
)
def test_altered_client_final_messages_fail(final: bytes) -> None:
    server = rfc_server()
    server.first(RFC_CLIENT_FIRST)
    with pytest.raises(ScramError):
        server.final(final)


@pytest.mark.parametrize(
    "first",
    [
        b"p=tls-unique,,n=user,r=abc",  # channel binding requested
        b"n,,r=abc,n=user",  # attributes out of order
        b"n,,n=us=er,r=abc",  # bad escape
        b"n,,m=ext,n=user,r=abc",
        b"n,a=other,n=user,r=abc",  # authzid of another user
        b"n,,n=user,r=",
        b"x" * 5000,
    ],
)
def test_malformed_client_first_messages_fail(first: bytes) -> None:
    with pytest.raises(ScramError):
        rfc_server().first(first)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_any_bytes_give_an_answer_or_a_scram_error(first: bytes, final: bytes) -> None:
    server = rfc_server()
    try:
        server.first(first)
        server.final(final)
    except ScramError:
        return
    raise AssertionError("random bytes authenticated")


def test_users_file_is_private_and_holds_no_password(tmp_path: Path) -> None:
    save_users(tmp_path, {"alice": Credential.derive("s3cret-pass")})
    path = users_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert b"s3cret-pass" not in path.read_bytes()
    loaded = load_users(tmp_path)["alice"]
    salted = hashlib.pbkdf2_hmac("sha256", b"s3cret-pass", loaded.salt, loaded.iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert hashlib.sha256(client_key).digest() == loaded.stored_key
    path.write_text("{not json")
    with pytest.raises(ConfigError):
        load_users(tmp_path)


# -- the handlers ----------------------------------------------------------------------


def ctx_for(data: Path) -> RequestContext:
    return RequestContext(data_dir=data, host="127.0.0.1", port=9092, auth_required=True)


def authenticate(ctx: RequestContext, token: bytes) -> tuple[int, bytes]:
    body = asyncio.run(handle_sasl_authenticate(ctx, 0, Reader(Writer().bytes_(token).getvalue())))
    r = Reader(body)
    error = r.int16()
    r.nullable_string()
    return error, r.bytes_()


def handshake(ctx: RequestContext, mechanism: str, version: int = 1) -> int:
    request = Reader(Writer().string(mechanism).getvalue())
    body = asyncio.run(handle_sasl_handshake(ctx, version, request))
    r = Reader(body)
    error = r.int16()
    assert r.array(Reader.string) == ["SCRAM-SHA-256"]
    return error


def test_handlers_accept_the_right_password(tmp_path: Path) -> None:
    save_users(tmp_path, {"user": Credential.derive("pencil", salt=RFC_SALT, iterations=4096)})
    ctx = ctx_for(tmp_path)
    assert handshake(ctx, "SCRAM-SHA-256") == ErrorCode.NONE
    error, server_first = authenticate(ctx, RFC_CLIENT_FIRST)
    assert error == ErrorCode.NONE and server_first.startswith(b"r=rOprNGfwEbeRWgbNEkqO")
    # A real client computes its proof over the nonce it got; do the same here.
    nonce = server_first.split(b",")[0][2:]
    without_proof = b"c=biws,r=" + nonce
    auth = RFC_CLIENT_FIRST[3:] + b"," + server_first + b"," + without_proof
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    error, server_final = authenticate(ctx, without_proof + b",p=" + proof)
    assert error == ErrorCode.NONE and server_final.startswith(b"v=")
    assert ctx.authenticated and ctx.principal == "user" and not ctx.close_after_response


def test_handlers_refuse_and_close(tmp_path: Path) -> None:
    save_users(tmp_path, {"user": Credential.derive("other", salt=RFC_SALT, iterations=4096)})
    ctx = ctx_for(tmp_path)
    assert handshake(ctx, "PLAIN") == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert not ctx.close_after_response
    # SaslAuthenticate before a successful handshake is out of order.
    error, _ = authenticate(ctx, RFC_CLIENT_FIRST)
    assert error == ErrorCode.ILLEGAL_SASL_STATE and ctx.close_after_response
    ctx = ctx_for(tmp_path)
    handshake(ctx, "SCRAM-SHA-256")
    authenticate(ctx, RFC_CLIENT_FIRST)
    error, _ = authenticate(ctx, RFC_CLIENT_FINAL)  # a proof for another nonce and password
    assert error == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert ctx.close_after_response and not ctx.authenticated


def test_a_v0_handshake_is_refused_and_closes(tmp_path: Path) -> None:
    """v0 is in the table (older librdkafka looks for it, then speaks v1), but its exchange
    (raw SASL tokens) is not served: a client that picks it is told, not left hanging."""
    save_users(tmp_path, {"user": Credential.derive("pencil", salt=RFC_SALT, iterations=4096)})
    ctx = ctx_for(tmp_path)
    assert handshake(ctx, "SCRAM-SHA-256", version=0) == ErrorCode.UNSUPPORTED_VERSION
    assert ctx.close_after_response and not ctx.authenticated


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE]), st.binary(max_size=200))
def test_fuzzed_sasl_bodies_parse_or_raise_decode_error(api: int, body: bytes) -> None:
    ctx = ctx_for(Path("/nonexistent"))
    ctx.conn["sasl"] = "handshake"
    handler = handle_sasl_handshake if api == ApiKey.SASL_HANDSHAKE else handle_sasl_authenticate
    try:
        answer = asyncio.run(handler(ctx, 1 if api == ApiKey.SASL_HANDSHAKE else 0, Reader(body)))
    except KafkaDecodeError:
        return
    assert Reader(answer).int16() in {e.value for e in ErrorCode}
