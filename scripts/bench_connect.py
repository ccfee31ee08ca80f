"""How a broker's TCP listener takes a burst of clients: N processes open a ``Publisher``
over TCP at the same moment (a barrier) and publish one message each.

    uv run python scripts/bench_connect.py                 # 64 clients
    uv run python scripts/bench_connect.py --clients 200

Starts ``spoolmq broker --listen 127.0.0.1:0`` on a fresh data directory in a temporary
directory, waits until it answers, runs the burst, stops the broker by its pid. Prints
how many clients published within ``--within`` seconds, and the median and largest time
from the barrier to a stored message. A client that has not published by then is ended
(a connection the kernel dropped from a full accept queue waits for ever in the
authentication challenge).
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def client(address: tuple[str, int], key: bytes, barrier: Any, out: Any) -> None:
    from spoolmq.client import Publisher

    barrier.wait()
    started = time.monotonic()
    with Publisher(address=address, authkey=key) as publisher:
        publisher.publish("burst", {"x": 1})
    out.put(time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--within", type=float, default=60.0, help="seconds (default 60)")
    args = parser.parse_args()
    from spoolmq.testing import BrokerProcess

    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-connect-") as directory:
        data = Path(directory) / "queue_data"
        broker = BrokerProcess(data, args=["--listen", "127.0.0.1:0"])
        broker.start(timeout=90)
        try:
            address = broker.tcp_address()
            assert address is not None
            key = (data / ".authkey").read_bytes()
            barrier, out = context.Barrier(args.clients), context.Queue()
            clients = [
                context.Process(target=client, args=(address, key, barrier, out))
                for _ in range(args.clients)
            ]
            for process in clients:
                process.start()
            times: list[float] = []
            deadline = time.monotonic() + args.within
            while len(times) < args.clients and time.monotonic() < deadline:
                try:
                    times.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
                except queue.Empty:
                    break
            for process in clients:
                process.join(1)
                if process.is_alive():
                    process.kill()
                    process.join(5)
        finally:
            broker.stop()
    times.sort()
    print(f"{len(times)} of {args.clients} clients published within {args.within:g} s")
    if times:
        print(f"from the barrier: median {times[len(times) // 2]:.3f} s, max {times[-1]:.3f} s")
    sys.exit(0 if len(times) == args.clients else 1)


if __name__ == "__main__":
    main()
