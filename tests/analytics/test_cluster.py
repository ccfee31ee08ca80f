"""The job on a real Spark standalone cluster (a master and a worker on loopback, started
from the pyspark package) with no Python for the executors: the same outputs as a local run.

Executors that needed Python (a Python UDF, or rows shipped from the driver as pickles)
would fail here: ``spark.pyspark.python`` points at a path that does not exist, as the
driver's virtualenv does not on a real cluster's hosts.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyspark
import pytest
from analytics_helpers import event_file, need
from pyspark.sql import SparkSession
from test_event_shapes import delivery_history

import spoolmq.analytics.job
from spoolmq import Message, Store
from spoolmq.analytics import run
from spoolmq.testing import wait_until

pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).parent
NO_PYTHON = "/nonexistent/venv/bin/python"
START_S = 120  # two JVMs starting on a busy 2-core machine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env() -> dict[str, str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(SPARK_HOME)}
    env.pop("PYSPARK_PYTHON", None)  # the test session's setting: not the cluster's
    return env


def _log_says(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and one worker (1 core) on 127.0.0.1; its master URL."""
    need("java", "openjdk-17-jre-headless")
    root = tmp_path_factory.mktemp("cluster")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    commands = {
        "master": [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(port), "--webui-port", str(_free_port()),
        ],
        "worker": [
            spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
            "--cores", "1", "--memory", "1g", "--webui-port", str(_free_port()),
            "--work-dir", str(root / "work"),
        ],
    }  # fmt: skip
    started: list[subprocess.Popen[bytes]] = []
    logs = {name: root / f"{name}.log" for name in commands}
    try:
        for name, ready in (
            ("master", "I have been elected leader"),
            ("worker", "Successfully registered with master"),
        ):
            with logs[name].open("wb") as log:
                started.append(
                    subprocess.Popen(
                        commands[name], stdout=log, stderr=subprocess.STDOUT, env=_env()
                    )
                )
            wait_until(
                lambda log=logs[name], text=ready: _log_says(log, text),  # type: ignore[misc]
                START_S,
                f"the Spark {name}",
            )
        yield url
    finally:
        for process in reversed(started):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _store(root: Path) -> Path:
    """60 records on 3 partitions and their delivery history, in both event shapes."""
    data = root / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=3)
        positions = [
            position
            for n in range(3)
            for position in store.append_batch(
                "orders", [Message({"n": n * 20 + i}, key=f"k{i % 4}") for i in range(20)]
            )
        ]
    day = data / "events" / "date=2026-11-23"
    day.mkdir(parents=True)
    (day / "1-1.jsonl").write_bytes(event_file(delivery_history(positions), "mixed"))
    return data


def _tables(spark: SparkSession, out: Path) -> dict[str, list[str]]:
    return {
        path.name: sorted(map(repr, spark.read.parquet(str(path)).collect()))
        for path in sorted((out / "tables").iterdir())
    }


# Four JVMs (master, worker, driver, executor) start on a busy 2-core machine.
@pytest.mark.timeout(1200)
def test_the_readme_spark_submit_on_a_cluster_without_python_gives_the_local_outputs(
    spark: SparkSession, cluster: str, tmp_path: Path
) -> None:
    data = _store(tmp_path)
    local = run(spark, data, tmp_path / "local").summary
    submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or str(
        SPARK_HOME / "bin" / "spark-submit"
    )
    job = Path(spoolmq.analytics.job.__file__)
    log4j = job.with_name("log4j2.properties")
    completed = subprocess.run(
        [
            submit, "--master", cluster,
            "--driver-java-options", f"-Dlog4j.configurationFile={log4j}",
            "--conf", f"spark.pyspark.python={NO_PYTHON}",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            "--executor-memory", "512m", "--total-executor-cores", "1",
            str(job), "--data", str(data), "--out", str(tmp_path / "cluster"),
        ],
        capture_output=True,
        timeout=600,
        check=False,
        env=_env(),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr.decode()[-4000:]
    on_cluster: dict[str, Any] = orjson.loads((tmp_path / "cluster" / "summary.json").read_bytes())
    assert on_cluster == local
    assert local["topics"]["orders"]["messages"] == 60  # something was compared
    assert _tables(spark, tmp_path / "cluster") == _tables(spark, tmp_path / "local")
