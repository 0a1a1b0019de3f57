"""The streaming job end to end on real Kafka, Spark and ClickHouse: dedup, dead letters, offsets,
exactly-once across SIGKILLs and a ClickHouse outage."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.crashes import kill_mid_stream
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import (
    consume_all,
    dumps,
    group_lag,
    load_example,
    produce,
    run_to_end,
    start_continuous,
    total_of,
    totals,
    write_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar", "spark_jars")]
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)


def sms(sms_id: str, status: str, at: datetime, **extra: Any) -> tuple[bytes, bytes]:
    doc = {"sms_id": sms_id, "status": status, "phone": "+100", "meta": {"provider": "p"}, "sent_at": at.isoformat()}
    doc.update(extra)
    return sms_id.encode(), dumps(doc)


# The three deduplication engines: transformWithState across partitions (the default), glasspipe's own state after
# the shuffle by key (deduplication.ownState) and per Kafka partition (deduplication.perKafkaPartition; the records
# of these tests are keyed by sms_id, so the topic is partitioned by the deduplication key).
ENGINES = pytest.mark.parametrize("engine", ["by-key", "own-state", "per-kafka-partition"])


def pipeline(tmp_path: Path, kafka: KafkaServer, partitions: int = 4, max_per_trigger: int | None = None,
             engine: str = "by-key", **batching: Any) -> tuple[Path, str, str]:
    """The sms-dedup example on fresh topics and a fresh table; returns (file, topic, table)."""
    suffix = uuid.uuid4().hex[:8]
    topic, table = f"sms-{suffix}", f"sms_{suffix}"
    kafka.create_topic(topic, partitions)
    kafka.create_topic(f"{topic}-dlq", 1)
    doc = load_example("sms-dedup.yaml")
    doc["metadata"]["name"] = f"sms-{suffix}"
    spec = doc["spec"]
    spec["sources"][0]["kafka"]["topic"] = topic
    if engine == "per-kafka-partition":
        spec["sources"][0]["deduplication"]["perKafkaPartition"] = True
    elif engine == "own-state":
        spec["sources"][0]["deduplication"]["ownState"] = True
    if max_per_trigger:
        spec["sources"][0]["kafka"]["maxOffsetsPerTrigger"] = max_per_trigger
    spec["sink"]["clickhouse"]["table"] = table
    spec["sink"]["clickhouse"]["batching"].update(batching)
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    return write_pipeline(doc, tmp_path), topic, table


def run(path: Path, kafka: KafkaServer, ch: ClickHouseServer, checkpoint: Path, *extra: str) -> str:
    return totals(run_to_end(path, kafka.bootstrap, f"127.0.0.1:{ch.port}", checkpoint, *extra).stdout)


@ENGINES
def test_100k_events_with_20_percent_duplicates_land_exactly_once(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, engine: str
) -> None:
    path, topic, table = pipeline(tmp_path, kafka, engine=engine)
    rng = random.Random(1)
    uniques = 80_000
    records = [sms(f"id-{i:06d}", "first", T0 + timedelta(milliseconds=5 * i)) for i in range(uniques)]
    for _ in range(20_000):  # repeats with another payload, 1-120 s later: inside the 5 m window
        i = rng.randrange(uniques)
        records.append(sms(f"id-{i:06d}", "repeat", T0 + timedelta(milliseconds=5 * i, seconds=rng.randint(1, 120))))
    produce(kafka.bootstrap, topic, records)
    started = time.monotonic()
    summary = run(path, kafka, clickhouse, tmp_path / "ckpt")
    elapsed = time.monotonic() - started
    print(f"100k events: {summary} in {elapsed:.1f} s")
    rows, distinct, repeats = clickhouse.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0]
    assert (rows, distinct, repeats) == (uniques, uniques, 0)
    assert "duplicates dropped 20000" in summary and "rows written 80000" in summary
    assert "records in 100000," in summary, summary
    # the consumer group's committed offsets reach the end of every partition
    lag = group_lag(kafka.bootstrap, default_consumer_group("default", f"sms-{table[4:]}"), topic)
    assert len(lag) == 4 and all(committed == end for committed, end in lag.values()), lag
    # a second run finds nothing new and writes nothing twice
    again = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "rows written 0" in again, again
    assert clickhouse.client().execute(f"SELECT count() FROM {table}")[0][0] == uniques


@ENGINES
def test_window_expiry_accepts_a_key_again(tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer,
                                          engine: str) -> None:
    path, topic, table = pipeline(tmp_path, kafka, partitions=1, engine=engine)
    produce(kafka.bootstrap, topic, [
        sms("a", "first", T0),
        sms("a", "inside", T0 + timedelta(minutes=4, seconds=59)),  # < 5 m after the first: dropped
        sms("b", "first", T0 + timedelta(minutes=1)),
        sms("a", "after", T0 + timedelta(minutes=5, seconds=1)),   # window passed: written, new window
        sms("a", "inside-2", T0 + timedelta(minutes=7)),            # inside the new window: dropped
    ])
    run(path, kafka, clickhouse, tmp_path / "ckpt")
    # Later, another run from the same checkpoint. The watermark is T0+6m (max T0+7m - 1m lateness),
    # so only a repeat at or above it can test the restored dedup state.
    produce(kafka.bootstrap, topic, [
        sms("a", "inside-3", T0 + timedelta(minutes=8)),            # a's window from 5m01s: dropped by state
        sms("b", "too-late", T0 + timedelta(minutes=5)),            # below the watermark: late
        sms("c", "first", T0 + timedelta(minutes=8)),               # new key: written
    ])
    second = run(path, kafka, clickhouse, tmp_path / "ckpt")
    # The late record is not lost with a counter: it is a dead letter with reason 'late'.
    assert ("records in 3," in second and "duplicates dropped 1," in second and "late dropped 0," in second
            and "dead-lettered 1 {" in second and "rows written 1," in second), second
    got = clickhouse.client().execute(f"SELECT sms_id, status FROM {table} ORDER BY sms_id, sent_at")
    assert got == [("a", "first"), ("a", "after"), ("b", "first"), ("c", "first")]
    [late] = consume_all(kafka.bootstrap, f"{topic}-dlq", expected=1)
    assert b"too-late" in late.value()
    assert dict(late.headers())["glasspipe.reason"].decode().startswith(
        "late: event time 2026-11-01T08:05:00.000Z is more than eventTime.allowedLateness (1m) behind")


def edit_source(path: Path, **event_time: str) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["sources"][0]["eventTime"].update(event_time)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_far_future_event_time_costs_no_later_record(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Issue #14: one record dated 2099 used to move the watermark for good, and every later record
    was dropped as late. Now it is a dead letter, and so is a broken record with a far-future time."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=2)
    future = T0.replace(year=2099)
    produce(kafka.bootstrap, topic, [
        *[sms(f"x-{i}", "first", T0 + timedelta(seconds=i)) for i in range(1000)],
        sms("y-2099", "from the future", future),
        (b"broken", dumps({"status": "no key", "sent_at": future.isoformat()})),  # dead: missing key
    ])
    first = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "rows written 1000," in first and "dead-lettered 2 {" in first, first
    produce(kafka.bootstrap, topic, [sms(f"z-{i}", "first", T0 + timedelta(seconds=1000 + i)) for i in range(1000)])
    second = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "rows written 1000," in second and "late dropped 0," in second and "dead-lettered 0 {" in second, second
    assert clickhouse.client().execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0] == (2000, 2000)
    dead = {json.loads(m.value()).get("sms_id", "broken"): dict(m.headers())["glasspipe.reason"].decode()
            for m in consume_all(kafka.bootstrap, f"{topic}-dlq", expected=2)}
    assert dead["y-2099"].startswith("event_time_in_future: 2099-11-01T08:00:00.000Z is more than "
                                      "eventTime.maxFutureSkew (1h) after the record's Kafka timestamp"), dead
    assert dead["broken"] == "missing_key: sms_id", dead


@ENGINES
def test_a_straggler_more_than_a_window_before_the_first_is_not_a_duplicate(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, engine: str
) -> None:
    """Issue #14: with allowedLateness above the window, a record of a key arriving later but more than a
    window *earlier* than the key's first occurrence is a new occurrence, not a duplicate."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=1, engine=engine)
    edit_source(path, allowedLateness="1h")  # the example's window is 5m
    produce(kafka.bootstrap, topic, [sms("a", "first", T0 + timedelta(minutes=30))])
    run(path, kafka, clickhouse, tmp_path / "ckpt")
    produce(kafka.bootstrap, topic, [
        sms("a", "20m-earlier", T0 + timedelta(minutes=10)),    # > 5m before the first, not late: written
        sms("a", "4m-earlier", T0 + timedelta(minutes=26)),     # within 5m of the first: duplicate
        sms("a", "1m-later", T0 + timedelta(minutes=31)),       # within 5m of the first: duplicate
    ])
    second = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "duplicates dropped 2," in second and "rows written 1," in second, second
    got = clickhouse.client().execute(f"SELECT status FROM {table} ORDER BY sent_at")
    assert got == [("20m-earlier",), ("first",)]
    # The straggler's own window: Spark's engine keeps only the key's later window, so a repeat of the straggler
    # is written again; glasspipe's own state remembers the straggler, so the repeat is a duplicate (semantics.md).
    produce(kafka.bootstrap, topic, [sms("a", "straggler-repeat", T0 + timedelta(minutes=12))])
    third = run(path, kafka, clickhouse, tmp_path / "ckpt")
    written = 1 if engine == "by-key" else 0
    assert f"rows written {written}," in third and f"duplicates dropped {1 - written}," in third, third


