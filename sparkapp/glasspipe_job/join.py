"""Temporal join of two Kafka sources: each side parsed, checked, filtered and deduplicated as a
single source is, then joined by key within an event-time window by glasspipe's JVM join operator
(``io.glasspipe.spark.TemporalJoin``: ``transformWithState``, through jvm.temporal_join).

The plan, per micro-batch (one query, both topics in one offset log):

    orders: Kafka -> parse/check -(ok, dead)-> watermark -> [late flag + dedup (JVM), dups dropped] --+
                                                                                                     | union
    users:  Kafka -> parse/check -(ok, dead)-> watermark -> [late flag + dedup (JVM), dups dropped] --+
                                                                                                     |
                     join operator (JVM), by join key: matched; dead and late rows passed through;
                     left join: unmatched left  ->  select_output -> BatchWriter

- A record matches every record of the other side with the same key(s) whose event time lies within
  ``join.window`` of its own: ``|t_left - t_right| <= window`` (both directions, so arrival order
  does not matter). A pair is emitted in the micro-batch in which its second record arrives.
- State: per key, each side's records still inside their window, evicted by event-time timers once
  the watermark reaches ``t + window`` (a later record that is not late has ``t' > watermark``, so it
  cannot match). Keys are kept in buckets with a timer a bucket, on a grid of half a window, so a
  record may stay up to a grid step longer, which changes no match; a left join also sets a timer at the
  expiry of each left record that found no match on arrival, and emits it at that watermark if it
  never matched. Eviction reads the expired keys or buckets only, so a micro-batch's cost does not grow
  with the state (Spark's
  stream-stream join, which this replaces, scanned its whole state every micro-batch: docs/semantics.md,
  Joins).
- The joined row holds each side's fields in a struct column named after its source, so the output
  columns' SQL (``\\`orders\\`.\\`user_id\\```, from glasspipe.api.validation.resolve_columns) reads
  them as struct fields; dead rows carry NULL structs and their original Kafka coordinates. Through the
  operator and in its state, each struct is its bytes (``io.glasspipe.spark.PackedRows``).
- Dead rows go through the stateful operators untouched (``transform.DEAD``, the join's ``PASS``), so a
  side's Kafka batch is read and parsed once. (Until plan ``/2`` they branched off before them, and
  each topic was read and parsed twice per batch.) Duplicates are counted by an ``observe``
  (``dedup_<source>``) on the dedup output and dropped before the join.
- A side with ``deduplication.ownState`` deduplicates in glasspipe's own store after the shuffle by key
  (``jvm.deduplicate_per_kafka_partition``), not in ``transformWithState``; its watermark is the batch's, as the
  driver reads it from the offset log: in a join, the minimum over both sides that the join operator also has.
- Late rows (at or below the watermark) are not dropped by Spark: a side with deduplication flags them
  in its own JVM operator; a side without has no operator of its own (one shuffle and one state store
  fewer per batch) and the join operator flags them against the same watermark. They pass the join at
  once without entering its state and go to the dead-letter topic with reason ``late``, with their own
  Kafka coordinates.
- A checkpoint of an earlier plan cannot resume: ``JOIN_STATE_PLAN`` is recorded in the hand-over
  record and runner.prepare_handover starts a new checkpoint instead (docs/operations.md, Upgrading
  glasspipe). Plan ``""`` was Spark's join; ``/1`` ran a late-flag operator on every side, so its
  operators' state stores are numbered differently; a ``/2`` with a deduplicating side kept a value and a
  timer a key there (``JOIN_DEDUP_BUCKETS_PLAN`` since); an inner ``/2`` joined by key, with a timer a
  key (``JOIN_BUCKETS`` is added to the plan since), a left ``/2`` too (``LEFT_JOIN_BUCKETS`` since; its ``/1``
  kept a timer for each distinct expiry of its waiting rows);
  until ``JOIN_PACKED_ROWS`` the operator kept each side's
  fields as a struct, not as its bytes. Since then the plan also names the sides' field types, so a change
  to a source's schema starts a new checkpoint the same way.
- A dead or late row's dead letter has its own Kafka key, value and coordinates; a joined row has none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms
from glasspipe_job.config import JobConfig, UnsupportedPipeline
from glasspipe_job.jvm import JOIN_LEFT, JOIN_RIGHT, JudgedLateRanges, temporal_join
from glasspipe_job.transform import (
    DEAD,
    DUPLICATE,
    EVENT_TIME,
    KAFKA_TIMESTAMP,
    KEY,
    LATE,
    META_COLUMNS,
    REASON,
    STATUS,
    WARMUP,
    in_own_state,
    late_reason,
    select_output,
    source_rows,
    spark_type,
)

# Recorded in each checkpoint's hand-over record (handover.Handover.plan): a checkpoint of an earlier join
# plan (Spark's stream-stream join, plan "") is set aside and a new one started, as after a rescale.
JOIN_STATE_PLAN = "glasspipe-temporal-join/2"
# A join with a deduplicating side: that side's state is a bucket of keys with a timer a bucket
# (io.glasspipe.spark.BucketDedupProcessor), no longer a value and a timer a key as recorded under JOIN_STATE_PLAN.
JOIN_DEDUP_BUCKETS_PLAN = f"{JOIN_STATE_PLAN}+dedup-buckets/1"
# An inner join: its state is grouped by a bucket of the key with a timer a bucket
# (io.glasspipe.spark.BucketJoinProcessor), no longer by the key with a timer a key. A change of
# io.glasspipe.spark.KeyBuckets.BUCKETS or of the processor's state variables needs a new number: /2 keeps
# a record as its event time, warm-up flag and fields, without the Kafka coordinates and matched flag of /1
# (io.glasspipe.spark.TemporalJoin.entrySchema).
JOIN_BUCKETS = "+join-buckets/2"
# A left join: grouped by a bucket of the key too, with the bucket's sweep timer and the keys of its unmatched left
# rows by slots of their expiry, each slot with an exact timer at its earliest (state variables rows, pending and
# sweep). /1 kept them by the exact expiry, a timer each; before it, by the key with a timer a key. Its records keep
# the matched flag.
LEFT_JOIN_BUCKETS = "+left-join-buckets/2"
# Every join: each side's fields go through the join operator and its state as their UnsafeRow bytes
# (io.glasspipe.spark.PackedRows), which only a reader of the same struct type may read. Spark's check of the state's
# schema no longer sees the fields, so the plan names their types (fields_digest): a checkpoint written with other
# fields is set aside and its state rebuilt from the ledger with warm-up, instead of read wrongly.
JOIN_PACKED_ROWS = "+packed-rows/1"
# A side with deduplication.ownState deduplicates in glasspipe's own store after the shuffle by key (the layout of
# runner.OWN_STATE_PLAN) instead of transformWithState, which numbers Spark's state stores differently; the side, its
# window and spark.shufflePartitions are named after it.
JOIN_OWN_STATE_SIDES = "+own-state-sides/1"
DEDUP_OBSERVATION = "dedup_"  # + source name: per-batch duplicates dropped on that side before the join


def join_state_plan(config: JobConfig) -> str:
    """The join's state plan (runner.state_plan): its dedup operators' layout, its own, and its sides' fields."""
    left, right = join_sides(config)
    plan = JOIN_DEDUP_BUCKETS_PLAN if left.deduplication or right.deduplication else JOIN_STATE_PLAN
    assert config.spec.join is not None
    plan += JOIN_BUCKETS if config.spec.join.type == "inner" else LEFT_JOIN_BUCKETS
    plan = f"{plan}{JOIN_PACKED_ROWS}:{fields_digest(left, right)}"
    own = [f"{s.name}=window={parse_duration_ms(s.deduplication.window)}ms" for s in (left, right)
           if s.deduplication is not None and in_own_state(s)]
    if own:
        plan += f"{JOIN_OWN_STATE_SIDES}:{','.join(own)}/partitions={config.spec.spark.shuffle_partitions}"
    return plan


