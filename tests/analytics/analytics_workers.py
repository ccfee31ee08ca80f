"""Consumer processes of the end-to-end analytics test (importable under ``spawn``)."""

from __future__ import annotations

from pathlib import Path

from spoolmq import Consumer

POISON_EVERY = 40  # always NACKed by billing: dead-lettered after 3 attempts
FLAKY_EVERY = 7  # NACKed by billing on the first attempt only
HOLD_DELAY_S = 1.5  # billing keeps the "hold" key busy this long: its next message expires


def billing_fails(value: dict[str, int], attempt: int) -> float | None:
    """The NACK delay billing answers with (None: a retry backoff), or -1.0 to ACK."""
    n = value["n"]
    if value.get("hold") and attempt == 1:
        return HOLD_DELAY_S
    if n > 0 and n % POISON_EVERY == 0:
        return None
    if n > 0 and n % FLAKY_EVERY == 0 and attempt == 1:
        return None
    return -1.0


def consume(data: str, group: str, name: str, ready_file: str, idle_s: float) -> None:
    """Consume until ``idle_s`` pass with nothing to do; billing fails some messages."""
    with Consumer(
        "orders",
        group,
        data=data,
        prefetch=10,
        max_deliveries=3,
        retry_backoff=0.1,
        retry_backoff_max=0.2,
        name=name,
    ) as consumer:
        Path(ready_file).touch()
        while (message := consumer.receive(timeout=idle_s)) is not None:
            delay = billing_fails(message.value, message.attempt) if group == "billing" else -1.0
            if delay is not None and delay < 0:
                message.ack()
            else:
                message.nack(delay=delay, reason="billing refused it")
