"""The traps a new user fell into (issue 12, points 9-16), each run as the user ran it: a
real ``spoolmq`` subprocess, against a real broker process where one is involved."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from spoolmq import Consumer, Message, Publisher, Store, __version__
from spoolmq.broker.dead_letter import DeadLetterHeader
from spoolmq.errors import CorruptRecordError
from spoolmq.testing import BrokerProcess, wait_until

SPOOLMQ = [sys.executable, "-m", "spoolmq"]


def run(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SPOOLMQ, *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def ok(*args: str, stdin: str = "") -> str:
    """Run a command that must succeed with nothing on stderr; its stdout."""
    result = run(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("spoolmq: ") and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def json_lines(text: str) -> list[Any]:
    return [orjson.loads(line) for line in text.splitlines()]


# -- 10: publish ---------------------------------------------------------------------------


def test_publish_options_may_come_before_the_value(broker: BrokerProcess, data_dir: Path) -> None:
    d = ["--data", str(data_dir)]
    run("topics", "create", "jobs", *d)
    ok("publish", "jobs", "--delay", "3", '"later"', *d)
    ok("publish", "--key", "k", "jobs", "--tag", "t", '{"n": 2}', *d)
    with Store(data_dir) as store:
        records = list(store.reader("jobs", 0))
    assert [r.value for r in records] == ["later", {"n": 2}]
    assert records[0].deliver_at is not None and records[0].deliver_at > records[0].timestamp
    assert (records[1].key, records[1].tags) == ("k", ("t",))
    one_line_error(run("publish", "jobs", "--delay", "3", "a", "b", *d), "unrecognized", "b")


def test_publish_sends_each_stdin_line_as_it_arrives(broker: BrokerProcess, data_dir: Path) -> None:
    d = ["--data", str(data_dir)]
    run("topics", "create", "logs", *d)
    process = subprocess.Popen(
        [*SPOOLMQ, "publish", "logs", *d],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    try:

        def stored() -> list[Any]:
            with Store(data_dir) as store:
                return [r.value for r in store.reader("logs", 0)]

        for n in range(3):
            process.stdin.write(orjson.dumps({"line": n}) + b"\n")
            process.stdin.flush()
            # Stored, and its position printed, while stdin is still open (as under tail -f).
            wait_until(lambda n=n: len(stored()) == n + 1 or None, 60, f"line {n} stored")
            assert orjson.loads(process.stdout.readline())["offset"] == n
        process.stdin.close()
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert stored() == [{"line": n} for n in range(3)]


# -- 11: numeric options, consume --follow -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["consume", "t", "--group", "g", "--timeout", "inf"], "--timeout: 'inf' must be"),
        (["consume", "t", "--group", "g", "--timeout", "nan"], "--timeout: 'nan' must be"),
        (["consume", "t", "--group", "g", "--timeout", "1e12"], "--timeout: '1e12' must be"),
        (["consume", "t", "--group", "g", "--timeout", "0"], "--follow"),
        (["consume", "t", "--group", "g", "--timeout", "-1"], "--timeout"),
        (["consume", "t", "--group", "g", "--max", "0"], "--max: '0' must be 1 or more"),
        (["consume", "t", "--group", "g", "--max", "2.5"], "not a whole number"),
        (["consume", "t", "--group", "g", "--follow", "--timeout", "3"], "not allowed"),
        (["publish", "t", "1", "--delay", "nan"], "--delay"),
        (["publish", "t", "1", "--ttl", "inf"], "--ttl"),
        (["topics", "create", "t", "--partitions", "-2"], "--partitions"),
        (["groups", "reset", "g", "--topic", "t", "--to-offset", "-1"], "--to-offset"),
        (["dlq", "replay", "t", "--offset", "x"], "--offset"),
        (["demo", "--messages", "0"], "--messages"),
    ],
)
def test_every_numeric_option_is_checked(tmp_path: Path, args: list[str], fragment: str) -> None:
    result = run(*args, "--data", str(tmp_path / "q"))
    assert result.returncode == 2
    line = one_line_error(result, fragment)
    assert f"(see `spoolmq {args[0]}" in line
    assert not (tmp_path / "q").exists()


def test_consume_follow_prints_messages_as_they_come(broker: BrokerProcess, data_dir: Path) -> None:
    d = ["--data", str(data_dir)]
    run("topics", "create", "live", *d)
    process = subprocess.Popen(
        [*SPOOLMQ, "consume", "live", "--group", "tail", "--follow", *d],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        with Publisher(data=data_dir) as publisher:
            for n in range(2):
                publisher.publish("live", {"n": n}, tags=["vip"])
                line = orjson.loads(process.stdout.readline())  # waits for the message
                assert (line["value"], line["tags"]) == ({"n": n}, ["vip"])
        assert process.poll() is None  # still following
        process.send_signal(signal.SIGINT)  # Ctrl-C: how --follow is stopped
        assert process.wait(60) == 0  # as read --follow and stats --watch (it was 130)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


# -- 12: groups reset ----------------------------------------------------------------------


def test_a_refused_reset_says_only_that_and_a_preview_says_it_is_one(
    broker: BrokerProcess, data_dir: Path
) -> None:
    d = ["--data", str(data_dir)]
    with Publisher(data=data_dir) as publisher:
        for n in range(3):
            publisher.publish("r", n)
    reset = ["groups", "reset", "g", "--topic", "r", "--to-earliest"]
    with Consumer("r", "g", data=data_dir) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None
        message.ack()
        refused = run(*reset, "--execute", *d)
        assert refused.stdout == ""
        one_line_error(refused, "live consumer")
        preview = ok(*reset, *d)
        assert "PREVIEW" in preview and "nothing changed" in preview
    wait_until(lambda: run(*reset, "--execute", *d).returncode == 0 or None, 60, "reset once idle")


# -- 13, 14: unknown topics, durations, conflicting settings, auto-creation --------------


def test_dlq_commands_on_a_topic_that_does_not_exist_fail(tmp_path: Path) -> None:
    data = tmp_path / "q"
    with Store(data) as store:
        store.create_topic("real")
    for action in ("list", "replay", "purge"):
        one_line_error(run("dlq", action, "nope", "--data", str(data)), "'nope' does not exist")
    assert orjson.loads(ok("dlq", "list", "real", "--json", "--data", str(data))) == []


def test_topic_settings_say_what_they_mean(tmp_path: Path) -> None:
    d = ["--data", str(tmp_path / "q")]
    one_line_error(run("topics", "create", "x", "--retention", "5", *d), "unit")
    ok("topics", "create", "x", "--retention", "5d", *d)
    conflict = run("topics", "create", "x", "--partitions", "3", *d)
    line = one_line_error(conflict, "partitions: 1 (wanted 3)", "retention_ms: 432000000")
    assert "{" not in line  # not a Python dict
    altered = orjson.loads(ok("topics", "alter", "x", "--retention", "12h", "--json", *d))
    assert altered["retention_ms"] == 12 * 3600 * 1000
    one_line_error(run("topics", "alter", "x", *d), "needs --retention")


def test_auto_creation_is_a_broker_setting_and_the_cli_says_when_it_happens(
    tmp_path: Path,
) -> None:
    data = tmp_path / "q"
    d = ["--data", str(data)]
    with BrokerProcess(data, log_file=tmp_path / "broker.log"):
        created = run("publish", "fresh", "1", *d)
        assert created.returncode == 0
        assert created.stderr.startswith("spoolmq: created topic 'fresh'")
        assert run("publish", "fresh", "2", *d).stderr == ""  # only the first time
    with BrokerProcess(data, args=["--auto-create-topics", "off"], log_file=tmp_path / "b2.log"):
        refused = run("publish", "typo", "1", *d)
        one_line_error(
            refused, "'typo' does not exist", f"`spoolmq topics create typo --data {data}`"
        )
        refused = run("consume", "typo", "--group", "g", "--timeout", "1", *d)
        one_line_error(refused, "'typo' does not exist")
        assert ok("publish", "fresh", "3", *d)  # an existing topic is fine
    with Store(data) as store:
        assert set(store.topics()) == {"fresh"}


def test_dead_letters_are_written_with_topic_auto_creation_off(tmp_path: Path) -> None:
    """The DLQ is the broker's own topic: it was refused as a missing topic, so the dead
    letter was retried for ever, holding the group's committed offset, and every message
    ACKed after it came back after a restart."""
    data = tmp_path / "queue_data"
    d = ["--data", str(data)]
    with Store(data) as store:
        store.create_topic("jobs")
    args = ["--auto-create-topics", "off"]
    with BrokerProcess(data, args=args, log_file=tmp_path / "broker.log"):
        with Publisher(data=data) as publisher:
            publisher.publish_many("jobs", [b"\x00poison", *range(5)])
        with Consumer("jobs", "g", data=data, max_deliveries=1, prefetch=10) as consumer:
            for _ in range(6):
                message = consumer.receive(timeout=30)
                assert message is not None
                if message.value == b"\x00poison":
                    message.nack(reason="bad input")
                else:
                    message.ack()

        def committed() -> list[Any] | None:
            rows = orjson.loads(ok("groups", "describe", "g", "--json", *d))
            return rows if rows[0]["committed"] == 6 else None

        [row] = wait_until(committed, 60, "the group to commit past the dead letter")
        assert row["lag"] == 0
        [letter] = orjson.loads(ok("dlq", "list", "jobs", "--json", *d))
        assert letter["offset"] == 0 and letter["reason"] == "bad input"
        assert letter["value"] == {"hex": b"\x00poison".hex()}  # raw bytes, not a text
        assert run("publish", "jobs.dlq.typo", "1", *d).returncode != 0  # still refused
    assert "could not dead-letter" not in (tmp_path / "broker.log").read_text()


# -- 15: --data, --version, help, error hints -----------------------------------------------


def test_data_version_and_help(tmp_path: Path) -> None:
    data = tmp_path / "q"
    with Store(data) as store:
        store.create_topic("before")
    assert "before" in ok("--data", str(data), "topics", "list")
    assert ok("--version").strip() == f"spoolmq {__version__}"
    create_help = ok("topics", "create", "--help")
    assert create_help.startswith("usage: spoolmq topics create")
    assert "--partitions" in create_help and "--to-earliest" not in create_help
    line = one_line_error(run("topics", "create"), "required: name")
    assert line.endswith("(see `spoolmq topics create --help`)")


def test_every_option_has_help_text() -> None:
    """Every option and argument of every command, those of spoolmq.commands included."""
    import argparse

    from spoolmq.cli import build_parser

    def leaves(parser: argparse.ArgumentParser, words: list[str]) -> list[Any]:
        found = [(words, parser)]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found += leaves(child, [*words, name])
        return found

    missing = [
        f"{' '.join(words)} {action.dest}"
        for words, parser in leaves(build_parser(), [])
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def test_the_missing_broker_hint_names_the_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "q"
    with BrokerProcess(data, log_file=tmp_path / "broker.log"):
        pass
    line = one_line_error(
        run("consume", "t", "--group", "g", "--timeout", "1", "--data", str(data)),
        f"spoolmq broker --data {data}",
    )
    assert "Error" not in line  # no exception class name


# -- 16: --json shapes, check -----------------------------------------------------------------


def _types(value: Any) -> Any:
    """The JSON types of a value, keys kept: what a script reading it relies on."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def test_numbers_are_numbers_in_every_json_shape(broker: BrokerProcess, data_dir: Path) -> None:
    d = ["--data", str(data_dir), "--json"]
    created = orjson.loads(ok("topics", "create", "pay", "--retention", "1d", *d))
    with Publisher(data=data_dir) as publisher:
        publisher.publish("pay", {"order": 1}, key="a")
        publisher.publish("pay", {"order": 2}, key="b")
    with Consumer("pay", "billing", data=data_dir, max_deliveries=1) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None
        message.nack(reason="declined")  # max_deliveries 1: dead-lettered at once
        wait_until(lambda: Store(data_dir).topics().get("pay.dlq"), 60, "a dead letter")
    integer, text = "int", "str"
    config = {
        "partitions": integer,
        "retention_ms": integer,
        "retention_bytes": integer,
        "cleanup_policy": text,
        "segment_bytes": integer,
        "segment_ms": integer,
        "tombstone_retention_ms": integer,
    }
    assert _types(created) == {"name": text, **config}
    assert _types(orjson.loads(ok("topics", "list", *d)))[0] == {"name": text, **config}
    described = _types(orjson.loads(ok("topics", "describe", "pay", *d)))
    assert described["partitions"] == [
        {
            "partition": integer,
            "log_start_offset": integer,
            "log_end_offset": integer,
            "segments": integer,
        }
    ]
    wait_until(lambda: orjson.loads(ok("groups", "list", *d)) or None, 60, "the group committed")
    assert _types(orjson.loads(ok("groups", "list", *d))) == [
        {
            "group": text,
            "partitions": integer,
            "lag": integer,
            "in_flight": integer,
            "parked": integer,
        }
    ]
    rows = orjson.loads(ok("groups", "describe", "billing", *d))
    assert {k: v for k, v in _types(rows[0]).items() if k != "consumers"} == {
        "topic": text,
        "partition": integer,
        "committed": integer,
        "log_end_offset": integer,
        "lag": integer,
        "in_flight": integer,
        "parked": integer,
    }
    reset = orjson.loads(ok("groups", "reset", "billing", "--topic", "pay", "--to-offset", "1", *d))
    assert _types(reset) == {
        "group": text,
        "executed": "bool",
        "changes": [{"topic": text, "partition": integer, "from": integer, "to": integer}],
    }
    wait_until(lambda: orjson.loads(ok("dlq", "list", "pay", *d)) or None, 60, "listed")
    letters = orjson.loads(ok("dlq", "list", "pay", *d))
    assert _types(letters) == [
        {
            "dlq_partition": integer,
            "dlq_offset": integer,
            "topic": text,
            "partition": integer,
            "offset": integer,
            "group": text,
            "attempts": integer,
            "reason": text,
            "timestamp": integer,
            "key": text,
            "value": {"order": integer},
            "tags": [],
        }
    ]
    replay = _types(orjson.loads(ok("dlq", "replay", "pay", "--dry-run", *d)))
    assert {k: v for k, v in replay.items() if k != "letters"} == {
        "dry_run": "bool",
        "to_group": "NoneType",
        "selected": integer,
        "replayed": integer,
        "already_replayed": integer,
        "tasks_queued": integer,
    }
    assert replay["letters"] == _types(letters)
    assert _types(orjson.loads(ok("dlq", "purge", "pay", *d))) == {"purged": integer}
    checked = orjson.loads(ok("check", *d))
    assert _types(checked) == {
        "checked": {
            "topics": integer,
            "partitions": integer,
            "segments": integer,
            "offsets": integer,
        },
        "problems": [],
    }
    assert checked["checked"]["topics"] == 2  # pay and pay.dlq


