"""Build and start one replica's streaming query (replica_loop.py runs it): the job's side effects live here.

``start_pipeline`` goes one way: assign partitions -> open the sink's table -> decide the hand-over and
the writer id (handover.py) -> build the sink as that writer -> build the stream (transform.py, join.py)
-> start it with BatchWriter as its ``foreachBatch``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms
from glasspipe.api.validation import table_sort_key
from glasspipe_job import handover as ho
from glasspipe_job.batch_writer import BatchWriter, DeadLetters
from glasspipe_job.clickhouse.connection import Connection
from glasspipe_job.clickhouse.ledger import Fence, Ledger, LedgerRow, next_generation
from glasspipe_job.clickhouse.sink import ClickHouseSink
from glasspipe_job.clickhouse.table import ClickHouseTable
from glasspipe_job.config import JobConfig, UnsupportedPipeline
from glasspipe_job.join import build_join_stream, join_sides, join_state_plan
from glasspipe_job.jvm import QueryEnd, partition_dedup_counts
from glasspipe_job.kafka_offsets import LATEST, ConsumerGroup, fallback_offset, owned_partitions
from glasspipe_job.metrics import JobMetrics
from glasspipe_job.session import driver_heap_bytes
from glasspipe_job.transform import (
    batch_bound,
    in_own_state,
    parse_and_check,
    per_kafka_partition,
    read_kafka,
    select_output,
    source_rows,
    watermark_after_output,
    with_warmup_flag,
)

log = logging.getLogger("glasspipe.job")


@dataclass
class SourceAssignment:
    """The partitions of one source this replica owns, and the group that records their progress."""

    source: models.Source
    group: ConsumerGroup
    partitions: list[int]
    topic_partitions: int  # how many the topic had when they were assigned (recorded with the writer's claim)

    @property
    def owned(self) -> ho.Offsets:
        return {self.source.kafka.topic: {p: 0 for p in self.partitions}}


@dataclass
class RunningPipeline:
    query: StreamingQuery
    metrics: JobMetrics
    sink: ClickHouseSink
    assignments: list[SourceAssignment]
    writer: BatchWriter | None = None

    def close(self) -> None:
        for a in self.assignments:
            a.group.close()
        self.sink.close()


def assign_partitions(config: JobConfig) -> list[SourceAssignment]:
    out = []
    for source in config.spec.sources:
        group = ConsumerGroup(config.librdkafka_options(source), config.consumer_group(source))
        every = group.partitions(source.kafka.topic)
        mine = owned_partitions(every, config.replica, config.replicas)
        if not mine:
            raise UnsupportedPipeline(f"replica {config.replica} of {config.replicas} owns no partition of "
                                      f"{source.kafka.topic}: lower spec.replicas to at most its partition count")
        out.append(SourceAssignment(source, group, mine, len(every)))
    return out


def make_table(config: JobConfig) -> ClickHouseTable:
    """The sink's table as the spec and the rendered Secrets say (nothing talks to the server yet)."""
    spec = config.spec
    ch = spec.sink.clickhouse
    user, password = config.clickhouse_credentials
    connection = Connection(list(ch.hosts), ch.database, user=user, password=password, secure=ch.secure,
                            ca_file=config.clickhouse_ca_file, insert_block_size=ch.batching.max_rows,
                            mutation_deadline=config.mutation_deadline)
    return ClickHouseTable(connection, ch.table, config.columns, create_table=ch.create_table,
                           order_by=table_sort_key(spec, config.columns))


def claim(config: JobConfig, ledger: Ledger, rows: list[LedgerRow], writer_id: str, starts: ho.Offsets,
          assignments: list[SourceAssignment]) -> Fence:
    """Claim this replica's partitions (``starts``: each one's offset where this writer starts reading it) in the
    ledger with a generation above every earlier claim: a writer of an older layout that is somehow still running
    sees it and stops (ledger.Fence)."""
    generation = next_generation(rows)  # rows (handover_rows) hold every claimed row of the pipeline
    offsets = json.dumps([{t: {str(p): o for p, o in sorted(parts.items())}} for t, parts in sorted(starts.items())])
    ledger.claim(config.writer_prefix, writer_id, generation, offsets,
                 {a.source.kafka.topic: a.topic_partitions for a in assignments})
    log.info("writer %s claims %s (generation %d)", writer_id, {t: sorted(p) for t, p in starts.items()}, generation)
    return Fence(ledger, config.writer_prefix, writer_id, generation,
                 frozenset((t, p) for t, parts in starts.items() for p in parts))


