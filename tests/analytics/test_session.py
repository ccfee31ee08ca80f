"""The settings a new SparkSession gets: a short-job JVM for small stores, on the driver and
on a cluster's executors alike, and Spark's defaults with the throughput GC on the driver
for large ones (and that the driver JVM really runs with it)."""

from __future__ import annotations

from typing import Any

import pytest

from spoolmq.analytics.session import LOG4J_CONFIG, session_settings


def test_a_small_store_gets_short_job_jvms_for_the_driver_and_the_executors() -> None:
    settings = session_settings(small=True)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert "-XX:TieredStopAtLevel=1" in settings[key].split()
        assert "-XX:+UseSerialGC" in settings[key].split()
    assert settings["spark.sql.codegen.wholeStage"] == "false"
    assert settings["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    assert settings["spark.sql.adaptive.enabled"] == "false"
    assert settings["spark.sql.shuffle.partitions"] == "2"
    assert f"-Dlog4j.configurationFile={LOG4J_CONFIG}" in settings["spark.driver.extraJavaOptions"]


def test_a_large_store_keeps_the_jit_and_code_generation_with_the_throughput_gc() -> None:
    settings = session_settings(shuffle_partitions=8)
    assert settings["spark.driver.extraJavaOptions"].split() == [
        f"-Dlog4j.configurationFile={LOG4J_CONFIG}",
        "-XX:+UseParallelGC",
    ]
    assert "spark.executor.extraJavaOptions" not in settings  # a cluster's, left alone
    assert "spark.sql.codegen.wholeStage" not in settings
    assert "spark.sql.codegen.factoryMode" not in settings
    assert "spark.sql.adaptive.enabled" not in settings
    assert settings["spark.sql.shuffle.partitions"] == "8"
    assert (settings["spark.ui.enabled"], settings["spark.sql.session.timeZone"]) == (
        "false",
        "UTC",
    )


def test_a_large_store_rerun_stops_the_driver_jit_at_its_first_tier_and_interprets() -> None:
    rerun = session_settings(rerun=True)
    assert rerun["spark.driver.extraJavaOptions"].split()[1:] == [
        "-XX:+UseParallelGC",
        "-XX:TieredStopAtLevel=1",
    ]
    assert "spark.executor.extraJavaOptions" not in rerun
    # Its queries are short ones too: interpreted, no adaptive re-planning, 2 partitions.
    assert rerun["spark.sql.codegen.wholeStage"] == "false"
    assert rerun["spark.sql.codegen.factoryMode"] == "NO_CODEGEN"
    assert rerun["spark.sql.adaptive.enabled"] == "false"
    assert rerun["spark.sql.shuffle.partitions"] == "2"
    # A small store's short-job JVM already stops there; it gets it once.
    small = session_settings(small=True, rerun=True)["spark.driver.extraJavaOptions"].split()
    assert small.count("-XX:TieredStopAtLevel=1") == 1


@pytest.mark.spark
def test_the_driver_jvm_of_a_large_store_collects_with_the_throughput_gc(spark: Any) -> None:
    """The option reaches the JVM that pyspark starts (the shared session is built with the
    large-store settings): its collectors are the Parallel GC's, not G1's."""
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    names = {bean.getName() for bean in beans.getGarbageCollectorMXBeans()}
    assert names == {"PS Scavenge", "PS MarkSweep"}
