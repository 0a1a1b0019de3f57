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
    """Each of librdkafka's windows over a run, on average and at worst, and when the worst sum came (seconds after
    the producer was made): an upper bound of the time from a record's send to the broker having it."""

    worst_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS.values(), 0.0))
    sum_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WINDOWS.values(), 0.0))
    count: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WINDOWS.values(), 0))
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
                figures = b.get(window, {})
                worst = figures.get("max", 0) / 1000
                self.worst_ms[name] = max(self.worst_ms[name], worst)
                self.sum_us[name] += figures.get("sum", 0)
                self.count[name] += figures.get("cnt", 0)
                total += worst
            if total > self.worst_total_ms:
                self.worst_total_ms, self.worst_at_s = total, time.monotonic() - self.started

    def as_record(self) -> dict[str, float]:
        """What a run's record keeps (``freshness.py --json``)."""
        mean = {f"{name}_mean": self.sum_us[name] / self.count[name] / 1000 if self.count[name] else 0.0
                for name in WINDOWS.values()}
        return {**self.worst_ms, **mean, "total_ms": self.worst_total_ms, "total_at_s": self.worst_at_s,
                "retried": self.retried, "timed_out": self.timed_out, "documents": self.documents}


def delays_text(delays: dict[str, float]) -> str:
    """One line of a run's printout."""
    def both(name: str) -> str:
        mean = delays.get(f"{name}_mean")  # records of 2026-12-08's first two runs have no mean
        return f"{'-' if mean is None else f'{mean:.1f}'} ({delays[name]:.0f})"

    return (f"  the harness's producer over {delays['documents']:.0f} s (librdkafka's statistics), on average (at "
            f"worst) in ms: a record queued {both('queued_ms')}, a request queued {both('request_queued_ms')}, a "
            f"request's round trip {both('round_trip_ms')}; the worst second's sum {delays['total_ms']:.0f} ms "
            f"({delays['total_at_s']:.0f} s in); {delays['retried']:.0f} requests retried, "
            f"{delays['timed_out']:.0f} timed out")
