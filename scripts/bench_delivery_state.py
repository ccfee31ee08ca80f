"""The ConsumerBroker's delivery state on its common path, with no processes or I/O: read
keyless records in batches, dispatch them to consumers, ACK each dispatched run as one
frame. What it costs per message, for comparing two versions of ``broker/delivery.py``.

    uv run python scripts/bench_delivery_state.py --messages 200000
    valgrind --tool=callgrind uv run python scripts/bench_delivery_state.py --messages 0

Run it under callgrind with ``--messages 0`` and with ``--messages N`` and divide the
difference of the instruction counts by N: a count that does not move with the machine's
load (CPU seconds on this VM move 2x between runs).
"""

from __future__ import annotations

import argparse
import time

from spoolmq.broker.delivery import Group, GroupSettings, delivery_tag

_LINE = b'{"offset":0,"timestamp":1,"key":null,"value":1,"headers":[],"crc":1}\n'


def run(messages: int, batch: int, consumers: int, prefetch: int) -> float:
    """CPU seconds per message of reading, dispatching and ACKing ``messages``."""
    group = Group("g", GroupSettings())
    state = group.add_partition("t", 0, 0)
    for number in range(consumers):
        group.add_consumer(f"c{number}", prefetch=prefetch, topics=["t"])
    started = time.process_time()
    done = now = 0
    while done < messages:
        group.add_batch(state, [_LINE] * batch, None, None, now)
        while sent := group.dispatch(now):
            for consumer, dispatched in sent.items():
                for partition, first, count, attempt in dispatched.runs:
                    tag = delivery_tag(partition.slot, first, attempt)
                    group.ack_runs([(tag, count)], consumer, now)
                    done += count
            group.events.clear()
        now += 1
    return (time.process_time() - started) / max(messages, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=500, help="records per read batch")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=1000)
    args = parser.parse_args()
    seconds = run(args.messages, args.batch, args.consumers, args.prefetch)
    print(f"{args.messages} messages: {seconds * 1e6:.3f} µs of CPU per message")


if __name__ == "__main__":
    main()
