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
def spark(jvm_ops_jar: str) -> Iterator[Any]:
    """The one local[2] SparkSession of a test run (spark.jars is fixed when the JVM starts): Kafka
    connector + glasspipe's JVM operators, and the Spark settings the job requires (RocksDB state store
    with changelog checkpointing, glasspipe's checkpoint file manager), as the job runs them."""
    from glasspipe.contract import REQUIRED_SPARK_CONF
    from glasspipe_dev.spark import local_spark_session

    session = local_spark_session("glasspipe-tests", extra_jars=[jvm_ops_jar], extra_conf=REQUIRED_SPARK_CONF)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_dedup(spark: Any) -> Any:
    """The shared session (kept as a name for the dedup operator tests)."""
    return spark