def test_check_gives_the_damaged_offset_what_to_do_and_counts(tmp_path: Path) -> None:
    data = tmp_path / "q"
    with Store(data) as store:
        for n in range(5):
            store.append("c", {"n": n})
    good = ok("check", "--data", str(data))
    assert "no problems found: 1 topic(s), 1 partition(s), 1 segment(s), 5 offset(s)" in good
    segment = next((data / "logs" / "c" / "0").glob("*.jsonl"))
    lines = segment.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"n":2', b'"n":7')  # the CRC no longer matches
    segment.write_bytes(b"".join(lines))
    bad = run("check", "--data", str(data))
    assert bad.returncode == 1
    assert "c/0 offset 2 " in bad.stdout and "What to do" in bad.stdout
    problem = orjson.loads(run("check", "--json", "--data", str(data)).stdout)["problems"][0]
    assert (problem["offset"], problem["partition"]) == (2, 0)


def test_check_names_the_damaged_record_of_a_batch_and_where_readers_stop(
    tmp_path: Path,
) -> None:
    """It gave the batch's first offset and byte as the damaged record's, and said to
    repair the line at that byte: a good line."""
    data = tmp_path / "q"
    with Store(data) as store:
        store.append_batch("c", [Message(value={"n": n}) for n in range(3)])
        store.append_batch("c", [Message(value={"n": n}) for n in range(3, 13)])
    segment = next((data / "logs" / "c" / "0").glob("*.jsonl"))
    lines = segment.read_bytes().splitlines(keepends=True)
    damaged_at = sum(len(line) for line in lines[:8])
    batch_at = sum(len(line) for line in lines[:3])
    assert b'"offset":8' in lines[8] and b'"offset":3' in lines[3]
    lines[8] = lines[8].replace(b'"n":8', b'"n":9')  # the CRC no longer matches
    segment.write_bytes(b"".join(lines))
    bad = run("check", "--data", str(data))
    assert bad.returncode == 1
    assert f"c/0 offset 8 ({segment} byte {damaged_at}): damage inside the segment" in bad.stdout
    assert f"its batch starts at offset 3 (byte {batch_at}), where readers stop" in bad.stdout
    problem = orjson.loads(run("check", "--json", "--data", str(data)).stdout)["problems"][0]
    assert (problem["offset"], problem["position"]) == (8, damaged_at)
    assert (problem["batch_offset"], problem["batch_position"]) == (3, batch_at)
    read: list[int] = []
    with Store(data) as store, pytest.raises(CorruptRecordError):  # readers stop at offset 3
        read.extend(record.offset for record in store.reader("c", 0))
    assert read == [0, 1, 2]


