"""The group coordinator APIs of the Kafka front.

FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, ListGroups and DescribeGroups, at the versions docs/KAFKA.md lists.
kafka/dispatch.py registers every handler in ``APIS`` and advertises it in the
ApiVersions answer, so an API appears on the wire as soon as it is listed here.

These handlers only parse and encode: membership lives in
:mod:`spoolmq.kafka.coordinator` (one :class:`Coordinator` per Kafka child, kept in
``ctx.shared``), committed offsets in ``state.db`` through
:mod:`spoolmq.kafka.group_store`. Every length a client sends is bounded by the
:class:`~spoolmq.kafka.wire.Reader` and by the limits below before anything is kept.
"""

from __future__ import annotations

import asyncio
from typing import Any

from spoolmq.kafka.api import ApiHandler, ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.coordinator import MAX_GROUP_ID_CHARS, Coordinator, GroupState
from spoolmq.kafka.group_store import GroupStore
from spoolmq.kafka.wire import Reader, Writer
from spoolmq.types import TopicPartition

# A member's protocols and their metadata are kept for the life of the group, so one
# JoinGroup may not make the child hold more than this (the frame limit is 100 MiB).
MAX_PROTOCOLS = 16
MAX_METADATA_BYTES = 1024 * 1024
# Kafka's offset.metadata.max.bytes; spoolmq keeps no per-commit metadata, but a client
# sending more than Kafka would accept gets Kafka's answer.
MAX_OFFSET_METADATA_BYTES = 4096
OFFSET_METADATA_TOO_LARGE = 12
_SHARED_KEY = "kafka-groups"


class _Groups:
    """The coordinator and its database handle, made once per Kafka child."""

    def __init__(self, ctx: RequestContext) -> None:
        self.store = GroupStore(ctx.data_dir)
        self.coordinator = Coordinator(asyncio.get_running_loop(), on_change=self.store.record)


def _groups(ctx: RequestContext) -> _Groups:
    groups = ctx.shared.get(_SHARED_KEY)
    if groups is None:
        groups = ctx.shared[_SHARED_KEY] = _Groups(ctx)
    assert isinstance(groups, _Groups)
    return groups


def close_groups(shared: dict[str, Any]) -> None:
    """Stop the coordinator's timers and flush its database writes (the child is stopping)."""
    groups = shared.pop(_SHARED_KEY, None)
    if isinstance(groups, _Groups):
        groups.coordinator.close()
        groups.store.close()


def _client_host(peer: str) -> str:
    # The server gives str(peername), e.g. "('127.0.0.1', 53412)"; Kafka shows "/127.0.0.1".
    host = peer.strip("()[]").split(",")[0].strip("' ")
    return f"/{host}" if host else ""


def _throttle(w: Writer, version: int, since: int) -> Writer:
    """The throttle_time_ms field, present from version ``since`` on (never throttled)."""
    return w.int32(0) if version >= since else w


# -- FindCoordinator ---------------------------------------------------------------------


async def handle_find_coordinator(ctx: RequestContext, version: int, r: Reader) -> bytes:
    r.string()  # the group id: this node coordinates every group
    key_type = r.int8() if version >= 1 else 0
    w = _throttle(Writer(), version, 1)
    # Key type 1 asks for a transaction coordinator. spoolmq has no transactions, but
    # answers with this node, which refuses the transactional InitProducerId with a fatal
    # error: COORDINATOR_NOT_AVAILABLE here had clients retry until their timeout.
    error = ErrorCode.NONE if key_type in (0, 1) else ErrorCode.COORDINATOR_NOT_AVAILABLE
    w.int16(error)
    if version >= 1:
        w.nullable_string(None if error == ErrorCode.NONE else "transactions are not supported")
    return w.int32(ctx.node_id).string(ctx.host).int32(ctx.port).getvalue()


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ---------------------------------------


def _protocol(r: Reader) -> tuple[str, bytes]:
    return r.string(), r.bytes_()


