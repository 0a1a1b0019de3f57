"""Session-scoped local SparkSession with glasspipe's JVM operators jar (wired in via pytest_plugins).

The jar is (re)built by dev/install/jvm-ops.sh, which is idempotent and takes well under a second
when cached, so a test run never uses a jar older than the Java sources. Only one SparkSession can
run per process and spark.jars is fixed at start-up: if the lead's shared Spark fixture starts the
session, it must put jvm_ops_jar() on spark.jars too (next to the Kafka connector jars).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
INSTALL = REPO / "dev" / "install" / "jvm-ops.sh"


@pytest.fixture(scope="session")
def jvm_ops_jar() -> str:
    """Path of the freshly built operators jar (fails loudly if it cannot be built)."""
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"{INSTALL} failed:\n{done.stderr}", pytrace=False)
    from glasspipe_job.jvm import jvm_ops_jar as find_jar

    return find_jar()


@pytest.fixture(scope="session")
def spark_dedup(jvm_ops_jar: str) -> Iterator[Any]:
    """local[2] Spark with the RocksDB state store + changelog checkpointing, as the job runs it."""
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        spark = SparkSession.getActiveSession()
        assert spark is not None
        jars = spark.sparkContext.getConf().get("spark.jars", "")
        if jvm_ops_jar not in jars:
            pytest.fail(f"a SparkSession is already running without {jvm_ops_jar} on spark.jars")
        yield spark
        return
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("glasspipe-it-dedup")
        .config("spark.jars", jvm_ops_jar)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        yield spark
    finally:
        spark.stop()