@ENGINES
def test_bad_records_go_to_the_dead_letter_topic_with_reasons(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, engine: str
) -> None:
    """Dead letters with their reasons; a filtered record is counted, neither written nor dead-lettered, and its
    event time (a day ahead) moves no watermark: the next run's records, an hour behind it, are not late."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=2, engine=engine)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["sources"][0]["filter"] = "status != 'test'"
    path.write_text(yaml.safe_dump(doc))
    good = [sms(f"ok-{i}", "sent", T0 + timedelta(seconds=i)) for i in range(10)]
    good.append(sms("f-0", "test", T0 + timedelta(days=1)))  # filtered out
    bad = [
        (b"m1", b"{not json"),
        (b"m2", b"[1, 2, 3]"),
        (b"k1", dumps({"status": "sent", "sent_at": T0.isoformat()})),                       # no sms_id
        (b"k2", dumps({"sms_id": None, "status": "sent", "sent_at": T0.isoformat()})),       # null key
        (b"t1", dumps({"sms_id": "t1", "status": "sent", "sent_at": "yesterday-ish"})),      # wrong type
        (b"e1", dumps({"sms_id": "e1", "status": "sent"})),                                  # no event time
    ]
    produce(kafka.bootstrap, topic, good + bad)
    summary = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "dead-lettered 6" in summary and "filtered 1," in summary and "records in 17," in summary, summary
    assert clickhouse.client().execute(f"SELECT count() FROM {table}")[0][0] == 10
    produce(kafka.bootstrap, topic, [sms(f"ok-{i}", "sent", T0 + timedelta(hours=23)) for i in range(10, 15)])
    again = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "rows written 5," in again and "dead-lettered 0" in again, again
    assert clickhouse.client().execute(f"SELECT count(), countIf(status = 'test') FROM {table}")[0] == (15, 0)
    dead = consume_all(kafka.bootstrap, f"{topic}-dlq", expected=6)
    assert len(dead) == 6
    by_value = {m.value(): dict(m.headers()) for m in dead}
    reasons = {v: h["glasspipe.reason"].decode() for v, h in by_value.items()}
    assert reasons[b"{not json"].startswith("malformed_json")
    assert reasons[b"[1, 2, 3]"].startswith("malformed_json")
    assert reasons[bad[2][1]] == "missing_key: sms_id"
    assert reasons[bad[3][1]] == "missing_key: sms_id"
    assert reasons[bad[4][1]].startswith("schema_mismatch")
    assert reasons[bad[5][1]] == "missing_required_field: sent_at"
    for headers in by_value.values():
        assert headers["glasspipe.source.topic"].decode() == topic
        assert int(headers["glasspipe.source.offset"]) >= 0
        assert headers["glasspipe.source.partition"] in (b"0", b"1")


def test_a_value_that_does_not_cast_to_its_column_goes_to_the_dead_letter_topic_with_its_bytes(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Rows that only fail in the writer (a required column's cast gives NULL) still carry their original
    record and topic to the dead-letter topic, though the driver only collects those of rows that may die."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=2)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["sink"]["clickhouse"]["columns"] = [
        {"name": "sms_id", "type": "String"},
        {"name": "code", "expression": "status", "type": "Int32"},
        {"name": "sent_at", "type": "DateTime"},
    ]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    numeric = [sms(f"n-{i}", "200", T0 + timedelta(seconds=i)) for i in range(5)]
    words = [sms(f"w-{i}", "sent", T0 + timedelta(seconds=i)) for i in range(3)]
    produce(kafka.bootstrap, topic, numeric + words)
    summary = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "dead-lettered 3" in summary, summary
    assert clickhouse.client().execute(f"SELECT count(), sum(code) FROM {table}")[0] == (5, 1000)
    dead = consume_all(kafka.bootstrap, f"{topic}-dlq", expected=3)
    assert sorted(m.value() for m in dead) == sorted(v for _, v in words)
    for m in dead:
        headers = dict(m.headers())
        assert headers["glasspipe.reason"] == b"cast_failed: column code got no value"
        assert headers["glasspipe.source.topic"].decode() == topic


@ENGINES
def test_sigkill_at_random_moments_loses_and_doubles_nothing(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, engine: str
) -> None:
    # In own state a batch takes less time: smaller batches keep the stream long enough for the kills, in several
    # INSERT chunks each (a replayed batch's chunks must hold the rows they held before the kill).
    own = engine != "by-key"
    path, topic, table = pipeline(tmp_path, kafka, max_per_trigger=400 if own else 1500,
                                  engine=engine, maxRows=100 if own else 1000, maxDelay="200ms")
    rng = random.Random(5)
    uniques = 30_000
    records = [sms(f"c-{i:06d}", "first", T0 + timedelta(milliseconds=20 * i)) for i in range(uniques)]
    for _ in range(6_000):
        i = rng.randrange(uniques)
        records.append(sms(f"c-{i:06d}", "repeat", T0 + timedelta(milliseconds=20 * i, seconds=3)))
    produce(kafka.bootstrap, topic, records)
    ckpt = tmp_path / "ckpt"
    counts = kill_mid_stream(
        lambda: start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", ckpt, tmp_path / "job.log"),
        lambda: _count(clickhouse, table), rng, uniques)
    summary = run(path, kafka, clickhouse, ckpt)  # restart once more and drain
    rows, distinct, repeats = clickhouse.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0]
    print(f"rows after each kill: {counts}, final: {summary}")
    assert (rows, distinct, repeats) == (uniques, uniques, 0)


def _count(ch: ClickHouseServer, table: str) -> int:
    try:
        return int(ch.client().execute(f"SELECT count() FROM {table}")[0][0])
    except Exception:  # the table is created by the job's first batch
        return 0


def test_clickhouse_down_for_30s_mid_run(tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer) -> None:
    path, topic, table = pipeline(tmp_path, kafka, max_per_trigger=2000, maxRows=2000, maxDelay="200ms")
    uniques = 20_000
    produce(kafka.bootstrap, topic, [sms(f"d-{i:06d}", "first", T0 + timedelta(milliseconds=50 * i))
                                     for i in range(uniques)])
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt",
                           tmp_path / "job.log")
    try:
        deadline = time.monotonic() + 120
        while _count(clickhouse, table) == 0 and time.monotonic() < deadline:
            assert job.alive(), job.log_tail(60)
            time.sleep(0.3)
        clickhouse.stop()
        down_at = time.monotonic()
        time.sleep(30)
        assert job.alive(), f"the job gave up while ClickHouse was down:\n{job.log_tail(60)}"
        clickhouse.start()
        print(f"ClickHouse was down {time.monotonic() - down_at:.0f} s")
        deadline = time.monotonic() + 180
        while _count(clickhouse, table) < uniques and time.monotonic() < deadline:
            assert job.alive(), job.log_tail(60)
            time.sleep(0.5)
    finally:
        job.stop()
        if not clickhouse.running():
            clickhouse.start()
    rows, distinct = clickhouse.client().execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0]
    assert (rows, distinct) == (uniques, uniques)


@pytest.mark.parametrize("engine", ["by-key", "own-state"])
def test_a_key_in_two_partitions_is_reported(tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer,
                                             engine: str) -> None:
    """Both engines that bring a key's records together deduplicate it across partitions, and count it."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=2, engine=engine)
    first = [sms("x", "first", T0), sms("y", "first", T0)]
    again = [sms("x", "again", T0 + timedelta(seconds=5))]
    produce(kafka.bootstrap, topic, first, partition_of=lambda _k: 0)
    produce(kafka.bootstrap, topic, again, partition_of=lambda _k: 1)  # a producer that does not key by sms_id
    summary = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "keys in two partitions 1" in summary, summary
    assert clickhouse.client().execute(f"SELECT sms_id, status FROM {table} ORDER BY sms_id") == [
        ("x", "first"), ("y", "first")]


