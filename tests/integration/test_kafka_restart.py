"""Issue #14: Kafka stopped for 30 s in the middle of a stream and started again. The running job
must ride it out: exact rows in ClickHouse, exact dead letters, the consumer group's lag back to 0.

The broker here is this test's own (a restart would disturb the session's shared one)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import (
    consume_all,
    dumps,
    group_lag,
    load_example,
    produce,
    start_continuous,
    write_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar", "spark_jars")]
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[KafkaServer]:
    server = KafkaServer(tmp_path / "kafka")
    try:
        server.start()
        yield server
    finally:
        server.close()


def sms(i: int, status: str = "first", seconds: float = 0.0) -> tuple[bytes, bytes]:
    key = f"k-{i:06d}"
    doc = {"sms_id": key, "status": status, "phone": "+100", "meta": {"provider": "p"},
           "sent_at": (T0 + timedelta(milliseconds=20 * i, seconds=seconds)).isoformat()}
    return key.encode(), dumps(doc)


def records(lo: int, hi: int) -> list[tuple[bytes, bytes]]:
    """Uniques lo..hi-1, every 10th repeated 2 s later (a duplicate), every 500th followed by a broken
    record (a dead letter)."""
    out: list[tuple[bytes, bytes]] = []
    for i in range(lo, hi):
        out.append(sms(i))
        if i % 10 == 0:
            out.append(sms(i, "repeat", seconds=2))
        if i % 500 == 0:
            out.append((f"bad-{i}".encode(), f"{{not json {i}".encode()))
    return out


def _count(ch: ClickHouseServer, table: str) -> int:
    try:
        return int(ch.client().execute(f"SELECT count() FROM {table}")[0][0])
    except Exception:  # the table is created by the job's first batch (or ClickHouse is busy)
        return 0


def _lag(kafka: KafkaServer, group: str, topic: str) -> int | None:
    try:
        lag = group_lag(kafka.bootstrap, group, topic)
    except Exception:
        return None
    return sum(end - committed for committed, end in lag.values())


def test_kafka_down_for_30s_mid_stream_exact_output_and_lag_back_to_0(
    tmp_path: Path, own_kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    kafka = own_kafka
    suffix = uuid.uuid4().hex[:8]
    topic, table, name = f"sms-{suffix}", f"sms_{suffix}", f"sms-{suffix}"
    kafka.create_topic(topic, 4)
    kafka.create_topic(f"{topic}-dlq", 1)
    doc = load_example("sms-dedup.yaml")
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["sources"][0]["kafka"]["topic"] = topic
    spec["sources"][0]["kafka"]["maxOffsetsPerTrigger"] = 2000
    spec["sink"]["clickhouse"]["table"] = table
    spec["sink"]["clickhouse"]["batching"].update(maxRows=2000, maxDelay="300ms")
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    path = write_pipeline(doc, tmp_path)
    uniques, before_outage = 24_000, 12_000
    produce(kafka.bootstrap, topic, records(0, before_outage))
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt",
                           tmp_path / "job.log")
    later: dict[str, Any] = {}

    def produce_rest() -> None:  # the producer keeps going as soon as the broker is back
        try:
            later["n"] = produce(kafka.bootstrap, topic, records(before_outage, uniques))
        except Exception as e:  # reported by the main thread
            later["error"] = e

    group = default_consumer_group("default", name)
    try:
        deadline = time.monotonic() + 180
        while _count(clickhouse, table) == 0 and time.monotonic() < deadline:
            assert job.alive(), job.log_tail(60)
            time.sleep(0.3)
        at_stop = _count(clickhouse, table)
        assert 0 < at_stop < before_outage, f"stop Kafka mid-stream, not at {at_stop} rows"
        kafka.stop()
        down_at = time.monotonic()
        time.sleep(30)
        assert job.alive(), f"the job gave up while Kafka was down:\n{job.log_tail(60)}"
        kafka.start()
        print(f"Kafka was down {time.monotonic() - down_at:.0f} s; rows when it stopped: {at_stop}")
        producer = threading.Thread(target=produce_rest)
        producer.start()
        producer.join(120)
        assert "error" not in later and later.get("n"), later
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert job.alive(), f"the job died after Kafka came back:\n{job.log_tail(60)}"
            if _count(clickhouse, table) >= uniques and _lag(kafka, group, topic) == 0:
                break
            time.sleep(1.0)
    finally:
        job.stop()
    rows, distinct, repeats = clickhouse.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0]
    assert (rows, distinct, repeats) == (uniques, uniques, 0), job.log_tail(60)
    lag = group_lag(kafka.bootstrap, group, topic)
    assert len(lag) == 4 and all(committed == end for committed, end in lag.values()), lag
    dead = consume_all(kafka.bootstrap, f"{topic}-dlq", expected=uniques // 500)
    values = sorted(m.value() for m in dead)
    reasons = {dict(m.headers())["glasspipe.reason"].decode() for m in dead}
    assert reasons == {"malformed_json: not a JSON object"}, reasons
    assert values == sorted(f"{{not json {i}".encode() for i in range(0, uniques, 500)), (len(values), len(set(values)))
