"""bench/freshness.py's printout of a run, made from the run's stored record alone: the figures printed are the ones
``--json`` keeps, and what is missing or behind is said."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from freshness import run_text


def record(**over: Any) -> dict[str, Any]:
    """A dedup run's record as freshness.py stores it: 10 000/s for 60 s, every first occurrence landed."""
    run: dict[str, Any] = {
        "variant": "dedup-partition", "replicas": 1, "offered": 10_000.0, "seconds": 60.0, "measured_s": 60.0,
        "trigger": "250ms", "poll_s": 0.05, "linger_ms": 5, "window": "2m", "scattered_keys": False,
        "events": 600_000, "repeats": 55_655, "landed": 544_345, "exact": True, "exact_detail": "818671 rows",
        "p50": 0.31, "p95": 0.45, "p99": 0.53, "max": 0.68, "first_fifth": 0.36, "last_fifth": 0.29,
        "drained": 0.4, "batches": 240, "phases_ms": {"addBatch": 140.0, "triggerExecution": 169.0},
        "phases_by_fifth_ms": [[208, 140, 120]], "trigger_us_per_row_by_fifth": [[87.8, 2500]],
        "trigger_us_per_row_by_live_keys": [], "by_minute": [[0, 0.31, 0.45, 0.53]],
        "firsts": 818_671, "firsts_seen": 818_671,
        "cpu_cores": {"pipeline": 0.88, "Kafka": 0.19}, "pipeline_cores_by_thread": {"JIT compiler (c2)": 0.31,
                                                                                      "idle (x)": 0.004}}
    run.update(over)
    return run


def test_the_headline_and_the_figures_come_from_the_record() -> None:
    lines = run_text(record())
    assert lines[0].startswith("glasspipe, the sms-dedup pipeline with deduplication.perKafkaPartition")
    assert "offered    10000 ev/s for 60 s (600000 events, 55655 repeats; ordered keys; trigger 250ms" in lines[0]
    assert "landed 544345 rows; latency (polled every 50 ms) p50 0.31 s, p95 0.45 s, p99 0.53 s, max 0.68 s" in lines[0]
    assert lines[0].endswith("exact: True (818671 rows)")
    assert lines[1].endswith("0: 0.31 / 0.45 / 0.53 s")
    assert lines[2].endswith("all landed 0.4 s after the last event was produced")
    # 0.88 cores at 10 000 events/s: 88 CPU-us an event
    assert lines[3] == "  CPU while offering, in cores: pipeline 0.88, Kafka 0.19; the pipeline 88 CPU-us per event"
    assert lines[4] == "  the pipeline's CPU by kind of thread, in cores: JIT compiler 0.31"  # under 0.01 left out
    assert lines[5].endswith("over 240 batches with data): triggerExecution 169, addBatch 140")
    assert len(lines) == 8  # no line by live keys where keys expire


def test_rows_still_missing_are_said() -> None:
    lines = run_text(record(firsts_seen=800_000, drained=120.3))
    assert "NOT all landed: 800000 of 818671 first occurrences seen 120.3 s after the last event" in lines[2]


def test_a_join_counts_pairs_and_records() -> None:
    lines = run_text(record(variant="join", offered=5_000.0, events=600_000, window="1h", replicas=2,
                            cpu_cores={"pipeline": 1.0}))
    assert lines[0].startswith("glasspipe, the orders-users inner join")
    assert ", 2 replicas: offered     5000 pairs/s for 60 s (600000 records; join window 1h;" in lines[0]
    assert lines[3].endswith("the pipeline 200 CPU-us per pair")
    assert lines[4].startswith("  replica 0's CPU by kind of thread")


def test_a_growing_state_gets_its_cost_by_live_keys() -> None:
    lines = run_text(record(trigger_us_per_row_by_live_keys=[[10_000_000, 6.1], [20_000_000, 6.4]]))
    assert lines[-1].endswith("by ten million live keys (none expired), the trigger's us an input row: to 10 M 6.1; "
                              "to 20 M 6.4")


def test_the_pipelines_own_histogram_over_the_window_is_printed_beside_the_measured_latency() -> None:
    import numpy as np
    from job_latency import window_summary

    from glasspipe.freshness import Histogram

    inf = float("inf")
    before = Histogram(((0.5, 10.0), (1.0, 10.0), (2.0, 10.0), (inf, 10.0)), 3.0)  # the warm-up's 10 rows
    # 100 more rows: 80 in (0, 0.5], 15 in (0.5, 1], 5 in (1, 2]
    after = Histogram(((0.5, 90.0), (1.0, 105.0), (2.0, 110.0), (inf, 110.0)), 40.0)
    job = window_summary(before, after, np.array([0.2] * 90 + [1.5] * 10))
    assert job is not None and job["rows"] == 100 and job["under_1s"] == 0.95 and job["measured_under_1s"] == 0.9
    assert job["p50"] == 0.5 * 50 / 80  # within the first bucket, as histogram_quantile interpolates
    assert job["p99"] == 1.0 + 1.0 * (99 - 95) / 5
    assert window_summary(None, after, np.array([0.2])) is None  # the plain loop serves no metrics
    lines = run_text(record(job_latency=job))
    assert run_text(record(job_latency={**job, "rows": 0}))[2].endswith("observed no row over the offered window")
    assert lines[2] == ("  the pipeline's own end-to-end latency histogram over the offered window (Kafka timestamp to "
                        "commit, interpolated within its buckets): 100 rows, p50 0.31 s, p95 1.00 s, p99 1.80 s; "
                        "95.0 % within 1 s (measured: 90.0 %)")


def test_how_long_the_harness_records_took_to_reach_the_broker_is_printed_when_recorded() -> None:
    producer = {"queued_ms": 9.0, "request_queued_ms": 0.2, "round_trip_ms": 3.1, "total_ms": 12.3,
                "total_at_s": 42.0, "retried": 0, "timed_out": 0, "documents": 120}
    lines = run_text(record(producer=producer))
    assert lines[2].startswith("  the harness's producer over 120 s") and "sum 12 ms (42 s in)" in lines[2]
    assert not any("harness's producer" in line for line in run_text(record()))  # runs recorded before it
