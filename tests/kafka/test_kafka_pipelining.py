"""The Kafka listener's pipelining, with stand-in handlers in one event loop: a pipelined
request (Produce) is started before the requests ahead of it are answered, the answers
leave in request order, any other request waits until every request before it is
answered and is answered before the next one starts, one connection has a bounded
number (and size) of requests started ahead of its answers, and a connection that ends
with requests under way leaves no error uncollected."""

from __future__ import annotations

import asyncio
import gc
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import batch_around, request_frame

from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka import server as server_module
from spoolmq.kafka.api import ApiHandler, ApiKey, RequestContext
from spoolmq.kafka.dispatch import Dispatcher
from spoolmq.kafka.server import MAX_PIPELINED, MAX_PIPELINED_BYTES, KafkaServer
from spoolmq.kafka.wire import Reader

PIPELINED, ALONE = ApiKey.PRODUCE, ApiKey.METADATA


class Handlers:
    """A pipelined handler that holds each request until its gate opens, and one that is
    not pipelined; both answer with the number the request carries, and log what they do."""

    def __init__(
        self, failing: frozenset[int] = frozenset(), holding: dict[int, int] | None = None
    ) -> None:
        self.failing = failing  # these raise at once, as a request that does not parse
        self.holding = holding or {}  # what these hold beside their frames (ctx.holds)
        self.log: list[tuple[str, int]] = []
        self.gates: dict[int, asyncio.Event] = {}
        self.running = 0
        self.most_running = 0

    def gate(self, n: int) -> asyncio.Event:
        return self.gates.setdefault(n, asyncio.Event())

    async def held(self, ctx: RequestContext, version: int, r: Reader) -> bytes:
        n = r.int32()
        self.log.append(("start", n))
        if n in self.failing:
            raise KafkaDecodeError(f"request {n} does not parse")
        ctx.holds(self.holding.get(n, 0))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await self.gate(n).wait()
        self.running -= 1
        self.log.append(("end", n))
        return struct.pack(">i", n)

    async def alone(self, ctx: RequestContext, version: int, r: Reader) -> bytes:
        n = r.int32()
        self.log.append(("alone", n))
        return struct.pack(">i", n)

    def dispatcher(self) -> Dispatcher:
        return Dispatcher(
            [
                ApiHandler(PIPELINED, 0, 9, self.held, name="held", pipelined=True),
                ApiHandler(ALONE, 0, 9, self.alone, name="alone"),
            ]
        )


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (the server runs in this loop meanwhile), 30 s at most."""
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0.001)
    assert condition(), what


async def _answer(reader: asyncio.StreamReader) -> tuple[int, int]:
    """The next answer's correlation id and the number in its body."""
    (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 30))
    body = await asyncio.wait_for(reader.readexactly(size), 30)
    correlation, n = struct.unpack(">ii", body)
    return correlation, n


def _serve(
    tmp_path: Path,
    handlers: Handlers,
    test: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: uncollected.append(context["message"]))
        server = KafkaServer(tmp_path, "127.0.0.1", 0, dispatcher=handlers.dispatcher())
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            await test(reader, writer)
        finally:
            writer.close()
            await server.close()
        gc.collect()  # a task or future dropped with an error unread says so here

    uncollected: list[str] = []
    asyncio.run(main())
    assert uncollected == []


