"""Hostile request bodies for the group coordinator's APIs, straight into the server's
frame handler (no socket): each frame is answered or refused with KafkaDecodeError
(which closes that one connection), never anything else, and nothing waits forever."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka import groups
from spoolmq.kafka.dispatch import Dispatcher
from spoolmq.kafka.server import KafkaServer
from spoolmq.kafka.wire import Reader, Writer

_APIS = {h.api_key: h for h in groups.APIS}


def _join_body(version: int, protocols: int, metadata: bytes) -> bytes:
    w = Writer().string("fuzz").int32(10_000)
    if version >= 1:
        w.int32(10_000)
    w.string("").string("consumer").int32(protocols)
    for i in range(min(protocols, 3)):
        w.string(f"p{i}").bytes_(metadata)
    return w.getvalue()


_bodies = st.one_of(
    st.binary(max_size=200),
    st.builds(_join_body, st.integers(0, 3), st.integers(-2, 5), st.binary(max_size=50)),
    # Valid-looking strings and counts with lies in the lengths.
    st.builds(
        lambda n, count, tail: (
            struct.pack(">h", n) + b"g" * max(n, 0) + struct.pack(">i", count) + tail
        ),
        st.integers(-3, 6),
        st.integers(-2, 2**31 - 1),
        st.binary(max_size=60),
    ),
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-groups")


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=st.sampled_from(sorted(_APIS)), version=st.integers(0, 4), body=_bodies)
def test_group_requests_answer_or_refuse(data: Path, key: int, version: int, body: bytes) -> None:
    handler = _APIS[key]
    version = min(max(version, handler.min_version), handler.max_version)
    server = KafkaServer(data, "127.0.0.1", 0, dispatcher=Dispatcher(groups.APIS))
    frame = struct.pack(">hhih", key, version, 42, 1) + b"c" + body

    async def one() -> bytes | None:
        ctx = server.new_context("('127.0.0.1', 1)")
        try:
            return await asyncio.wait_for(server.handle_frame(ctx, frame), 30)
        finally:
            groups.close_groups(ctx.shared)

    try:
        answer = asyncio.run(one())
    except KafkaDecodeError:
        return
    assert answer is not None
    reader = Reader(answer)
    assert reader.int32() == len(answer) - 4
    assert reader.int32() == 42
