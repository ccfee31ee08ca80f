"""The group coordinator's state machine: members, generations, rebalances, session timeouts.

Kafka splits a consumer group's work between the broker and the clients. The *broker*
(this module) keeps the membership: who joined, with which protocols (assignors) and
metadata, which generation is current, who leads, and whether each member still
heartbeats within its session timeout. The *leader client* runs the assignor (range,
roundrobin, ...) on the member list the broker gives it and sends the result in its
SyncGroup; the broker stores those opaque bytes and hands each member its own. So the
broker never decodes an assignment, and any assignor the clients agree on works.

The states follow Kafka's ``GroupCoordinator`` (2.0):

* ``Empty``: no members (offsets may still be committed by ``assign()`` users);
* ``PreparingRebalance``: someone joined, left or expired; every member must send
  JoinGroup again, and the join answers wait until all have, or until the rebalance
  timeout drops those that did not;
* ``CompletingRebalance``: the generation is chosen, the members' SyncGroups wait for the
  leader's assignment;
* ``Stable``: everyone has an assignment; heartbeats keep the members in.

No code here sleeps or polls: timeouts are timers from an injected :class:`Timers`
(``asyncio``'s loop in the broker, a manual one in the tests), re-armed by each heartbeat,
and the waiting requests are futures resolved by state changes.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from spoolmq.kafka.api import ErrorCode

# Kafka's group.min.session.timeout.ms and group.max.session.timeout.ms defaults (2.0):
# a session shorter than the minimum would expire members between two heartbeats of a
# busy client; one longer than the maximum would keep a dead member's partitions idle.
MIN_SESSION_TIMEOUT_MS = 6_000
MAX_SESSION_TIMEOUT_MS = 300_000
# Bounds on what one request may add to the coordinator's memory: a hostile client
# cannot grow a group or a member's metadata without limit.
MAX_MEMBERS_PER_GROUP = 1_000
MAX_GROUPS = 10_000
MAX_GROUP_ID_CHARS = 255

T = TypeVar("T")


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """Where timeouts come from: ``asyncio.AbstractEventLoop`` has this method."""

    def call_later(self, delay: float, callback: Callable[[], object]) -> TimerHandle: ...


class CoordinatorError(Exception):
    """A group request refused with a Kafka error code (the handler answers it)."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode
    generation: int = -1
    protocol: str = ""
    leader_id: str = ""
    member_id: str = ""
    # (member_id, metadata) of every member: only the leader gets them, to assign.
    members: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[tuple[ErrorCode, bytes]] | None = None
    session_timer: TimerHandle | None = None

    def metadata(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        return b""


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    leader_id: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    rebalance_timer: TimerHandle | None = None


def _resolve(future: asyncio.Future[T] | None, value: T) -> None:
    # A client that disconnected cancelled its request: its future may be done already.
    if future is not None and not future.done():
        future.set_result(value)


class Coordinator:
    """Every consumer group of one Kafka child.

    ``on_change(group)`` is called after each transition that changes who is in a group
    or what it owns (Stable, Empty, a member removed), so the broker can record the
    membership in ``state.db`` for ``spoolmq groups``; it is never called on heartbeats.
    """

    def __init__(
        self,
        timers: Timers,
        *,
        on_change: Callable[[Group], None] = lambda group: None,
        min_session_timeout_ms: int = MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = MAX_SESSION_TIMEOUT_MS,
    ) -> None:
        self.groups: dict[str, Group] = {}
        self._timers = timers
        self._on_change = on_change
        self._min_session = min_session_timeout_ms
        self._max_session = max_session_timeout_ms
        self._member_ids = itertools.count(1)

    # -- lookups ------------------------------------------------------------------

    def group(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    def _member(self, group_id: str, member_id: str) -> tuple[Group, Member]:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            raise CoordinatorError(ErrorCode.UNKNOWN_MEMBER_ID)
        return group, member

    # -- JoinGroup --------------------------------------------------------------------

    def join(
        self,
        group_id: str,
        member_id: str,
        *,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
    ) -> asyncio.Future[JoinResult]:
        """Register a join; the future resolves when the rebalance completes.

        An empty ``member_id`` is a new member: the coordinator names it. Errors come
        back in the result (already resolved) so the handler has one path.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[JoinResult] = loop.create_future()
        error = self._check_join(group_id, member_id, session_timeout_ms, protocol_type, protocols)
        if error is not ErrorCode.NONE:
            done.set_result(JoinResult(error, member_id=member_id))
            return done
        group = self.groups.setdefault(group_id, Group(group_id))
        if not group.members:
            group.protocol_type = protocol_type
        if member_id == "":
            if len(group.members) >= MAX_MEMBERS_PER_GROUP:
                done.set_result(JoinResult(ErrorCode.UNKNOWN_SERVER_ERROR))
                return done
            member_id = f"{client_id or 'member'}-{next(self._member_ids)}-{uuid.uuid4().hex}"
            member = Member(
                member_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                list(protocols),
            )
            group.members[member_id] = member
        else:
            member = group.members[member_id]
            member.protocols = list(protocols)
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
        # While it waits for the join to complete, the rebalance timeout governs the
        # member, not its session (it cannot heartbeat with a join in flight).
        self._stop_session(member)
        if member.join_waiter is not None:
            _resolve(member.join_waiter, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.join_waiter = done
        if group.state is not GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return done

    def _check_join(
        self,
        group_id: str,
        member_id: str,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
    ) -> ErrorCode:
        if not group_id or len(group_id) > MAX_GROUP_ID_CHARS:
            return ErrorCode.INVALID_GROUP_ID
        if not self._min_session <= session_timeout_ms <= self._max_session:
            return ErrorCode.INVALID_SESSION_TIMEOUT
        group = self.groups.get(group_id)
        if group is None and len(self.groups) >= MAX_GROUPS:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not protocols or not protocol_type:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if member_id and (group is None or member_id not in group.members):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group is not None and group.members:
            if protocol_type != group.protocol_type:
                return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            names = {name for name, _ in protocols}
            others = [m for m in group.members.values() if m.member_id != member_id]
            if others and not names.intersection(*({n for n, _ in m.protocols} for m in others)):
                return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return ErrorCode.NONE

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            # The assignment being synced is for a generation that will not be: members
            # waiting in SyncGroup must rejoin.
            for member in group.members.values():
                _resolve(member.sync_waiter, (ErrorCode.REBALANCE_IN_PROGRESS, b""))
                member.sync_waiter = None
        group.state = GroupState.PREPARING_REBALANCE
        timeout_ms = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        self._cancel(group.rebalance_timer)
        group.rebalance_timer = self._timers.call_later(
            timeout_ms / 1000, lambda: self._rebalance_timed_out(group)
        )

    def _rebalance_timed_out(self, group: Group) -> None:
        group.rebalance_timer = None
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        # Members that did not rejoin in time lose their place (and their partitions).
        for member in [m for m in group.members.values() if m.join_waiter is None]:
            self._drop(group, member)
        self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state is GroupState.PREPARING_REBALANCE and all(
            m.join_waiter is not None for m in group.members.values()
        ):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        self._cancel(group.rebalance_timer)
        group.rebalance_timer = None
        group.generation += 1
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol = ""
            group.leader_id = ""
            self._on_change(group)
            # An empty group holds nothing the coordinator needs (its offsets are in
            # state.db): forget it, so the groups in memory are the live ones only and
            # MAX_GROUPS bounds those, not every group id ever seen.
            if self.groups.get(group.group_id) is group:
                del self.groups[group.group_id]
            return
        group.protocol = self._select_protocol(group)
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        everyone = tuple((m.member_id, m.metadata(group.protocol)) for m in group.members.values())
        for member in group.members.values():
            waiter, member.join_waiter = member.join_waiter, None
            member.assignment = b""
            _resolve(
                waiter,
                JoinResult(
                    ErrorCode.NONE,
                    group.generation,
                    group.protocol,
                    group.leader_id,
                    member.member_id,
                    everyone if member.member_id == group.leader_id else (),
                ),
            )
            self._start_session(group, member)

    @staticmethod
    def _select_protocol(group: Group) -> str:
        """The protocol every member supports that ranks best in the members' own
        preference orders (each member votes for its most preferred common one)."""
        members = list(group.members.values())
        common = set.intersection(*({n for n, _ in m.protocols} for m in members))
        votes: dict[str, int] = {}
        for m in members:
            choice = next(n for n, _ in m.protocols if n in common)
            votes[choice] = votes.get(choice, 0) + 1
        # Ties go to the leader-to-be's order, so the choice never depends on dict luck.
        first = members[0]
        order = {n: i for i, (n, _) in enumerate(first.protocols)}
        return max(votes, key=lambda n: (votes[n], -order.get(n, 0)))

    # -- SyncGroup --------------------------------------------------------------------

    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: Sequence[tuple[str, bytes]],
    ) -> asyncio.Future[tuple[ErrorCode, bytes]]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[ErrorCode, bytes]] = loop.create_future()
        try:
            group, member = self._member(group_id, member_id)
        except CoordinatorError as exc:
            done.set_result((exc.code, b""))
            return done
        if generation != group.generation:
            done.set_result((ErrorCode.ILLEGAL_GENERATION, b""))
        elif group.state is GroupState.PREPARING_REBALANCE:
            done.set_result((ErrorCode.REBALANCE_IN_PROGRESS, b""))
        elif group.state is GroupState.STABLE:
            done.set_result((ErrorCode.NONE, member.assignment))
        else:  # COMPLETING_REBALANCE
            member.sync_waiter = done
            self._restart_session(group, member)
            if member_id == group.leader_id:
                given = dict(assignments)
                for m in group.members.values():
                    m.assignment = given.get(m.member_id, b"")
                group.state = GroupState.STABLE
                for m in group.members.values():
                    _resolve(m.sync_waiter, (ErrorCode.NONE, m.assignment))
                    m.sync_waiter = None
                self._on_change(group)
        return done

    # -- Heartbeat and LeaveGroup ---------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        try:
            group, member = self._member(group_id, member_id)
        except CoordinatorError as exc:
            return exc.code
        if member.join_waiter is None:
            self._restart_session(group, member)
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is not GroupState.STABLE:
            # The member learns of the rebalance here and sends JoinGroup again.
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, member_id: str) -> ErrorCode:
        try:
            group, member = self._member(group_id, member_id)
        except CoordinatorError as exc:
            return exc.code
        self._remove_and_rebalance(group, member)
        return ErrorCode.NONE

    def _session_expired(self, group: Group, member: Member) -> None:
        member.session_timer = None
        if group.members.get(member.member_id) is member:
            self._remove_and_rebalance(group, member)

    def _remove_and_rebalance(self, group: Group, member: Member) -> None:
        self._drop(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        self._on_change(group)

    def _drop(self, group: Group, member: Member) -> None:
        self._stop_session(member)
        _resolve(member.join_waiter, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID))
        _resolve(member.sync_waiter, (ErrorCode.UNKNOWN_MEMBER_ID, b""))
        del group.members[member.member_id]
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), "")

    # -- OffsetCommit's membership check --------------------------------------------------

    def check_commit(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        """May this member commit offsets now? Kafka's rules: a generation of -1 with no
        members is a standalone consumer (``assign()``), always allowed; otherwise the
        member must be in the group's current generation, outside CompletingRebalance."""
        group = self.groups.get(group_id)
        if group is None or not group.members:
            return ErrorCode.NONE if generation < 0 else ErrorCode.UNKNOWN_MEMBER_ID
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if member.join_waiter is None:
            self._restart_session(group, member)
        return ErrorCode.NONE

    # -- session timers -------------------------------------------------------------

    def _start_session(self, group: Group, member: Member) -> None:
        self._stop_session(member)
        member.session_timer = self._timers.call_later(
            member.session_timeout_ms / 1000, lambda: self._session_expired(group, member)
        )

    _restart_session = _start_session

    def _stop_session(self, member: Member) -> None:
        self._cancel(member.session_timer)
        member.session_timer = None

    @staticmethod
    def _cancel(handle: TimerHandle | None) -> None:
        if handle is not None:
            handle.cancel()

    def close(self) -> None:
        """Cancel every timer (the child is stopping); waiting requests get an error."""
        for group in self.groups.values():
            self._cancel(group.rebalance_timer)
            for member in list(group.members.values()):
                self._stop_session(member)
                _resolve(member.join_waiter, JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
                _resolve(member.sync_waiter, (ErrorCode.COORDINATOR_NOT_AVAILABLE, b""))
