"""How long the harness's own records took to reach the broker, from librdkafka's statistics (one JSON document a
second, read by ``produce_plan``'s producer through ``stats_cb``; no call per record).

A latency is measured from a record's send (its ``sent_at``, and the Kafka timestamp the pipeline's own histogram
counts from), so a record held in the producer or by the broker is late before the pipeline could read it. These
figures bound that part: a row far later than them was late in the pipeline.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

# librdkafka's per-broker windows, microseconds, reset at each document: a record's wait in the producer's queue
# (linger included), a request's wait to be sent, a request's round trip to the broker's answer
WINDOWS = {"int_latency": "queued_ms", "outbuf_latency": "request_queued_ms", "rtt": "round_trip_ms"}
STATS_INTERVAL_MS = 1000


@dataclass
class ProducerDelays:
    """The worst of each of librdkafka's windows over a run, and when the worst sum came (seconds after the producer
    was made): an upper bound of the time from a record's send to the broker having it."""

    worst_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS.values(), 0.0))
    worst_total_ms: float = 0.0
    worst_at_s: float = 0.0
    retried: int = 0  # requests sent again (librdkafka's txretries)
    timed_out: int = 0  # requests that timed out (req_timeouts)
    documents: int = 0
    started: float = field(default_factory=time.monotonic)

    def __call__(self, document: str) -> None:
        """librdkafka's ``stats_cb``: fold in one statistics document."""
        stats: dict[str, Any] = json.loads(document)
        self.documents += 1
        brokers = stats.get("brokers", {}).values()
        self.retried = sum(int(b.get("txretries", 0)) for b in brokers)  # totals since the producer began
        self.timed_out = sum(int(b.get("req_timeouts", 0)) for b in brokers)
        for b in brokers:
            total = 0.0
            for window, name in WINDOWS.items():
                worst = b.get(window, {}).get("max", 0) / 1000
                self.worst_ms[name] = max(self.worst_ms[name], worst)
                total += worst
            if total > self.worst_total_ms:
                self.worst_total_ms, self.worst_at_s = total, time.monotonic() - self.started

    def as_record(self) -> dict[str, float]:
        """What a run's record keeps (``freshness.py --json``)."""
        return {**self.worst_ms, "total_ms": self.worst_total_ms, "total_at_s": self.worst_at_s,
                "retried": self.retried, "timed_out": self.timed_out, "documents": self.documents}


def delays_text(delays: dict[str, float]) -> str:
    """One line of a run's printout."""
    return (f"  the harness's producer, the worst second of {delays['documents']:.0f} (librdkafka's statistics): "
            f"a record queued {delays['queued_ms']:.0f} ms, a request queued {delays['request_queued_ms']:.0f} ms "
            f"and {delays['round_trip_ms']:.0f} ms to its answer; at most {delays['total_ms']:.0f} ms in one second "
            f"({delays['total_at_s']:.0f} s in); {delays['retried']:.0f} requests retried, "
            f"{delays['timed_out']:.0f} timed out")
