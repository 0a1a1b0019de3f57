"""Prometheus metrics of the job, served by the driver, fed by the batch writer and a query listener."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from pyspark.sql.streaming import StreamingQueryListener

from glasspipe import contract
from glasspipe_job.freshness import BatchHistogram, ages_seconds

log = logging.getLogger("glasspipe.job")


@dataclass
class Totals:
    """Running totals, printed by ``glasspipe run`` and used by tests."""

    records_in: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    late: int = 0
    rows_written: int = 0
    batches: int = 0
    replayed_batches: int = 0
    warmup: int = 0
    keys_in_two_partitions: int = 0
    per_reason: dict[str, int] = field(default_factory=dict)


class JobMetrics:
    def __init__(self, pipeline: str, replica: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = {"pipeline": pipeline, "replica": str(replica)}
        names = list(labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=self.registry).labels(**labels)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, names, registry=self.registry).labels(**labels)

        self.records_in = counter("glasspipe_records_in", "Kafka records read")
        self.filtered = counter("glasspipe_records_filtered", "Records the filter did not keep")
        self.dead_lettered = counter("glasspipe_records_dead_lettered", "Records sent to the dead-letter topic")
        self.duplicates = counter("glasspipe_duplicates_dropped", "Records dropped as duplicates within the window")
        self.late = counter("glasspipe_late_records_dropped", "Records older than the watermark, dropped")
        self.rows_written = counter("glasspipe_rows_written", "Rows inserted into ClickHouse")
        self.batch_seconds = Histogram("glasspipe_batch_duration_seconds", "Micro-batch write duration", names,
                                       registry=self.registry).labels(**labels)
        self.state_rows = gauge(
            "glasspipe_state_rows",
            f"Rows in the streaming state store: only counted with {contract.STATE_ROW_COUNT_CONF}=true in "
            "spec.spark.conf (off by default for speed), 0 otherwise")
        self.state_disk_bytes = gauge(
            "glasspipe_state_disk_bytes", "State store files on the executors' local disk (RocksDB SST files)")
        self.state_memory_bytes = gauge(
            "glasspipe_state_memory_bytes", "State store memory (RocksDB memtables, block cache, pinned blocks)")
        self.lag = gauge("glasspipe_consumer_lag", "Records behind the newest offsets, summed over partitions")
        self.keys_in_two_partitions = gauge(
            "glasspipe_keys_in_two_partitions",
            "Keys seen again in another Kafka partition within their window: dedup is only exact when the "
            "topic is partitioned by the key")
        self.dead_letters_by_reason = Counter(
            "glasspipe_dead_letters_by_reason", "Records sent to the dead-letter topic, by reason kind",
            [*names, "reason"], registry=self.registry)
        self.end_to_end_latency = BatchHistogram(
            contract.METRIC_END_TO_END_LATENCY,
            "Per row written: ClickHouse commit time minus the record's Kafka timestamp (its append time)",
            labels, self.registry)
        self.event_time_lag = BatchHistogram(
            contract.METRIC_EVENT_TIME_LAG,
            "Per row written: ClickHouse commit time minus the row's event time", labels, self.registry)
        self.last_committed_event_time = gauge(
            contract.METRIC_LAST_COMMITTED_EVENT_TIME,
            "Newest event time (Unix seconds) of the rows this replica has committed to ClickHouse")
        self._newest_event_s = 0.0
        self._labels = labels
        self.totals = Totals()

    def observe_commit(self, committed_at: float, kafka_micros: np.ndarray, event_micros: np.ndarray) -> None:
        """Freshness of one committed batch's rows (epoch microseconds of their Kafka and event times)."""
        self.end_to_end_latency.observe_many(ages_seconds(committed_at, kafka_micros))
        self.event_time_lag.observe_many(ages_seconds(committed_at, event_micros))
        if event_micros.size:
            self._newest_event_s = max(self._newest_event_s, float(event_micros.max()) / 1e6)
            self.last_committed_event_time.set(self._newest_event_s)

    def count_dead_letter(self, reason: str) -> None:
        """One dead-lettered record of a reason kind (the text before the first colon)."""
        self.totals.per_reason[reason] = self.totals.per_reason.get(reason, 0) + 1
        self.dead_letters_by_reason.labels(**self._labels, reason=reason).inc()

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)

    def count_input(self, counts: Mapping[str, Any]) -> None:
        """A batch's counts of what was read (``records_in``, ``filtered``, ``warmup``), as ``observe`` reports them
        (transform.observe_counts) or the operator of deduplication per Kafka partition counts them."""
        n_in, n_filtered = int(counts.get("records_in") or 0), int(counts.get("filtered") or 0)
        self.records_in.inc(n_in)
        self.filtered.inc(n_filtered)
        self.totals.records_in += n_in
        self.totals.filtered += n_filtered
        self.totals.warmup += int(counts.get("warmup") or 0)

    def on_progress(self, progress: dict[str, Any]) -> None:
        """Counts Spark reports per micro-batch: observed input counts, state size, late rows, lag."""
        observed = progress.get("observedMetrics") or {}
        for name, row in observed.items():
            if name.startswith("input"):
                self.count_input(row)
            elif name.startswith("dedup_"):  # joins: duplicates dropped on one side before the join (join.py)
                n_dup = int(row.get("duplicates") or 0)
                self.duplicates.inc(n_dup)
                self.totals.duplicates += n_dup
        state_rows = disk = memory = 0
        for op in progress.get("stateOperators") or []:
            state_rows += int(op.get("numRowsTotal") or 0)
            disk += int((op.get("customMetrics") or {}).get("rocksdbSstFileSize") or 0)
            memory += int(op.get("memoryUsedBytes") or 0)
            late = int(op.get("numRowsDroppedByWatermark") or 0)
            self.late.inc(late)
            self.totals.late += late
        self.state_rows.set(state_rows)
        self.state_disk_bytes.set(disk)
        self.state_memory_bytes.set(memory)
        lag = 0
        for src in progress.get("sources") or []:
            lag += offsets_behind(src.get("endOffset"), src.get("latestOffset"))
        self.lag.set(lag)


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            loaded = json.loads(value)
        except ValueError:
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return value if isinstance(value, dict) else {}


