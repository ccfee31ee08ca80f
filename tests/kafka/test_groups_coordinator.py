"""The group coordinator's state machine, without sockets: membership, generations,
rebalances on join/leave/expiry, and timeouts driven by a manual timer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from groups_helpers import ManualTimers
from hypothesis import given, settings
from hypothesis import strategies as st

from spoolmq.kafka.api import ErrorCode
from spoolmq.kafka.coordinator import Coordinator, Group, GroupState, JoinResult

SESSION_MS = 10_000
REBALANCE_MS = 30_000


def run(scenario: Callable[[Coordinator, ManualTimers], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        timers = ManualTimers()
        return await scenario(Coordinator(timers), timers)

    return asyncio.run(main())


def join(
    c: Coordinator,
    member_id: str = "",
    protocols: tuple[str, ...] = ("range",),
    group: str = "g",
    session_ms: int = SESSION_MS,
    protocol_type: str = "consumer",
) -> asyncio.Future[JoinResult]:
    return c.join(
        group,
        member_id,
        client_id="client",
        client_host="/127.0.0.1",
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=REBALANCE_MS,
        protocol_type=protocol_type,
        protocols=[(p, f"meta-{p}".encode()) for p in protocols],
    )


async def stable_pair(c: Coordinator) -> tuple[str, str]:
    """Two members, A the leader, in a Stable generation 2."""
    a = (await join(c)).member_id
    assert c.sync("g", 1, a, [(a, b"A1")]).result() == (ErrorCode.NONE, b"A1")
    b_join = join(c)
    assert c.heartbeat("g", 1, a) is ErrorCode.REBALANCE_IN_PROGRESS
    a_join = join(c, a)
    ra, rb = await a_join, await b_join
    b = rb.member_id
    assert ra.generation == rb.generation == 2
    c.sync("g", 2, a, [(a, b"A2"), (b, b"B2")])
    return a, b


def test_single_member_joins_leads_and_gets_its_assignment() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        result = await join(c)
        assert result.error is ErrorCode.NONE
        assert result.generation == 1
        assert result.leader_id == result.member_id
        assert result.protocol == "range"
        assert result.members == ((result.member_id, b"meta-range"),)
        group = c.group("g")
        assert group is not None and group.state is GroupState.COMPLETING_REBALANCE
        synced = c.sync("g", 1, result.member_id, [(result.member_id, b"assignment")])
        assert await synced == (ErrorCode.NONE, b"assignment")
        assert group.state is GroupState.STABLE
        assert c.heartbeat("g", 1, result.member_id) is ErrorCode.NONE

    run(scenario)


def test_second_member_triggers_a_rebalance_and_the_follower_waits_for_the_leader() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a = (await join(c)).member_id
        await c.sync("g", 1, a, [(a, b"all")])
        b_join = join(c)
        await asyncio.sleep(0)
        assert not b_join.done(), "the join waits until the known member rejoins"
        assert c.heartbeat("g", 1, a) is ErrorCode.REBALANCE_IN_PROGRESS
        a_join = join(c, a)
        ra, rb = await a_join, await b_join
        assert ra.generation == rb.generation == 2
        assert ra.leader_id == rb.leader_id == a
        assert {m for m, _ in ra.members} == {a, rb.member_id}
        assert rb.members == (), "only the leader gets the member list"
        b_sync = c.sync("g", 2, rb.member_id, [])
        await asyncio.sleep(0)
        assert not b_sync.done(), "a follower's SyncGroup waits for the leader's assignment"
        a_sync = c.sync("g", 2, a, [(a, b"p0"), (rb.member_id, b"p1")])
        assert await a_sync == (ErrorCode.NONE, b"p0")
        assert await b_sync == (ErrorCode.NONE, b"p1")

    run(scenario)


def test_leave_rebalances_the_survivor_into_a_new_generation() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a, b = await stable_pair(c)
        assert c.leave("g", a) is ErrorCode.NONE
        assert c.heartbeat("g", 2, b) is ErrorCode.REBALANCE_IN_PROGRESS
        rb = await join(c, b)
        assert rb.generation == 3
        assert rb.leader_id == b, "leadership passes to a remaining member"
        assert c.leave("g", a) is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_member_missing_its_session_timeout_is_removed() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a, b = await stable_pair(c)
        for _ in range(5):  # A heartbeats, B goes silent
            timers.advance(SESSION_MS / 1000 / 3)
            assert c.heartbeat("g", 2, a) in (ErrorCode.NONE, ErrorCode.REBALANCE_IN_PROGRESS)
        group = c.group("g")
        assert group is not None
        assert set(group.members) == {a}
        assert group.state is GroupState.PREPARING_REBALANCE
        assert c.heartbeat("g", 2, b) is ErrorCode.UNKNOWN_MEMBER_ID
        ra = await join(c, a)
        assert ra.generation == 3 and ra.members == ((a, b"meta-range"),)

    run(scenario)


def test_heartbeats_keep_a_member_in_past_its_session_timeout() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a = (await join(c)).member_id
        await c.sync("g", 1, a, [(a, b"x")])
        for _ in range(10):
            timers.advance(SESSION_MS / 1000 / 2)
            assert c.heartbeat("g", 1, a) is ErrorCode.NONE
        timers.advance(SESSION_MS / 1000 + 0.001)
        assert c.heartbeat("g", 1, a) is ErrorCode.UNKNOWN_MEMBER_ID
        assert c.group("g") is None, "an empty group is forgotten (its offsets are in state.db)"
        assert timers.pending() == 0, "no timer is left behind"

    run(scenario)


def test_member_that_does_not_rejoin_within_the_rebalance_timeout_is_dropped() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a, b = await stable_pair(c)
        c_join = join(c)  # a third member; A rejoins, B never does
        a_join = join(c, a)
        await asyncio.sleep(0)
        assert not a_join.done()
        timers.advance(REBALANCE_MS / 1000)
        ra, rc = await a_join, await c_join
        assert ra.generation == rc.generation == 3
        assert {m for m, _ in ra.members} == {a, rc.member_id}
        assert c.heartbeat("g", 3, b) is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_rejoin_during_completing_rebalance_sends_waiting_syncs_back() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a, b = await stable_pair(c)
        c.leave("g", b)
        ra = await join(c, a)
        assert ra.generation == 3
        # A newcomer arrives before A's SyncGroup of generation 3.
        a_sync = c.sync("g", 3, a, [])  # A is the leader: assigning now makes it Stable
        assert await a_sync == (ErrorCode.NONE, b"")
        new = join(c)
        follower_sync = c.sync("g", 3, a, [(a, b"late")])
        assert await follower_sync == (ErrorCode.REBALANCE_IN_PROGRESS, b"")
        join(c, a)
        assert (await new).generation == 4

    run(scenario)


def test_protocol_is_the_common_one_the_members_prefer() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a = (await join(c, protocols=("range", "roundrobin"))).member_id
        b_join = join(c, protocols=("roundrobin",))
        a_join = join(c, a, protocols=("range", "roundrobin"))
        ra, rb = await a_join, await b_join
        assert ra.protocol == rb.protocol == "roundrobin"
        assert dict(ra.members)[a] == b"meta-roundrobin"

    run(scenario)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"session_ms": 1_000}, ErrorCode.INVALID_SESSION_TIMEOUT),
        ({"session_ms": 10_000_000}, ErrorCode.INVALID_SESSION_TIMEOUT),
        ({"group": ""}, ErrorCode.INVALID_GROUP_ID),
        ({"member_id": "nobody"}, ErrorCode.UNKNOWN_MEMBER_ID),
        ({"protocols": ()}, ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
    ],
)
def test_join_refusals(kwargs: dict[str, Any], error: ErrorCode) -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        result = await join(c, **kwargs)
        assert result.error is error
        assert c.group("g") is None, "a refused join leaves nothing behind"

    run(scenario)


def test_join_with_no_common_protocol_or_another_type_is_refused() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        await join(c, protocols=("range",))
        other = await join(c, protocols=("sticky",))
        assert other.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        connect = await join(c, protocol_type="connect")
        assert connect.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL

    run(scenario)


def test_sync_and_heartbeat_check_generation_and_member() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        a = (await join(c)).member_id
        assert await c.sync("g", 7, a, []) == (ErrorCode.ILLEGAL_GENERATION, b"")
        assert await c.sync("g", 1, "who", []) == (ErrorCode.UNKNOWN_MEMBER_ID, b"")
        assert await c.sync("nog", 1, a, []) == (ErrorCode.UNKNOWN_MEMBER_ID, b"")
        await c.sync("g", 1, a, [(a, b"x")])
        assert c.heartbeat("g", 0, a) is ErrorCode.ILLEGAL_GENERATION
        assert c.heartbeat("g", 1, "who") is ErrorCode.UNKNOWN_MEMBER_ID
        # Stable: a late SyncGroup of the current generation gets the stored assignment.
        assert await c.sync("g", 1, a, []) == (ErrorCode.NONE, b"x")

    run(scenario)


def test_commit_rules() -> None:
    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        assert c.check_commit("solo", -1, "") is ErrorCode.NONE, "assign() users commit freely"
        assert c.check_commit("solo", 3, "m") is ErrorCode.UNKNOWN_MEMBER_ID
        a = (await join(c)).member_id
        assert c.check_commit("g", 1, a) is ErrorCode.REBALANCE_IN_PROGRESS
        await c.sync("g", 1, a, [])
        assert c.check_commit("g", 1, a) is ErrorCode.NONE
        assert c.check_commit("g", 0, a) is ErrorCode.ILLEGAL_GENERATION
        assert c.check_commit("g", 1, "x") is ErrorCode.UNKNOWN_MEMBER_ID
        assert c.check_commit("g", -1, "") is ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_on_change_reports_stable_and_empty_groups() -> None:
    seen: list[tuple[str, GroupState, int]] = []

    async def main() -> None:
        timers = ManualTimers()

        def record(group: Group) -> None:
            seen.append((group.group_id, group.state, len(group.members)))

        c = Coordinator(timers, on_change=record)
        a = (await join(c)).member_id
        await c.sync("g", 1, a, [])
        c.leave("g", a)

    asyncio.run(main())
    assert seen[0] == ("g", GroupState.STABLE, 1)
    assert ("g", GroupState.EMPTY, 0) in seen


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["join", "sync", "beat", "leave", "tick"]), st.integers(0, 3)),
        max_size=40,
    )
)
def test_random_operations_keep_the_group_consistent(ops: list[tuple[str, int]]) -> None:
    """Whatever order members join, sync, heartbeat, leave and time passes in, the group
    stays consistent: a leader who is a member, a state that matches the members, no timer
    left for a member that is gone."""

    async def scenario(c: Coordinator, timers: ManualTimers) -> None:
        ids: list[str] = []
        pending: list[asyncio.Future[Any]] = []
        for op, n in ops:
            group = c.group("g")
            member = ids[n % len(ids)] if ids else ""
            generation = group.generation if group else 0
            if op == "join":
                fut = join(c, member if n % 2 and member else "")
                pending.append(fut)
            elif op == "sync" and member:
                pending.append(c.sync("g", generation, member, [(member, b"a")]))
            elif op == "beat" and member:
                c.heartbeat("g", generation, member)
            elif op == "leave" and member:
                c.leave("g", member)
            elif op == "tick":
                timers.advance(n * 5.0)
            await asyncio.sleep(0)
            for fut in [f for f in pending if f.done()]:
                pending.remove(fut)
                result = fut.result()
                if isinstance(result, JoinResult) and result.error is ErrorCode.NONE:
                    ids.append(result.member_id)
            group = c.group("g")
            if group is None:
                continue
            if group.members:
                assert group.leader_id in group.members
                assert group.state is not GroupState.EMPTY
            else:
                assert group.state in (GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
            for m in group.members.values():
                assert (m.join_waiter is None) or (m.session_timer is None)
        c.close()
        for fut in pending:
            assert fut.done()

    run(scenario)