def fields_digest(left: models.Source, right: models.Source) -> str:
    """12 hex digits of the two sides' struct types, names and types in order (what their packed bytes depend on)."""
    types = f"{source_struct_type(left).simpleString()}|{source_struct_type(right).simpleString()}"
    return hashlib.sha256(types.encode()).hexdigest()[:12]


def join_sides(config: JobConfig) -> tuple[models.Source, models.Source]:
    """(left, right) sources. Spark's offset log lists the join's sources in this order (left first),
    so consumer groups must be handed to BatchWriter in it."""
    join = config.spec.join
    assert join is not None
    return config.spec.source(join.left.source), config.spec.source(join.right.source)


def source_struct_type(source: models.Source) -> T.StructType:
    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in source.schema_.fields])


SIDE = "_gp_side"  # JOIN_LEFT / JOIN_RIGHT on input rows, JOIN_BOTH on joined rows
PASS = "_gp_pass"  # the join operator's late column: true passes the row through (dead, late), NULL: it decides
_PARTITION, _OFFSET = "_gp_p", "_gp_o"  # every row's Kafka coordinates: the order of rows within a batch


def _key(i: int) -> str:
    return f"_gp_k{i}"


def _kept_side(checked: DataFrame, source: models.Source, keys: Sequence[str], side: int,
               left: models.Source, right: models.Source, judged_late: JudgedLateRanges,
               state_root: str | None, shuffle_partitions: int) -> DataFrame:
    """ok and dead rows -> watermark -> (with dedup) late flagged, dedup (JVM); duplicates counted
    (observe) and dropped; fields packed in a struct named after the source (the other side's struct
    NULL), in the shape of the join operator's input. ``PASS``: true on dead and late rows, which pass
    the join untouched; NULL where the join operator decides lateness (no dedup). Rows that pass or may
    pass keep their Kafka coordinates and key; the others' are NULL (the join state never holds them).
    ``judged_late``: the side's warm-up rows earlier writers found late (handover.judged_late)."""
    # withWatermark(EVENT_TIME) inside; re-emitted
    rows = source_rows(checked, source, join_keys=keys, judged_late=judged_late, state_root=state_root,
                       shuffle_partitions=shuffle_partitions)
    if source.deduplication is not None:
        # a warm-up row's repeat was counted by the writer that read it first, as a single source's is
        repeat = F.col(DUPLICATE) & ~F.coalesce(F.col(WARMUP), F.lit(False))
        rows = rows.observe(DEDUP_OBSERVATION + source.name,
                            F.sum(F.when(repeat, 1).otherwise(0)).alias("duplicates"))
        rows = rows.where(~F.col(DUPLICATE))
    own = F.struct(*[F.col(f.name) for f in source.schema_.fields])

    def struct_of(s: models.Source) -> Column:
        return (own if s.name == source.name else F.lit(None).cast(source_struct_type(s))).alias(s.name)

    passes = F.col(DEAD) | F.col(LATE)  # dead or late: true; NULL (no dedup, not dead): the join decides
    may_pass = F.coalesce(passes, F.lit(True))
    return rows.select(
        *[F.col(k).alias(_key(i)) for i, k in enumerate(keys)],
        F.lit(side).alias(SIDE),
        F.col(EVENT_TIME),
        F.col(WARMUP),
        passes.alias(PASS),
        *[F.when(may_pass, F.col(c)).alias(c) for c in [*META_COLUMNS, KEY]],
        F.when(passes, F.col(REASON)).alias(REASON),
        F.col("_gp_partition").alias(_PARTITION),
        F.col("_gp_offset").alias(_OFFSET),
        F.col(KAFKA_TIMESTAMP),
        struct_of(left),
        struct_of(right),
    )


