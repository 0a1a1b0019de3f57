"""Run one replica's queries until they end or a stop is asked for: wait on the query (its failures in their own
words), restart it in place when the partitions the replica owns change or were added while it started, check the
fence while it idles, and stop it between micro-batches (clean_stop.py). runner.py builds each query.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from confluent_kafka import KafkaException
from pyspark.sql import SparkSession

from glasspipe_job.clickhouse.ledger import Superseded
from glasspipe_job.clickhouse.mutations import MutationStuck
from glasspipe_job.config import JobConfig
from glasspipe_job.failure import explain
from glasspipe_job.metrics import JobMetrics, ProgressListener
from glasspipe_job.runner import RunningPipeline, SourceAssignment, assign_partitions, start_pipeline

log = logging.getLogger("glasspipe.job")

# how often a continuous run looks for partitions added to its topics (tests shorten it)
PARTITION_CHECK_SECONDS = float(os.environ.get("GLASSPIPE_PARTITION_CHECK_SECONDS", "30"))
FENCE_CHECK_SECONDS = 10.0  # an idle stale writer notices a newer layout within this time
STOP_DRAIN_SECONDS = 20.0  # SIGTERM: wait this long for the batch in flight (Kubernetes' grace is 30 s)
LISTENER_DRAIN_SECONDS = 5.0  # at the end of a run: wait this long for its queries' last events
STOP_POLL_SECONDS = 0.05  # a stop: how often to look whether the query's thread sleeps until its next trigger
# Spark's Kafka source (subscribe) refuses specific starting offsets that do not name every partition it finds
SPECIFIC_OFFSETS_INCOMPLETE = "you must specify all TopicPartitions"


def by_topic(assignments: list[SourceAssignment]) -> dict[str, list[int]]:
    """Per topic, the partitions assigned."""
    return {a.source.kafka.topic: a.partitions for a in assignments}


def owned_now(config: JobConfig) -> dict[str, list[int]]:
    """Per topic, the partitions this replica owns as the topics are now."""
    return by_topic(assign_partitions(config))


def _await(running: RunningPipeline, timeout: int | None = None) -> bool:
    """query.awaitTermination; a query that failed because a newer writer took over (Superseded), a DELETE
    passed sink.clickhouse.mutationTimeout (MutationStuck) or a micro-batch raised (BatchWriter.failure)
    raises with that error's own words rather than Spark's wrapped traceback, so they become the
    termination message. Any other failure of a writer that a newer one has superseded raises Superseded too,
    naming the failure."""
    try:
        return bool(running.query.awaitTermination() if timeout is None else running.query.awaitTermination(timeout))
    except Exception as e:
        stuck = running.sink.table.stuck
        if running.sink.superseded is not None:  # stepping down deletes our rows: that DELETE may be the stuck one
            raise Superseded(running.sink.superseded + (f"; then {stuck}" if stuck else "")) from e
        if stuck is not None:
            raise MutationStuck(str(stuck)) from e
        if running.writer is not None and running.writer.failure is not None:
            raise running.writer.failure from e  # the batch's own error, not Spark's wrapper of its traceback
        superseded = running.sink.superseded_after_failure()
        if superseded is not None:  # a stale replica woken from a pause may fail on Kafka before its fence check
            raise Superseded(f"{superseded}; its query had stopped on {explain(e)}") from e
        raise


def _stop_between_batches(running: RunningPipeline, why: str) -> None:
    """End the query between micro-batches (clean_stop.py): after the batch in flight or, if none is in the
    writer's call, after the next one, or at once if its thread sleeps until its next trigger. Failing that within
    STOP_DRAIN_SECONDS, StreamingQuery.stop() interrupts the batch in flight (exact all the same, but replayed). A
    batch that fails meanwhile raises its error, as it does while the job runs."""
    log.info("stopping the query between micro-batches (%s)", why)
    deadline = time.monotonic() + STOP_DRAIN_SECONDS
    gate = running.writer.stop_between_batches if running.writer is not None else None
    if gate is not None:
        gate.ask()
        while not (gate.wait_marked(STOP_POLL_SECONDS) or gate.end_if_waiting_for_trigger()
                   or gate.thread_ended(0) or time.monotonic() >= deadline):
            pass  # a batch is being planned or committed: the next to enter the writer's call marks the query
        if gate.thread_ended(max(0.0, deadline - time.monotonic())):
            _await(running, 1)  # at once now; raises the error of a batch that failed
            log.info("the query ended between micro-batches")
            return
    log.warning("the query did not end between micro-batches: stopping it, which interrupts the batch in flight "
                "(exact all the same: the next start replays it)")
    running.query.stop()


def _stopped(running: RunningPipeline, stop: threading.Event | None) -> bool:
    """Whether a stop was asked for (SIGTERM, Ctrl-C); if so, the query is stopped between micro-batches."""
    if stop is None or not stop.is_set():
        return False
    _stop_between_batches(running, "SIGTERM or Ctrl-C")
    return True


def run_pipeline(spark: SparkSession, config: JobConfig, available_now: bool = False,
                 metrics_port: int = 0, stop: threading.Event | None = None) -> JobMetrics:
    """Run until the query ends (or ``stop`` is set). A continuous run restarts its query in place when
    partitions are added to a topic and this replica owns some of them: Spark's Kafka source reads the
    new ones from their beginning, the others from the checkpoint."""
    metrics = JobMetrics(config.pipeline, config.replica)
    metrics.serve(metrics_port)
    listener = ProgressListener(metrics)
    spark.streams.addListener(listener)
    try:
        return _run_queries(spark, config, available_now, metrics, stop)
    finally:  # Spark delivers a query's last events later: at exit, they reached a Python already gone
        listener.wait_for_query_ends(LISTENER_DRAIN_SECONDS)
        spark.streams.removeListener(listener)


def added_while_starting(error: Exception, config: JobConfig, owned: dict[str, list[int]]) -> bool:
    """Whether the query failed at its start because partitions were added to its topic after this replica listed
    them (and wrote them in its hand-over record) but before Spark's Kafka source first looked: Spark refuses the
    record's starting offsets then, as they do not name every partition. The next start completes the record
    (handover.Handover.with_partitions_added)."""
    if SPECIFIC_OFFSETS_INCOMPLETE not in str(error):
        return False
    try:
        return owned_now(config) != owned
    except (KafkaException, RuntimeError):
        return False


def _run_queries(spark: SparkSession, config: JobConfig, available_now: bool, metrics: JobMetrics,
                 stop: threading.Event | None) -> JobMetrics:
    """run_pipeline's queries: one, or one after another while partitions are added."""
    while True:
        running = start_pipeline(spark, config, available_now, metrics)
        owned = by_topic(running.assignments)
        try:
            if available_now:  # to its end, unless stopped (Ctrl-C, SIGTERM) between micro-batches first
                while not _await(running, 1):
                    if _stopped(running, stop):
                        break
                return metrics
            checked = fenced = time.monotonic()
            while not _await(running, 1):
                if _stopped(running, stop):
                    return metrics
                if time.monotonic() - fenced >= FENCE_CHECK_SECONDS:
                    fenced = time.monotonic()
                    try:
                        running.sink.check_fence_between_batches()
                    except Superseded:
                        running.query.stop()
                        raise
                if time.monotonic() - checked < PARTITION_CHECK_SECONDS:
                    continue
                checked = time.monotonic()
                try:
                    now = owned_now(config)
                except (KafkaException, RuntimeError) as e:  # a broker restart: the query itself rides it out
                    log.warning("cannot list the topics' partitions (%s); checking again in %.0f s", e,
                                PARTITION_CHECK_SECONDS)
                    continue
                if now != owned:
                    log.warning("partitions owned changed from %s to %s: restarting the query", owned, now)
                    _stop_between_batches(running, "to restart it")
                    break
            else:
                return metrics
        except Exception as e:
            if not added_while_starting(e, config, owned):
                raise
            log.warning("partitions were added to %s while the query started (Spark: %s): restarting it",
                        sorted(owned), explain(e))
        finally:
            running.close()
