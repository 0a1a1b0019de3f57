"""bench/producer_delays.py: the worst of librdkafka's per-second windows over a run, which bound how long the
harness's records took to reach the broker before the pipeline could read them."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from producer_delays import ProducerDelays, delays_text


def document(queued_us: int, request_us: int, rtt_us: int, retries: int = 0, timeouts: int = 0) -> str:
    """A statistics document as librdkafka emits it, cut to the fields read: the bootstrap entry (no window) and one
    broker, whose every window holds two samples: the worst and one of 1 000 us."""
    def window(worst: int) -> dict[str, int]:
        return {"max": worst, "sum": worst + 1_000, "cnt": 2}

    broker: dict[str, Any] = {"int_latency": window(queued_us), "outbuf_latency": window(request_us),
                              "rtt": window(rtt_us), "txretries": retries, "req_timeouts": timeouts}
    return json.dumps({"brokers": {"127.0.0.1:9092/bootstrap": {"txretries": 0, "req_timeouts": 0},
                                   "127.0.0.1:9092/1": broker}})


def test_the_worst_of_each_window_and_of_their_sum_over_the_run() -> None:
    delays = ProducerDelays(started=time.monotonic() - 100)  # made 100 s ago
    delays(document(6_000, 200, 1_500))
    delays(document(21_000_000, 100, 3_000, retries=2))  # a record held 21 s: the second the worst sum came
    delays(document(5_000, 900, 40_000, retries=3, timeouts=1))  # counters are totals since the producer began
    got = delays.as_record()
    assert (got["queued_ms"], got["request_queued_ms"], got["round_trip_ms"]) == (21_000.0, 0.9, 40.0)
    assert got["total_ms"] == 21_000 + 0.1 + 3.0 and 100 <= got["total_at_s"] < 160
    assert (got["retried"], got["timed_out"], got["documents"]) == (3, 1, 3)
    # the mean of every sample of the run (the bootstrap entry has none): 6 samples of each window
    assert got["round_trip_ms_mean"] == (1_500 + 3_000 + 40_000 + 3 * 1_000) / 6 / 1000


def test_a_document_without_brokers_changes_only_the_count() -> None:
    delays = ProducerDelays()
    delays(json.dumps({"brokers": {}}))
    assert delays.as_record()["total_ms"] == 0 and delays.documents == 1


def test_the_printed_line() -> None:
    delays = ProducerDelays()
    delays(document(6_000, 200, 1_500, retries=1))
    text = delays_text({**delays.as_record(), "total_at_s": 61.4})
    assert text == ("  the harness's producer over 1 s (librdkafka's statistics), on average (at worst) in ms: a "
                    "record queued 3.5 (6), a request queued 0.6 (0), a request's round trip 1.2 (2); the worst "
                    "second's sum 8 ms (61 s in); 1 requests retried, 0 timed out")


def test_a_record_without_means_prints_only_the_worst() -> None:
    delays = ProducerDelays()
    delays(document(6_000, 200, 1_500))
    record = {k: v for k, v in delays.as_record().items() if not k.endswith("_mean")}
    assert "a record queued - (6), a request queued - (0), a request's round trip - (2)" in delays_text(record)