def test_a_hand_over_record_cut_short_sets_the_checkpoint_aside_and_stays_exact(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """A replica killed while it wrote its checkpoint's hand-over record left the file empty, and every start
    after failed on it (a CI run of the rescale test). The job now sets such a checkpoint aside and starts where
    the ledger says, its state rebuilt from the topic."""
    path, topic, table = pipeline(tmp_path, kafka)
    produce(kafka.bootstrap, topic, [sms(f"k-{i}", "first", T0 + timedelta(seconds=i)) for i in range(1000)])
    first = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "rows written 1000," in first, first
    [record] = (tmp_path / "ckpt").glob("*/glasspipe-handover.json")
    record.write_text("")
    produce(kafka.bootstrap, topic, [
        *[sms(f"k-{i}", "repeat", T0 + timedelta(seconds=i, milliseconds=500)) for i in range(1000)],
        *[sms(f"n-{i}", "first", T0 + timedelta(seconds=1000 + i)) for i in range(100)],
    ])
    second = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "duplicates dropped 1000," in second and "rows written 100," in second, second
    assert clickhouse.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0] == (1100, 1100, 0)
    assert [p.name for p in (tmp_path / "ckpt").glob("*.superseded-*")] == ["replica-0-of-1.superseded-0"]


@pytest.mark.parametrize(("before", "after"), [("by-key", "perKafkaPartition"), ("by-key", "ownState"),
                                               ("own-state", "perKafkaPartition")])
