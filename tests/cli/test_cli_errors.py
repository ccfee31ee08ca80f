"""The CLI's error paths, run as a user runs them (``python -m spoolmq`` in a subprocess):
a mistake is one line on stderr starting with ``spoolmq:``, a non-zero exit, no traceback,
and nothing stored."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from spoolmq import Store
from spoolmq.broker.manager import broker_running
from spoolmq.testing import BrokerProcess, run_spoolmq


def run_cli(*args: str, stdin: str = "", timeout: float = 45) -> subprocess.CompletedProcess[str]:
    return run_spoolmq(*args, stdin=stdin, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("spoolmq: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


# Mistakes caught before anything runs: no broker is needed.
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["nosuch"], "invalid choice: 'nosuch'"),
        (["publish"], "required: topic"),
        (["publish", "t", "1", "--bogus"], "unrecognized arguments: --bogus"),
        (["publish", "t", "1", "--acks", "2"], "invalid choice: '2'"),
        (["publish", "t", "1", "--delay", "soon"], "'soon' is not a number of seconds"),
        (["consume", "t"], "--group"),
        (["consume", "t", "--group", "g", "--start", "middle"], "invalid choice: 'middle'"),
        (["groups", "reset", "g", "--topic", "t"], "--to-datetime"),
        (["groups", "reset", "g", "--to-earliest"], "--topic --all-topics is required"),
        (["groups", "reset", "g", "--topic", "t", "--to-earliest", "--to-latest"], "not allowed"),
        (["groups", "describe"], "required: group"),
        (["topics", "create"], "required: name"),
        (["topics", "create", "x", "--partitions", "0"], "partitions"),
        (["topics", "create", "bad/name"], "invalid topic name 'bad/name'"),
        (["topics", "create", "x", "--retention", "forever-ish"], "bad duration"),
        (["topics", "create", "x", "--retention", "9999999999999d"], "is too long"),
        (["topics", "create", "x", "--retention", "0.0001ms"], "under 1 ms: give 0"),
        (["cancel", "t", "99999999999999999999999"], "is too large"),
        (["cancel", "t", "0", "--partition", "99999999999999999999999"], "is too large"),
        (["dlq", "list", "../up"], "invalid topic name"),
        (["broker", "--listen", "nonsense"], "HOST:PORT"),
        (["broker", "--kafka-max-connections", "0"], "'0' must be 1 or more"),
        (["broker", "--kafka-max-connections", "5"], "--kafka-max-connections is a setting"),
        (["broker", "--kafka-tls", "c.pem", "k.pem"], "--kafka-tls is a setting"),
        (["broker", "--listen", "::1"], "HOST:PORT"),
        (["tasks", "list", "--limit", "0"], "'0' must be 1 or more"),
        (["publish", "t", '{"a": 1,}'], "VALUE opens as JSON but is not"),
        (["publish", "t", "[1, 2"], "VALUE opens as JSON but is not"),
        # orjson reads it as the float 1e+20: it was stored as another number.
        (["publish", "t", '{"a": 99999999999999999999}'], "99999999999999999999 is past 64 bits"),
        (["publish", "t", "-9223372036854775809"], "-9223372036854775809 is past 64 bits"),
    ],
)
def test_a_mistake_is_one_line_on_stderr(tmp_path: Path, args: list[str], fragment: str) -> None:
    result = run_cli(*args, "--data", str(tmp_path / "queue_data"))
    assert result.returncode == 2
    assert_one_line_error(result, fragment)


@pytest.mark.parametrize("option", ["--listen", "--metrics", "--kafka"])
def test_a_port_already_taken_is_one_line_and_leaves_nothing_behind(
    tmp_path: Path, option: str
) -> None:
    """Found before any child starts: the Kafka child used to be restarted in a loop for
    60 s, and --listen and --metrics ended in a traceback."""
    data = tmp_path / "queue_data"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_cli("broker", option, f"127.0.0.1:{port}", "--data", str(data))
    assert result.returncode == 2
    assert_one_line_error(
        result, f"cannot listen on 127.0.0.1:{port} ({option}): Address already in use"
    )
    assert not (data / "broker.pid").exists() and not (data / "broker.sock").exists()
    assert not broker_running(data)


def test_two_of_our_own_listeners_on_one_port_are_one_line(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free once closed
    data = str(tmp_path / "queue_data")
    address = f"127.0.0.1:{port}"
    result = run_cli("broker", "--listen", address, "--kafka", address, "--data", data)
    assert result.returncode == 2
    assert_one_line_error(result, f"cannot listen on {address} (--kafka): Address already in use")


def test_a_data_directory_that_cannot_be_one_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    assert_one_line_error(run_cli("broker", "--data", str(a_file)), "is a file, not a directory")
    assert_one_line_error(
        run_cli("broker", "--data", str(a_file / "below")),
        "cannot create the data directory",
        "Not a directory",
    )
    assert a_file.read_text() == "not a directory"


def test_analytics_mistakes_are_one_line_before_spark_starts(tmp_path: Path) -> None:
    """A bad --master or --out was a traceback, after seconds of starting Spark."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("t")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for extra, says in [
        (["--master", "bogus://x"], "is not a Spark master URL"),
        # Spark took these and failed as it started: a traceback, exit status 1.
        (["--master", "local[0]"], "--master 'local[0]' is not a Spark master URL"),
        (["--master", "local[00,2]"], "--master 'local[00,2]' is not a Spark master URL"),
        (["--out", str(a_file)], "exists and is not a directory"),
        (["--out", str(a_file / "below")], "cannot make the output directory"),
    ]:
        result = run_cli("analytics", "--data", str(data), *extra, timeout=120)
        assert result.returncode == 2
        assert_one_line_error(result, says)


