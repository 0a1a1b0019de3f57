"""Session fixtures for a real Kafka broker and Spark's Kafka connector jars (wired in via pytest_plugins).

Kafka's jars come from dev/install/kafka.sh, the connector's from dev/install/spark-jars.sh. A missing
install fails the run loudly (never a skip): integration tests must talk to the real thing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.paths import NotInstalledError
from glasspipe_dev.spark import spark_jars as find_spark_jars
from server_fixture import started_server


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaServer]:
    """A started single-node KRaft Kafka on free loopback ports with a temporary data folder."""
    yield from started_server(KafkaServer, "Kafka")


@pytest.fixture(scope="session")
def spark_jars() -> list[str]:
    """Absolute paths of the spark-sql-kafka connector jars for the installed pyspark (for spark.jars)."""
    try:
        return find_spark_jars()
    except NotInstalledError as e:
        pytest.fail(f"Spark Kafka connector not installed: {e}", pytrace=False)
