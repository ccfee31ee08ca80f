"""Points 9, 11 and 12: stale runtime files after a SIGKILL, authentication, no unpickling
of client data, and file permissions."""

from __future__ import annotations

import ast
import contextlib
import os
import stat
from collections.abc import Callable
from multiprocessing.connection import Client
from pathlib import Path

import pytest
from fault_checks import pid_alive

import spoolmq
from spoolmq import Consumer, Publisher, protocol
from spoolmq.client.admin import Admin
from spoolmq.errors import AuthenticationError, BrokerUnavailableError
from spoolmq.testing import BrokerProcess, run_spoolmq, wait_until

SOURCE = Path(spoolmq.__file__).parent


def test_stale_lock_and_socket_after_sigkill(
    data_dir: Path, tmp_path: Path, long_run: bool, figure: Callable[[str], None]
) -> None:
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    clean_start = broker.start()
    starts = []
    try:
        for _ in range(10 if long_run else 3):
            pids = broker.pids()
            broker.kill()
            # PR_SET_PDEATHSIG takes the children.
            wait_until(
                lambda pids=pids: not any(pid_alive(pid) for pid in pids),
                60,
                "the children of the SIGKILLed manager to die",
            )
            for name in ("broker.lock", "broker.sock", "broker.pid"):
                assert (data_dir / name).exists(), f"{name} was not left behind"
            starts.append(broker.start())
            with Publisher(data=data_dir) as pub:
                assert pub.publish("after-kill", {"n": len(starts)}).offset == len(starts) - 1
    finally:
        broker.stop()
    figure(
        f"start after SIGKILL (stale broker.lock, broker.sock, broker.pid): max "
        f"{max(starts):.2f} s over {len(starts)} kills (clean start {clean_start:.2f} s)"
    )
    assert max(starts) < 5.0 * 4  # a correctness bound with margin for a loaded machine


def test_wrong_or_missing_key_is_refused(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path, figure: Callable[[str], None]
) -> None:
    socket_path = str(data_dir / protocol.SOCKET_FILE)
    refused = []
    with pytest.raises(AuthenticationError):
        Publisher(data=data_dir, authkey=b"w" * 32)
    refused.append("wrong key (Publisher)")
    with pytest.raises(AuthenticationError):
        Consumer("t", group="g", data=data_dir, authkey=os.urandom(32))
    refused.append("random key (Consumer)")
    with pytest.raises(AuthenticationError):
        Admin(data_dir, authkey=b"")
    refused.append("empty key (Admin)")
    # No key at all: the client skips the challenge and says hello; it is never welcomed.
    raw = Client(socket_path, family="AF_UNIX")
    protocol.send(
        raw,
        {
            "op": "hello",
            "version": protocol.PROTOCOL_VERSION,
            "role": "publisher",
            "pid": os.getpid(),
        },
    )
    answers = []
    with contextlib.suppress(EOFError, OSError):
        while raw.poll(30):
            answers.append(raw.recv_bytes(1024))
    raw.close()
    assert answers and answers[0].startswith(b"#CHALLENGE#")
    assert not any(b"welcome" in answer for answer in answers)
    refused.append("no key (raw client, closed without a welcome)")
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    with pytest.raises(BrokerUnavailableError, match=r"\.authkey"):
        Publisher(data=other)
    refused.append("no .authkey file")
    with Publisher(data=data_dir) as pub:  # the right key still works
        assert pub.publish("auth", 1).offset == 0
    assert broker.stats()["clients"]["publisher"] == 0
    figure(f"refused: {len(refused)} of {len(refused)} ({', '.join(refused)})")


UNPICKLING_CALLS = {"loads", "load", "Unpickler"}
UNPICKLING_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve"}


