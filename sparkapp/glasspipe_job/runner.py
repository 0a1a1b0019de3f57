"""Build and run one replica's streaming query: the job's side effects live here."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms
from glasspipe_job import handover as ho
from glasspipe_job.batch_writer import BatchWriter, DeadLetters, select_output
from glasspipe_job.clickhouse.sink import ClickHouseSink
from glasspipe_job.config import JobConfig
from glasspipe_job.failure import JobFailure
from glasspipe_job.kafka_offsets import EARLIEST, LATEST, ConsumerGroup, owned_partitions
from glasspipe_job.metrics import JobMetrics, ProgressListener
from glasspipe_job.transform import (
    deduplicate,
    observe_counts,
    parse_and_check,
    read_kafka,
    with_dead_flag,
    with_warmup_flag,
)

log = logging.getLogger("glasspipe.job")

PARTITION_CHECK_SECONDS = 30.0


class UnsupportedPipeline(JobFailure):
    """The spec asks for something this job version cannot run; the message says what."""


@dataclass
class SourceAssignment:
    """The partitions of one source this replica owns, and the group that records their progress."""

    source: models.Source
    group: ConsumerGroup
    partitions: list[int]

    @property
    def owned(self) -> ho.Offsets:
        return {self.source.kafka.topic: {p: 0 for p in self.partitions}}


@dataclass
class RunningPipeline:
    query: StreamingQuery
    metrics: JobMetrics
    sink: ClickHouseSink
    assignments: list[SourceAssignment]

    def close(self) -> None:
        for a in self.assignments:
            a.group.close()
        self.sink.close()


def assign_partitions(config: JobConfig) -> list[SourceAssignment]:
    out = []
    for source in config.spec.sources:
        group = ConsumerGroup(config.librdkafka_options(source), config.consumer_group(source))
        mine = owned_partitions(group.partitions(source.kafka.topic), config.replica, config.replicas)
        if not mine:
            raise UnsupportedPipeline(f"replica {config.replica} of {config.replicas} owns no partition of "
                                      f"{source.kafka.topic}: lower spec.replicas to at most its partition count")
        out.append(SourceAssignment(source, group, mine))
    return out


def make_sink(config: JobConfig) -> ClickHouseSink:
    spec = config.spec
    ch = spec.sink.clickhouse
    user, password = config.clickhouse_credentials
    dedup_keys = next((list(s.deduplication.keys) for s in spec.sources if s.deduplication), None)
    return ClickHouseSink(
        hosts=list(ch.hosts), database=ch.database, table=ch.table, columns=config.columns,
        writer_id=f"{config.writer_prefix}{config.replica}", max_rows=ch.batching.max_rows, user=user,
        password=password, secure=ch.secure, ca_file=config.clickhouse_ca_file, create_table=ch.create_table,
        order_by=ch.order_by or dedup_keys,
    )


def prepare_handover(spark: SparkSession, config: JobConfig, sink: ClickHouseSink,
                     assignments: list[SourceAssignment]) -> ho.Handover:
    """Resume this replica's checkpoint, or start a new one where the pipeline's ledger left off."""
    files = ho.CheckpointFiles(spark, config.checkpoint_dir)
    rows = sink.ledger.pipeline_rows(config.writer_prefix)
    progress = ho.ledger_progress(rows)
    owned: ho.Offsets = {}
    for a in assignments:
        owned.update(a.owned)
    if files.exists(ho.HANDOVER_FILE):
        previous = ho.Handover.from_json(files.read(ho.HANDOVER_FILE))
        last_commit = files.latest_committed() or previous.resume
        if not ho.is_superseded(last_commit, ho.ledger_progress(rows, except_writer=previous.writer_id)):
            log.info("resuming checkpoint %s as writer %s", config.checkpoint_dir, previous.writer_id)
            return previous
        log.warning("checkpoint %s is behind the pipeline's ledger (another replica layout wrote its partitions "
                    "since): set aside as %s", config.checkpoint_dir, files.set_aside())
    elif files.exists():
        log.warning("checkpoint %s has no hand-over record: set aside as %s", config.checkpoint_dir,
                    files.set_aside())
    writer_id = ho.new_writer_id(config.writer_prefix, config.replica, config.replicas)
    for writer, batch, offsets in ho.abandoned_batches(rows, owned, writer_id):
        log.warning("batch %d of stopped writer %s never finished: rolling it back", batch, writer)
        sink.ledger.roll_back(writer, batch, offsets)
    resume: ho.Offsets = {}
    read_from: ho.Offsets = {}
    for a in assignments:
        topic = a.source.kafka.topic
        committed = a.group.committed(topic, a.partitions)
        fallback = EARLIEST if a.source.kafka.starting_offsets == "earliest" else LATEST
        resume[topic] = {p: progress.get(topic, {}).get(p, committed.get(p, fallback)) for p in a.partitions}
        read_from[topic] = dict(resume[topic])
        windows = [parse_duration_ms(w) for w in (
            a.source.deduplication.window if a.source.deduplication else None,
            config.spec.join.window if config.spec.join else None) if w]
        if windows and any(o > 0 for o in resume[topic].values()):
            # re-read what the stateful operators must remember: the longest window plus the lateness
            lookback = max(windows) + parse_duration_ms(a.source.event_time.allowed_lateness)
            read_from.update(ho.warmup_start(config.librdkafka_options(a.source), {topic: resume[topic]}, lookback))
    decision = ho.Handover(writer_id, resume, read_from)
    files.write(ho.HANDOVER_FILE, decision.to_json())
    log.info("new checkpoint %s as writer %s: resume %s, read from %s", config.checkpoint_dir, writer_id,
             resume, read_from)
    return decision


def parsed_stream(spark: SparkSession, config: JobConfig, a: SourceAssignment, decision: ho.Handover) -> DataFrame:
    """One source's rows after parsing and checks (stateless; warm-up rows flagged)."""
    topic = a.source.kafka.topic
    assign = {topic: a.partitions} if config.replicas > 1 else None
    raw = read_kafka(spark, config, a.source, assign, ho.starting_offsets_json({topic: decision.read_from[topic]}))
    parsed = parse_and_check(raw, a.source)
    return with_warmup_flag(parsed, {topic: decision.warmup_partitions().get(topic, {})})