def latest_resolved(resume: ho.Offsets, assignments: list[SourceAssignment]) -> ho.Offsets:
    """``resume`` with each LATEST replaced by the partition's end offset now: the claim records where this writer
    starts, so a successor that takes over before its first batch is committed starts there too, and the
    query reads every record appended from now on (Spark would look for "latest" only at its first trigger)."""
    out = {t: dict(parts) for t, parts in resume.items()}
    for a in assignments:
        topic = a.source.kafka.topic
        latest = [p for p, o in out.get(topic, {}).items() if o == LATEST]
        if latest:
            out[topic].update(a.group.end_offsets(topic, latest))
    return out


def prepare_handover(spark: SparkSession, config: JobConfig, ledger: Ledger,
                     assignments: list[SourceAssignment]) -> tuple[ho.Handover, Fence]:
    """Resume this replica's checkpoint, or start a new one where the pipeline's ledger left off: gathers
    the inputs of handover.resumable / handover.new_start and carries out what they decide. Either way the
    writer claims its partitions first (before any roll-back of a predecessor's batch)."""
    files = ho.CheckpointFiles(spark, config.checkpoint_dir)
    rows = ledger.handover_rows(config.writer_prefix)
    previous = ho.Handover.from_record(files.read(ho.HANDOVER_FILE)) if files.exists(ho.HANDOVER_FILE) else None
    owned: ho.Offsets = {}
    for a in assignments:
        owned.update(a.owned)
    plan = state_plan(config)
    if previous is not None and previous.plan != plan:
        log.warning("checkpoint %s holds the state of another plan (%r, this job runs %r; see docs/operations.md, "
                    "Upgrading glasspipe): set aside as %s", config.checkpoint_dir, previous.plan, plan,
                    files.set_aside())
    elif previous is not None:
        if ho.resumable(previous, files.latest_committed(), rows):
            log.info("resuming checkpoint %s as writer %s", config.checkpoint_dir, previous.writer_id)
            resumed = previous.with_partitions_added(owned)
            return resumed, claim(config, ledger, rows, previous.writer_id, resumed.resume, assignments)
        log.warning("checkpoint %s is behind the pipeline's ledger (another replica layout wrote its partitions "
                    "since): set aside as %s", config.checkpoint_dir, files.set_aside())
    elif files.exists():
        log.warning("checkpoint %s has no hand-over record it can read (none, or one cut short by a kill): set aside "
                    "as %s", config.checkpoint_dir, files.set_aside())
    committed: ho.Offsets = {}
    fallback: dict[str, int] = {}
    for a in assignments:
        topic = a.source.kafka.topic
        committed[topic] = a.group.committed(topic, a.partitions)
        fallback[topic] = fallback_offset(a.source.kafka.starting_offsets)
    start = ho.new_start(ho.new_writer_id(config.writer_prefix, config.replica, config.replicas), rows, owned,
                         committed, fallback, ledger.first_partition_counts(config.writer_prefix))
    resume = latest_resolved(start.resume, assignments)
    fence = claim(config, ledger, rows, start.writer_id, resume, assignments)
    for writer, batch, offsets in start.roll_back:
        log.warning("batch %d of stopped writer %s never finished: rolling it back", batch, writer)
        ledger.roll_back(writer, batch, offsets)
    read_from: ho.Offsets = {t: dict(parts) for t, parts in resume.items()}
    for a in assignments:
        topic = a.source.kafka.topic
        lookback = ho.warmup_lookback_ms(a.source, config.spec.join)
        continued = {p: o for p, o in start.resume[topic].items() if o > 0}  # not a partition read for the first time
        if lookback is not None and continued:
            read_from[topic].update(ho.warmup_start(config.librdkafka_options(a.source), {topic: continued},
                                                    lookback)[topic])
    decision = ho.Handover(start.writer_id, resume, read_from, plan)
    closed = closed_left_windows(config, ledger, decision)
    late = judged_late(config, ledger, rows, decision)
    decision = replace(decision, closed=closed, late=late)
    files.write(ho.HANDOVER_FILE, decision.to_json())
    ranges = sum(len(r) for parts in late.values() for r in parts.values())
    log.info("new checkpoint %s as writer %s: resume %s, read from %s%s%s", config.checkpoint_dir, start.writer_id,
             resume, read_from, f", left rows closed by earlier writers {closed}" if closed else "",
             f", {ranges} range(s) of records earlier writers found late in the warm-up" if ranges else "")
    return decision, fence


