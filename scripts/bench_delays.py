"""How delayed messages scale (issue 13, point 12): memory, restart time, lateness.

    uv run python scripts/bench_delays.py --messages 200000 --spread 120
    uv run python scripts/bench_delays.py --messages 1000000 --spread 3600   # the issue's case

A real broker in a temporary directory; one consumer (auto-ACK, prefetch 1000) subscribes
first; then ``--messages`` messages are published with due times spread at random over the
next ``--spread`` seconds (published in random order, as independent producers would).
Halfway through the spread the broker is stopped (SIGTERM) and started again. Printed, as
a Markdown table for BENCHMARKS.md:

- the publish rate of the delayed messages (the first is due ``--lead`` seconds after
  publishing starts, so that none is due before it is published);
- the peak resident memory of the broker's processes, sampled every 0.5 s (the
  ConsumerBroker holds what a group has read and not finished: delayed messages today);
- where the messages are once published: rows in ``state.db``'s ``parked`` table and the
  group's committed offset (parked messages are out of the group's in-memory window);
- the restart: seconds from the start command until the broker answers, and the
  ConsumerBroker's memory right after it (what it re-read);
- lateness: when the consumer received each message minus its due time (p50, p99, max),
  and how many messages arrived more than once (the restart redelivers what was in flight).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import threading
import time
from pathlib import Path

import psutil

from spoolmq import Consumer, Publisher
from spoolmq.stats import percentile
from spoolmq.store.state import StateDB
from spoolmq.testing import BrokerProcess

TOPIC = "later"


def parked_and_committed(data: Path) -> tuple[int, int]:
    """(rows the bench group has parked, its committed offsets summed) in state.db."""
    state = StateDB(data / "state.db")
    try:
        committed = sum(state.committed_offsets("bench").values())
        return state.parked_counts().get("bench", 0), committed
    finally:
        state.close()


def broker_rss(broker: BrokerProcess) -> dict[str, int]:
    """Resident bytes of the manager and each child, by name."""
    sizes = {"manager": psutil.Process(broker.pid).memory_info().rss}
    for name, pid in broker.child_pids().items():
        sizes[name] = psutil.Process(pid).memory_info().rss
    return sizes


class Sampler(threading.Thread):
    """The peak resident memory of each broker process, every 0.5 s."""

    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.peak: dict[str, int] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            try:
                sizes = broker_rss(self.broker)
            except Exception:  # restarting: no pids for a moment
                continue
            for name, size in sizes.items():
                self.peak[name] = max(self.peak.get(name, 0), size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--spread", type=float, default=120.0, help="seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--lead",
        type=float,
        default=None,
        help="seconds from the start of publishing to the first due time (default: 5 s "
        "plus one per 20,000 messages, so that none is published after it is due)",
    )
    args = parser.parse_args()
    random.seed(args.seed)

    with tempfile.TemporaryDirectory(prefix="spoolmq-delays-") as tmp:
        data = Path(tmp) / "queue_data"
        broker = BrokerProcess(data)
        broker.start()
        received: dict[int, int] = {}  # message number -> times received
        lateness: list[int] = []
        done = threading.Event()
        subscribed = threading.Event()

        def consume() -> None:
            with Consumer(TOPIC, "bench", data=data, prefetch=1000, auto_ack=True) as consumer:
                subscribed.set()
                while not done.is_set():
                    message = consumer.receive(0.5)
                    if message is None:
                        continue
                    now = time.time_ns() // 1_000_000
                    number, due = message.value
                    lateness.append(now - due)
                    received[number] = received.get(number, 0) + 1
                    if len(received) == args.messages:
                        done.set()

        sampler = Sampler(broker)
        sampler.start()
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        # The group exists (the consumer subscribed) before anything is published.
        if not subscribed.wait(60):
            raise SystemExit("the consumer did not subscribe within 60 s")

        lead = args.lead if args.lead is not None else 5 + args.messages / 20_000
        start_ms = time.time_ns() // 1_000_000 + int(lead * 1000)
        spread_ms = int(args.spread * 1000)
        dues = [start_ms + random.randrange(spread_ms) for _ in range(args.messages)]
        began = time.perf_counter()
        with Publisher(data) as publisher:
            for number, due in enumerate(dues):
                publisher.publish_async(TOPIC, [number, due], deliver_at=due)
            publisher.flush()
        publish_s = time.perf_counter() - began
        # Once the broker has read them all (its committed offset at the log end, since
        # the delayed messages are parked, or a minute at most).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            parked, committed = parked_and_committed(data)
            if committed >= args.messages:
                break
            time.sleep(0.5)
        after_publish = broker_rss(broker)
        delivered_then = len(lateness)

        # Halfway through the spread: stop and start the broker.
        halfway = (start_ms + spread_ms / 2) / 1000
        time.sleep(max(0.0, halfway - time.time()))
        broker.stop()
        restart_s = broker.start(timeout=600)
        after_restart = broker_rss(broker)

        done.wait(args.spread + 600)
        sampler.stopping.set()
        broker.stop()

    late = sorted(lateness)
    twice = sum(1 for count in received.values() if count > 1)
    mib = 1024 * 1024
    print(
        f"\n{args.messages:,} messages due over {args.spread:g} s; {platform.node()}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n"
    )
    print("| measure | value |")
    print("|---|---|")
    print(f"| publish (deliver_at, async) | {args.messages / publish_s:,.0f} msg/s |")
    for name in ("manager", "publisher", "consumer"):
        print(f"| peak RSS {name} | {sampler.peak.get(name, 0) / mib:,.0f} MiB |")
    print(f"| ConsumerBroker RSS after publishing | {after_publish['consumer'] / mib:,.0f} MiB |")
    print(
        f"| after publishing: parked rows / committed offset / delivered | {parked:,} / "
        f"{committed:,} / {delivered_then:,} |"
    )
    print(f"| restart halfway: until ready | {restart_s:.2f} s |")
    print(
        f"| ConsumerBroker RSS right after the restart | "
        f"{after_restart['consumer'] / mib:,.0f} MiB |"
    )
    print(
        f"| received / distinct / more than once | {len(late):,} / {len(received):,} / {twice:,} |"
    )
    if late:
        print(
            f"| lateness p50 / p99 / max | {percentile(late, 0.5):,.0f} / "
            f"{percentile(late, 0.99):,.0f} / {late[-1]:,} ms |"
        )


if __name__ == "__main__":
    main()
