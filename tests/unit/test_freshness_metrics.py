"""The freshness histograms: a batch observed at once reads like prometheus_client's own Histogram."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from glasspipe_job.freshness import FRESHNESS_BUCKETS, BatchHistogram, epoch_micros
from glasspipe_job.metrics import JobMetrics

pytestmark = pytest.mark.unit


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == name:
            for s in family.samples:
                out[(s.name, s.labels.get("le", ""))] = s.value
    return out


def test_batch_histogram_matches_prometheus_histogram() -> None:
    values = np.array([0.0, 0.05, 0.051, 1.0, 2.5, 7.0, 4000.0, float("nan"), -0.2])
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    BatchHistogram("x_seconds", "doc", {"pipeline": "p", "replica": "0"}, ours).observe_many(values)
    h = Histogram("x_seconds", "doc", ["pipeline", "replica"], registry=theirs,
                  buckets=FRESHNESS_BUCKETS).labels(pipeline="p", replica="0")
    for v in values[~np.isnan(values)]:
        h.observe(float(v))
    got, want = samples(ours, "x_seconds"), samples(theirs, "x_seconds")
    want = {k: v for k, v in want.items() if k[0] != "x_seconds_created"}
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k]), k
    assert got[("x_seconds_count", "")] == 8  # the NaN is not a value


def test_observe_commit_per_pipeline_and_replica() -> None:
    m = JobMetrics("sms-dedup", 2, registry=CollectorRegistry())
    now = dt.datetime(2026, 11, 23, 9, 0, tzinfo=dt.UTC)
    kafka = pa.chunked_array([pa.array([now - dt.timedelta(seconds=0.3), None, now - dt.timedelta(seconds=3)],
                                       pa.timestamp("us", "UTC"))])
    event = pa.array([now - dt.timedelta(seconds=40), now - dt.timedelta(seconds=90), None], pa.timestamp("us"))
    m.observe_commit(now.timestamp(), epoch_micros(kafka), epoch_micros(event))
    lat = samples(m.registry, "glasspipe_end_to_end_latency_seconds")
    assert lat[("glasspipe_end_to_end_latency_seconds_count", "")] == 2
    assert lat[("glasspipe_end_to_end_latency_seconds_bucket", "0.5")] == 1
    assert lat[("glasspipe_end_to_end_latency_seconds_bucket", "5.0")] == 2
    assert lat[("glasspipe_end_to_end_latency_seconds_sum", "")] == pytest.approx(3.3)
    lag = samples(m.registry, "glasspipe_event_time_lag_seconds")
    assert lag[("glasspipe_event_time_lag_seconds_bucket", "60.0")] == 1
    assert lag[("glasspipe_event_time_lag_seconds_bucket", "120.0")] == 2
    last = samples(m.registry, "glasspipe_last_committed_event_time_seconds")
    assert last[("glasspipe_last_committed_event_time_seconds", "")] == pytest.approx(now.timestamp() - 40)
    labels = {s.labels["replica"] for f in m.registry.collect() for s in f.samples
              if s.name.startswith("glasspipe_end_to_end_latency_seconds")}
    assert labels == {"2"}
    m.observe_commit(now.timestamp(), epoch_micros(pa.array([], pa.timestamp("us"))),
                     epoch_micros(pa.array([None], pa.timestamp("us"))))  # a batch without timestamps
    assert m.end_to_end_latency.count == 2
