"""``spoolmq users add/list/remove`` as a user runs it: a subprocess, the password on stdin."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from spoolmq.kafka.scram import load_users, users_path


def users(data: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolmq", "users", *args, "--data", str(data)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_add_list_replace_remove(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    added = users(data, "add", "alice", stdin="correct horse\n")
    assert added.returncode == 0, added.stderr
    assert stat.S_IMODE(users_path(data).stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert b"correct horse" not in users_path(data).read_bytes()
    first = load_users(data)["alice"]

    again = users(data, "add", "alice", stdin="other\n")
    assert again.returncode != 0 and "exists" in again.stderr
    assert load_users(data)["alice"] == first, "a refused add changes nothing"
    replaced = users(data, "add", "alice", "--replace", stdin="other\n")
    assert replaced.returncode == 0, replaced.stderr
    assert load_users(data)["alice"].stored_key != first.stored_key

    assert users(data, "add", "bob", stdin="pw\n").returncode == 0
    listed = users(data, "list", "--json")
    assert [u["user"] for u in json.loads(listed.stdout)] == ["alice", "bob"]

    assert users(data, "remove", "alice").returncode == 0
    assert set(load_users(data)) == {"bob"}
    missing = users(data, "remove", "alice")
    assert missing.returncode != 0 and "no user" in missing.stderr


def test_refusals_are_one_line_errors(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    for args, stdin in [
        (("add", "alice"), ""),  # empty password
        (("add", "../etc"), "pw\n"),  # not a user name
        (("add",), "pw\n"),  # no name
        (("add", "alice"), "tab\there\n"),  # a control character: SASLprep prohibits it
        (("add", "alice"), "caf\u0065\u0301\n"),  # SASLprep composes it: clients differ
    ]:
        done = users(data, *args, stdin=stdin)
        assert done.returncode != 0, args
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr
    assert not users_path(data).exists()


def test_concurrent_adds_lose_nothing(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    names = [f"user{i}" for i in range(6)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "spoolmq", "users", "add", name, "--data", str(data)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    for proc in procs:
        _, err = proc.communicate("pw\n", timeout=120)
        assert proc.returncode == 0, err
    assert sorted(load_users(data)) == names


def test_a_data_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    """As every command that opens a store: someone who can write the directory could
    plant a user of their own for the Kafka listener."""
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o777)
    for args in (["add", "alice"], ["list"], ["remove", "alice"]):
        result = users(data, *args, stdin="s3cret-pass\ns3cret-pass\n")
        assert result.returncode == 2, result
        assert "can be written by other users" in result.stderr, result.stderr
    assert list(data.iterdir()) == []