# -- 9: groups and dlq administration -----------------------------------------------------------


def test_groups_delete_shift_and_all_topics(tmp_path: Path) -> None:
    data = tmp_path / "q"
    d = ["--data", str(data)]
    with Store(data) as store:
        for topic in ("a", "b"):
            for n in range(10):
                store.append(topic, n)
        from spoolmq.types import TopicPartition

        store.state.commit_offsets("g", {TopicPartition("a", 0): 5, TopicPartition("b", 0): 8})
    shifted = orjson.loads(
        ok("groups", "reset", "g", "--all-topics", "--shift-by", "-3", "--execute", "--json", *d)
    )
    assert [(c["topic"], c["from"], c["to"]) for c in shifted["changes"]] == [
        ("a", 5, 2),
        ("b", 8, 5),
    ]
    forward = orjson.loads(
        ok("groups", "reset", "g", "--topic", "b", "--shift-by", "99", "--json", *d)
    )
    assert forward["changes"][0]["to"] == 10  # kept in the log
    assert ok("groups", "delete", "g", *d).strip() == "deleted consumer group g"
    assert orjson.loads(ok("groups", "list", "--json", *d)) == []
    one_line_error(run("groups", "delete", "g", *d), "no consumer group 'g'")


def test_dlq_replay_to_one_group_reaches_only_that_group(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """Redrive to one group: the other group of the topic, which already processed the
    message, never sees the replayed copy."""
    d = ["--data", str(data_dir)]
    with Publisher(data=data_dir) as publisher:
        publisher.publish("orders", {"id": 1})
    with (
        Consumer("orders", "audit", data=data_dir) as audit,
        Consumer("orders", "billing", data=data_dir, max_deliveries=1) as billing,
    ):
        first = audit.receive(timeout=30)
        assert first is not None
        first.ack()
        failed = billing.receive(timeout=30)
        assert failed is not None
        failed.nack(reason="card declined")
        wait_until(lambda: Store(data_dir).topics().get("orders.dlq"), 60, "dead-lettered")
        wait_until(
            lambda: orjson.loads(ok("dlq", "list", "orders", "--json", *d)) or None, 60, "listed"
        )
        dry = ok(
            "dlq", "replay", "orders", "--to-group", "billing", "--reason", "card", "--dry-run", *d
        )
        assert "dry run: would replay 1 dead letter(s) to orders for group billing only" in dry
        out = ok("dlq", "replay", "orders", "--to-group", "billing", "--offset", "0", *d)
        assert out.startswith("replayed 1 dead letter(s) to orders for group billing only")
        again = billing.receive(timeout=30)
        assert again is not None and again.value == {"id": 1} and again.offset == 1
        again.ack()
        # audit passes over offset 1: a message published after it is what it gets next.
        with Publisher(data=data_dir) as publisher:
            publisher.publish("orders", {"id": 2})
        following = audit.receive(timeout=30)
        assert following is not None and following.value == {"id": 2}
        following.ack()
    assert "purged 1 dead letter(s) of orders" in ok("dlq", "purge", "orders", *d)
    assert orjson.loads(ok("dlq", "list", "orders", "--json", *d)) == []


def test_dlq_purge_before_a_time(tmp_path: Path) -> None:
    data = tmp_path / "q"
    with Store(data) as store:
        store.create_topic("t")
        for n in range(3):
            store.append(
                "t.dlq", n, headers=[(DeadLetterHeader.REASON, "x"), (DeadLetterHeader.TOPIC, "t")]
            )
    d = ["--data", str(data)]
    one_line_error(run("dlq", "purge", "t", "--before", "soon", *d), "a time must be ISO 8601")
    assert ok("dlq", "purge", "t", "--before", "2000-01-01T00:00:00+00:00", *d).startswith(
        "purged 0"
    )
    assert ok("dlq", "purge", "t", "--before", "2999-01-01T00:00:00+00:00", *d).startswith(
        "purged 3"
    )


def test_groups_members_and_delete_with_a_broker_running(
    broker: BrokerProcess, data_dir: Path
) -> None:
    d = ["--data", str(data_dir)]
    with Publisher(data=data_dir) as publisher:
        publisher.publish("m", 1)
    with Consumer("m", "g", data=data_dir) as consumer:
        held = consumer.receive(timeout=30)
        assert held is not None
        members = orjson.loads(ok("groups", "describe", "g", "--members", "--json", *d))
        assert [(m["consumer"], m["kind"], m["pid"], m["in_flight"]) for m in members] == [
            (consumer.consumer_id, "spoolmq", os.getpid(), 1)
        ]
        # Both moments in epoch ms (`since` was in seconds, a float, beside `last_seen`).
        assert type(members[0]["last_seen"]) is int and type(members[0]["since"]) is int
        now_ms = time.time() * 1000
        assert now_ms - 120_000 < members[0]["since"] <= members[0]["last_seen"] <= now_ms
        assert consumer.consumer_id in ok("groups", "describe", "g", "--members", *d)
        one_line_error(run("groups", "delete", "g", *d), "live consumer")
        held.ack()
    wait_until(lambda: run("groups", "delete", "g", *d).returncode == 0 or None, 60, "deleted")
    assert orjson.loads(ok("groups", "list", "--json", *d)) == []


def test_tables_into_a_pipe_keep_every_cell_whole(tmp_path: Path) -> None:
    """Into a pipe (no terminal, no COLUMNS), a table is as wide as its cells: it was cut
    to 80 columns, so `topics list | grep` saw "orders-xxxx…"."""
    data = str(tmp_path / "queue_data")
    names = ["orders-" + "x" * 100, "billing-" + "y" * 90]
    for name in names:
        ok("topics", "create", name, "--partitions", "2", "--data", data)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    listed = subprocess.run(
        [*SPOOLMQ, "topics", "list", "--data", data],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if any(n in line for n in names)]
    assert len(rows) == 2, listed.stdout
    for name, row in zip(sorted(names), sorted(rows), strict=True):
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[:2] == [name, "2"], row
    # A terminal's width still rules where one is given.
    narrow = subprocess.run(
        [*SPOOLMQ, "topics", "list", "--data", data],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "COLUMNS": "80"},
    )
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_a_topic_made_before_a_bad_stdin_line_is_still_told(tmp_path: Path) -> None:
    """`publish` created the topic with the first lines and then met a line that is not
    JSON: the "created topic" notice came only on success, so the typo passed unseen."""
    data = tmp_path / "queue_data"
    d = ["--data", str(data)]
    with BrokerProcess(data, log_file=tmp_path / "broker.log"):
        process = subprocess.Popen(
            [*SPOOLMQ, "publish", "fresh-typo", *d],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdin is not None
            process.stdin.write('{"a": 1}\n')
            process.stdin.flush()

            def stored() -> bool:
                with Store(data) as store:
                    return (
                        "fresh-typo" in store.topics()
                        and store.log_end_offset("fresh-typo", 0) == 1
                    )

            wait_until(stored, 60, "the first line to be stored")
            _, stderr = process.communicate("{bad\n", timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 2
    assert stderr.splitlines()[0].startswith("spoolmq: created topic 'fresh-typo'"), stderr
    assert "stdin line 2 is not JSON" in stderr
