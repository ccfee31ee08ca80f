"""The settings a new SparkSession gets (no JVM needed): a short-job JVM for small stores,
on the driver and on a cluster's executors alike, and Spark's defaults for large ones."""

from __future__ import annotations

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


def test_a_large_store_keeps_the_jit_and_whole_stage_code_generation() -> None:
    settings = session_settings(shuffle_partitions=8)
    assert settings["spark.driver.extraJavaOptions"] == f"-Dlog4j.configurationFile={LOG4J_CONFIG}"
    assert "spark.executor.extraJavaOptions" not in settings
    assert "spark.sql.codegen.wholeStage" not in settings
    assert "spark.sql.codegen.factoryMode" not in settings
    assert "spark.sql.adaptive.enabled" not in settings
    assert settings["spark.sql.shuffle.partitions"] == "8"
    assert (settings["spark.ui.enabled"], settings["spark.sql.session.timeZone"]) == (
        "false",
        "UTC",
    )
