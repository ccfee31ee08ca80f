"""The CLI's commands against a real broker: what they print (the ``--json`` shapes are
asserted key by key so that they stay stable for scripts) and what they do. Most run
in-process through ``spoolmq.cli.main`` (as rq tests its CLI); a few as a subprocess."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from spoolmq import Consumer, Publisher, Store
from spoolmq.cli import main
from spoolmq.testing import BrokerProcess, wait_until

POSITION_KEYS = {"topic", "partition", "offset"}
MESSAGE_KEYS = {
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "headers",
    "tags",
    "timestamp",
    "attempt",
}
CREATED = "spoolmq: created topic"


def cli(capsys: pytest.CaptureFixture[str], *args: str, created: str | None = None) -> str:
    """Run a command in-process; it must succeed; return what it printed. Its stderr is
    empty, or (``created``) exactly the notice that it created that topic."""
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    if created is None:
        assert captured.err == ""
    else:
        assert captured.err.startswith(f"{CREATED} {created!r}")
        assert len(captured.err.splitlines()) == 1
    return captured.out


def json_lines(text: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in text.splitlines()]


def test_publish_a_value_and_stdin_lines(
    broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    d = ["--data", str(data_dir)]
    out = cli(
        capsys,
        "publish",
        "orders",
        '{"id": 1}',
        "--key",
        "c7",
        "--header",
        "h=v",
        *d,
        created="orders",
    )
    assert json_lines(out) == [{"topic": "orders", "partition": 0, "offset": 0}]
    out = cli(capsys, "publish", "orders", "plain text", "--tag", "vip", "--tag", "eu", *d)
    assert json_lines(out) == [{"topic": "orders", "partition": 0, "offset": 1}]
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"id": 2}\n\n[3]\n"four"\n'))
    out = cli(capsys, "publish", "orders", "--acks", "1", "--delay", "0", *d)
    lines = json_lines(out)
    assert all(set(line) == POSITION_KEYS for line in lines)
    assert [line["offset"] for line in lines] == [2, 3, 4]
    with Store(data_dir) as store:
        records = list(store.reader("orders", 0))
    assert [r.value for r in records] == [{"id": 1}, "plain text", {"id": 2}, [3], "four"]
    assert records[0].key == "c7" and records[0].headers == [("h", "v")]
    assert records[1].tags == ("vip", "eu")


def test_consume_max_timeout_no_ack_and_start(
    broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data", str(data_dir)]
    with Publisher(data=data_dir) as publisher:
        for n in range(4):
            publisher.publish("jobs", {"n": n}, key=f"k{n}", headers={"trace": str(n)})
    out = cli(capsys, "consume", "jobs", "--group", "g", "--max", "2", *d)
    first = json_lines(out)
    assert all(set(line) == MESSAGE_KEYS for line in first)
    assert [(m["offset"], m["value"], m["key"], m["attempt"]) for m in first] == [
        (0, {"n": 0}, "k0", 1),
        (1, {"n": 1}, "k1", 1),
    ]
    assert first[0]["headers"] == [["trace", "0"]]
    # They were ACKed: the group goes on from offset 2 and stops when idle.
    out = cli(capsys, "consume", "jobs", "--group", "g", "--timeout", "1", *d)
    assert [m["offset"] for m in json_lines(out)] == [2, 3]
    # --no-ack: at-most-once, a message handed out is final even though nobody ACKed it.
    out = cli(capsys, "consume", "jobs", "--group", "quick", "--no-ack", "--max", "1", *d)
    assert [m["offset"] for m in json_lines(out)] == [0]
    out = cli(capsys, "consume", "jobs", "--group", "quick", "--no-ack", "--max", "1", *d)
    assert [m["offset"] for m in json_lines(out)] == [1]
    # Raw bytes as {"hex": ...}, as the console's API gives them: not the text "00ff".
    with Publisher(data=data_dir) as publisher:
        publisher.publish("raw", b"\x00\xff", key=b"\x01", headers={"h": b"\x02"})
        publisher.publish("raw", "00ff", key="01")
    out = cli(capsys, "consume", "raw", "--group", "g", "--max", "2", *d)
    assert [(m["value"], m["key"], m["headers"]) for m in json_lines(out)] == [
        ({"hex": "00ff"}, {"hex": "01"}, [["h", {"hex": "02"}]]),
        ("00ff", "01", []),
    ]
    # --start latest: a new group skips what is already there.
    out = cli(
        capsys, "consume", "jobs", "--group", "new", "--start", "latest", "--timeout", "1", *d
    )
    assert out == ""


def test_consume_and_publish_as_subprocesses(broker: BrokerProcess, data_dir: Path) -> None:
    command = [sys.executable, "-m", "spoolmq"]
    published = subprocess.run(
        [*command, "publish", "sub", "--data", str(data_dir)],
        input='{"a": 1}\n{"a": 2}\n',
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert published.returncode == 0, published.stderr
    assert json_lines(published.stdout) == [
        {"topic": "sub", "partition": 0, "offset": 0},
        {"topic": "sub", "partition": 0, "offset": 1},
    ]
    consumed = subprocess.run(
        [*command, "consume", "sub", "--group", "g", "--timeout", "2", "--data", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert [m["value"] for m in json_lines(consumed.stdout)] == [{"a": 1}, {"a": 2}]


def test_topics_create_list_describe_delete(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data", str(data_dir)]
    created = orjson.loads(
        cli(
            capsys,
            "topics",
            "create",
            "events",
            "--partitions",
            "3",
            "--retention",
            "2d",
            "--compact",
            "--json",
            *d,
        )
    )
    config_keys = {
        "partitions",
        "retention_ms",
        "retention_bytes",
        "cleanup_policy",
        "segment_bytes",
        "segment_ms",
        "tombstone_retention_ms",
    }
    assert set(created) == {"name"} | config_keys
    assert (created["name"], created["partitions"], created["retention_ms"]) == (
        "events",
        3,
        2 * 86_400_000,
    )
    assert created["cleanup_policy"] == "compact"
    cli(capsys, "topics", "create", "plain", *d)
    listed = orjson.loads(cli(capsys, "topics", "list", "--json", *d))
    assert all(set(entry) == {"name"} | config_keys for entry in listed)
    assert sorted(entry["name"] for entry in listed) == ["events", "plain"]
    with BrokerProcess(data_dir), Publisher(data=data_dir) as publisher:
        publisher.publish("events", 1, partition=2)
        publisher.publish("events", 2, partition=2)
    described = orjson.loads(cli(capsys, "topics", "describe", "events", "--json", *d))
    assert set(described) == {"name", "partitions"} | config_keys - {"partitions"}
    assert described["partitions"] == [
        {"partition": 0, "log_start_offset": 0, "log_end_offset": 0, "segments": 0},
        {"partition": 1, "log_start_offset": 0, "log_end_offset": 0, "segments": 0},
        {"partition": 2, "log_start_offset": 0, "log_end_offset": 2, "segments": 1},
    ]
    assert "deleted topic plain" in cli(capsys, "topics", "delete", "plain", *d)
    assert [e["name"] for e in orjson.loads(cli(capsys, "topics", "list", "--json", *d))] == [
        "events"
    ]


def test_groups_list_and_describe(
    broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    d = ["--data", str(data_dir)]
    with Store(data_dir) as store:
        store.create_topic("orders", partitions=2)
    with Publisher(data=data_dir) as publisher:
        for n in range(5):
            publisher.publish("orders", n, partition=n % 2)  # 3 in partition 0, 2 in 1
    with Consumer("orders", group="billing", data=data_dir, prefetch=1) as consumer:
        held = consumer.receive(timeout=30)
        assert held is not None
        rows = orjson.loads(cli(capsys, "groups", "describe", "billing", "--json", *d))
        assert all(
            set(row)
            == {
                "topic",
                "partition",
                "committed",
                "log_end_offset",
                "lag",
                "in_flight",
                "consumers",
                "parked",
            }
            for row in rows
        )
        by_partition = {row["partition"]: row for row in rows}
        mine = by_partition[held.partition]
        assert (mine["committed"], mine["in_flight"]) == (0, 1)
        assert mine["consumers"] == [consumer.consumer_id]
        assert [(r["log_end_offset"], r["lag"]) for _, r in sorted(by_partition.items())] == [
            (3, 3),
            (2, 2),
        ]
        summary = orjson.loads(cli(capsys, "groups", "list", "--json", *d))
        assert summary == [
            {"group": "billing", "partitions": 2, "lag": 5, "in_flight": 1, "parked": 0}
        ]
        # The table has the columns Kafka users know.
        monkeypatch.setenv("COLUMNS", "200")
        table = cli(capsys, "groups", "describe", "billing", *d)
        for column in (
            "topic",
            "partition",
            "committed offset",
            "log end offset",
            "lag",
            "in-flight",
            "parked",
            "consumer",
        ):
            assert column in table
        assert consumer.consumer_id in table
        held.ack()


def test_groups_show_the_delayed_messages_parked_in_state_db(
    broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Messages due long after the broker reads them are parked in state.db (README,
    "Delays and expiry"): the committed offset moves past them, so the lag alone would not
    say where they are. `groups list/describe` count them per partition, live and with the
    broker stopped."""
    d = ["--data", str(data_dir)]
    with Store(data_dir) as store:
        store.create_topic("later", partitions=2)
    with Publisher(data=data_dir) as publisher:
        for n in range(5):
            publisher.publish("later", n, partition=n % 2, delay=3600)  # 3 in 0, 2 in 1
        publisher.publish("later", "now", partition=0)

    def described() -> dict[int, dict[str, Any]]:
        rows = orjson.loads(cli(capsys, "groups", "describe", "reports", "--json", *d))
        return {row["partition"]: row for row in rows}

    with Consumer("later", group="reports", data=data_dir) as consumer:
        message = consumer.receive(timeout=60)
        assert message is not None and message.value == "now"
        message.ack()
        wait_until(
            lambda: [r["parked"] for _, r in sorted(described().items())] == [3, 2],
            60,
            "the delayed messages to be parked and saved",
        )
    rows = described()
    assert [(rows[p]["committed"], rows[p]["log_end_offset"]) for p in (0, 1)] == [(4, 4), (2, 2)]
    summary = orjson.loads(cli(capsys, "groups", "list", "--json", *d))
    assert [(s["group"], s["parked"], s["lag"]) for s in summary] == [("reports", 5, 0)]
    assert broker.stop() == 0
    assert [r["parked"] for _, r in sorted(described().items())] == [3, 2]  # from state.db


