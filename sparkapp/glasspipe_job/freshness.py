"""Freshness of what a replica writes: Prometheus histograms fed a whole micro-batch at a time.

Two ages of every row a batch commits, taken at the moment its ledger row is written (the commit):
- end-to-end latency: commit time - the record's Kafka timestamp (the append time, with the topic's
  default ``message.timestamp.type``); how long a record took from Kafka to a committed ClickHouse row;
- event-time lag: commit time - the row's event time; how far behind the world the table is.

``prometheus_client.Histogram`` takes one value per call (~1 us each, a second per million rows, under
the GIL); BatchHistogram counts a batch's values into its buckets with numpy and exposes the same
``_bucket`` / ``_sum`` / ``_count`` series a Histogram would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

# Seconds: sub-second micro-batches up to an hour behind (a pipeline catching up). Bounds at 0.7 and 2 s, issue 15's
# latency targets for p95 and p99 (docs/benchmarks.md), make the share within each exact; with 1.5 s too, no bucket
# between 0.5 and 2 s is wider than half a second, so a quantile histogram_quantile interpolates there is that close.
FRESHNESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.7, 1.0, 1.5, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                     3600.0)


class BatchHistogram(Collector):
    """A histogram with one label set, observed a numpy array at a time."""

    def __init__(self, name: str, doc: str, labels: dict[str, str], registry: CollectorRegistry,
                 buckets: Sequence[float] = FRESHNESS_BUCKETS) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.bounds = np.asarray(sorted(buckets), dtype=np.float64)
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # the last one: above every bound (+Inf)
        self.total = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: np.ndarray) -> None:
        values = values[~np.isnan(values)]
        if not values.size:
            return
        # bucket i counts values <= bounds[i] (Prometheus' "le"), the cumulative sum is taken on collect
        idx = np.searchsorted(self.bounds, values, side="left")
        with self._lock:
            self.counts += np.bincount(idx, minlength=len(self.counts))
            self.total += float(values.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative = np.cumsum(self.counts).tolist()
            total = self.total
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        les = [_le(b) for b in self.bounds.tolist()] + ["+Inf"]
        family.add_metric(list(self.labels.values()), list(zip(les, cumulative, strict=True)), total)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))


def _le(bound: float) -> str:
    return repr(float(bound))


def epoch_micros(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The non-null values of an Arrow timestamp column as epoch microseconds (UTC whatever its zone)."""
    present = column.drop_null()
    if not len(present):
        return np.zeros(0, dtype=np.int64)
    micros = pc.cast(present, pa.timestamp("us", present.type.tz)).cast(pa.int64())
    return np.asarray(micros.to_numpy(), dtype=np.int64)


def ages_seconds(now: float, micros: np.ndarray) -> np.ndarray:
    """now (epoch seconds) minus each timestamp (epoch microseconds), in seconds."""
    return now - micros.astype(np.float64) / 1e6
