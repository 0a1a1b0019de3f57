"""How the job's Kafka read cuts a micro-batch into Spark tasks (transform.read_kafka), on a real Kafka and Spark.

A pipeline whose rows reach the sink without a shuffle is read in parts of at most an eighth of its batch bound:
those parts are what the driver holds at once. A join or Spark's deduplication hashes the rows into
spark.shufflePartitions partitions, which are what reaches the driver, so there a Kafka range is read whole and
only a topic with fewer partitions than that, or a hot partition's range, is split (each split is one more task
and its fixed costs).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import load_example, produce
from glasspipe_job.config import JobConfig, config_from_resource, load_job_config

pytestmark = pytest.mark.integration

RECORDS = 800
BOUND = 800  # kafka.maxOffsetsPerTrigger: one batch; an eighth is 100


def _config(example: str, source: str, bootstrap: str, topic: str, dedup: bool = True,
            shuffle_partitions: int | None = None) -> JobConfig:
    doc = load_example(example)
    if shuffle_partitions is not None:
        doc["spec"].setdefault("spark", {})["shufflePartitions"] = shuffle_partitions
    for s in doc["spec"]["sources"]:
        s["kafka"].update(bootstrapServers=bootstrap, maxOffsetsPerTrigger=BOUND)
        if s["name"] == source:
            s["kafka"]["topic"] = topic
            if not dedup:
                s.pop("deduplication", None)
    return load_job_config(config_from_resource(doc, 0, 1))


def _rows_per_task(spark: Any, config: JobConfig, source: str, checkpoint: Path) -> list[int]:
    """The rows of each Spark partition of the source's first micro-batch, as read_kafka reads it."""
    from pyspark.sql import functions as F

    from glasspipe_job.transform import read_kafka

    counts: list[int] = []

    def batch(df: Any, _batch_id: int) -> None:
        rows = df.groupBy(F.spark_partition_id().alias("p")).count().collect()
        counts.extend(sorted(r["count"] for r in rows))

    raw = read_kafka(spark, config, config.spec.source(source), None, None, 1 << 30)
    query = (raw.writeStream.foreachBatch(batch).trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    query.awaitTermination(120)
    assert not query.isActive, "the query did not finish its one batch"
    return counts


@pytest.fixture(scope="module")
def topics(kafka: KafkaServer) -> dict[int, str]:
    """A topic of one partition and one of four, RECORDS records each (keyed, spread evenly over the four)."""
    names = {}
    for partitions in (1, 4):
        name = f"split-{partitions}-{uuid.uuid4().hex[:8]}"
        kafka.create_topic(name, partitions)
        produce(kafka.bootstrap, name, [(f"{i}".encode(), b'{"sms_id":"x"}') for i in range(RECORDS)],
                partition_of=lambda key, n=partitions: int(key) % n)
        names[partitions] = name
    return names


def test_a_pipeline_without_a_shuffle_reads_a_range_in_eighths_of_its_bound(
    spark: Any, kafka: KafkaServer, topics: dict[int, str], tmp_path: Path
) -> None:
    config = _config("sms-dedup.yaml", "sms", kafka.bootstrap, topics[1], dedup=False)
    assert _rows_per_task(spark, config, "sms", tmp_path) == [100] * 8


def test_deduplication_reads_a_range_whole_and_splits_only_below_the_shuffle_partitions(
    spark: Any, kafka: KafkaServer, topics: dict[int, str], tmp_path: Path
) -> None:
    one = _config("sms-dedup.yaml", "sms", kafka.bootstrap, topics[1])
    assert one.spec.spark.shuffle_partitions == 2
    assert _rows_per_task(spark, one, "sms", tmp_path / "one") == [400, 400]
    four = _config("sms-dedup.yaml", "sms", kafka.bootstrap, topics[4])
    assert _rows_per_task(spark, four, "sms", tmp_path / "four") == [200] * 4


def test_a_whole_batch_on_one_partition_is_read_by_as_many_tasks_as_shuffle_partitions(
    spark: Any, kafka: KafkaServer, topics: dict[int, str], tmp_path: Path
) -> None:
    """4 shuffle partitions: the range of 800 is over a share and a tenth (220), so it is split into 4 parts, not
    into 3 that Spark's minPartitions would round to 3 tasks."""
    config = _config("sms-dedup.yaml", "sms", kafka.bootstrap, topics[1], shuffle_partitions=4)
    assert config.spec.spark.shuffle_partitions == 4
    assert _rows_per_task(spark, config, "sms", tmp_path) == [200] * 4


def test_a_join_side_without_deduplication_reads_a_range_whole(
    spark: Any, kafka: KafkaServer, topics: dict[int, str], tmp_path: Path
) -> None:
    config = _config("orders-users-join.yaml", "orders", kafka.bootstrap, topics[4])
    assert config.spec.source("orders").deduplication is None
    assert _rows_per_task(spark, config, "orders", tmp_path) == [200] * 4


def test_a_hot_partitions_range_is_split_so_that_both_cores_read_it(
    spark: Any, kafka: KafkaServer, tmp_path: Path
) -> None:
    """720 of the batch's 800 records on one of two partitions: more than a share of a full batch for 2 shuffle
    partitions and a tenth (440), so that range is read by two tasks; the other stays whole."""
    topic = f"split-hot-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    produce(kafka.bootstrap, topic, [(f"{i}".encode(), b'{"sms_id":"x"}') for i in range(RECORDS)],
            partition_of=lambda key: 0 if int(key) % 10 < 9 else 1)
    config = _config("sms-dedup.yaml", "sms", kafka.bootstrap, topic)
    assert _rows_per_task(spark, config, "sms", tmp_path) == [80, 360, 360]
