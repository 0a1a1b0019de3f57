"""Catch-up in bounded memory (issue #14): a backlog several times larger than one micro-batch, wide records and
a small driver heap. Before the fix each whole micro-batch (a fixed 200,000 records) was gathered in the driver
and the job ran out of memory on its first batch; now the bound follows the heap and a batch reaches the
driver one Spark partition at a time.

The size can be raised for a manual run (GLASSPIPE_CATCHUP_RECORDS, GLASSPIPE_CATCHUP_WIDTH); the CI default
is 3.3 batches of the bound a 512m driver gets (65,536 records), ~215 MB."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import (
    consume_all,
    dumps,
    load_example,
    produce,
    run_to_end,
    sms_dedup_pipeline,
    totals,
    write_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar", "spark_jars")]
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
RECORDS = int(os.environ.get("GLASSPIPE_CATCHUP_RECORDS", "216000"))
WIDTH = int(os.environ.get("GLASSPIPE_CATCHUP_WIDTH", "1000"))  # bytes of the wide field per record
DRIVER_MEMORY = os.environ.get("GLASSPIPE_CATCHUP_DRIVER_MEMORY", "512m")
POOL_RUN = str(Path(__file__).with_name("fetched_data_pool_run.py"))  # glasspipe run, then the reader's pool


def backlog(n: int, width: int) -> tuple[list[tuple[bytes, bytes]], int, int, set[bytes]]:
    """(records, rows expected, duplicates, keys of the malformed ones): every 10th record repeats the key
    before it (a duplicate), every 1000th is not JSON (a dead letter); event times rise 10 ms a record."""
    pad = "x" * width
    records: list[tuple[bytes, bytes]] = []
    rows = dups = 0
    bad: set[bytes] = set()
    for i in range(n):
        at = T0 + timedelta(milliseconds=10 * i)
        if i % 1000 == 999:
            key = f"bad-{i}".encode()
            records.append((key, b"{not json " + pad.encode()))
            bad.add(key)
            continue
        if i % 10 == 9:
            sms_id, dups = f"id-{i - 1:07d}", dups + 1
        else:
            sms_id, rows = f"id-{i:07d}", rows + 1
        doc = {"sms_id": sms_id, "status": pad, "phone": f"+{i}", "meta": {"provider": "p"}, "sent_at": at.isoformat()}
        records.append((sms_id.encode(), dumps(doc)))
    return records, rows, dups, bad


def test_catch_up_of_a_backlog_of_many_batches_with_a_small_driver_is_exact(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, table = f"catchup-{suffix}", f"catchup_{suffix}"
    kafka.create_topic(topic, 1)  # one Kafka partition: without splitting, a batch would be one Spark partition
    kafka.create_topic(f"{topic}-dlq", 1)
    doc = load_example("sms-dedup.yaml")
    doc["metadata"]["name"] = f"catchup-{suffix}"
    spec = doc["spec"]
    spec["sources"][0]["kafka"]["topic"] = topic
    spec["sources"][0]["kafka"].pop("maxOffsetsPerTrigger", None)  # the default: derived from the driver heap
    spec["sink"]["clickhouse"]["table"] = table
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    path = write_pipeline(doc, tmp_path)

    records, rows, dups, bad = backlog(RECORDS, WIDTH)
    started = time.monotonic()
    produce(kafka.bootstrap, topic, records)
    megabytes = sum(len(v) for _k, v in records) / 1e6
    del records
    produced = time.monotonic() - started

    monkeypatch.setenv("GLASSPIPE_DRIVER_MEMORY", DRIVER_MEMORY)
    started = time.monotonic()
    done = run_to_end(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt", timeout=900)
    elapsed = time.monotonic() - started
    summary = totals(done.stdout)
    bound = re.search(r"at most (\d+) records per micro-batch \(driver max heap (\d+) MiB", done.stderr)
    print(f"catch-up of {RECORDS} records ({megabytes:.0f} MB, produced in {produced:.0f} s), driver "
          f"{DRIVER_MEMORY}: {summary} in {elapsed:.1f} s; bound {bound and bound.group(0)}")
    print("\n".join(line for line in done.stderr.splitlines() if re.search(r"batch \d+: ", line)))
    assert bound is not None, done.stderr[-3000:]
    per_batch = int(bound.group(1))
    assert per_batch * 3 < RECORDS, f"the backlog must be several batches: {per_batch} per batch"
    batches = int(re.search(r"glasspipe run: (\d+) batches", summary).group(1))  # type: ignore[union-attr]
    assert batches >= RECORDS // per_batch, summary

    got = clickhouse.client().execute(f"SELECT count(), uniqExact(sms_id), min(length(status)) FROM {table}")[0]
    assert got == (rows, rows, WIDTH)
    assert f"duplicates dropped {dups}," in summary and f"rows written {rows}," in summary, summary
    assert f"dead-lettered {len(bad)} {{'malformed_json': {len(bad)}}}" in summary, summary
    dead = consume_all(kafka.bootstrap, f"{topic}-dlq", expected=len(bad) + 1, timeout=20)
    assert len(dead) == len(bad)
    assert {m.key() for m in dead} == bad  # a dead letter keeps the record's Kafka key


def test_the_kafka_readers_pool_lets_go_of_a_split_batchs_records(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Issue #15: a batch whose Kafka ranges are split (maxRecordsPerPartition, a bounded batch's eighth, in a
    pipeline without a shuffle) leaves a poll's records (up to kafka.max.poll.records) in Spark's pool of fetched
    data for each range, and Spark keeps an idle entry 5 minutes, with no bound: catching up, a join's driver (its
    ranges were split then too) ran out of heap. The job's settings (contract.REQUIRED_SPARK_CONF) let the pool
    evict an idle entry after seconds; with Spark's defaults this run's entries would all still be held."""
    suffix = uuid.uuid4().hex[:8]
    topic = f"pool-{suffix}"
    kafka.create_topic(topic, 2)
    kafka.create_topic(f"{topic}-dlq", 1)
    # without deduplication: a pipeline with no shuffle is the one whose ranges are split (transform.read_kafka)
    path = sms_dedup_pipeline(tmp_path, f"pool-{suffix}", topic, max_rows=100_000, max_offsets=4_000, dedup=False)
    records, rows, dups, _bad = backlog(20_000, 100)
    produce(kafka.bootstrap, topic, records)
    done = run_to_end(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt", timeout=600,
                      launcher=(sys.executable, POOL_RUN, "--linger", "10"))
    summary = totals(done.stdout)
    assert f"rows written {rows + dups}," in summary, summary
    pool = re.search(r"fetched-data pool: created (\d+), held (\d+)", done.stdout)
    assert pool is not None, done.stdout[-2000:]
    created, held = int(pool.group(1)), int(pool.group(2))
    # 5 batches of 2 Kafka partitions, each range split in 4: far more entries than partitions
    assert created > 4 * 2, (created, summary)
    assert held == 0, f"{held} of {created} fetched-data entries still held 10 s after the run"