def _record_refusals(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets, each time the reading is refused room, how many requests were
    started then."""
    refused: list[int] = []
    has_room = server_module._has_room

    def recorded(started: dict[asyncio.Task[bytes | None], int], size: int) -> bool:
        room = has_room(started, size)
        if not room:
            refused.append(len(started))
        return room

    monkeypatch.setattr(server_module, "_has_room", recorded)
    return refused


def _request(api: int, n: int, padding: int = 0) -> bytes:
    return request_frame(api, 1, n, struct.pack(">i", n) + bytes(padding))


def test_pipelined_requests_start_before_the_answers_and_are_answered_in_order(
    tmp_path: Path,
) -> None:
    handlers = Handlers()
    handlers.gate(4).set()

    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kinds = [(1, PIPELINED), (2, PIPELINED), (3, ALONE), (4, PIPELINED)]
        writer.write(b"".join(_request(api, n) for n, api in kinds))
        await writer.drain()
        await _until(
            lambda: ("start", 2) in handlers.log, "the second request starts before the first ends"
        )
        assert handlers.log == [("start", 1), ("start", 2)]  # 3 waits for both answers
        handlers.gate(2).set()  # the second is done first ...
        await _until(lambda: ("end", 2) in handlers.log, "the second request ends")
        handlers.gate(1).set()
        # ... and is answered second.
        assert [await _answer(reader) for _ in kinds] == [(n, n) for n, _ in kinds]
        assert handlers.log == [
            ("start", 1),
            ("start", 2),
            ("end", 2),
            ("end", 1),
            ("alone", 3),  # after every answer before it
            ("start", 4),  # after it was answered
            ("end", 4),
        ]

    _serve(tmp_path, handlers, test)


@pytest.mark.parametrize("padding", [0, 3 * 1024 * 1024], ids=["small", "3 MiB each"])
def test_a_connection_starts_a_bounded_number_of_requests_ahead(
    tmp_path: Path, padding: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    handlers = Handlers()
    size = len(_request(PIPELINED, 0, padding)) - 4  # the frame after its size prefix
    bound = min(MAX_PIPELINED, MAX_PIPELINED_BYTES // size)
    count = bound * 2
    refused = _record_refusals(monkeypatch)

    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Written without waiting for the server to read it: it stops reading.
        writer.write(b"".join(_request(PIPELINED, n, padding) for n in range(count)))
        await _until(
            lambda: bool(refused) and handlers.running == bound, "the connection's room fills up"
        )
        assert refused[0] == bound
        for n in range(count):
            handlers.gate(n).set()
            assert await _answer(reader) == (n, n)
        assert handlers.most_running == bound

    _serve(tmp_path, handlers, test)


def test_what_a_request_holds_beside_its_frame_counts_against_the_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small Produce request whose batches inflate to the whole budget (ctx.holds): the
    next request is not started until it is answered."""
    handlers = Handlers(holding={0: MAX_PIPELINED_BYTES})
    refused = _record_refusals(monkeypatch)

    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_request(PIPELINED, 0) + _request(PIPELINED, 1))
        await writer.drain()
        await _until(lambda: bool(refused), "the second request is refused room")
        assert handlers.log == [("start", 0)]
        handlers.gate(0).set()
        assert await _answer(reader) == (0, 0)
        await _until(lambda: ("start", 1) in handlers.log, "the second starts once room is made")
        handlers.gate(1).set()
        assert await _answer(reader) == (1, 1)
        assert refused == [1]

    _serve(tmp_path, handlers, test)


@pytest.mark.parametrize("ending", ["a later request fails", "the server closes"])
def test_a_connection_that_ends_with_requests_under_way_collects_them(
    tmp_path: Path, ending: str
) -> None:
    handlers = Handlers(
        failing=frozenset({1, 2}) if ending == "a later request fails" else frozenset()
    )

    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"".join(_request(PIPELINED, n) for n in range(3)))
        await writer.drain()
        await _until(lambda: ("start", 2) in handlers.log, "all three start")
        if ending == "a later request fails":
            handlers.gate(0).set()
            assert await _answer(reader) == (0, 0)  # answered before the failure ...
            # ... which closes the connection, with the third request's error collected.
            assert await asyncio.wait_for(reader.read(), 30) == b""
        # Otherwise the server closes with all three under way (``_serve`` closes it).

    _serve(tmp_path, handlers, test)


