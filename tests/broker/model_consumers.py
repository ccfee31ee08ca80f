"""The consumers of the delivery-state model tests: what each holds (tag -> offset), and
their answers (ACK, NACK, release) and lease expiries applied to a group."""

from __future__ import annotations

from spoolmq.broker.delivery import Group
from spoolmq.errors import LeaseExpiredError


class ModelConsumers:
    def __init__(self, group: Group, names: tuple[str, ...]) -> None:
        self.group = group
        self.held: dict[str, dict[int, int]] = {name: {} for name in names}

    def holding(self, offset: int) -> bool:
        return any(offset in tags.values() for tags in self.held.values())

    def settle(
        self, kind: str, pick: int, now: int, *, delay_ms: int = 0
    ) -> tuple[int, bool] | None:
        """The ``pick``-th delivery held (if any) is ACKed, NACKed (``delay_ms``) or
        released; returns its offset and whether an ACK finished it."""
        owners = [(c, t) for c in self.held for t in self.held[c]]
        if not owners:
            return None
        consumer, tag = owners[pick % len(owners)]
        offset = self.held[consumer].pop(tag)
        try:
            if kind == "ack":
                # Refused: its lease expired (it is due again).
                return offset, not self.group.ack_runs([(tag, 1)], consumer, now)
            elif kind == "nack":
                self.group.nack(tag, consumer, now, delay_ms=delay_ms, reason="model")
            else:
                self.group.release(tag, consumer, now)
        except LeaseExpiredError:
            pass  # its lease ran out: it is due again, not finished
        return offset, False

    def run_timers(self, now: int) -> None:
        """Fire due timers; forget the deliveries whose lease expired."""
        seen = len(self.group.events)
        self.group.run_timers(now)
        for event in self.group.events[seen:]:
            if event.type == "lease_expired":
                for tags in self.held.values():
                    for tag in [t for t, o in tags.items() if o == event.offset]:
                        del tags[tag]

    def ack_all(self, now: int) -> list[int]:
        """ACK everything held (each must be accepted); the offsets finished."""
        done = []
        for consumer, tags in self.held.items():
            for tag, offset in list(tags.items()):
                assert self.group.ack_runs([(tag, 1)], consumer, now) == []
                done.append(offset)
                del tags[tag]
        return done