def test_an_unreachable_spark_master_is_one_line_before_spark_starts(tmp_path: Path) -> None:
    """Spark tried a master that takes no connections for 60 s, then a traceback (exit
    status 1) saying "Cannot call methods on a stopped SparkContext"."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("t")
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    master = f"spark://127.0.0.1:{port}"
    result = run_cli("analytics", "--data", str(data), "--master", master, timeout=120)
    assert result.returncode == 2
    assert_one_line_error(
        result, f"cannot reach Spark master {master}: 127.0.0.1:{port}: Connection refused"
    )


def test_an_unknown_topic_is_named(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    with Store(data):
        pass
    result = run_cli("topics", "describe", "missing", "--data", str(data))
    assert result.returncode == 2
    assert_one_line_error(result, "topic 'missing' does not exist")


@pytest.mark.parametrize(
    "args",
    [
        ["topics", "list"],
        ["topics", "describe", "orders"],
        ["groups", "list"],
        ["groups", "describe", "g"],
        ["dlq", "list", "orders"],
        ["check"],
    ],
)
def test_commands_that_only_look_refuse_a_missing_data_directory(
    tmp_path: Path, args: list[str]
) -> None:
    """A mistyped --data is an error, not a new empty store."""
    typo = tmp_path / "queue_dta"
    result = run_cli(*args, "--data", str(typo))
    assert_one_line_error(result, f"no queue data directory at {typo}")
    assert not typo.exists()
    # An existing directory that is not a store is left as it was: no store made in it,
    # its mode unchanged.
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    (home / "notes.txt").write_text("mine")
    result = run_cli(*args, "--data", str(home))
    assert_one_line_error(result, f"{home} is not a queue data directory")
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]
    assert home.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize(
    "args",
    [
        ["publish", "t", "1"],
        ["consume", "t", "--group", "g", "--timeout", "1"],
        ["stats"],
    ],
)
def test_no_broker_running_is_a_clear_error(tmp_path: Path, args: list[str]) -> None:
    data = tmp_path / "queue_data"
    # A directory where a broker ran once (its key is there) but none runs now.
    with BrokerProcess(data):
        pass
    result = run_cli(*args, "--data", str(data), timeout=40)
    assert_one_line_error(result, "no broker is listening", "spoolmq broker")
    # A directory where no broker ever ran.
    result = run_cli(*args, "--data", str(tmp_path / "never"), timeout=40)
    assert_one_line_error(result, "no broker has run at")


def test_mistakes_with_a_broker_running_store_nothing(
    broker: BrokerProcess, data_dir: Path
) -> None:
    data = ["--data", str(data_dir)]
    assert run_cli("publish", "ok", '{"n": 1}', *data).returncode == 0
    assert_one_line_error(run_cli("publish", "../ok", "1", *data), "invalid topic name '../ok'")
    assert_one_line_error(run_cli("publish", "ok", "1", "--header", "novalue", *data), "NAME=VALUE")
    assert_one_line_error(run_cli("publish", "ok", "1", "--delay", "-1", *data), "delay")
    assert_one_line_error(run_cli("publish", "ok", "1", "--ttl", "0", *data), "ttl")
    # One bad line in stdin: nothing of that input is published.
    bad_stdin = run_cli("publish", "ok", *data, stdin='{"n": 2}\nnot json\n{"n": 3}\n')
    assert_one_line_error(bad_stdin, "stdin line 2 is not JSON")
    assert bad_stdin.stdout == ""
    past_64_bits = run_cli("publish", "ok", *data, stdin='{"n": 2}\n[1, 123456789012345678901]\n')
    assert_one_line_error(past_64_bits, "stdin line 2: the integer 123456789012345678901 is past")
    # What 64 bits hold is stored as it is, and so are long digits in a string.
    edges = '18446744073709551615\n-9223372036854775808\n"123456789012345678901"\n'
    assert run_cli("publish", "ok", *data, stdin=edges).returncode == 0
    too_big = run_cli("publish", "ok", *data, stdin='"' + "x" * (1100 * 1024) + '"\n')
    assert_one_line_error(too_big, "over")
    assert_one_line_error(
        run_cli("groups", "reset", "g", "--topic", "ok", "--to-datetime", "yesterday", *data),
        "a time must be ISO 8601",
        "not 'yesterday'",
    )
    assert_one_line_error(run_cli("groups", "describe", "nobody", *data), "no consumer group")
    assert_one_line_error(
        run_cli("topics", "delete", "nothere", *data), "topic 'nothere' does not exist"
    )
    with Store(data_dir) as store:
        assert store.topics().keys() == {"ok"}
        assert [r.value for r in store.reader("ok", 0)] == [
            {"n": 1}, 2**64 - 1, -(2**63), "123456789012345678901",
        ]  # fmt: skip


@pytest.mark.parametrize(
    ("hidden", "args", "what"),
    [
        ("cramjam", ["broker", "--kafka", "127.0.0.1:0"], "spoolmq broker --kafka"),
        ("confluent_kafka", ["export", "t", "--kafka", "127.0.0.1:9"], "spoolmq export"),
    ],
)
def test_a_kafka_command_without_the_kafka_extra_says_what_to_install(
    tmp_path: Path, hidden: str, args: list[str], what: str
) -> None:
    """The broker started without its codecs (lz4 and snappy batches were refused one by
    one, with nothing in its log), and export ended in a ModuleNotFoundError."""
    (tmp_path / "sitecustomize.py").write_text(  # the module looks uninstalled, in the child
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {hidden!r}:\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.append("t", 1)
    result = run_spoolmq(*args, "--data", str(data), env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2
    assert_one_line_error(
        result, f"{what} needs the 'kafka' extra ({hidden} is not installed)", "spoolmq[kafka]"
    )
    assert not broker_running(data)


def test_a_state_db_that_is_not_a_database_is_one_line(tmp_path: Path) -> None:
    """The broker's start read it and ended in a sqlite3 traceback."""
    data = tmp_path / "queue_data"
    with Store(data):
        pass
    (data / "state.db").write_bytes(bytes(range(256)) * 32)
    for extra in ("state.db-wal", "state.db-shm"):
        (data / extra).unlink(missing_ok=True)
    result = run_cli("broker", "--data", str(data))
    assert result.returncode == 2
    assert_one_line_error(result, "state.db cannot be read", "not a database")
    assert not broker_running(data)


@pytest.mark.parametrize("action", ["add", "remove"])
def test_users_without_a_name_says_how_to_give_one(tmp_path: Path, action: str) -> None:
    data = tmp_path / "queue_data"
    with Store(data):
        pass
    result = run_cli("users", action, "--data", str(data))
    assert result.returncode == 2
    assert_one_line_error(result, f"users {action} needs a NAME: `spoolmq users {action} NAME`")