class _Wire:
    """A PublisherBroker connection that keeps what is sent (the link's answers come from
    the test)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, frame: bytes) -> None:
        self.sent.append(frame)

    def close(self) -> None:
        pass


def _gated_link(tmp_path: Path, held: int) -> tuple[Any, _Wire, asyncio.Event, list[int]]:
    """A PublisherLink on a :class:`_Wire` (call on the loop) whose ``held``-th send (from
    1) waits until the gate returned is set; the frame ids it was asked to send."""
    from spoolmq.kafka.link import PublisherLink

    link = PublisherLink(tmp_path)
    wire = _Wire()
    link._conn, link._loop = wire, asyncio.get_running_loop()  # type: ignore[assignment]
    link._waiting[wire] = {}  # type: ignore[index]
    gate, real_send, calls = asyncio.Event(), link.send, []

    async def gated_send(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        if len(calls) == held:
            await gate.wait()
        return await real_send(*args, **kwargs)

    link.send = gated_send  # type: ignore[method-assign]
    return link, wire, gate, calls


def test_a_cancelled_request_passes_the_turn_on_only_after_the_one_before_it(
    tmp_path: Path,
) -> None:
    """Three Produce requests of one connection: A is held while it sends (its link send
    waits at a gate), B is cancelled while it waits for A, and C sends only once A has
    sent, so the store gets the requests' frames in their order."""
    from types import SimpleNamespace

    from spoolmq.kafka.produce import _Frame, _send_in_turn

    async def main() -> None:
        link, wire, gate, calls = _gated_link(tmp_path, held=1)  # A, held while it sends
        core = SimpleNamespace(link=link, count=lambda *_: None)
        ctx = SimpleNamespace(conn={})

        def answer_all() -> None:
            for frame_id in list(link._waiting[wire]):  # type: ignore[index]
                link._resolve(wire, frame_id, {"op": "ok", "r": [[0, 7, 1000]]})  # type: ignore[arg-type]

        def tags() -> list[bytes]:
            return [frame.rsplit(b'"v":"', 1)[1][:2] for frame in wire.sent]

        a, b, c = (
            asyncio.create_task(
                _send_in_turn(
                    ctx,
                    core,
                    [_Frame("t", 0, ("p", [b'{"v":"%s0"}' % tag], None, None, []))],
                    -1,
                    1000,
                )  # type: ignore[arg-type]
            )
            for tag in (b"a", b"b", b"c")
        )
        await _until(lambda: len(calls) == 1, "A starts sending")
        b.cancel()
        await _until(b.done, "B ends")
        for _ in range(20):  # C gets every chance to go ahead of A, and must not
            await asyncio.sleep(0)
        assert len(calls) == 1 and wire.sent == []
        gate.set()
        await _until(lambda: len(wire.sent) == 2, "A's frame and C's are sent")
        assert tags() == [b"a0", b"c0"]
        answer_all()
        assert [r.error for r in await a] == [0] and [r.error for r in await c] == [0]

    asyncio.run(main())


def test_a_request_cancelled_after_its_link_was_lost_leaves_no_error_unseen(
    tmp_path: Path,
) -> None:
    """A request of two partitions: the first one's frame is sent, the link is lost while
    the second one's send waits (its answer fails), then the request is cancelled (its
    connection ended). The failed answer is seen on the way out: asyncio logs no "exception
    was never retrieved" when it is collected."""
    from types import SimpleNamespace

    from spoolmq.kafka.produce import _Frame, _send_in_turn

    unseen: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: unseen.append(str(context.get("message")))
        )
        # The second partition's send is held, and never let through.
        link, wire, _, calls = _gated_link(tmp_path, held=2)
        core = SimpleNamespace(link=link, count=lambda *_: None)
        frames = [_Frame("t", p, ("p", [b'{"v":"%d"}' % p], None, None, [])) for p in (0, 1)]
        request = asyncio.create_task(
            _send_in_turn(SimpleNamespace(conn={}), core, frames, -1, 1000)  # type: ignore[arg-type]
        )
        await _until(lambda: len(calls) == 2 and len(wire.sent) == 1, "partition 0 is sent")
        link._lost(wire)  # type: ignore[arg-type]  # partition 0's answer fails
        request.cancel()
        await _until(request.done, "the request ends")
        assert request.cancelled()
        del request
        gc.collect()

    asyncio.run(main())
    assert unseen == []


def _values(count: int, pad: int = 0) -> list[bytes]:
    return [b'{"n":%d,"p":"%s"}' % (i, b"x" * pad) for i in range(count)]