def check_runnable(config: JobConfig, partition_counts: Mapping[str, int]) -> None:
    """Raise UnsupportedPipeline for joins this job cannot run correctly."""
    left, right = join_sides(config)
    if left.kafka.topic == right.kafka.topic:
        raise UnsupportedPipeline(f"spec.join: sources {left.name} and {right.name} read the same topic "
                                  f"{left.kafka.topic}; a join needs two topics")
    nl, nr = partition_counts[left.name], partition_counts[right.name]
    if config.replicas > 1 and nl != nr:
        raise UnsupportedPipeline(
            f"spec.join with spec.replicas > 1: replica i joins partitions p mod {config.replicas} == i of both "
            f"topics, so {left.kafka.topic} ({nl} partitions) and {right.kafka.topic} ({nr}) need the same "
            "partition count and must both be keyed by the join key; or set spec.replicas: 1")


def build_join_stream(config: JobConfig, parsed: Mapping[str, DataFrame], partition_counts: Mapping[str, int],
                      closed_left: Mapping[int, Sequence[tuple[int, int]]] | None = None,
                      judged_late: Mapping[str, JudgedLateRanges] | None = None,
                      state_roots: Mapping[str, str] | None = None) -> DataFrame:
    """The joined stream with the columns BatchWriter expects (select_output).

    ``parsed[source.name]`` is that source's stream after ``parse_and_check`` and ``with_warmup_flag``
    (stateless); everything stateful happens here, once per source. ``partition_counts``: partitions
    of each source's topic (checked for co-partitioning when there are several replicas). ``closed_left``: a left
    join's hand-over record's ``closed`` for its left topic (the warm-up rows earlier writers wrote).
    ``judged_late``: per source name, the hand-over record's ``late`` for its topic (handover.judged_late).
    ``state_roots``: per source name, where a side with deduplication.ownState keeps its state.
    """
    join = config.spec.join
    assert join is not None
    check_runnable(config, partition_counts)
    left, right = join_sides(config)
    judged = ((judged_late or {}).get(left.name, {}), (judged_late or {}).get(right.name, {}))
    roots, partitions = state_roots or {}, config.spec.spark.shuffle_partitions
    both = (_kept_side(parsed[left.name], left, join.left.keys, JOIN_LEFT, left, right, judged[0],
                       roots.get(left.name), partitions)
            .unionByName(_kept_side(parsed[right.name], right, join.right.keys, JOIN_RIGHT, left, right, judged[1],
                                    roots.get(right.name), partitions)))
    out = temporal_join(
        both, [_key(i) for i in range(len(join.left.keys))], side_col=SIDE, event_time_col=EVENT_TIME,
        late_col=PASS, warmup_col=WARMUP, partition_col=_PARTITION, offset_col=_OFFSET,
        left_col=left.name, right_col=right.name, window_seconds=parse_duration_ms(join.window) / 1000,
        left_outer=join.type != "inner", kafka_time_col=KAFKA_TIMESTAMP, closed_left=closed_left, judged_late=judged)
    late = F.col(PASS)  # dead and late rows
    # late rows (flagged by a side's dedup operator or by the join operator) get their reason here;
    # dead rows keep their own
    late_here = late & F.col(REASON).isNull()
    joined = out.select(
        F.when(~late, F.col(left.name)).alias(left.name),
        F.when(~late, F.col(right.name)).alias(right.name),
        *META_COLUMNS,
        KEY,  # dead and late rows' own; NULL on joined rows
        F.when(late, F.lit("dead")).otherwise(F.lit("ok")).alias(STATUS),
        F.when(late_here & (F.col(SIDE) == JOIN_LEFT), late_reason(left, joined=True))
        .when(late_here, late_reason(right, joined=True)).otherwise(F.col(REASON)).alias(REASON),
        F.lit(False).alias(DUPLICATE),
        # a joined row is warm-up when both of its rows are (the previous replica layout wrote it); a
        # late warm-up row was dead-lettered by that layout; an unmatched left row is not
        WARMUP,
        # freshness: a joined row's Kafka timestamp is the later of its rows' that arrived in this batch (the
        # record that made the pair; the join state keeps none), an unmatched left row's NULL (its window's close
        # emitted it: no end-to-end latency); its event time is its later side's; a late row keeps its own (its
        # batch's ledger row records the late rows' ranges, handover.judged_late), a dead row has none
        F.col(KAFKA_TIMESTAMP),
        F.when(~late | late_here, F.col(EVENT_TIME)).alias(EVENT_TIME),
    )
    return select_output(joined, config)