async def handle_join_group(ctx: RequestContext, version: int, r: Reader) -> bytes:
    group_id = r.string()
    session_timeout = r.int32()
    rebalance_timeout = r.int32() if version >= 1 else session_timeout
    member_id = r.string()
    protocol_type = r.string()
    protocols = r.array(_protocol, min_size=6)
    w = _throttle(Writer(), version, 2)
    if len(protocols) > MAX_PROTOCOLS or any(len(m) > MAX_METADATA_BYTES for _, m in protocols):
        error, result = ErrorCode.INVALID_REQUEST, None
    else:
        groups = _groups(ctx)
        result = await groups.coordinator.join(
            group_id,
            member_id,
            client_id=ctx.client_id or "",
            client_host=_client_host(ctx.peer),
            session_timeout_ms=session_timeout,
            rebalance_timeout_ms=max(rebalance_timeout, 0),
            protocol_type=protocol_type,
            protocols=protocols,
        )
        error = result.error
    if result is None or error != ErrorCode.NONE:
        w.int16(error).int32(-1).string("").string("").string(member_id).int32(0)
        return w.getvalue()
    w.int16(ErrorCode.NONE).int32(result.generation).string(result.protocol)
    w.string(result.leader_id).string(result.member_id)
    return w.array(list(result.members), lambda w, m: w.string(m[0]).bytes_(m[1])).getvalue()


def _assignment(r: Reader) -> tuple[str, bytes]:
    return r.string(), r.bytes_()


async def handle_sync_group(ctx: RequestContext, version: int, r: Reader) -> bytes:
    group_id = r.string()
    generation = r.int32()
    member_id = r.string()
    assignments = r.array(_assignment, min_size=6)
    error, assignment = await _groups(ctx).coordinator.sync(
        group_id, generation, member_id, assignments
    )
    return _throttle(Writer(), version, 1).int16(error).bytes_(assignment).getvalue()


async def handle_heartbeat(ctx: RequestContext, version: int, r: Reader) -> bytes:
    group_id = r.string()
    generation = r.int32()
    member_id = r.string()
    error = _groups(ctx).coordinator.heartbeat(group_id, generation, member_id)
    return _throttle(Writer(), version, 1).int16(error).getvalue()


async def handle_leave_group(ctx: RequestContext, version: int, r: Reader) -> bytes:
    group_id = r.string()
    member_id = r.string()
    error = _groups(ctx).coordinator.leave(group_id, member_id)
    return _throttle(Writer(), version, 1).int16(error).getvalue()


# -- OffsetCommit / OffsetFetch ---------------------------------------------------------


def _commit_partition(r: Reader) -> tuple[int, int, str | None]:
    return r.int32(), r.int64(), r.nullable_string()


def _commit_topic(r: Reader) -> tuple[str, list[tuple[int, int, str | None]]]:
    return r.string(), r.array(_commit_partition, min_size=14)


async def handle_offset_commit(ctx: RequestContext, version: int, r: Reader) -> bytes:
    group_id = r.string()
    generation = r.int32()
    member_id = r.string()
    r.int64()  # retention_time: committed offsets are kept until the group is reset
    topics = r.array(_commit_topic, min_size=6)
    groups = _groups(ctx)
    if not group_id or len(group_id) > MAX_GROUP_ID_CHARS:
        check = ErrorCode.INVALID_GROUP_ID
    else:
        check = groups.coordinator.check_commit(group_id, generation, member_id)
    partitions = await groups.store.run(groups.store.partitions) if check == 0 else {}
    accepted: dict[TopicPartition, int] = {}
    answers: list[tuple[str, list[tuple[int, int]]]] = []
    for topic, parts in topics:
        answer = []
        for partition, offset, metadata in parts:
            error: int = check
            if error == ErrorCode.NONE:
                if not 0 <= partition < partitions.get(topic, 0):
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif metadata is not None and len(metadata) > MAX_OFFSET_METADATA_BYTES:
                    error = OFFSET_METADATA_TOO_LARGE
                elif offset < 0:
                    error = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
                else:
                    accepted[TopicPartition(topic, partition)] = offset
            answer.append((partition, error))
        answers.append((topic, answer))
    if accepted:
        await groups.store.run(groups.store.commit, group_id, accepted)
    w = _throttle(Writer(), version, 3)
    w.array(
        answers,
        lambda w, t: w.string(t[0]).array(t[1], lambda w, p: w.int32(p[0]).int16(p[1])),
    )
    return w.getvalue()


def _fetch_topic(r: Reader) -> tuple[str, list[int]]:
    return r.string(), r.array(Reader.int32, min_size=4)


