"""One local SparkSession for every analytics test (the JVM takes seconds to start)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from analytics_helpers import need


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    need("java", "openjdk-17-jre-headless")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from spoolmq.analytics.session import build_session

    # The job's own session settings (quiet log4j2.properties from the repo, UI off, no
    # downloads), on one core with one shuffle partition: small inputs, quick tests.
    session = build_session("local[1]", app_name="spoolmq-tests", shuffle_partitions=1)
    assert session.conf.get("spark.ui.enabled") == "false"
    yield session
    session.stop()