def unsafe_reads(tree: ast.AST) -> list[str]:
    """Calls that unpickle: ``x.recv()`` (Connection.recv unpickles what it reads; a
    socket's recv takes a size), ``pickle.loads``/``load``/``Unpickler`` and friends,
    ``ForkingPickler.loads``, and imports of pickling modules."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if attr == "recv" and not node.args and not node.keywords:
                found.append(f"line {node.lineno}: .recv()")
            if attr in UNPICKLING_CALLS and (
                owner_name in UNPICKLING_MODULES or "Pickler" in owner_name
            ):
                found.append(f"line {node.lineno}: {owner_name}.{attr}")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for name in [module, *names]:
                if name and name.split(".")[0] in UNPICKLING_MODULES:
                    found.append(f"line {node.lineno}: import {name}")
            if module == "multiprocessing.reduction" and "ForkingPickler" in names:
                found.append(f"line {node.lineno}: import ForkingPickler")
    return found


def test_the_scan_finds_what_it_looks_for() -> None:
    planted = (
        "import pickle\nfrom multiprocessing.reduction import ForkingPickler\n"
        "def f(conn, sock):\n    conn.recv()\n    sock.recv(4096)\n    pickle.loads(b'')\n"
        "    ForkingPickler.loads(b'')\n"
    )
    assert len(unsafe_reads(ast.parse(planted))) == 5


def test_no_connection_is_unpickled(figure: Callable[[str], None]) -> None:
    files = sorted(SOURCE.rglob("*.py"))
    found = {
        str(path.relative_to(SOURCE)): hits
        for path in files
        if (hits := unsafe_reads(ast.parse(path.read_text(), str(path))))
    }
    figure(
        f"unpickling reads in src/spoolmq: {sum(map(len, found.values()))} in {len(files)} files"
    )
    assert found == {}


def modes(root: Path) -> dict[str, tuple[str, int]]:
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            mode = path.lstat().st_mode
            kind = "dir" if stat.S_ISDIR(mode) else "socket" if stat.S_ISSOCK(mode) else "file"
            found[str(path.relative_to(root))] = (kind, stat.S_IMODE(mode))
    return found


def test_runtime_files_are_private(
    data_dir: Path, tmp_path: Path, figure: Callable[[str], None]
) -> None:
    old_umask = os.umask(0)  # the broker inherits it: its modes must not depend on it
    try:
        broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
        broker.start()
    finally:
        os.umask(old_umask)
    try:
        with Publisher(data=data_dir) as pub:
            for i in range(50):
                pub.publish_async("perm", {"i": i}, key=str(i % 3))
            pub.publish("perm", {"poison": True})
        with Consumer("perm", group="g", data=data_dir, max_deliveries=1, prefetch=10) as c:
            for _ in range(51):
                message = c.receive(timeout=60)
                assert message is not None
                if message.value.get("poison"):
                    message.nack(reason="bad")
                else:
                    message.ack()
        # The ConsumerBroker writes its events and checkpoints state.db within a second or
        # so: wait for the files, so that their modes are seen while it runs.
        wait_until(
            lambda: (
                (data_dir / "state.db-wal").exists() and any((data_dir / "events").rglob("*.jsonl"))
            ),
            60,
            "the events and the checkpoint",
        )
        found = modes(data_dir)  # while the broker runs: socket, -wal and -shm exist
    finally:
        broker.stop()
    found.update(modes(data_dir))
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    for expected in ("broker.sock", "state.db-wal", ".authkey", "broker.lock", "events"):
        assert expected in found, sorted(found)
    assert any(name.startswith("logs/perm.dlq") for name in found)
    wrong = {
        name: oct(mode)
        for name, (kind, mode) in found.items()
        if mode != (0o700 if kind == "dir" else 0o600)
    }
    figure(
        f"{len(found)} paths under the data directory (umask 0): {len(wrong)} not 0700/0600; "
        f"{sum(k == 'dir' for k, _ in found.values())} dirs, "
        f"{sum(k == 'socket' for k, _ in found.values())} socket"
    )
    assert wrong == {}


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701])
def test_a_data_directory_others_can_read_is_made_private(tmp_path: Path, mode: int) -> None:
    """As git checks the repository's queue_data/ out (0755 under the usual umask)."""
    data_dir = tmp_path / "checked-out"
    data_dir.mkdir()
    os.chmod(data_dir, mode)
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log", log_level="info")
    broker.start()
    try:
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    finally:
        broker.stop()
    assert "made " + str(data_dir) + " private" in (tmp_path / "broker.log").read_text()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_data_directory_others_can_write_is_refused(
    tmp_path: Path, mode: int, figure: Callable[[str], None]
) -> None:
    data_dir = tmp_path / "shared"
    data_dir.mkdir()
    os.chmod(data_dir, mode)
    result = run_spoolmq("broker", "--data", str(data_dir), timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines and "can be written by other users" in lines[-1]
    assert f"chmod 700 {data_dir}" in lines[-1]
    assert sorted(os.listdir(data_dir)) == []  # refused before anything was created
    figure(f"mode {oct(mode)}: exit {result.returncode}, {lines[-1]!r}")
