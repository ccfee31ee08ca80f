"""Building the SparkSession: quiet, loopback-only in local mode, nothing downloaded."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from spoolmq.analytics.jvm_cache import ClassArchive

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# Below this many bytes of segment and event files, a run is a short job (build_session).
SMALL_INPUT_BYTES = 16 * 2**20
# A JVM for a short job: the JIT's quick first tier only, the single-threaded GC with a
# young generation and a class-metadata threshold that the job's start does not outgrow
# (each time it did, a collection; the metadata's a full one: ~40 pauses, 0.7 s, a run).
_SHORT_JOB_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmn256m -XX:MetaspaceSize=256m"
# The driver JVM for a large store's batch job: the throughput collector, not the default
# G1, whose concurrent threads and write barriers take CPU from the job's tasks (in local
# mode the driver runs them: 1M messages on two cores, 51 -> 45 s, see BENCHMARKS.md).
# A cluster's executors keep their own settings: measured in local mode only.
_BATCH_JOB_JVM = "-XX:+UseParallelGC"
# A re-run of a large store that reuses what earlier runs kept (analytics/kept.py) reads
# little: its ~50 short queries are compiled once each, and the JIT's optimising tier
# costs more than it gives back (1M messages + 1 %, re-run: 28 -> 22 s, BENCHMARKS.md).
# A cold run over the same store is faster with it (45 against 56 s): not for those.
_RERUN_JVM = "-XX:TieredStopAtLevel=1"
# A small store's query settings (below), for the same reason (1M messages + 1 %,
# re-run: 22 -> 19 s, BENCHMARKS.md); its GC and young generation gave nothing more.
_SHORT_QUERIES = {
    "spark.sql.codegen.wholeStage": "false",
    # Expressions, projections and orderings interpreted too, not compiled to Java classes
    # by Janino one by one (~600 classes for the demo's store: 1 s of a 16 s run). An
    # internal setting: a Spark that no longer knows it ignores it, and the interpreted
    # forms are the ones Spark itself falls back to when a compile fails.
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # No re-planning between a query's stages: with a few thousand rows it has nothing to
    # adapt to, and each stage it waits for is a Spark job of its own.
    "spark.sql.adaptive.enabled": "false",
}


def session_settings(
    *, shuffle_partitions: int = 8, small: bool = False, rerun: bool = False
) -> dict[str, str]:
    """The Spark settings build_session gives a new session (see its docstring)."""
    driver_java = f"-Dlog4j.configurationFile={LOG4J_CONFIG}"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        # A segment deleted by retention between listing and reading is not an error.
        "spark.sql.files.ignoreMissingFiles": "true",
    }
    if small or rerun:
        settings.update(_SHORT_QUERIES)
        settings["spark.sql.shuffle.partitions"] = str(min(shuffle_partitions, 2))
    if small:
        # On a cluster the executors are JVMs of their own, as short-lived as the driver.
        settings["spark.executor.extraJavaOptions"] = _SHORT_JOB_JVM
        driver_java += f" {_SHORT_JOB_JVM}"
    else:
        driver_java += f" {_BATCH_JOB_JVM}"
        if rerun:
            driver_java += f" {_RERUN_JVM}"
    settings["spark.driver.extraJavaOptions"] = driver_java
    return settings


def build_session(
    master: str | None,
    *,
    app_name: str = "spoolmq-analytics",
    shuffle_partitions: int = 8,
    small: bool = False,
    rerun: bool = False,
    class_archive: ClassArchive | None = None,
) -> SparkSession:
    """A SparkSession for the job (or the tests).

    ``master`` None keeps what ``spark-submit`` configured (or Spark's default). In local
    mode Spark binds to the loopback address only. Executors never start Python (the job
    uses only Spark's built-in functions), so no ``PYSPARK_PYTHON`` is set for them.
    No ``spark.jars.packages``: the job needs nothing that is not in pyspark.

    ``small`` tunes new JVMs (the driver's and, on a cluster, the executors') for a short
    job over a small store (SMALL_INPUT_BYTES), where fixed costs, not the data, take the
    time: ~25 queries each compiled to Java bytecode (whole-stage code generation, and a class
    per projection or ordering) and then JIT-compiled, for a few thousand rows. Then the
    queries and their expressions are interpreted, the JIT stops
    at its quick first tier, the GC is the single-threaded one, and shuffles have 2
    partitions. A large store keeps Spark's defaults, where generated and fully optimised
    code pays for itself, but the driver's JVM (in local mode, the one that runs the
    tasks) uses the throughput garbage collector.

    ``rerun`` (a large store whose run will reuse what earlier runs kept, and parse
    little): the driver's JIT stops at its quick first tier, and the queries are
    interpreted, with 2 shuffle partitions, as for a small store.

    ``class_archive``: the driver JVM starts from it, or writes it (``jvm_cache``; the
    caller calls its ``finish`` after stopping the session).
    """
    local = master is None or master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # The JVM started below inherits this: glibc's per-thread malloc arenas otherwise
        # let its native memory (outside the 1 GiB heap) grow past another GiB.
        os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = session_settings(shuffle_partitions=shuffle_partitions, small=small, rerun=rerun)
    if class_archive is not None:
        settings["spark.driver.extraJavaOptions"] += " " + class_archive.java_option()
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if class_archive is not None:
        class_archive.check_used(SparkContext._gateway)
    # Under spark-submit the JVM started before the options above: quiet it from here on.
    session.sparkContext.setLogLevel("ERROR")
    return session