def test_turning_per_kafka_partition_on_rebuilds_the_state_from_the_topic(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, before: str, after: str
) -> None:
    """deduplication.perKafkaPartition and ownState change the shape of the state: the checkpoint of the other
    engine is set aside and the new one's state rebuilt by the hand-over's warm-up, so repeats of keys written before
    the change are still duplicates."""
    path, topic, table = pipeline(tmp_path, kafka, engine=before)
    produce(kafka.bootstrap, topic, [sms(f"k-{i}", "first", T0 + timedelta(seconds=i)) for i in range(1000)])
    first = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "rows written 1000," in first, first
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["sources"][0]["deduplication"][after] = True
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    produce(kafka.bootstrap, topic, [
        *[sms(f"k-{i}", "repeat", T0 + timedelta(seconds=i, milliseconds=500)) for i in range(1000)],
        *[sms(f"n-{i}", "first", T0 + timedelta(seconds=1000 + i)) for i in range(100)],
    ])
    second = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "duplicates dropped 1000," in second and "rows written 100," in second, second
    assert clickhouse.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0] == (1100, 1100, 0)
    assert "warm-up rows 1000," in second, second  # the state was rebuilt from the records written before
    assert [p.name for p in (tmp_path / "ckpt").glob("*.superseded-*")] == ["replica-0-of-1.superseded-0"]


