"""The real Kafka broker from dev/ takes writes on every partition and gives them all back."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer

from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import consume_all, produce

pytestmark = pytest.mark.integration

N = 3000
PARTITIONS = 3


def test_produce_and_consume_every_partition(kafka: KafkaServer) -> None:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, PARTITIONS)

    producer = Producer({**kafka.client_config(), "enable.idempotence": True, "linger.ms": 5})
    for i in range(N):
        producer.produce(topic, key=f"k{i}".encode(), value=f'{{"i": {i}}}'.encode())
        producer.poll(0)
    assert producer.flush(30) == 0, "producer did not deliver everything"

    consumer = Consumer(
        {
            **kafka.client_config(),
            "group.id": f"smoke-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: dict[int, int] = {}
    values: set[bytes] = set()
    deadline = time.monotonic() + 60
    try:
        while len(values) < N and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                assert msg.error() is None, msg.error()
                partition, value = msg.partition(), msg.value()
                assert partition is not None and value is not None
                seen[partition] = seen.get(partition, 0) + 1
                values.add(value)
    finally:
        consumer.close()

    assert len(values) == N
    assert sum(seen.values()) == N  # no duplicates either
    assert sorted(seen) == list(range(PARTITIONS)), f"partitions used: {seen}"


def test_a_record_the_broker_did_not_take_fails_produce(kafka: KafkaServer) -> None:
    """The tests' produce helper: a record for a partition the topic does not have is refused, not dropped with a
    clean flush (which counts only the records still queued)."""
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    with pytest.raises(RuntimeError, match=r"1 of 2 records were not delivered \(0 still queued after 60 s; the "
                                           r"first failure: smoke-\w+ partition 3: "):
        produce(kafka.bootstrap, topic, [(b"a", b"1"), (b"b", b"2")], partition_of=lambda key: 3 if key == b"b" else 0)


def test_partitions_added_are_served_when_add_partitions_returns(kafka: KafkaServer) -> None:
    """A producer started right after the topic grew writes to its new partitions, every record."""
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1)
    kafka.add_partitions(topic, 3)
    assert produce(kafka.bootstrap, topic, [(f"k{i}".encode(), b"v") for i in range(30)],
                   partition_of=lambda key: int(key[1:]) % 3) == 30
    got = consume_all(kafka.bootstrap, topic, 30, timeout=30)
    assert sorted(m.partition() for m in got) == sorted(i % 3 for i in range(30))