def test_dlq_list_and_replay(
    broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data", str(data_dir)]
    with Publisher(data=data_dir) as publisher:
        publisher.publish("pay", {"order": 1}, key="a")
        publisher.publish("pay", {"order": 2}, key="b")
    with Consumer("pay", group="billing", data=data_dir, prefetch=2, max_deliveries=2) as consumer:
        for _ in range(4):
            message = consumer.receive(timeout=30)
            assert message is not None
            message.nack(delay=0, reason=f"card declined {message.value['order']}")
        assert consumer.receive(timeout=1.0) is None

    def dead_letters() -> list[dict[str, Any]]:
        return orjson.loads(cli(capsys, "dlq", "list", "pay", "--json", *d))

    rows = dead_letters()
    assert all(
        set(row)
        == {
            "dlq_partition",
            "dlq_offset",
            "topic",
            "partition",
            "offset",
            "group",
            "attempts",
            "reason",
            "timestamp",
            "key",
            "value",
            "tags",
        }
        for row in rows
    )
    # Numbers are JSON numbers, not the header strings they are stored as.
    assert sorted(
        (r["offset"], r["key"], r["value"]["order"], r["attempts"], r["reason"]) for r in rows
    ) == [
        (0, "a", 1, 2, "card declined 1"),
        (1, "b", 2, 2, "card declined 2"),
    ]
    assert {(r["topic"], r["partition"], r["group"]) for r in rows} == {("pay", 0, "billing")}
    assert all(type(r["timestamp"]) is int and type(r["dlq_offset"]) is int for r in rows)

    def replay() -> tuple[int, int, int]:
        result = orjson.loads(cli(capsys, "dlq", "replay", "pay", "--json", *d))
        return result["selected"], result["replayed"], result["already_replayed"]

    assert replay() == (2, 2, 0)
    assert replay() == (2, 0, 2)
    with Store(data_dir) as store:
        replayed = list(store.reader("pay", 0, offset=2))
    assert sorted((r.key, r.value["order"]) for r in replayed) == [("a", 1), ("b", 2)]
    assert all(not name.startswith("x-dlq-") for r in replayed for name, _ in r.headers)


def test_stats(broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("s", 1)
        stats = orjson.loads(cli(capsys, "stats", "--json", "--data", str(data_dir)))
        assert set(stats) == {
            "pid",
            "publisher",
            "consumer",
            "restarts",
            "pids",
            "clients",
            "listen",
            "ready_s",
            "uptime_s",
        }  # no "kafka": no Kafka listener was asked for
        assert stats["pid"] == broker.pid
        # Both children have been up since the broker started, and no longer than the test.
        assert all(0 <= s < 600 for s in stats["ready_s"].values()), stats["ready_s"]
        assert set(stats["pids"]) == {"publisher", "consumer"}
        assert stats["clients"] == {"publisher": 1, "consumer": 0, "admin": 1}
        assert stats["restarts"] == {"publisher": 0, "consumer": 0}
        assert set(stats["consumer"]) == {
            "delivered",
            "acked",
            "nacked",
            "dead_lettered",
            "expired",
            "skipped",
            "consumers",
            "groups",
            "in_flight",
            "by_topic",
            "bytes_by_topic",
            "settled_bytes_by_topic",
            "ack_latency",
        }
        assert set(stats["publisher"]) == {
            "frames",
            "frames_prechecked",
            "messages",
            "batches",
            "errors",
            "by_topic",
            "bytes_by_topic",
            "publishers",
            "commit_size",
            "ack_seconds",
            "fsync_seconds",
        }
    assert "broker process" in cli(capsys, "stats", "--data", str(data_dir))


COMMANDS = [
    "broker",
    "publish",
    "cancel",
    "consume",
    "topics",
    "groups",
    "dlq",
    "stats",
    "check",
    "demo",
]
FAMILIES = {
    "topics": ["create", "list", "describe", "alter", "delete"],
    "groups": ["list", "describe", "reset", "delete"],
    "dlq": ["list", "replay", "purge"],
}


def test_publish_with_a_priority_and_cancel_through_the_broker(
    broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = str(data_dir)
    cli(capsys, "publish", "jobs", '"low"', "--data", d, created="jobs")
    cli(capsys, "publish", "jobs", '"doomed"', "--data", d)
    cli(capsys, "publish", "jobs", '"high"', "--priority", "9", "--data", d)
    out = cli(capsys, "cancel", "jobs", "1", "--reason", "wrong order", "--json", "--data", d)
    assert orjson.loads(out) == {"cancelled": "jobs/0@1", "groups": {}}
    with Consumer("jobs", group="g", data=data_dir, prefetch=3) as consumer:
        values = []
        while (message := consumer.receive(timeout=60 if len(values) < 2 else 1.0)) is not None:
            values.append(message.value)
            message.ack()
    assert values == ["high", "low"]  # the priority first; the cancelled one never
    out = cli(capsys, "cancel", "jobs", "0", "--data", d)
    assert out.splitlines() == [
        "cancelled jobs/0@0: no group will deliver it",
        "  group g: already done with it",
    ]


def test_cancel_with_no_broker_holds_once_one_starts(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(data_dir) as store:
        for value in ("a", "b"):
            store.append("offline", value, partition=0)
    cli(capsys, "cancel", "offline", "0", "--data", str(data_dir))
    assert main(["cancel", "offline", "2", "--data", str(data_dir)]) == 2
    assert capsys.readouterr().err == (
        "spoolmq: offline/0 has no message at offset 2 (its log ends at 2)\n"
    )
    with (
        BrokerProcess(data_dir, log_file=tmp_path / "broker.log"),
        Consumer("offline", group="g", data=data_dir) as consumer,
    ):
        message = consumer.receive(timeout=60)
        assert message is not None and message.value == "b"
        message.ack()
        assert consumer.receive(timeout=1.0) is None


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    for words in [[command, a] for a in FAMILIES[command]] if command in FAMILIES else [[command]]:
        with pytest.raises(SystemExit) as exited:
            main([*words, "--help"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: spoolmq {' '.join(words)}")
        assert "--data" in out


def test_the_data_directory_comes_from_the_option_the_environment_or_the_cwd(
    tmp_path: Path,
) -> None:
    data = tmp_path / "queue_data"
    command = [sys.executable, "-m", "spoolmq"]
    environment = {k: v for k, v in os.environ.items() if k != "SPOOLMQ_DATA"}
    broker = subprocess.Popen(
        [*command, "broker", "--log-level", "warning"],
        env={**environment, "SPOOLMQ_DATA": str(data)},
        cwd=tmp_path / "..",
        stdin=subprocess.DEVNULL,
    )
    try:
        BrokerProcess(data).wait_ready(60)  # the broker took its directory from SPOOLMQ_DATA

        def publish(value: str, **where: Any) -> dict[str, Any]:
            done = subprocess.run(
                [*command, "publish", "where", value, *where.pop("args", [])],
                capture_output=True,
                text=True,
                timeout=60,
                **where,
            )
            assert done.returncode == 0, done.stderr
            return orjson.loads(done.stdout)

        assert publish("option", args=["--data", str(data)], env=environment)["offset"] == 0
        assert publish("env", env={**environment, "SPOOLMQ_DATA": str(data)})["offset"] == 1
        assert publish("cwd", env=environment, cwd=tmp_path)["offset"] == 2
        # The option wins over the environment.
        wrong = {**environment, "SPOOLMQ_DATA": str(tmp_path / "elsewhere")}
        assert publish("both", args=["--data", str(data)], env=wrong)["offset"] == 3
    finally:
        broker.terminate()
        assert broker.wait(60) == 0
    with Store(data) as store:
        assert [r.value for r in store.reader("where", 0)] == ["option", "env", "cwd", "both"]
