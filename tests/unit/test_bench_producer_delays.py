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
    """A statistics document as librdkafka emits it, cut to the fields read: the bootstrap entry and one broker."""
    def broker(q: int, o: int, r: int, tx: int, to: int) -> dict[str, Any]:
        return {"int_latency": {"max": q, "p99": q}, "outbuf_latency": {"max": o}, "rtt": {"max": r},
                "txretries": tx, "req_timeouts": to}
    return json.dumps({"brokers": {"127.0.0.1:9092/bootstrap": broker(0, 0, 0, 0, 0),
                                   "127.0.0.1:9092/1": broker(queued_us, request_us, rtt_us, retries, timeouts)}})


def test_the_worst_of_each_window_and_of_their_sum_over_the_run() -> None:
    delays = ProducerDelays(started=time.monotonic() - 100)  # made 100 s ago
    delays(document(6_000, 200, 1_500))
    delays(document(21_000_000, 100, 3_000, retries=2))  # a record held 21 s: the second the worst sum came
    delays(document(5_000, 900, 40_000, retries=3, timeouts=1))  # counters are totals since the producer began
    got = delays.as_record()
    assert (got["queued_ms"], got["request_queued_ms"], got["round_trip_ms"]) == (21_000.0, 0.9, 40.0)
    assert got["total_ms"] == 21_000 + 0.1 + 3.0 and 100 <= got["total_at_s"] < 160
    assert (got["retried"], got["timed_out"], got["documents"]) == (3, 1, 3)


def test_a_document_without_brokers_changes_only_the_count() -> None:
    delays = ProducerDelays()
    delays(json.dumps({"brokers": {}}))
    assert delays.as_record()["total_ms"] == 0 and delays.documents == 1


def test_the_printed_line() -> None:
    delays = ProducerDelays()
    delays(document(6_000, 200, 1_500, retries=1))
    text = delays_text({**delays.as_record(), "total_at_s": 61.4})
    assert text == ("  the harness's producer, the worst second of 1 (librdkafka's statistics): a record queued 6 ms, "
                    "a request queued 0 ms and 2 ms to its answer; at most 8 ms in one second (61 s in); "
                    "1 requests retried, 0 timed out")