def judged_late(config: JobConfig, ledger: Ledger, rows: list[LedgerRow], decision: ho.Handover) -> ho.JudgedLate:
    """A new writer: the ranges of warm-up rows its predecessors dead-lettered as late (handover.judged_late), recorded
    with the hand-over so that replays judge the same rows. No ledger read without warm-up rows."""
    warmup = {t: {p: decision.read_from[t][p] for p in parts} for t, parts in decision.warmup_partitions().items()
              if parts}
    if not warmup:
        return {}
    return ho.judged_late(ledger.late_ranges(config.writer_prefix, warmup), rows, decision.read_from,
                          decision.resume)


def closed_left_windows(config: JobConfig, ledger: Ledger, decision: ho.Handover) -> ho.ClosedWindows:
    """A left join's new writer: how far the earlier writers closed the windows of its left side's warm-up rows
    (handover.closed_windows), recorded with the hand-over so that replays drop the same rows. No ledger read
    when the left side has no warm-up rows."""
    join = config.spec.join
    if join is None or join.type == "inner":
        return {}
    topic = config.spec.source(join.left.source).kafka.topic
    if not decision.warmup_partitions().get(topic):
        return {}
    steps = ho.closed_windows(ledger.left_closed(config.writer_prefix), topic, decision.read_from.get(topic, {}),
                              decision.resume.get(topic, {}))
    return {topic: steps} if steps else {}


# Recorded in the hand-over record as the plan of a checkpoint whose source deduplicates per Kafka partition, with
# its window: its state is not transformWithState's and its keys are laid out by fractions of the window, so a
# checkpoint of another kind or window is set aside (and the state rebuilt by the hand-over's warm-up) when
# deduplication.perKafkaPartition or the window changes. A change of io.glasspipe.spark.PartitionDedup's layout
# (its SEGMENTS, its key bytes) needs a new number; 2: glasspipe's own key bytes, not Spark's range-scan encoding.
PARTITION_DEDUP_PLAN = "dedup-per-kafka-partition/2"
PARTITION_DEDUP_STATE = "dedup-per-kafka-partition"  # its stores' folder in the query's checkpoint
# The same for deduplication.ownState: the same operator and key bytes after the shuffle by key, a store per shuffle
# partition (so spark.shufflePartitions is part of the plan, as it is of Spark's own), each key's first time with its
# Kafka partition and offset. A change of that layout needs a new number.
OWN_STATE_PLAN = "dedup-own-state/1"
OWN_STATE_STATE = "dedup-own-state"
# The plan of a checkpoint whose single source deduplicates with the default engine: transformWithState grouped by
# a bucket of the key, a map state and a timer a bucket (io.glasspipe.spark.BucketDedupProcessor). A checkpoint of
# the earlier layout (a value and a timer a key, recorded as plan "") is set aside and its state rebuilt by the
# warm-up. A change of io.glasspipe.spark.KeyBuckets.BUCKETS or of the processor's state variables needs a new number.
DEDUP_BUCKETS_PLAN = "dedup-buckets/1"


def state_plan(config: JobConfig) -> str:
    """The shape of the query's state, recorded with each checkpoint (handover.Handover.plan)."""
    if config.spec.join is not None:
        return join_state_plan(config)
    source = config.spec.sources[0]
    if source.deduplication is None:
        return ""
    window = f"window={parse_duration_ms(source.deduplication.window)}ms"
    if per_kafka_partition(source):
        return f"{PARTITION_DEDUP_PLAN}/{window}"
    if in_own_state(source):
        return f"{OWN_STATE_PLAN}/{window}/partitions={config.spec.spark.shuffle_partitions}"
    return DEDUP_BUCKETS_PLAN


def own_state_by_key(config: JobConfig) -> bool:
    """Whether a source deduplicates in glasspipe's own state after the shuffle by key (ownState): a single source,
    or a join's side."""
    return any(in_own_state(s) and not per_kafka_partition(s) for s in config.spec.sources)


def start_query(spark: SparkSession, stream: DataStreamWriter, sorted_stream: bool) -> StreamingQuery:
    """``stream.start()``. Deduplication in own state after the shuffle sorts each shuffle partition of a
    micro-batch (by event time, Kafka partition and offset: the order a replay repeats), which Spark's check of a
    streaming plan refuses whole (a sort is only for a complete aggregate); it is run on each micro-batch's rows,
    as a batch plan's sort is. So for that plan alone the check is off while the query starts (where Spark checks
    the plan), and set back at once."""
    if not sorted_stream:
        return stream.start()
    key = "spark.sql.streaming.unsupportedOperationCheck"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    try:
        return stream.start()
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def parsed_stream(spark: SparkSession, config: JobConfig, a: SourceAssignment, decision: ho.Handover) -> DataFrame:
    """One source's rows after parsing and checks (stateless; warm-up rows flagged)."""
    topic = a.source.kafka.topic
    assign = {topic: a.partitions} if config.replicas > 1 else None
    raw = read_kafka(spark, config, a.source, assign, ho.starting_offsets_json({topic: decision.read_from[topic]}),
                     driver_heap_bytes(spark))
    parsed = parse_and_check(raw, a.source)
    return with_warmup_flag(parsed, {topic: decision.warmup_partitions().get(topic, {})})


