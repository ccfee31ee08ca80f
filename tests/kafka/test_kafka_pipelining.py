"""The Kafka listener's pipelining, with stand-in handlers in one event loop: a pipelined
request (Produce) is started before the requests ahead of it are answered, the answers
leave in request order, any other request waits until every request before it is
answered and is answered before the next one starts, and one connection has a bounded
number of requests started ahead of its answers."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

from kafka_helpers import request_frame

from spoolmq.kafka.api import ApiHandler, ApiKey, RequestContext
from spoolmq.kafka.dispatch import Dispatcher
from spoolmq.kafka.server import MAX_PIPELINED, KafkaServer
from spoolmq.kafka.wire import Reader

PIPELINED, ALONE = ApiKey.PRODUCE, ApiKey.METADATA


class Handlers:
    """A pipelined handler that holds each request until its gate opens, and one that is
    not pipelined; both answer with the number the request carries, and log what they do."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.gates: dict[int, asyncio.Event] = {}
        self.running = 0
        self.most_running = 0

    def gate(self, n: int) -> asyncio.Event:
        return self.gates.setdefault(n, asyncio.Event())

    async def held(self, ctx: RequestContext, version: int, r: Reader) -> bytes:
        n = r.int32()
        self.log.append(("start", n))
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
        server = KafkaServer(tmp_path, "127.0.0.1", 0, dispatcher=handlers.dispatcher())
        await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            await test(reader, writer)
        finally:
            writer.close()
            await server.close()

    asyncio.run(main())


def _request(api: int, n: int) -> bytes:
    return request_frame(api, 1, n, struct.pack(">i", n))


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


def test_a_connection_starts_a_bounded_number_of_requests_ahead(tmp_path: Path) -> None:
    handlers = Handlers()
    count = MAX_PIPELINED * 3

    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"".join(_request(PIPELINED, n) for n in range(count)))
        await writer.drain()
        # One being answered, the queue's worth behind it, and one read and waiting for
        # room in the queue.
        await _until(lambda: handlers.running == MAX_PIPELINED + 2, "the queue fills up")
        for n in range(count):
            handlers.gate(n).set()
            assert await _answer(reader) == (n, n)
        assert handlers.most_running <= MAX_PIPELINED + 2

    _serve(tmp_path, handlers, test)
