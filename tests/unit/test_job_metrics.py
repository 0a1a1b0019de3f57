"""The job's Prometheus metrics follow Spark's query progress (no Spark needed: progress is JSON)."""

import threading
import urllib.request

import pytest

from glasspipe_dev.process import free_port
from glasspipe_job.metrics import JobMetrics, ProgressListener, offsets_behind

pytestmark = pytest.mark.unit

PROGRESS = {
    "observedMetrics": {"input_sms": {"records_in": 120, "dead": 3, "filtered": 7, "warmup": 40}},
    "stateOperators": [{"numRowsTotal": 5000, "numRowsDroppedByWatermark": 2, "memoryUsedBytes": 300,
                        "customMetrics": {"rocksdbSstFileSize": 7000}},
                       {"numRowsTotal": 0, "memoryUsedBytes": 50, "customMetrics": {"rocksdbSstFileSize": 1000}}],
    "sources": [{"endOffset": '{"sms":{"0":100,"1":50}}', "latestOffset": '{"sms":{"0":130,"1":50}}'}],
}


def value(m: JobMetrics, name: str) -> float:
    got = m.registry.get_sample_value(name, {"pipeline": "p", "replica": "0"})
    assert got is not None, name
    return got


def test_progress_feeds_counters_and_gauges() -> None:
    m = JobMetrics("p", 0)
    m.on_progress(PROGRESS)
    m.on_progress(PROGRESS)
    assert value(m, "glasspipe_records_in_total") == 240
    assert value(m, "glasspipe_records_filtered_total") == 14
    assert value(m, "glasspipe_late_records_dropped_total") == 4
    assert value(m, "glasspipe_state_rows") == 5000
    assert value(m, "glasspipe_state_disk_bytes") == 8000  # a gauge: the newest progress, summed over operators
    assert value(m, "glasspipe_state_memory_bytes") == 350
    assert value(m, "glasspipe_consumer_lag") == 30
    assert (m.totals.records_in, m.totals.warmup) == (240, 80)


def test_offsets_behind_ignores_partitions_not_yet_read() -> None:
    assert offsets_behind({"t": {"0": 5}}, {"t": {"0": 9, "1": 4}}) == 4
    assert offsets_behind(None, "not json") == 0


def test_metrics_are_served_for_prometheus() -> None:
    m = JobMetrics("p", 0)
    m.on_progress(PROGRESS)
    port = free_port()
    m.serve(port)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'glasspipe_records_in_total{pipeline="p",replica="0"} 120.0' in text
    for name in ("glasspipe_duplicates_dropped_total", "glasspipe_rows_written_total",
                 "glasspipe_records_dead_lettered_total", "glasspipe_batch_duration_seconds_bucket",
                 "glasspipe_keys_in_two_partitions"):
        assert name in text


def test_the_run_waits_for_its_queries_last_events_before_it_drops_the_listener() -> None:
    """Spark delivers a query's end (after its last progress) to listeners later than awaitTermination returns;
    the run waits for it, so the events neither go missing from the totals nor reach a Python already gone."""
    listener = ProgressListener(JobMetrics("p", 0))
    assert listener.wait_for_query_ends(0.01)  # no query started
    listener.on_started("q1", "r1")
    listener.on_started("q2", "r2")  # restarted in place: the first query's end may come after the second's start
    listener.on_terminated(None)
    assert not listener.wait_for_query_ends(0.05)
    done = threading.Timer(0.1, listener.on_terminated, args=(None,))
    done.start()
    assert listener.wait_for_query_ends(5)
    done.join()
