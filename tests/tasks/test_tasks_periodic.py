"""Periodic jobs: once per tick across schedulers and broker restarts, missed ticks once on
return or skipped (point 6)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from tasks_helpers import count_marks

from spoolmq import Store
from spoolmq.tasks import Tasks
from spoolmq.tasks.scheduler import Scheduler
from spoolmq.testing import BrokerProcess, wait_until

HOUR = 3600.0


def _stored(data_dir: Path, topic: str) -> int:
    with Store(data_dir) as store:
        config = store.topics().get(topic)
        if config is None:
            return 0
        return sum(store.log_end_offset(topic, p) for p in range(config.partitions))


def test_missed_ticks_fire_once_on_return_or_are_skipped(
    broker: BrokerProcess, data_dir: Path
) -> None:
    tasks = Tasks(data_dir)

    @tasks.task(topic="t.hourly", name="report")
    def report() -> None: ...

    tasks.periodic(None, report, every=timedelta(hours=1), name="catching-up")
    tasks.periodic(None, report, every=timedelta(hours=1), catch_up=False, name="skipping")
    scheduler = Scheduler(tasks)
    start = (1_800_000_000 // HOUR) * HOUR + 60  # a minute past the hour
    scheduler.step(start)
    assert scheduler.fired == []  # a new job starts from now, with no tick from before
    # Everything was down for three hours and twenty minutes: three ticks were missed.
    later = start + 3 * HOUR + 20 * 60
    scheduler.step(later)
    tick = int(later // HOUR * HOUR * 1000)  # a tick's number: its epoch ms
    assert scheduler.fired == [("catching-up", tick, False)]
    scheduler.step(later + 5)
    assert len(scheduler.fired) == 1  # once, not once per step
    # On time, both fire.
    next_tick = tick + int(HOUR * 1000)
    scheduler.step(next_tick / 1000 + 1)
    assert sorted(name for name, _, _ in scheduler.fired[1:]) == ["catching-up", "skipping"]
    assert {j["name"]: j["last_tick"] for j in tasks.store.periodic_jobs()} == {
        "catching-up": next_tick,
        "skipping": next_tick,
    }
    scheduler.close()

    # Across a broker restart: a scheduler that sends a tick again (it crashed before
    # recording it) is told the broker has it, and the topic holds it once.
    stored = _stored(data_dir, "t.hourly")
    broker.stop()
    broker.start()
    with sqlite3.connect(data_dir / "tasks.db") as db:
        db.execute("UPDATE periodic SET last_tick = last_tick - 1 WHERE name = 'catching-up'")
    again = Scheduler(tasks)
    again.step(next_tick / 1000 + 2)
    assert again.fired == [("catching-up", next_tick, True)]
    assert _stored(data_dir, "t.hourly") == stored == 3
    again.close()
    tasks.close()


def test_two_workers_send_each_tick_once(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, marks: Path, data_dir: Path
) -> None:
    first = start_worker("--processes", "1", TASKS_PERIODIC="1")
    second = start_worker("--processes", "1", TASKS_PERIODIC="1")
    wait_until(lambda: len(app.tasks.store.recent(name="task_app.tick")) >= 3, 90, "three ticks")
    first.stop()
    second.stop()
    start_worker("--no-scheduler")  # runs what the stopped workers left
    ticks = app.tasks.store.recent(name="task_app.tick")
    wait_until(
        lambda: all(r.state == "succeeded" for r in app.tasks.store.recent(name="task_app.tick")),
        60,
        "every tick to run",
    )
    # One message and one run per tick, though two schedulers saw every one due.
    assert _stored(data_dir, "t.periodic") == len(ticks)
    assert len(count_marks(marks, "every2")) == len(ticks)
    assert len({r.id for r in ticks}) == len(ticks)
    listed = subprocess.run(
        [sys.executable, "-m", "spoolmq", "tasks", "periodic", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SPOOLMQ_DATA": str(data_dir)},
    )
    jobs = json.loads(listed.stdout)
    assert [j["name"] for j in jobs] == ["every2"] and jobs[0]["schedule"] == "every 2s"
    assert jobs[0]["last_tick"] >= max(int(r.id.rsplit("-", 1)[1]) for r in ticks)


def test_cron_ticks_follow_their_time_zone() -> None:
    from datetime import UTC, datetime

    from spoolmq.tasks import Periodic

    job = Periodic.build(
        "t",
        cron="0 9 * * *",
        every=None,
        tz="Europe/Paris",
        catch_up=True,
        args=[],
        kwargs={},
        name=None,
    )
    assert job.name == "t@cron 0 9 * * * Europe/Paris"
    winter = datetime(2026, 1, 15, 12, 0, tzinfo=UTC).timestamp()  # Paris is UTC+1
    tick, when = job.latest_tick(winter)
    assert datetime.fromtimestamp(when, UTC) == datetime(2026, 1, 15, 8, 0, tzinfo=UTC)
    assert tick == int(when) * 1000
    summer = datetime(2026, 7, 15, 12, 0, tzinfo=UTC).timestamp()  # UTC+2
    assert datetime.fromtimestamp(job.latest_tick(summer)[1], UTC).hour == 7
    # Exactly on a tick: that tick, not the one before.
    assert job.latest_tick(when) == (tick, when)
    assert job.next_time(when) == when + 86400


def test_a_job_whose_schedule_changes_keeps_firing(broker: BrokerProcess, data_dir: Path) -> None:
    # Numbered by their schedule, the ticks of every=2s made every=60s were 30 times lower
    # than the last one fired: never due again, and duplicates to the broker besides.
    def declare(every: timedelta) -> tuple[Tasks, Scheduler]:
        tasks = Tasks(data_dir)

        @tasks.task(topic="t.beat", name="beat")
        def beat() -> None: ...

        tasks.periodic(None, beat, every=every, name="heartbeat")
        return tasks, Scheduler(tasks)

    start = 1_800_000_000.0
    tasks, scheduler = declare(timedelta(seconds=2))
    scheduler.step(start)
    scheduler.step(start + 2)
    assert [tick for _, tick, _ in scheduler.fired] == [int((start + 2) * 1000)]
    scheduler.close()
    tasks.close()
    tasks, scheduler = declare(timedelta(seconds=60))
    scheduler.step(start + 60)
    scheduler.step(start + 120)
    assert scheduler.fired == [
        ("heartbeat", int((start + 60) * 1000), False),
        ("heartbeat", int((start + 120) * 1000), False),
    ]
    assert _stored(data_dir, "t.beat") == 3
    scheduler.close()
    tasks.close()


def test_a_tick_recorded_before_ticks_were_epoch_ms_is_not_sent_again(
    broker: BrokerProcess, data_dir: Path
) -> None:
    # A tasks.db of an earlier version numbered the hourly job's 10:00 tick 500,000 (time //
    # interval). At 10:30 that tick is done: read as 10:00, it is not sent again.
    tasks = Tasks(data_dir)

    @tasks.task(topic="t.hourly", name="report")
    def report() -> None: ...

    tasks.periodic(None, report, every=timedelta(hours=1), name="hourly")
    tasks.store.periodic_last_tick("hourly", "report", "every 3600s")
    tasks.store.periodic_advance("hourly", 500_000, None, fired=True)
    scheduler = Scheduler(tasks)
    scheduler.step(500_000 * HOUR + 30 * 60)
    assert scheduler.fired == []
    scheduler.step(500_001 * HOUR + 1)
    assert scheduler.fired == [("hourly", int(500_001 * HOUR * 1000), False)]
    scheduler.close()
    tasks.close()


def test_a_legacy_tick_is_read_with_the_schedule_it_was_recorded_under(
    broker: BrokerProcess, data_dir: Path
) -> None:
    # Recorded by an earlier spoolmq under every=2s (tick 900,000,000: epoch second 1.8e9),
    # then the job is made every=60s in the same upgrade. Read with the new interval, the
    # tick would be in the year 3680 and the job would never fire again.
    tasks = Tasks(data_dir)

    @tasks.task(topic="t.beat", name="beat")
    def beat() -> None: ...

    tasks.store.periodic_last_tick("beat-job", "beat", "every 2s")
    tasks.store.periodic_advance("beat-job", 900_000_000, None, fired=True)
    tasks.periodic(None, beat, every=timedelta(seconds=60), name="beat-job")
    scheduler = Scheduler(tasks)
    scheduler.step(1_800_000_060.0)
    assert scheduler.fired == [("beat-job", 1_800_000_060_000, False)]
    scheduler.close()
    tasks.close()