@ENGINES
def test_a_warm_up_read_over_many_batches_from_partitions_apart_in_event_time_keeps_every_key(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, engine: str
) -> None:
    """A new writer re-reads the window as warm-up, in as many micro-batches as maxOffsetsPerTrigger makes, each
    partition a share of it. Its own watermark rises with the partition furthest ahead in event time, so a warm-up
    row of a partition behind it falls below it. Such a row was on time for the writer that wrote it and must still
    enter the state: its key's later repeats within the window are duplicates, as they were before the hand-over."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=2, engine=engine)
    part = {b"a": 0, b"b": 1}
    first = [sms(f"a-{i}", "first", T0 + timedelta(seconds=i)) for i in range(400)]  # partition 0: 0-399 s
    first += [sms(f"b-{i}", "first", T0 + timedelta(seconds=200, milliseconds=100 * i)) for i in range(400)]  # 1
    produce(kafka.bootstrap, topic, first, partition_of=lambda k: part[k[:1]])
    one = run(path, kafka, clickhouse, tmp_path / "ckpt")  # one micro-batch: nothing late
    assert "rows written 800," in one and "dead-lettered 0 {" in one, one
    [record] = (tmp_path / "ckpt").glob("*/glasspipe-handover.json")
    record.write_text("")  # the next run is a new writer, its state rebuilt by warm-up
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["sources"][0]["kafka"]["maxOffsetsPerTrigger"] = 100
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    # every key of the first run from 50 s on, again at 345 s: within its window (5 m), above the watermark the
    # warm-up leaves (399 s - 1 m), so a duplicate each
    again = [sms(f"a-{i}", "repeat", T0 + timedelta(seconds=345, milliseconds=i)) for i in range(50, 400)]
    again += [sms(f"b-{i}", "repeat", T0 + timedelta(seconds=345, milliseconds=i)) for i in range(400)]
    produce(kafka.bootstrap, topic, again, partition_of=lambda k: part[k[:1]])
    two = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "warm-up rows 800," in two, two
    assert clickhouse.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0] == (800, 800, 0), two
    assert "duplicates dropped 750," in two and "rows written 0," in two, two



@ENGINES
def test_a_record_late_for_its_first_writer_stays_late_when_the_next_writer_reads_it_again(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, engine: str
) -> None:
    """A record the first writer found late went to the dead-letter topic and never entered its state, so that
    writer would write the key's next on-time record. The next writer reads the record again as warm-up, below a
    watermark of its own that has not risen yet: it must still count it late (the first writer's batch recorded its
    late rows in the ledger), or the key's next record is dropped as a duplicate of a dead letter."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=1, max_per_trigger=200, engine=engine)
    produce(kafka.bootstrap, topic, [
        *[sms(f"a-{i}", "first", T0 + timedelta(seconds=i)) for i in range(400)],  # two batches: watermark 339 s
        sms("x", "late", T0 + timedelta(seconds=100)), sms("y", "late", T0 + timedelta(seconds=120)),  # the third
    ])
    one = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "rows written 400," in one and "dead-lettered 2 {" in one, one
    ms = int((T0 + timedelta(seconds=120)).timestamp() * 1000)
    [(key, late)] = clickhouse.client().execute(  # the third batch's late rows, stored with its done row
        "SELECT writer, offsets FROM glasspipe_ledger WHERE state = 'late' AND writer LIKE %(w)s", {"w": f"%{topic}%"})
    assert key.endswith(f".sms-{topic[4:]}.#late/{topic}/0"), key
    assert {k: v for k, v in json.loads(late).items() if k != "writer"} == {
        "batch": 2, "from": 400, "through": 401, "eventTimeMs": ms}
    [record] = (tmp_path / "ckpt").glob("*/glasspipe-handover.json")
    record.write_text("")  # the next run is a new writer: its warm-up reads all 402 records again
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["sources"][0]["kafka"]["maxOffsetsPerTrigger"] = 1000  # in one batch, at watermark 0
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    produce(kafka.bootstrap, topic, [
        sms("x", "repeat", T0 + timedelta(seconds=360)),  # within 5 m of x's dead letter, the first x on time
        sms("y", "repeat", T0 + timedelta(seconds=380)),
        sms("a-399", "repeat", T0 + timedelta(seconds=399, milliseconds=500)),  # a duplicate
    ])
    two = run(path, kafka, clickhouse, tmp_path / "ckpt")
    assert "warm-up rows 402," in two, two
    assert "rows written 2," in two and "duplicates dropped 1," in two and "dead-lettered 0 {" in two, two
    assert clickhouse.client().execute(
        f"SELECT sms_id, status FROM {table} WHERE sms_id IN ('x', 'y') ORDER BY sms_id") == [
        ("x", "repeat"), ("y", "repeat")]
    dead = consume_all(kafka.bootstrap, f"{topic}-dlq", expected=2)
    assert sorted(json.loads(m.value())["status"] for m in dead) == ["late", "late"]


