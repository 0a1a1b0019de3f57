"""PySpark Structured Streaming reads a real Kafka topic through the locally cached connector jars."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from glasspipe_dev.kafka import KafkaServer

pytestmark = pytest.mark.integration

N = 2000
PARTITIONS = 3


def test_structured_streaming_reads_every_record(spark: Any, kafka: KafkaServer, tmp_path: Path) -> None:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    topic = f"smoke-spark-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)
    producer = Producer(kafka.client_config())
    for i in range(N):
        producer.produce(topic, key=f"k{i}".encode(), value=f'{{"id": {i}, "name": "n{i}"}}'.encode())
        producer.poll(0)
    assert producer.flush(30) == 0

    batches: list[tuple[int, int, list[int], int]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        row = df.agg(
            F.count("*").alias("n"),
            F.sort_array(F.collect_set("partition")).alias("parts"),
            F.countDistinct("id").alias("ids"),
        ).collect()[0]
        batches.append((batch_id, row["n"], list(row["parts"]), row["ids"]))

    parsed = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select("partition", F.from_json(F.col("value").cast("string"), "id long, name string").alias("v"))
        .select("partition", "v.id")
    )
    query = (
        parsed.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "availableNow query did not finish in 180 s"
    assert query.exception() is None

    assert sum(b[1] for b in batches) == N, batches
    assert sorted({p for b in batches for p in b[2]}) == list(range(PARTITIONS)), batches
    assert sum(b[3] for b in batches) == N, batches  # every id once (batches do not overlap)