@pytest.mark.parametrize(
    "case",
    [
        "records",
        "inflated bytes",
        "a damaged block ends the inflating",
        "records that do not decode end the inflating",
        "a record set that fails late has used its records",
    ],
)
def test_the_partitions_of_a_request_share_its_bounds_and_count_in_its_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Partitions of one Produce request, decoded in the handler with the link's frames
    answered here. "records": 6 + 6 records where the request may hold 10; "inflated
    bytes": two zstd batches of ~60 kB where it may inflate 100 kB; then a damaged zstd
    batch, a good one, and a plain one. Past a bound, or after a damaged block, a
    compressed partition is answered MESSAGE_TOO_LARGE without being sent; what was
    decoded counts in the connection's pipelining room (ctx.holds) while it runs."""
    from spoolmq import Store
    from spoolmq.kafka import produce, records
    from spoolmq.kafka.api import ErrorCode
    from spoolmq.kafka.core import KafkaCore
    from spoolmq.kafka.link import PublisherLink
    from spoolmq.kafka.records import COMPRESSION_ZSTD, OutRecord, encode_batch
    from spoolmq.kafka.wire import Writer

    def batch(values: list[bytes], codec: int = 0) -> bytes:
        return encode_batch(
            [OutRecord(i, 1000, None, v, []) for i, v in enumerate(values)], compression=codec
        )

    def damaged() -> bytes:
        packed = records.compress(COMPRESSION_ZSTD, b"".join(_values(50, 1000)))
        return batch_around(packed[: len(packed) // 2], 50, COMPRESSION_ZSTD)  # cut short

    def cut_short() -> bytes:
        """8 records whose last one is cut short: CORRUPT once the 8 are drawn."""
        parts: list[bytes] = []
        for i, value in enumerate(_values(8)):
            records.encode_record(parts, i, 0, None, value, [])
        return records.batch_of(
            [b"".join(parts)[:-1]],
            base=0,
            last_offset_delta=7,
            first_timestamp=1000,
            max_timestamp=1000,
            count=8,
        )

    big = _values(60, 1000)  # ~60 kB inflated
    if case == "records":
        # 6, then 6 more (past 10, refused from the header: nothing inflated, so the
        # inflating goes on), then 2 compressed that fit.
        monkeypatch.setattr(produce, "MAX_RECORDS_PER_REQUEST", 10)
        sets = [batch(_values(6)), batch(_values(6)), batch(_values(2), COMPRESSION_ZSTD)]
        codes = [ErrorCode.NONE, ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.NONE]
    elif case == "inflated bytes":
        monkeypatch.setattr(produce, "MAX_INFLATED_BYTES", 100_000)
        sets = [batch(big, COMPRESSION_ZSTD), batch(big, COMPRESSION_ZSTD)]
        codes = [ErrorCode.NONE, ErrorCode.MESSAGE_TOO_LARGE]
    elif case == "a damaged block ends the inflating":
        sets = [damaged(), batch(big, COMPRESSION_ZSTD), batch(_values(3))]
        codes = [ErrorCode.CORRUPT_MESSAGE, ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.NONE]
    elif case == "records that do not decode end the inflating":
        sets = [cut_short(), batch(big, COMPRESSION_ZSTD), batch(_values(3))]
        codes = [ErrorCode.CORRUPT_MESSAGE, ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.NONE]
    else:
        # the 8 records cut short, then 6 that no longer fit in 10, then 2 that do.
        monkeypatch.setattr(produce, "MAX_RECORDS_PER_REQUEST", 10)
        sets = [cut_short(), batch(_values(6)), batch(_values(2))]
        codes = [ErrorCode.CORRUPT_MESSAGE, ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.NONE]
    w = Writer().nullable_string(None).int16(-1).int32(30_000).int32(1).string("t")
    w.int32(len(sets))
    for partition, record_set in enumerate(sets):
        w.int32(partition).bytes_(record_set)

    async def main(store: Store) -> tuple[bytes | None, int, int]:
        link = PublisherLink(tmp_path)
        wire = _Wire()
        link._conn, link._loop = wire, asyncio.get_running_loop()  # type: ignore[assignment]
        link._waiting[wire] = {}  # type: ignore[index]
        ctx = RequestContext(data_dir=store.path, host="127.0.0.1", port=0)
        ctx.shared["core"] = KafkaCore(store=store, link=link, watcher=None)  # type: ignore[arg-type]
        task = asyncio.create_task(produce.handle_produce(ctx, 3, Reader(w.getvalue())))
        ctx.pipelined[task] = 0  # as the server counts a pipelined request (its frame: 0 here)
        await _until(lambda: len(wire.sent) == codes.count(ErrorCode.NONE), "frames are sent")
        held = ctx.pipelined[task]
        for frame_id in list(link._waiting[wire]):  # type: ignore[index]
            link._resolve(wire, frame_id, {"op": "ok", "r": [[0, 0, 1000]]})  # type: ignore[arg-type]
        return await asyncio.wait_for(task, 30), held, len(wire.sent)

    with Store(tmp_path / "data") as store:
        store.create_topic("t", partitions=len(sets))
        answer, held, sent = asyncio.run(main(store))
    assert answer is not None
    r = Reader(answer)
    assert r.int32() == 1 and r.string() == "t" and r.int32() == len(sets)
    got = []
    for _ in sets:
        partition, error = r.int32(), r.int16()
        r.int64(), r.int64()  # base offset, log append time
        got.append((partition, error))
    assert got == list(enumerate(codes))
    # The partitions answered NONE were sent; the others never were.
    assert sent == codes.count(ErrorCode.NONE)
    if case == "records":  # 6 + 2 records, and what the 2 inflated to
        assert 8 * produce.HELD_PER_RECORD < held < 8 * produce.HELD_PER_RECORD + 1000
    elif case == "a record set that fails late has used its records":
        assert held == 10 * produce.HELD_PER_RECORD  # 8 + 2
    elif case == "inflated bytes":  # its ~60 kB inflated, and its records
        assert 60_000 + 60 * produce.HELD_PER_RECORD < held < 100_000 + 60 * produce.HELD_PER_RECORD


def test_the_requests_of_every_connection_share_one_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three connections, each with a request of ~1 MB (one holding 0.5 MB more once
    started, ctx.holds), under a child-wide bound of 2 MB + 0.6 MB: the third one's body
    is not read until an answer makes room; what a connection held is given back when it
    ends; one request larger than the bound is read when nothing else is held. A peer
    that announces 100 MiB and sends nothing holds that room until its body's deadline,
    then its connection is closed and the others go on."""
    monkeypatch.setattr(server_module, "BODY_MIN_BYTES_PER_S", 1e12)  # the deadline: 1 s
    handlers = Handlers(holding={11: 500_000})
    padding = 1_000_000
    size = len(_request(PIPELINED, 0, padding)) - 4

    async def main() -> None:
        server = KafkaServer(
            tmp_path,
            "127.0.0.1",
            0,
            dispatcher=handlers.dispatcher(),
            max_held_bytes=2 * size + 600_000,
            body_timeout_s=1.0,
        )
        await server.start()
        memory = server.memory
        conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
        try:
            # Written, not drained: the server may leave them unread for a while.
            for n, (_, writer) in enumerate(conns[:2], start=10):
                writer.write(_request(PIPELINED, n, padding))
            await _until(lambda: handlers.running == 2, "two requests run")
            assert memory.held == 2 * size + 500_000  # request 11 holds 0.5 MB more
            conns[2][1].write(_request(PIPELINED, 12, padding))
            await _until(lambda: memory.waiting == 1, "the third frame waits for room")
            assert ("start", 12) not in handlers.log
            handlers.gate(10).set()
            assert await _answer(conns[0][0]) == (10, 10)
            await _until(
                lambda: ("start", 12) in handlers.log, "the third starts once room is made"
            )
            assert memory.held == 2 * size + 500_000 and memory.waiting == 0
            # A connection that ends gives back what it held (the server sees the end
            # once the request before it is through).
            conns[1][1].close()
            handlers.gate(11).set()
            await _until(lambda: memory.held == size, "connection 11's bytes come back")
            handlers.gate(12).set()
            assert await _answer(conns[2][0]) == (12, 12)
            await _until(lambda: memory.held == 0, "everything given back")
            # A size prefix of 100 MiB and nothing more: room taken (nothing else is
            # held), then the next request waits for it, until the body's deadline.
            stalled_reader, stalled = await asyncio.open_connection("127.0.0.1", server.port)
            stalled.write(struct.pack(">i", server_module.DEFAULT_MAX_REQUEST_BYTES))
            await _until(lambda: memory.held > 0, "the stalled peer takes its room")
            conns[0][1].write(_request(PIPELINED, 13, 3 * padding))  # larger than the bound
            await _until(lambda: memory.waiting == 1, "the next request waits")
            assert await asyncio.wait_for(stalled_reader.read(), 30) == b""  # closed
            await _until(lambda: ("start", 13) in handlers.log, "the large one runs alone")
            handlers.gate(13).set()
            assert await _answer(conns[0][0]) == (13, 13)
            await _until(lambda: memory.held == 0, "everything given back again")
            stalled.close()
        finally:
            for _, writer in conns:
                writer.close()
            await server.close()
        assert memory.held == 0 and memory.waiting == 0

    asyncio.run(main())


def test_a_wait_for_room_cancelled_after_it_was_dropped_is_still_a_cancel() -> None:
    """A waiting take() cancelled, then a release before it resumed: the release drops
    the cancelled entry, and the take raised ValueError from its deque instead of
    CancelledError."""
    from spoolmq.kafka.api import HeldBytes

    async def main() -> None:
        memory = HeldBytes(100)
        await memory.take(90)
        waiting = asyncio.create_task(memory.take(50))
        await asyncio.sleep(0)
        waiting.cancel()
        memory.give_back(0)
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert memory.held == 90 and memory.waiting == 0
        memory.give_back(90)
        assert memory.held == 0

    asyncio.run(main())