def output_stream(spark: SparkSession, config: JobConfig, assignments: list[SourceAssignment],
                  decision: ho.Handover) -> DataFrame:
    """Kafka -> parse/check -> per-source rows (transform.source_rows) -> join if any -> output columns.

    For a join, ``assignments`` is sorted into the join's side order first: BatchWriter zips the consumer
    groups with the offset log, which lists the join's sources left first."""
    if config.spec.join is None:
        [a] = assignments
        return select_output(source_rows(parsed_stream(spark, config, a, decision), a.source,
                                         state_root=partition_dedup_root(config, a.source),
                                         judged_late=decision.late.get(a.source.kafka.topic, {}),
                                         shuffle_partitions=config.spec.spark.shuffle_partitions), config)
    order = [s.name for s in join_sides(config)]
    assignments.sort(key=lambda a: order.index(a.source.name))
    parsed = {a.source.name: parsed_stream(spark, config, a, decision) for a in assignments}
    left_topic = config.spec.source(order[0]).kafka.topic
    return build_join_stream(config, parsed,
                             {a.source.name: len(a.group.partitions(a.source.kafka.topic)) for a in assignments},
                             decision.closed.get(left_topic, {}),
                             {a.source.name: decision.late.get(a.source.kafka.topic, {}) for a in assignments},
                             {a.source.name: partition_dedup_root(config, a.source) for a in assignments})


def partition_dedup_root(config: JobConfig, source: models.Source) -> str:
    """Where deduplication in own state keeps a source's state: a folder of the query's checkpoint."""
    folder = PARTITION_DEDUP_STATE if per_kafka_partition(source) else OWN_STATE_STATE
    return f"{config.checkpoint_dir.rstrip('/')}/{folder}/{source.name}"


def start_pipeline(spark: SparkSession, config: JobConfig, available_now: bool = False,
                   metrics: JobMetrics | None = None) -> RunningPipeline:
    """Start the query of one replica: Kafka -> checks/filter -> dedup (-> join) -> ClickHouse."""
    spec = config.spec
    assignments = assign_partitions(config)
    table = make_table(config)
    decision, fence = prepare_handover(spark, config, Ledger(table), assignments)
    sink = ClickHouseSink(table, decision.writer_id, spec.sink.clickhouse.batching.max_rows, fence)
    for a in assignments:
        log.info("replica %d/%d reads %s partitions %s", config.replica, config.replicas, a.source.kafka.topic,
                 a.partitions)
    out = output_stream(spark, config, assignments, decision)

    dl = spec.dead_letter
    dl_conf = config.librdkafka_options(spec.sources[0])
    if dl.bootstrap_servers:
        dl_conf = {**dl_conf, "bootstrap.servers": dl.bootstrap_servers}
    metrics = metrics or JobMetrics(config.pipeline, config.replica)
    # The largest batch (transform.read_kafka): smaller ones reach the driver in fewer parts. A join's output may
    # outgrow its input, so its batches always go one Spark partition at a time.
    bound = 0 if spec.join is not None else batch_bound(config, spec.sources[0], driver_heap_bytes(spark))
    partitioned = spec.join is None and in_own_state(spec.sources[0])
    # deduplication in own state counts what was read in its operator, not in an observe (transform.py)
    root = partition_dedup_root(config, spec.sources[0])
    writer = BatchWriter(config, sink, DeadLetters(dl_conf, dl.topic, f"{config.namespace}/{config.pipeline}"),
                         [a.group for a in assignments], metrics, config.checkpoint_dir, bound, decision.read_from,
                         one_part=partitioned and per_kafka_partition(spec.sources[0]),
                         row_counts=(lambda: partition_dedup_counts(spark, root)) if partitioned else None,
                         resume=decision.resume)
    collected = writer.collected(out)
    if partitioned:
        collected = watermark_after_output(collected, spec.sources[0])
    stream = (collected.writeStream.queryName(f"glasspipe-{config.pipeline}-{config.replica}")
              .option("checkpointLocation", config.checkpoint_dir).foreachBatch(writer))
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{config.trigger_interval_ms} milliseconds")
    query = start_query(spark, stream, sorted_stream=own_state_by_key(config))
    writer.stop_between_batches.bind(QueryEnd(spark, query))
    return RunningPipeline(query, metrics, sink, assignments, writer)