def test_a_killed_jobs_spark_scratch_goes_with_it(tmp_path: Path, kafka: KafkaServer,
                                                   clickhouse: ClickHouseServer) -> None:
    """A SIGKILLed driver runs no shutdown hook: its Spark scratch (the jars, the state stores' working copies, the
    block manager's files; 34 MB a run) stayed in /tmp, 86 folders a CI run. It now lands in the job's TMPDIR,
    which goes with the job."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=2)
    produce(kafka.bootstrap, topic, [sms(f"s-{i:03d}", "first", T0 + timedelta(seconds=i)) for i in range(100)])
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt",
                           tmp_path / "job.log")
    temp_dir = job.temp_dir
    assert temp_dir is not None
    try:
        deadline = time.monotonic() + 240
        while _count(clickhouse, table) < 100:
            assert job.alive() and time.monotonic() < deadline, f"no rows landed; log:\n{job.log_tail()}"
            time.sleep(0.5)
        found = sorted(p.relative_to(temp_dir).as_posix() for p in temp_dir.glob("*/*"))
        print(f"in the job's TMPDIR: {found}")
        assert any(p.startswith("spark-") and "/userFiles-" in p for p in found), found
        assert any(p.startswith("spark-") and "/StateStoreId(" in p for p in found), found
        assert any(p.startswith("blockmgr-") for p in found), found
    finally:
        job.kill()
    assert not temp_dir.exists()


@pytest.mark.parametrize(("sig", "extra"), [(signal.SIGTERM, ()), (signal.SIGINT, ()),
                                            (signal.SIGTERM, ("--available-now",))],
                         ids=["SIGTERM", "Ctrl-C", "SIGTERM-available-now"])
def test_a_signal_to_the_jobs_process_group_stops_it_between_micro_batches(
        tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, sig: signal.Signals,
        extra: tuple[str, ...]) -> None:
    """systemd's stop, ``kill -- -PGID`` and the harness's stop signal the whole group, the local driver JVM
    included: its shutdown hook stopped Spark under the batch in flight and the job died with "the driver's Spark
    JVM is gone". The JVM leaves SIGTERM to the job's Python (and PySpark has it ignore a terminal's Ctrl-C), which
    stops between micro-batches and exits 0 with its totals, every row it counted committed."""
    per_batch = 100 if extra else 1000  # available-now: its start-up's backlog (~30 000) in batches of 100
    path, topic, table = pipeline(tmp_path, kafka, max_per_trigger=per_batch, maxRows=1000, maxDelay="200ms")
    producing = threading.Event()
    producing.set()

    def keep_producing() -> None:  # batches keep coming while the stop arrives
        i = 0
        while producing.is_set():
            produce(kafka.bootstrap, topic, [sms(f"t-{n:07d}", "first", T0 + timedelta(milliseconds=n))
                                             for n in range(i, i + 500)])
            i += 500
            time.sleep(0.05)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt",
                           tmp_path / "job.log", *extra)
    try:
        deadline = time.monotonic() + 240
        while _count(clickhouse, table) == 0:
            assert job.alive() and time.monotonic() < deadline, f"no rows landed; log:\n{job.log_tail()}"
            time.sleep(0.2)
        time.sleep(3)
        assert job.proc is not None and job.alive(), "the job ended before its stop"
        os.killpg(job.proc.pid, sig)
        job.proc.wait(timeout=60)
    finally:
        job.stop()
        producing.clear()
        producer.join(timeout=30)
    log = (tmp_path / "job.log").read_text()
    assert job.proc is not None and job.proc.returncode == 0, log[-6000:]
    assert "JVM is gone" not in log and "Traceback" not in log, log[-6000:]
    assert "stopping the query between micro-batches" in log, log[-6000:]
    # ended after a whole batch, not by StreamingQuery.stop(), whose interrupt cancels the batch's Spark jobs (a CI
    # run's batch failed so, with a StackOverflowError in Spark's regex over its Python traceback)
    assert "the query ended between micro-batches" in log and "Failed to cancel job group" not in log, log[-6000:]
    written = total_of(totals(log), "rows written")
    assert written > 0 and written == _count(clickhouse, table), (written, totals(log))


def test_a_checkpoint_stopped_before_its_first_offsets_reads_partitions_added_since(
        tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer) -> None:
    """A replica killed after it wrote its hand-over record but before Spark wrote the query's first offsets (the
    first seconds of a new checkpoint) resumes that record; partitions added to the topic meanwhile are not in it,
    and Spark takes specific starting offsets only when they name every partition. The record's offsets are
    completed with the added partitions (from their start), and every record lands."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=1)
    ckpt = tmp_path / "ckpt"
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", ckpt, tmp_path / "job.log")
    try:  # an empty topic: a hand-over record and the query's first offsets, no batch
        deadline = time.monotonic() + 180
        while "query started" not in (tmp_path / "job.log").read_text():
            assert job.alive() and time.monotonic() < deadline, job.log_tail(60)
            time.sleep(0.2)
    finally:
        job.kill()
    [record] = list(ckpt.glob("**/glasspipe-handover.json"))
    for entry in record.parent.iterdir():  # a kill a moment earlier: the record alone
        if entry != record:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    kafka.add_partitions(topic, 3)
    produce(kafka.bootstrap, topic, [sms(f"c-{i:03d}", "first", T0 + timedelta(seconds=i)) for i in range(90)],
            partition_of=lambda key: int(key[2:]) % 3)
    done = run_to_end(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", ckpt)
    assert "resuming checkpoint" in done.stderr, done.stderr[-4000:]
    landed = clickhouse.client().execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0]
    assert landed == (90, 90), done.stderr[-6000:]


