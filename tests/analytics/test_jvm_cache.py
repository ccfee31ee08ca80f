"""The Spark driver JVM's class archive (``analytics/jvm_cache.py``): written by a first
run once its JVM exits normally, mapped by the next run's JVM, dropped when the JVM does
not use it, never left half-written; for large stores, or any with ``SPOOLMQ_JVM_CACHE=on``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from analytics_helpers import need

from spoolmq import Store
from spoolmq.analytics.jvm_cache import ClassArchive
from spoolmq.errors import InvalidArgumentError


def _analytics(data: Path, out: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "spoolmq", "analytics", "--data", str(data)]
    return subprocess.run(
        [*command, "--out", str(out), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPOOLMQ_CACHE": str(cache),
            "SPOOLMQ_JVM_CACHE": "on",
        },
    )


def test_a_first_run_writes_the_archive_and_the_next_one_starts_from_it(tmp_path: Path) -> None:
    need("java", "openjdk-17-jre-headless")
    data, cache = tmp_path / "queue_data", tmp_path / "cache"
    with Store(data) as store:
        store.append("orders", [{"id": i} for i in range(20)])
    first = _analytics(data, tmp_path / "out1", cache)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "saving the Spark JVM's classes" in first.stderr
    # Not ~1,000 lines of the JVM's warnings about the classes it leaves out of the archive.
    assert "[warning][cds]" not in first.stdout + first.stderr
    assert first.stdout.splitlines()[-1].startswith("report: "), first.stdout[-3000:]
    (archive,) = cache.iterdir()  # nothing else: no temporary file left
    assert archive.name.startswith("spark-classes-") and archive.suffix == ".jsa"
    assert archive.stat().st_size > 10 * 2**20
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    written = archive.stat().st_mtime_ns
    second = _analytics(data, tmp_path / "out2", cache)
    assert second.returncode == 0, second.stderr[-3000:]
    # Mapped by the JVM (the job deletes an archive its JVM did not map), not rewritten.
    assert "saving the Spark JVM's classes" not in second.stderr
    assert "[warning][cds]" not in second.stdout + second.stderr
    assert "did not use the class archive" not in second.stderr
    assert [p.name for p in cache.iterdir()] == [archive.name]
    assert archive.stat().st_mtime_ns == written
    # The same figures with and without it.
    assert (tmp_path / "out1" / "summary.json").read_bytes().replace(b"out1", b"") == (
        tmp_path / "out2" / "summary.json"
    ).read_bytes().replace(b"out2", b"")

    # An archive the JVM cannot use (damaged) is ignored by it, then deleted.
    archive.write_bytes(b"not an archive")
    third = _analytics(data, tmp_path / "out3", cache)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "did not use the class archive" in third.stderr
    assert list(cache.iterdir()) == []


class _Gateway:
    """What ``finish`` needs of py4j's gateway: its JVM process, and shutdown."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def shutdown(self) -> None:
        pass


@pytest.fixture
def no_jvm_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process that has not started Spark (the suite's session has, and gets its
    JVM back after the test)."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_gateway", None)
    monkeypatch.setattr(SparkContext, "_jvm", None)


@pytest.mark.usefixtures("no_jvm_here")
@pytest.mark.parametrize(("code", "kept"), [(0, True), (3, False)])
def test_the_archive_is_put_in_place_only_after_a_normal_exit(
    tmp_path: Path, code: int, kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOOLMQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPOOLMQ_JVM_CACHE", "on")
    archive = ClassArchive.for_this_machine()
    assert archive is not None
    option = archive.java_option()
    assert option.startswith("-XX:ArchiveClassesAtExit=") and archive.writing is not None
    # A process in the JVM's place: it writes the file as it exits (when its stdin closes).
    script = f"import sys; sys.stdin.read(); open({str(archive.writing)!r}, 'wb').write(b'x' * 99)"
    proc = subprocess.Popen(
        [sys.executable, "-c", script + f"; sys.exit({code})"], stdin=subprocess.PIPE
    )
    archive.finish(_Gateway(proc))
    assert proc.returncode == code
    assert archive.path.exists() is kept
    assert not archive.writing.exists()  # renamed into place, or deleted
    if kept:
        assert archive.java_option() == f"-XX:SharedArchiveFile={archive.path}"


@pytest.mark.usefixtures("no_jvm_here")
def test_for_large_stores_or_when_asked_and_never_under_spark_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOOLMQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPOOLMQ_JVM_CACHE", raising=False)
    # By default: for a large store's run (run again and again), not a small one's.
    assert ClassArchive.for_this_machine() is None
    assert ClassArchive.for_this_machine(large=True) is not None
    monkeypatch.setenv("SPOOLMQ_JVM_CACHE", "off")
    assert ClassArchive.for_this_machine(large=True) is None
    monkeypatch.setenv("SPOOLMQ_JVM_CACHE", "maybe")
    with pytest.raises(InvalidArgumentError, match="SPOOLMQ_JVM_CACHE='maybe'"):
        ClassArchive.for_this_machine(large=True)
    monkeypatch.setenv("SPOOLMQ_JVM_CACHE", "on")
    assert ClassArchive.for_this_machine() is not None
    # spark-submit started the JVM before the job: too late for its options.
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")
    assert ClassArchive.for_this_machine(large=True) is None
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")
    # This process has a JVM already (a SparkSession it made): the job reuses it.
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_gateway", object())
    assert ClassArchive.for_this_machine(large=True) is None
