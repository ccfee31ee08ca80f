"""What every Kafka API handler sees: the request context, the handler record, error codes.

The server (kafka/server.py) reads one size-prefixed frame, parses the request
header (api key, version, correlation id, client id), finds the
:class:`ApiHandler` for the key, checks the version against the handler's
range, and awaits ``handle(ctx, version, reader)``. The handler reads the body
with the bounded :class:`~spoolmq.kafka.wire.Reader` and returns the response
*body*; the server prefixes the response header (the correlation id) and the
frame size. Returning ``None`` means "send nothing" (a Produce with acks=0).

Handlers live in kafka/produce.py, kafka/fetch.py, … (the core) and in
kafka/groups.py and kafka/sasl.py (the coordinator and authentication); each
module exports ``APIS: list[ApiHandler]`` and kafka/dispatch.py joins them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spoolmq.kafka.wire import Reader


class ErrorCode(enum.IntEnum):
    """Kafka's error codes (the subset a spoolmq broker can answer)."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_FOR_PARTITION = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    TOPIC_DELETION_DISABLED = 73
    UNSUPPORTED_COMPRESSION_TYPE = 76
    INVALID_RECORD = 87


class ApiKey(enum.IntEnum):
    """The API keys of the requests this front knows (docs/KAFKA.md has the versions)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36


# Requests served before authentication on a listener that requires it: the
# client must be able to learn our versions and run the SASL exchange. Anything
# else closes the connection, as a Kafka broker does.
PRE_AUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


class HeldBytes:
    """The bytes the requests of every connection hold together, against one bound
    (Kafka's ``queued.max.request.bytes``): each frame from when its size is read (its
    room is taken before its body is read, so nothing is allocated past the bound) until
    it is answered, and what its handler made of it (:meth:`RequestContext.holds`). A
    frame is read once it fits, in the order the connections asked, or when nothing is
    held at all (one request larger than the bound is served, alone). Each connection
    keeps its own count (``RequestContext.held``) and gives it all back when it ends;
    the server bounds how long a frame's body may take to arrive, so room taken for a
    body that never comes is given back."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, nbytes: int) -> bool:
        return self.held == 0 or self.held + nbytes <= self.limit

    async def take(self, nbytes: int) -> None:
        """Wait until ``nbytes`` fit, then count them."""
        if not self._waiting and self._fits(nbytes):
            self.held += nbytes
            return
        entry = (nbytes, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry[1].done() and not entry[1].cancelled():
                self.give_back(nbytes)  # taken for it just before it was cancelled
            else:
                with contextlib.suppress(ValueError):  # _wake dropped it already
                    self._waiting.remove(entry)
                self._wake()  # the next in line may fit now
            raise

    def add(self, nbytes: int) -> None:
        """Count ``nbytes`` more at once (what a running request made of its frame)."""
        self.held += nbytes

    def give_back(self, nbytes: int) -> None:
        self.held -= nbytes
        self._wake()

    @property
    def waiting(self) -> int:
        """Frames waiting to be read for want of room."""
        return sum(1 for _, future in self._waiting if not future.done())

    def _wake(self) -> None:
        while self._waiting:
            nbytes, future = self._waiting[0]
            if future.done():  # cancelled
                self._waiting.popleft()
                continue
            if not self._fits(nbytes):
                return
            self._waiting.popleft()
            self.held += nbytes
            future.set_result(None)


@dataclass
class RequestContext:
    """Per-connection state handed to every handler of that connection.

    ``conn`` is scratch space private to the connection (the SASL exchange keeps
    its step there); ``shared`` is one dict for the whole Kafka child (the group
    coordinator keeps its groups there, the core its publisher link). ``node_id``,
    ``host`` and ``port`` are what Metadata and FindCoordinator advertise: this
    one node is every partition's leader and every group's coordinator.
    """

    data_dir: Path
    host: str
    port: int
    node_id: int = 0
    client_id: str | None = None
    peer: str = ""
    auth_required: bool = False
    authenticated: bool = False
    principal: str | None = None
    tls: bool = False
    # Set by a handler whose answer must be the last one (a failed SASL exchange).
    close_after_response: bool = False
    conn: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    # The connection's pipelined requests started and not answered yet, with the bytes
    # each holds (server.py waits for room among them before starting another).
    pipelined: dict[asyncio.Task[Any], int] = field(default_factory=dict)
    # The bytes of every connection's requests (one object for the whole child), and
    # this connection's share of them, given back when it ends.
    memory: HeldBytes | None = None
    held: int = 0

    def holds(self, nbytes: int) -> None:
        """Count ``nbytes`` more against the pipelining budget for the request running
        now, beside its frame's size, and against the child's bound on every
        connection's requests: what its handler made of it (Produce: the records its
        compressed batches inflated to). No effect on a request not pipelined."""
        task = asyncio.current_task()
        if task in self.pipelined:
            self.pipelined[task] += nbytes
            if self.memory is not None:
                self.memory.add(nbytes)
                self.held += nbytes


Handle = Callable[[RequestContext, int, Reader], Awaitable[bytes | None]]


@dataclass(frozen=True)
class ApiHandler:
    """One Kafka API: its key, the version range we advertise, and the coroutine.

    ``flexible_from`` is the first version using the flexible (tagged-field)
    encoding and request header v2, or None when no advertised version is
    flexible (the case for the whole 2.0 table we advertise).

    ``pipelined``: the connection may read and start the next request before this
    one is answered (the answers still leave in request order). The handler then keeps
    its effects in request order itself (Produce: its turn to send, produce.py); any
    other request waits until every request before it is answered, and is answered
    before the next is started.
    """

    api_key: int
    min_version: int
    max_version: int
    handle: Handle
    flexible_from: int | None = None
    name: str = ""
    pipelined: bool = False

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from