def source_stream(spark: SparkSession, config: JobConfig, a: SourceAssignment, decision: ho.Handover) -> DataFrame:
    """One source's rows after parsing, checks, filter and dedup (dead rows passed through, flagged)."""
    parsed = observe_counts(parsed_stream(spark, config, a, decision), "input_" + a.source.name)
    return deduplicate(with_dead_flag(parsed), a.source, dead_letter_late=True)


def start_pipeline(spark: SparkSession, config: JobConfig, available_now: bool = False,
                   metrics: JobMetrics | None = None) -> RunningPipeline:
    """Start the query of one replica: Kafka -> checks/filter -> dedup -> ClickHouse."""
    spec = config.spec
    assignments = assign_partitions(config)
    sink = make_sink(config)
    decision = prepare_handover(spark, config, sink, assignments)
    sink.writer_id = decision.writer_id
    for a in assignments:
        log.info("replica %d/%d reads %s partitions %s", config.replica, config.replicas, a.source.kafka.topic,
                 a.partitions)
    if spec.join is not None:  # temporal join of two sources (join.py)
        from glasspipe_job.join import build_join_stream, join_sides

        order = [s.name for s in join_sides(config)]
        assignments.sort(key=lambda a: order.index(a.source.name))  # BatchWriter zips groups with the offset log
        out = build_join_stream(config, {a.source.name: parsed_stream(spark, config, a, decision) for a in assignments},
                                {a.source.name: len(a.group.partitions(a.source.kafka.topic)) for a in assignments})
    else:
        [a] = assignments
        out = select_output(source_stream(spark, config, a, decision), config)

    dl = spec.dead_letter
    dl_conf = config.librdkafka_options(spec.sources[0])
    if dl.bootstrap_servers:
        dl_conf = {**dl_conf, "bootstrap.servers": dl.bootstrap_servers}
    metrics = metrics or JobMetrics(config.pipeline, config.replica)
    writer = BatchWriter(config, sink, DeadLetters(dl_conf, dl.topic, f"{config.namespace}/{config.pipeline}"),
                         [a.group for a in assignments], metrics, config.checkpoint_dir)
    stream = (out.writeStream.queryName(f"glasspipe-{config.pipeline}-{config.replica}")
              .option("checkpointLocation", config.checkpoint_dir).foreachBatch(writer))
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{config.trigger_interval_ms} milliseconds")
    return RunningPipeline(stream.start(), metrics, sink, assignments)


def run_pipeline(spark: SparkSession, config: JobConfig, available_now: bool = False,
                 metrics_port: int = 0, stop: threading.Event | None = None) -> JobMetrics:
    """Run until the query ends (or ``stop`` is set). A continuous run restarts its query in place when
    partitions are added to a topic and this replica owns some of them: Spark's Kafka source reads the
    new ones from their beginning, the others from the checkpoint."""
    metrics = JobMetrics(config.pipeline, config.replica)
    metrics.serve(metrics_port)
    spark.streams.addListener(ProgressListener(metrics))
    while True:
        running = start_pipeline(spark, config, available_now, metrics)
        try:
            if available_now:
                running.query.awaitTermination()
                return metrics
            owned = {a.source.kafka.topic: a.partitions for a in running.assignments}
            checked = time.monotonic()
            while not running.query.awaitTermination(1):
                if stop is not None and stop.is_set():
                    running.query.stop()
                    return metrics
                if time.monotonic() - checked < PARTITION_CHECK_SECONDS:
                    continue
                checked = time.monotonic()
                now = {a.source.kafka.topic: a.partitions for a in assign_partitions(config)}
                if now != owned:
                    log.warning("partitions owned changed from %s to %s: restarting the query", owned, now)
                    running.query.stop()
                    break
            else:
                return metrics
        finally:
            running.close()