def test_partitions_added_while_the_query_starts_restart_it_instead_of_failing_the_replica(
        tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer) -> None:
    """Partitions added after a new checkpoint's replica listed the topic's (and wrote them in its hand-over record)
    but before Spark's Kafka source first looked: Spark refuses the record's starting offsets, as they do not name
    every partition it finds. The job is paused (SIGSTOP) right after it wrote the record, the topic grown, the job
    let go: it restarts its query, which completes the record, instead of failing the replica; every record lands."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=1)
    produce(kafka.bootstrap, topic, [sms(f"a-{i:03d}", "first", T0 + timedelta(seconds=i)) for i in range(50)])
    log_path = tmp_path / "job.log"
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt", log_path)
    try:
        deadline = time.monotonic() + 180
        while "new checkpoint" not in log_path.read_text():
            assert job.alive() and time.monotonic() < deadline, job.log_tail(60)
            time.sleep(0.01)
        assert job.proc is not None  # its own process group: the Python driver and Spark's JVM
        os.killpg(job.proc.pid, signal.SIGSTOP)
        try:
            kafka.add_partitions(topic, 3)
        finally:
            os.killpg(job.proc.pid, signal.SIGCONT)
        produce(kafka.bootstrap, topic, [sms(f"b-{i:03d}", "first", T0 + timedelta(seconds=50 + i))
                                         for i in range(90)], partition_of=lambda key: int(key[2:]) % 3)
        while _count(clickhouse, table) < 140:
            assert job.alive() and time.monotonic() < deadline, f"rows missing; log:\n{job.log_tail(80)}"
            time.sleep(0.5)
    finally:
        job.stop()
    log = log_path.read_text()
    assert "while the query started (Spark: " in log and "resuming checkpoint" in log, log[-6000:]
    assert clickhouse.client().execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0] == (140, 140)


def test_partitions_added_to_the_topic_restart_the_query_after_a_whole_batch(
        tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer) -> None:
    """A continuous run looks for partitions added to its topics (every 30 s; 2 s here) and restarts its query in
    place: ended after the batch in flight, as a stop is, not interrupted inside it. The new partitions' records
    land, the old partition's are not read again."""
    path, topic, table = pipeline(tmp_path, kafka, partitions=1)
    produce(kafka.bootstrap, topic, [sms(f"a-{i:03d}", "first", T0 + timedelta(seconds=i)) for i in range(100)])
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt",
                           tmp_path / "job.log", env={"GLASSPIPE_PARTITION_CHECK_SECONDS": "2"})
    try:
        deadline = time.monotonic() + 240
        while _count(clickhouse, table) < 100:
            assert job.alive() and time.monotonic() < deadline, f"no rows landed; log:\n{job.log_tail()}"
            time.sleep(0.5)
        kafka.add_partitions(topic, 3)
        produce(kafka.bootstrap, topic, [sms(f"b-{i:03d}", "first", T0 + timedelta(seconds=100 + i))
                                         for i in range(100)], partition_of=lambda key: 1 + int(key[2:]) % 2)
        deadline = time.monotonic() + 120  # one replica subscribes: Spark may read the new partitions before it
        while _count(clickhouse, table) < 200 or "partitions [0, 1, 2]" not in (tmp_path / "job.log").read_text():
            assert job.alive() and time.monotonic() < deadline, f"no restart, or the new partitions' rows did not " \
                                                                f"land; log:\n{job.log_tail()}"
            time.sleep(0.5)
    finally:
        job.stop()
    log = (tmp_path / "job.log").read_text()
    restart = log.index("stopping the query between micro-batches (to restart it)")
    assert "partitions owned changed" in log[:restart], log[-6000:]
    ended, restarted = log.find("the query ended between micro-batches", restart), log.find(" reads ", restart)
    assert 0 <= ended < restarted, log[restart:restart + 6000]
    assert "Failed to cancel job group" not in log and "Traceback" not in log, log[-6000:]
    assert "Listener PythonStreamingQueryListenerWrapper threw" not in log, log[-6000:]  # the queries' last events
    rows = clickhouse.client().execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0]
    assert rows == (200, 200), rows
