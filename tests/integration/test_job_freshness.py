"""Freshness metrics of a running job: every row written is observed once in the end-to-end latency and
event-time lag histograms its /metrics serves, with ages that fit how the records were produced; a joined row's
latency counts from the record that made its pair."""

from __future__ import annotations

import time
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import dumps, group_lag, load_example, produce, start_continuous, write_pipeline
from glasspipe_dev.process import ServerProcess, free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar", "spark_jars")]


def scrape(port: int) -> dict[tuple[str, str], float]:
    """(sample name, le) -> value of the replica-0 series of pipeline 'fresh-*'."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("replica") == "0" and s.labels.get("pipeline", "").startswith("fresh-"):
                out[(s.name, s.labels.get("le", ""))] = s.value
    return out


@dataclass
class Running:
    """An example pipeline on fresh topics, run continuously with its metrics on ``port``."""

    job: ServerProcess
    port: int
    name: str
    topics: list[str]  # its sources' topics, in order
    table: str


def start_example(tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, example: str) -> Running:
    """``example`` on fresh topics (two partitions each), a fresh dead-letter topic and table, its batches at most
    500 ms apart; named ``fresh-*``, which ``scrape`` reads."""
    suffix = uuid.uuid4().hex[:8]
    doc = load_example(example)
    name, table = f"fresh-{suffix}", f"fresh_{suffix}"
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    topics = [f"fresh-{s['name']}-{suffix}" for s in spec["sources"]]
    for source, topic in zip(spec["sources"], topics, strict=True):
        kafka.create_topic(topic, 2)
        source["kafka"]["topic"] = topic
    spec["deadLetter"]["topic"] = f"{name}-dlq"
    kafka.create_topic(spec["deadLetter"]["topic"], 1)
    spec["sink"]["clickhouse"]["table"] = table
    spec["sink"]["clickhouse"]["batching"] = {"maxRows": 10_000, "maxDelay": "500ms"}
    path = write_pipeline(doc, tmp_path)
    port = free_port()
    job = start_continuous(path, kafka.bootstrap, f"127.0.0.1:{clickhouse.port}", tmp_path / "ckpt",
                           tmp_path / "job.log", "--metrics-port", str(port))
    return Running(job, port, name, topics, table)


def test_latency_and_event_time_lag_are_observed_per_row_written(
        tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer) -> None:
    run = start_example(tmp_path, kafka, clickhouse, "sms-dedup.yaml")
    job, port, [topic], table = run.job, run.port, run.topics, run.table
    uniques, repeats = 2_000, 300
    event_base = datetime.now(UTC) - timedelta(seconds=30)  # event times 30-32 s before they are produced
    records = [(f"f-{i}".encode(), dumps({"sms_id": f"f-{i}", "status": "first", "phone": "+1",
                                          "meta": {"provider": "p"},
                                          "sent_at": (event_base + timedelta(milliseconds=i)).isoformat()}))
               for i in range(uniques)]
    records += records[:repeats]  # duplicates: dropped, so never observed
    try:
        produced_from = time.time()
        produce(kafka.bootstrap, topic, records)
        produced_to = time.time()
        deadline = time.monotonic() + 240
        got: dict[tuple[str, str], float] = {}
        while time.monotonic() < deadline:
            assert job.alive(), job.log_tail(60)
            got = scrape(port)
            if got.get(("glasspipe_end_to_end_latency_seconds_count", ""), 0) >= uniques:
                break
            time.sleep(0.5)
        seen_at = time.time()
        time.sleep(2)  # nothing more arrives: each row is observed once
        got = scrape(port)
    finally:
        job.stop()
    rows = clickhouse.client().execute(f"SELECT count() FROM {table}")[0][0]
    assert rows == uniques
    lat_count = got[("glasspipe_end_to_end_latency_seconds_count", "")]
    lag_count = got[("glasspipe_event_time_lag_seconds_count", "")]
    assert lat_count == lag_count == uniques, got
    # every latency lies between 0 and the time from the first produce to the scrape that saw them all
    mean_latency = got[("glasspipe_end_to_end_latency_seconds_sum", "")] / lat_count
    assert 0 < mean_latency <= seen_at - produced_from, (mean_latency, got)
    assert got[("glasspipe_end_to_end_latency_seconds_bucket", "+Inf")] == uniques
    # event times were 30-32 s before the produce: the lag is at least 30 s, at most that plus the latency
    assert got[("glasspipe_event_time_lag_seconds_bucket", "10.0")] == 0
    mean_lag = got[("glasspipe_event_time_lag_seconds_sum", "")] / lag_count
    assert 30 <= mean_lag <= 32 + (seen_at - produced_from), mean_lag
    last = got[("glasspipe_last_committed_event_time_seconds", "")]
    newest = (event_base + timedelta(milliseconds=uniques - 1)).timestamp()
    assert last == pytest.approx(newest, abs=1e-3), (last, newest)
    print(f"{uniques} rows produced in {produced_to - produced_from:.1f} s: mean end-to-end latency "
          f"{mean_latency:.2f} s, mean event-time lag {mean_lag:.2f} s")


def test_a_joined_rows_latency_counts_from_the_record_that_made_its_pair(
        tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer) -> None:
    """Orders first, their users 12 s after the orders were read: each joined row is observed once in the end-to-end
    latency histogram, timed from its user's Kafka timestamp (under 10 s), not its order's (over 12 s)."""
    run = start_example(tmp_path, kafka, clickhouse, "orders-users-join.yaml")
    job, port, [orders, users], table = run.job, run.port, run.topics, run.table
    n = 500
    at = datetime.now(UTC) - timedelta(minutes=1)
    try:
        produce(kafka.bootstrap, orders, [(f"u-{i}".encode(), dumps(
            {"order_id": f"o-{i}", "user_id": f"u-{i}", "amount": 1.0, "created_at": at.isoformat()}))
            for i in range(n)])
        group = default_consumer_group("default", run.name)
        deadline = time.monotonic() + 180
        while sum(c for c, _ in group_lag(kafka.bootstrap, group, orders).values()) < n:
            assert job.alive() and time.monotonic() < deadline, job.log_tail(60)
            time.sleep(0.5)
        time.sleep(12)  # the orders wait in the join's state
        users_from = time.time()
        produce(kafka.bootstrap, users, [(f"u-{i}".encode(), dumps(
            {"user_id": f"u-{i}", "country": "FR", "plan": "free", "updated_at": at.isoformat()}))
            for i in range(n)])
        got: dict[tuple[str, str], float] = {}
        while got.get(("glasspipe_end_to_end_latency_seconds_count", ""), 0) < n:
            assert job.alive() and time.monotonic() < deadline, job.log_tail(60)
            time.sleep(0.5)
            got = scrape(port)
        seen_at = time.time()
        time.sleep(2)  # nothing more arrives: each row is observed once
        got = scrape(port)
    finally:
        job.stop()
    assert clickhouse.client().execute(f"SELECT count(), uniqExact(order_id) FROM {table}") == [(n, n)]
    assert got[("glasspipe_end_to_end_latency_seconds_count", "")] == n, got
    assert got[("glasspipe_end_to_end_latency_seconds_bucket", "10.0")] == n, got
    mean_latency = got[("glasspipe_end_to_end_latency_seconds_sum", "")] / n
    assert 0 < mean_latency <= seen_at - users_from, (mean_latency, seen_at - users_from)
    print(f"{n} pairs: mean end-to-end latency {mean_latency:.2f} s from the users' produce")