def offsets_behind(end: Any, latest: Any) -> int:
    """Sum over partitions of latest - end offsets (Kafka source progress JSON)."""
    end_d, latest_d = _as_dict(end), _as_dict(latest)
    total = 0
    for topic, parts in latest_d.items():
        for p, off in parts.items():
            total += max(0, int(off) - int(end_d.get(topic, {}).get(p, off)))
    return total


def drain_listener_events(spark: Any, timeout_ms: int = 30_000) -> None:
    """Wait until Spark delivered every queued query event to the listeners (they run asynchronously):
    the last micro-batch's progress can otherwise arrive after a finished run printed its totals."""
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(timeout_ms)
    except Exception:  # best effort: totals may then miss the last batch's observed counts
        log.warning("could not wait for the listener bus to drain", exc_info=True)


class ProgressListener(StreamingQueryListener):
    """Feeds JobMetrics from Spark's query progress events (runs on the driver)."""

    def __init__(self, metrics: JobMetrics) -> None:
        self.metrics = metrics
        self._java: Any = None
        self._running = 0  # queries whose start reached this listener and whose end has not yet
        self._changed = threading.Condition()

    def wait_for_query_ends(self, timeout: float) -> bool:
        """Wait until every query's end has reached this listener (Spark delivers events later, in order: its
        last progress comes before it), at most ``timeout`` seconds; whether they all have."""
        with self._changed:
            return self._changed.wait_for(lambda: self._running <= 0, timeout)

    @property
    def _jlistener(self) -> Any:
        """What ``spark.streams.addListener`` registers: Spark's Python listener interface implemented by
        _ProgressJson, which reads a progress as one JSON string. PySpark's own wrapper first converts the
        whole progress object to Python field by field over py4j, hundreds of calls per micro-batch
        (measured: 9.4 s of the listener thread's 30 s at one micro-batch a second, most of it py4j
        round trips that the JVM serves too)."""
        if self._java is None:
            from pyspark import SparkContext

            jvm = SparkContext._jvm
            assert jvm is not None
            self._java = jvm.PythonStreamingQueryListenerWrapper(_ProgressJson(self))
        return self._java

    # Spark's events reach this listener through _ProgressJson as plain values; the methods of
    # StreamingQueryListener (which it must define) hand PySpark's event objects to the same ones.
    def onQueryStarted(self, event: Any) -> None:
        self.on_started(event.id, event.runId)

    def onQueryProgress(self, event: Any) -> None:
        self.on_progress_json(event.progress.json)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.on_terminated(event.exception)

    def on_started(self, query_id: Any, run_id: Any) -> None:
        with self._changed:
            self._running += 1
        log.info("query started: id=%s run=%s", query_id, run_id)

    def on_progress_json(self, text: str) -> None:
        try:
            progress = json.loads(text)
            self.metrics.on_progress(progress)
            log.info("progress of batch %s: %s input rows, durations ms %s", progress.get("batchId"),
                     progress.get("numInputRows"), json.dumps(progress.get("durationMs") or {}, sort_keys=True))
        except Exception:  # a metrics problem must never stop the stream
            log.exception("could not read query progress")

    def on_terminated(self, exception: str | None) -> None:
        with self._changed:
            self._running -= 1
            self._changed.notify_all()
        if exception:
            log.error("query terminated with %s", exception)


class _ProgressJson:
    """Implements org.apache.spark.sql.streaming.PythonStreamingQueryListener (py4j callback) for a
    ProgressListener with one py4j call per event."""

    def __init__(self, listener: ProgressListener) -> None:
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        self.listener.on_started(jevent.id().toString(), jevent.runId().toString())

    def onQueryProgress(self, jevent: Any) -> None:
        self.listener.on_progress_json(str(jevent.progress().json()))

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        exception = jevent.exception()
        self.listener.on_terminated(str(exception.get()) if exception.isDefined() else None)

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]
