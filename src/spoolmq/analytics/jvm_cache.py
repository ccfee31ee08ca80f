"""An archive of the Spark driver JVM's classes, kept between runs (class data sharing).

A cold ``spoolmq analytics`` spends ~16 s before it reads a line, most of it loading,
verifying and linking Spark's classes in a new JVM (BENCHMARKS.md, "the start"). Java can
map the classes a previous run loaded from an archive instead (dynamic CDS, JEP 350): the
first run writes the archive as its JVM exits, later runs start from it.

Java 17 has no safe way to create the archive on demand (``-XX:+AutoCreateSharedArchive``
is Java 19+), so this module does what that option does:

- the archive's file name carries a key of what it depends on (the ``java`` binary and
  the Spark jars), so another Java or another Spark gets its own;
- a run without an archive asks its JVM to write one to a temporary name at exit, ends
  that JVM itself as the process exits (after its results are out), and renames the file
  into place only if the JVM exited normally: a run killed or failing midway leaves no
  archive behind, only a temporary file that a later run deletes once it is an hour old;
- a JVM given an archive that does not match it runs as if it had none (Java checks the
  archive's header, its JVM and its class path); a run whose JVM did not map the
  archive deletes it, so the next run writes a good one.

Only a JVM that this Python process starts for the job is concerned (local mode, or the
driver of a cluster run started with ``spoolmq analytics --master``); under
``spark-submit``, or in a process whose JVM is already running, it does not apply.

Writing the archive makes the first run's JVM take 10-30 s longer to exit on the
development machine, for 3-8 s saved per later run (BENCHMARKS.md). So by default it is
used for a large store only (analytics.session.SMALL_INPUT_BYTES or more: its user waits
longest, and runs the job again and again: the re-run over 1M messages after +1 % takes
15 s with it, 19 s without), not for a small one (a user who runs the demo once would only
pay). ``SPOOLMQ_JVM_CACHE=on`` uses it for every store, ``off`` for none.
``SPOOLMQ_CACHE`` chooses the directory (default ``$XDG_CACHE_HOME/spoolmq``, else
``~/.cache/spoolmq``; mode 0700, the archive 0600, ~190 MB).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from spoolmq.errors import InvalidArgumentError

logger = logging.getLogger("spoolmq.analytics")

# A temporary archive older than this is one a killed run left behind.
_STALE_S = 3600.0


_ON = ("on", "1", "yes", "true")
_OFF = ("off", "0", "no", "false")


def cache_dir(*, large: bool) -> Path | None:
    """Where spoolmq keeps the archive, for a run over a ``large`` store or not; None when
    the archive is not used (``SPOOLMQ_JVM_CACHE``: unset, for large stores only; ``on``,
    for all; ``off``, for none). InvalidArgumentError for another value."""
    setting = os.environ.get("SPOOLMQ_JVM_CACHE", "").strip().lower()
    if setting and setting not in _ON + _OFF:
        raise InvalidArgumentError(
            f"SPOOLMQ_JVM_CACHE={setting!r}: use on, off, or leave it unset (large stores only)"
        )
    if setting in _OFF or not (setting in _ON or large):
        return None
    if os.environ.get("SPOOLMQ_CACHE"):
        return Path(os.environ["SPOOLMQ_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spoolmq"


def _java() -> Path | None:
    """The ``java`` that spark-submit runs (JAVA_HOME first, then the PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _key() -> str | None:
    """A digest of what the archive depends on, or None if Java or Spark is not found."""
    import pyspark

    java = _java()
    jars = Path(pyspark.__file__).parent / "jars"
    if java is None or not jars.is_dir():
        return None
    parts = [pyspark.__version__, str(jars.resolve())]
    for path in (java, jars, *sorted(jars.iterdir())[:1]):
        stat = path.stat()
        parts += [str(path), str(stat.st_size), str(stat.st_mtime_ns)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


class ClassArchive:
    """The archive for this machine's Java and Spark: the JVM option for a run, and what
    to do once Spark is stopped (:meth:`finish`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writing: Path | None = None  # the temporary file this run's JVM writes

    @classmethod
    def for_this_machine(cls, *, large: bool = False) -> ClassArchive | None:
        """For a run over a ``large`` store or not (see ``cache_dir``): None when the
        archive is not used, or Java or Spark cannot be found."""
        from pyspark import SparkContext

        directory = cache_dir(large=large)
        if directory is None or "PYSPARK_GATEWAY_PORT" in os.environ:
            return None  # off, or under spark-submit: the JVM is already running
        if SparkContext._gateway is not None:
            return None  # this process has a JVM already: the session will reuse it
        key = _key()
        if key is None:
            return None
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            logger.warning("no JVM class archive: cannot create %s: %s", directory, exc)
            return None
        archive = cls(directory / f"spark-classes-{key}.jsa")
        archive._remove_stale()
        return archive

    def _remove_stale(self) -> None:
        now = time.time()
        for path in self.path.parent.glob("spark-classes-*.jsa.*.tmp"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > _STALE_S:
                    path.unlink()

    def java_option(self) -> str:
        """The driver JVM's option: use the archive, or write one at exit."""
        if self.path.exists():
            return f"-XX:SharedArchiveFile={self.path}"
        self.writing = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        # As it writes the archive the JVM warns, on its stdout, of each class it leaves
        # out (~1,000 "[warning][cds] Skipping ..." and "Pre JDK 6 class not supported"
        # lines after the job's results): of no use to the user. Its errors stay on, and
        # an archive not written is not kept (finish).
        return f"-XX:ArchiveClassesAtExit={self.writing} -Xlog:cds=error"

    def check_used(self, gateway: Any) -> None:
        """After the JVM started: an archive it did not map (damaged, or made by another
        Java that the key did not tell apart) is deleted, so the next run writes one."""
        if self.writing is not None:
            return
        proc = getattr(gateway, "proc", None)
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text() if proc is not None else None
        except OSError:
            return  # no /proc here: nothing to check
        if maps is not None and str(self.path) not in maps:
            logger.warning("the JVM did not use the class archive %s; deleting it", self.path)
            with contextlib.suppress(OSError):
                self.path.unlink()

    def finish(self, gateway: Any) -> None:
        """After ``spark.stop()``: when this run's JVM writes the archive, end that JVM
        (it writes the archive as it exits) and put the archive in place if it exited
        normally. The next SparkSession of this process starts a new JVM."""
        if self.writing is None:
            return
        proc = getattr(gateway, "proc", None)
        if proc is None:
            return
        from pyspark import SparkContext

        with contextlib.suppress(Exception):
            gateway.shutdown()
        if SparkContext._gateway is gateway:  # a later session starts a new JVM
            SparkContext._gateway = None
            SparkContext._jvm = None
        with contextlib.suppress(OSError):
            proc.stdin.close()  # the gateway JVM exits when its stdin closes
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        try:
            if code == 0 and self.writing.stat().st_size > 0:
                os.chmod(self.writing, 0o600)
                os.replace(self.writing, self.path)
                return
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self.writing.unlink()