async def handle_offset_fetch(ctx: RequestContext, version: int, r: Reader) -> bytes:
    group_id = r.string()
    topics = r.nullable_array(_fetch_topic, min_size=6) if version >= 2 else r.array(_fetch_topic)
    groups = _groups(ctx)
    committed = await groups.store.run(groups.store.committed, group_id)
    if topics is None:  # v2+: every partition the group has committed
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(committed):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        topics = list(by_topic.items())
    w = _throttle(Writer(), version, 3)

    def partition(w: Writer, p: tuple[str, int]) -> None:
        # -1: nothing committed, the client falls back to its auto.offset.reset.
        offset = committed.get(TopicPartition(*p), -1)
        w.int32(p[1]).int64(offset).nullable_string("").int16(ErrorCode.NONE)

    w.array(topics, lambda w, t: w.string(t[0]).array([(t[0], p) for p in t[1]], partition))
    if version >= 2:
        w.int16(ErrorCode.NONE)
    return w.getvalue()


# -- DescribeGroups / ListGroups ---------------------------------------------------------


async def handle_describe_groups(ctx: RequestContext, version: int, r: Reader) -> bytes:
    names = r.array(Reader.string, min_size=2)
    groups = _groups(ctx)
    coordinator = groups.coordinator
    recorded = {
        row.group_name: row for row in await groups.store.run(groups.store.state.kafka_groups)
    }
    w = _throttle(Writer(), version, 1)
    w.int32(len(names))
    for name in names:
        group = coordinator.group(name)
        if group is None:
            # A group with no members is Empty if it ever existed (its offsets remain),
            # and Dead if not, as Kafka answers, without an error either way.
            row = recorded.get(name)
            state = GroupState.EMPTY if row is not None else GroupState.DEAD
            w.int16(ErrorCode.NONE).string(name).string(state.value)
            w.string(row.protocol_type if row is not None else "").string("").int32(0)
            continue
        w.int16(ErrorCode.NONE).string(name).string(group.state.value)
        w.string(group.protocol_type)
        stable = group.state is GroupState.STABLE
        w.string(group.protocol if stable else "")
        w.int32(len(group.members))
        for m in group.members.values():
            w.string(m.member_id).string(m.client_id).string(m.client_host)
            # Metadata and assignment are only meaningful once the group is Stable.
            w.bytes_(m.metadata(group.protocol) if stable else b"")
            w.bytes_(m.assignment if stable else b"")
    return w.getvalue()


async def handle_list_groups(ctx: RequestContext, version: int, r: Reader) -> bytes:
    groups = _groups(ctx)
    listed = {g.group_id: g.protocol_type for g in groups.coordinator.groups.values()}
    # Groups this child has not seen since it started, but whose membership an earlier
    # child recorded, are Empty groups to Kafka: listed, so admin tools can find them.
    for row in await groups.store.run(groups.store.state.kafka_groups):
        listed.setdefault(row.group_name, row.protocol_type)
    w = _throttle(Writer(), version, 1).int16(ErrorCode.NONE)
    return w.array(sorted(listed.items()), lambda w, g: w.string(g[0]).string(g[1])).getvalue()


APIS: list[ApiHandler] = [
    ApiHandler(ApiKey.OFFSET_COMMIT, 2, 4, handle_offset_commit, name="OffsetCommit"),
    ApiHandler(ApiKey.OFFSET_FETCH, 1, 4, handle_offset_fetch, name="OffsetFetch"),
    ApiHandler(ApiKey.FIND_COORDINATOR, 0, 2, handle_find_coordinator, name="FindCoordinator"),
    ApiHandler(ApiKey.JOIN_GROUP, 0, 3, handle_join_group, name="JoinGroup"),
    ApiHandler(ApiKey.HEARTBEAT, 0, 2, handle_heartbeat, name="Heartbeat"),
    ApiHandler(ApiKey.LEAVE_GROUP, 0, 2, handle_leave_group, name="LeaveGroup"),
    ApiHandler(ApiKey.SYNC_GROUP, 0, 2, handle_sync_group, name="SyncGroup"),
    ApiHandler(ApiKey.DESCRIBE_GROUPS, 0, 2, handle_describe_groups, name="DescribeGroups"),
    ApiHandler(ApiKey.LIST_GROUPS, 0, 2, handle_list_groups, name="ListGroups"),
]
