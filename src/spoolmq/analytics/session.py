"""Building the SparkSession: quiet, loopback-only in local mode, nothing downloaded."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def build_session(
    master: str | None, *, app_name: str = "spoolmq-analytics", shuffle_partitions: int = 8
) -> SparkSession:
    """A SparkSession for the job (or the tests).

    ``master`` None keeps what ``spark-submit`` configured (or Spark's default). In local
    mode Spark binds to the loopback address only, and executors run this interpreter.
    No ``spark.jars.packages``: the job needs nothing that is not in pyspark.
    """
    local = master is None or master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # The JVM started below inherits this: glibc's per-thread malloc arenas otherwise
        # let its native memory (outside the 1 GiB heap) grow past another GiB.
        os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    session = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        # A segment deleted by retention between listing and reading is not an error.
        .config("spark.sql.files.ignoreMissingFiles", "true")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile={LOG4J_CONFIG}")
        .getOrCreate()
    )
    # Under spark-submit the JVM started before the options above: quiet it from here on.
    session.sparkContext.setLogLevel("ERROR")
    return session
