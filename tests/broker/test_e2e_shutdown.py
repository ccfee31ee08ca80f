"""Stopping a broker the way a user does (SIGTERM, Ctrl-C) while clients work, refusing a
second broker on the same directory, and the TCP listener."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_workers import client_processes, join_all, publish_worker, read_lines, start

from spoolmq import Consumer, Publisher, Store, protocol
from spoolmq.client.connection import connect
from spoolmq.errors import AuthenticationError, BrokerUnavailableError, InvalidArgumentError
from spoolmq.testing import BrokerProcess, wait_until


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_broker_cleanly_while_publishers_send(
    data_dir: Path, tmp_path: Path, signum: int
) -> None:
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    broker.start()
    try:
        children = broker.child_pids()
        # A consumer at the protocol level, to see what the broker tells it.
        raw, _ = connect(
            str(data_dir / protocol.SOCKET_FILE), protocol.read_authkey(data_dir), "consumer"
        )
        protocol.send(raw, {"op": "subscribe", "id": 1, "group": "g", "topics": ["stop"]})
        assert protocol.receive(raw)["op"] == "subscribed"
        consumer = Consumer("stop", group="h", data=data_dir, reconnect_timeout=3.0)
        outputs = [tmp_path / f"p{w}" for w in range(2)]
        with client_processes() as processes:
            processes += [
                start(
                    publish_worker,
                    str(data_dir),
                    "stop",
                    w,
                    100_000,
                    str(out),
                    0,
                    "all",
                    3.0,  # delivery timeout: the publishers give up once the broker is gone
                    0.0,
                    8,
                    True,
                )
                for w, out in enumerate(outputs)
            ]
            wait_until(lambda: all(len(read_lines(out)) >= 50 for out in outputs), 60, "publishing")
            assert broker.stop(signum) == 0
            for name, pid in children.items():
                wait_until(lambda pid=pid: not alive(pid), 60, f"the {name} broker to exit")
            join_all(processes, 60)
        frames = []
        while raw.poll(5):
            try:
                frames.append(raw.recv_bytes())
            except EOFError:
                break
        raw.close()
        assert b'{"op":"closing"}' in frames, "the consumer was not told"
        # The Consumer client hands out what it had already received (prefetch 1: at most
        # one message), then tries to reconnect and says the broker is gone.
        with pytest.raises(BrokerUnavailableError, match="could not reconnect in 3 s"):
            for _ in range(2):
                consumer.receive(timeout=30)
        consumer.close()
    finally:
        broker.stop(signal.SIGKILL)

    acked = {}
    for out in outputs:
        lines = read_lines(out)
        ok = [line for line in lines if "error" not in line]
        assert len(ok) >= 50
        # After the first failure the publisher stopped: all failures are at the end.
        assert all("error" in line for line in lines[len(ok) :])
        for line in ok:
            acked[(line["partition"], line["offset"])] = {"w": line["w"], "i": line["i"]}
    with Store(data_dir) as store:
        assert not store.recovery_reports
        stored = {(0, r.offset): r.value for r in store.reader("stop", 0)}
    assert {k: stored.get(k) for k in acked} == acked, "an ACKed publish is not stored"
    assert "Traceback" not in (tmp_path / "broker.log").read_text()
    assert not (data_dir / protocol.SOCKET_FILE).exists()


def test_a_second_broker_on_the_same_directory_is_refused(
    broker: BrokerProcess, data_dir: Path
) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "spoolmq", "broker", "--data", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert second.returncode != 0
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spoolmq: "), second.stderr
    assert f"process {broker.pid} " in lines[0]
    # The first one still serves.
    with Publisher(data=data_dir) as publisher:
        assert publisher.publish("still", "here").offset == 0


def test_clients_connect_over_tcp_with_the_same_key(data_dir: Path, tmp_path: Path) -> None:
    with BrokerProcess(data_dir, args=["--listen", "127.0.0.1:0"]) as broker:
        address = broker.tcp_address()
        assert address is not None and address[0] == "127.0.0.1" and address[1] > 0
        key = protocol.read_authkey(data_dir)
        other = tmp_path / "elsewhere"  # a client with no access to the data directory
        with Publisher(data=other, address=address, authkey=key) as publisher:
            position = publisher.publish("tcp", {"over": "tcp"})
        # "host:port", as the CLI's --listen takes it, is the same address.
        text = f"{address[0]}:{address[1]}"
        with Consumer("tcp", group="g", data=other, address=text, authkey=key) as consumer:
            message = consumer.receive(timeout=30)
            assert message is not None and message.offset == position.offset
            assert message.value == {"over": "tcp"}
            message.ack()
        with pytest.raises(InvalidArgumentError, match="HOST:PORT"):
            Publisher(data=other, address="127.0.0.1:tcp", authkey=key)
        with pytest.raises(AuthenticationError):
            Publisher(data=other, address=address, authkey=b"x" * 32)
        assert not other.exists()


def test_the_children_do_not_outlive_a_killed_manager(broker: BrokerProcess) -> None:
    children = broker.child_pids()
    broker.kill()
    for name, pid in children.items():
        wait_until(lambda pid=pid: not alive(pid), 30, f"the {name} broker to die with its manager")


NEVER_READY = """
import sys, time
from pathlib import Path
from spoolmq.broker.consumer_broker import ConsumerBroker
from spoolmq.broker.manager import BrokerManager, BrokerSettings

class NeverReady(ConsumerBroker):
    def run(self):  # a ConsumerBroker that never says it is ready
        time.sleep(600)

if __name__ == "__main__":
    manager = BrokerManager(BrokerSettings(data_dir=Path(sys.argv[1])))
    manager._children["consumer"].child_class = NeverReady
    sys.exit(manager.run())
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_broker_whose_children_are_not_ready_yet(
    tmp_path: Path, signum: int
) -> None:
    """The start waited up to 60 s for its children whatever the user pressed, then
    failed with "did not start within 60 s"."""
    script = tmp_path / "never_ready.py"
    script.write_text(NEVER_READY)
    data = tmp_path / "queue_data"
    process = subprocess.Popen(
        [sys.executable, str(script), str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        # The pid file is written after the signal handlers are in place.
        wait_until(lambda: (data / "broker.pid").exists(), 60, "the broker to start starting")
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=45)  # well inside the start's own 60 s
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "did not start" not in stderr and "Traceback" not in stderr
    assert not (data / "broker.pid").exists()
    assert not (data / protocol.SOCKET_FILE).exists()
