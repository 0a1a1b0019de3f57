"""The streaming plan of one source: Kafka record -> parsed, checked, filtered, deduplicated row
(``source_rows``, used alone and by join.py), and the output columns (``select_output``).

Every record read ends in exactly one of these, counted per micro-batch:
- ``dead``: cannot be processed (malformed JSON, wrong types, a required field, key or event time
  missing): emitted with its reason so the batch writer sends it to the dead-letter topic;
- ``filtered``: the filter was not true: counted (``observe``; deduplication per Kafka partition counts in its
  operator), not emitted;
- ``duplicate``: a repeat of a key within the window: emitted with a flag, counted, not written;
- ``ok``: written to ClickHouse.
Late records (older than the watermark) become dead letters with reason ``late``: in a deduplicated
single-topic pipeline the dedup operator flags them; before a join each side's JVM operator flags
them (``source_rows(..., join_keys=...)``) and join.py routes them round the join. Dead rows carry no
event time, so a broken record can neither move the watermark nor be dropped as late, and an event
time further ahead of the record's Kafka timestamp than ``eventTime.maxFutureSkew`` makes a record
dead (``event_time_in_future``) instead of moving the watermark for good.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms
from glasspipe_job.config import JobConfig

if TYPE_CHECKING:
    from glasspipe_job.jvm import JudgedLateRanges

STATUS = "_gp_status"
REASON = "_gp_reason"
EVENT_TIME = "_gp_event_time"
KAFKA_TIMESTAMP = "_gp_kafka_timestamp"  # the record's Kafka timestamp: end-to-end latency (freshness.py)
DUPLICATE = "_gp_duplicate"
WARMUP = "_gp_warmup"
LATE = "_gp_late"
LATE_REASON_PREFIX = "late:"  # how the reason of a record dead-lettered as late starts (late_reason)
DEAD = "_gp_dead"  # a dead row on its way to the dead-letter topic, through the stateful operators untouched
CORRUPT = "_gp_corrupt"
META_COLUMNS = ["_gp_topic", "_gp_partition", "_gp_offset", "_gp_value"]
# The record's Kafka key, for its dead letter. Not among META_COLUMNS, which a joined row gets (NULL) by name:
# a joined row has two keys, and the join operator keeps neither in its state.
KEY = "_gp_key"
log = logging.getLogger("glasspipe.job")

INPUT_OBSERVATION = "input_"  # + source name: per-batch counts of what was read (metrics.JobMetrics.on_progress)

_SPARK_TYPES: dict[str, T.DataType] = {
    "string": T.StringType(), "int": T.IntegerType(), "long": T.LongType(), "float": T.FloatType(),
    "double": T.DoubleType(), "boolean": T.BooleanType(), "timestamp": T.TimestampType(), "date": T.DateType(),
}


def spark_type(field_type: str) -> T.DataType:
    if field_type.startswith("decimal("):
        precision, scale = field_type[len("decimal("):-1].split(",")
        return T.DecimalType(int(precision), int(scale))
    return _SPARK_TYPES[field_type]


def payload_schema(source: models.Source) -> T.StructType:
    """The JSON schema of a source's values, with nested structs for dotted paths."""
    tree: dict[str, Any] = {}
    for f in source.schema_.fields:
        parts = (f.path or f.name).split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"field {f.name}: path {f.path} goes through a value declared as a leaf")
        node[parts[-1]] = spark_type(f.type)

    def build(node: dict[str, Any]) -> T.StructType:
        return T.StructType([
            T.StructField(k, build(v) if isinstance(v, dict) else v, True) for k, v in node.items()
        ])

    schema = build(tree)
    return schema.add(T.StructField(CORRUPT, T.StringType(), True))


def _field_column(f: models.SchemaField) -> Column:
    return F.col("_gp_json." + ".".join(f"`{p}`" for p in (f.path or f.name).split(".")))


def _event_time(source: models.Source) -> Column:
    et = source.event_time
    if et.source == "kafkaTimestamp":
        return F.col("_gp_kafka_timestamp")
    field = source.field(et.field or "")
    assert field is not None
    col = F.col(field.name)
    if field.type in ("timestamp",):
        return col
    if field.type == "date":
        return col.cast("timestamp")
    if et.format == "epochMillis":
        return F.timestamp_millis(col.cast("long"))
    if et.format == "epochSeconds":
        return F.timestamp_seconds(col.cast("long"))
    return F.to_timestamp(col)


def read_kafka(spark: SparkSession, config: JobConfig, source: models.Source,
               assign: dict[str, list[int]] | None, starting_offsets: str | None, driver_heap: int) -> DataFrame:
    """The Kafka source of one GlassPipeline source (its partitions for this replica); ``driver_heap`` (bytes)
    bounds a micro-batch when kafka.maxOffsetsPerTrigger is not set."""
    reader = spark.readStream.format("kafka").options(**config.kafka_options(source))
    if assign is not None:
        reader = reader.option("assign", _json(assign))
    else:
        reader = reader.option("subscribe", source.kafka.topic)
    reader = reader.option("startingOffsets", starting_offsets or source.kafka.starting_offsets)
    reader = reader.option("failOnDataLoss", "true").option("includeHeaders", "false")
    bound = batch_bound(config, source, driver_heap)
    if source.kafka.max_offsets_per_trigger is None:
        log.info("source %s: at most %d records per micro-batch (driver max heap %d MiB; set "
                 "kafka.maxOffsetsPerTrigger to change it)", source.name, bound, driver_heap >> 20)
    reader = reader.option("maxOffsetsPerTrigger", str(bound))
    # The sink takes a batch to the driver one Spark partition at a time (batch_writer.py). Without a shuffle,
    # those are the read's partitions: none holds more than an eighth of the batch, however few Kafka partitions
    # the records come from. After one (a join, Spark's deduplication) they are the spark.shufflePartitions
    # partitions whatever the read's split, so a Kafka range is read whole, in at least as many tasks as those
    # partitions: each split was a task more with its fixed costs (a join delivered 8-18 % more pairs without
    # them, docs/benchmarks-journal.md). Only a hot partition's range, over a share of a full batch (all sources) and a
    # tenth, is split, so that it is not one task while the other cores wait. Deduplication per Kafka partition
    # needs each partition's range in one task: the driver then receives a Kafka partition's range at a time
    # (docs/operations.md, Catching up).
    if shuffled_by_key(config, source):
        partitions = config.spec.spark.shuffle_partitions
        batch = sum(batch_bound(config, s, driver_heap) for s in config.spec.sources)
        reader = reader.option("minPartitions", str(partitions)).option(
            "maxRecordsPerPartition", str(models.records_per_shuffled_read_task(batch, partitions)))
    elif not per_kafka_partition(source):
        reader = reader.option("maxRecordsPerPartition", str(models.records_per_partition(bound)))
    return reader.load()


def shuffled_by_key(config: JobConfig, source: models.Source) -> bool:
    """Whether the source's rows are hashed by key into spark.shufflePartitions partitions on their way to the sink:
    a join's sides (deduplicated or not), and a source deduplicated by Spark's engine (not per Kafka partition)."""
    if config.spec.join is not None:
        return True
    return source.deduplication is not None and not per_kafka_partition(source)


def per_kafka_partition(source: models.Source) -> bool:
    """Whether the source deduplicates per Kafka partition (jvm.deduplicate_per_kafka_partition)."""
    return source.deduplication is not None and source.deduplication.per_kafka_partition


def in_own_state(source: models.Source) -> bool:
    """Whether the source deduplicates in glasspipe's own state (jvm.deduplicate_per_kafka_partition): per Kafka
    partition, or after the shuffle by key (deduplication.ownState); else in Spark's transformWithState."""
    return source.deduplication is not None and (source.deduplication.per_kafka_partition
                                                 or source.deduplication.own_state)


def batch_bound(config: JobConfig, source: models.Source, heap: int) -> int:
    """Records per micro-batch of a source: kafka.maxOffsetsPerTrigger, else derived from the driver JVM's max
    heap (models.derived_max_offsets_per_trigger; docs/operations.md "Catching up")."""
    if source.kafka.max_offsets_per_trigger is not None:
        return source.kafka.max_offsets_per_trigger
    return models.derived_max_offsets_per_trigger(heap, len(config.spec.sources))


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def parse_and_check(raw: DataFrame, source: models.Source) -> DataFrame:
    """Parse JSON on the JVM and classify each record as ok / dead (with reason) / filtered."""
    from glasspipe_job.jvm import json_not_an_object, parse_json_values

    schema = payload_schema(source)
    df = raw.select(
        F.col("topic").alias("_gp_topic"),
        F.col("partition").alias("_gp_partition"),
        F.col("offset").alias("_gp_offset"),
        F.col("value").alias("_gp_value"),
        F.col("key").alias(KEY),
        F.col("timestamp").alias("_gp_kafka_timestamp"),
    )
    df = parse_json_values(df, "_gp_value", "_gp_json", schema, CORRUPT)
    fields = source.schema_.fields
    df = df.select(*META_COLUMNS, KEY, "_gp_kafka_timestamp", "_gp_json",
                   *[_field_column(f).alias(f.name) for f in fields])
    not_an_object = json_not_an_object(df, "_gp_value")
    reasons: list[tuple[Column, Column]] = [
        (F.col("_gp_value").isNull() | F.col("_gp_json").isNull(), F.lit("malformed_json: empty value")),
        (F.col(f"_gp_json.{CORRUPT}").isNotNull() & not_an_object,
         F.lit("malformed_json: not a JSON object")),
        (F.col(f"_gp_json.{CORRUPT}").isNotNull(),
         F.lit("schema_mismatch: a value does not fit its declared type")),
    ]
    keys = set(source.deduplication.keys) if source.deduplication else set()
    for f in fields:
        if f.name in keys:
            reasons.append((F.col(f.name).isNull(), F.lit(f"missing_key: {f.name}")))
        elif not f.nullable:
            reasons.append((F.col(f.name).isNull(), F.lit(f"missing_required_field: {f.name}")))
    df = df.withColumn(EVENT_TIME, _event_time(source))
    reasons.append((F.col(EVENT_TIME).isNull(), F.lit("missing_event_time: " + (source.event_time.field or ""))))
    if source.event_time.source == "field":
        skew_ms = parse_duration_ms(source.event_time.max_future_skew)
        # in microseconds since the epoch: a plain long comparison; adding an interval to a timestamp
        # is a date-time library call per row
        ahead = F.unix_micros(EVENT_TIME) > F.unix_micros("_gp_kafka_timestamp") + F.lit(skew_ms * 1000)
        reasons.append((ahead, F.concat(
            F.lit("event_time_in_future: "), F.date_format(EVENT_TIME, "yyyy-MM-dd'T'HH:mm:ss.SSSX"),
            F.lit(f" is more than eventTime.maxFutureSkew ({source.event_time.max_future_skew}) after the "
                  "record's Kafka timestamp "), F.date_format("_gp_kafka_timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSSX"))))
    reason: Column = F.lit(None).cast("string")
    for cond, text in reversed(reasons):
        reason = F.when(cond, text).otherwise(reason)
    df = df.withColumn(REASON, reason)
    keep = F.expr(source.filter) if source.filter else F.lit(True)
    status = (F.when(F.col(REASON).isNotNull(), F.lit("dead"))
              .when(F.coalesce(keep, F.lit(False)), F.lit("ok"))
              .otherwise(F.lit("filtered")))
    df = df.withColumn(STATUS, status)
    # A dead record has no place in event time: it must neither move the watermark nor be dropped as late. Nor
    # has a filtered one, which deduplication per Kafka partition carries past the watermark (``deduplicate``).
    df = df.withColumn(EVENT_TIME, F.when(F.col(STATUS) != "ok", F.lit(None)).otherwise(F.col(EVENT_TIME)))
    return df.drop("_gp_json")


def with_warmup_flag(df: DataFrame, resume: dict[str, dict[int, int]]) -> DataFrame:
    """Mark rows before the hand-over's resume offset: they rebuild dedup state and are never written
    (an earlier replica layout wrote them already; see handover.py)."""
    cond: Column = F.lit(False)
    for topic, parts in resume.items():
        for p, off in parts.items():
            cond = cond | ((F.col("_gp_topic") == topic) & (F.col("_gp_partition") == p) & (F.col("_gp_offset") < off))
    return df.withColumn(WARMUP, cond)


def observe_counts(df: DataFrame, name: str) -> DataFrame:
    """Per-micro-batch counts of what was read, reported in the query progress (``observedMetrics``).
    Warm-up rows are counted apart: they were counted by the replica that first processed them."""
    live = ~F.col(WARMUP)
    return df.observe(
        name,
        F.sum(F.when(live, 1).otherwise(0)).alias("records_in"),
        F.sum(F.when(live & (F.col(STATUS) == "dead"), 1).otherwise(0)).alias("dead"),
        F.sum(F.when(live & (F.col(STATUS) == "filtered"), 1).otherwise(0)).alias("filtered"),
        F.sum(F.when(F.col(WARMUP), 1).otherwise(0)).alias("warmup"),
    )


def deduplicate(df: DataFrame, source: models.Source, dead_letter_late: bool = False,
                state_root: str | None = None, judged_late: JudgedLateRanges | None = None,
                shuffle_partitions: int = 0) -> DataFrame:
    """Watermark on event time, then first-occurrence-wins dedup (dead rows pass through untouched).

    With ``dead_letter_late`` (nothing stateful follows: the single-topic path), late rows become dead
    rows with reason ``late`` instead of being dropped by Spark; nothing stateful may follow the result.
    A source deduplicated in glasspipe's own state (``in_own_state``) keeps it under ``state_root`` (single-topic
    path only), and its watermark comes later, on the output (``watermark_after_output``); with
    deduplication.ownState its rows are first hashed by key into ``shuffle_partitions`` partitions (the spec's
    spark.shufflePartitions). ``judged_late``: after a hand-over, the warm-up rows earlier writers found late
    (handover.judged_late), late again here.
    """
    lateness_ms = parse_duration_ms(source.event_time.allowed_lateness)
    partitioned = in_own_state(source)
    if partitioned and (not dead_letter_late or state_root is None):
        raise ValueError("deduplication in glasspipe's own state is for a single source, with a state root")
    if partitioned and not per_kafka_partition(source) and shuffle_partitions < 1:
        raise ValueError("deduplication.ownState needs the spec's spark.shufflePartitions")
    # Deduplication per Kafka partition counts the rows and drops filtered ones (no event time, parse_and_check)
    # in its operator, and its watermark comes after the output columns (watermark_after_output): the row counts
    # (observe_counts) and the watermark are not generated code, so each ended a stage of its own, with a copy
    # of every row in between.
    if not partitioned:
        df = df.where(F.col(STATUS) != "filtered").withWatermark(EVENT_TIME, f"{lateness_ms} milliseconds")
    df = with_dead_flag(df)
    if source.deduplication is None:
        return df.withColumn(DUPLICATE, F.lit(False))
    if partitioned:
        assert state_root is not None  # checked above
        out = _in_own_state(df, source.deduplication, state_root, judged_late,
                            0 if per_kafka_partition(source) else shuffle_partitions,
                            filtered=F.col(STATUS) == "filtered", late_at_watermark=False)
        out = out.where(F.col(STATUS) != "filtered")
    else:
        from glasspipe_job.jvm import deduplicate_within_window

        window_s = parse_duration_ms(source.deduplication.window) / 1000
        out = deduplicate_within_window(df, list(source.deduplication.keys), EVENT_TIME, window_s,
                                        flag_col=DUPLICATE, passthrough_col=DEAD,
                                        partition_col="_gp_partition", offset_col="_gp_offset",
                                        late_col=LATE if dead_letter_late else None,
                                        warmup_col=WARMUP if dead_letter_late else None, judged_late=judged_late)
    if not dead_letter_late:
        return out
    return (out.withColumn(STATUS, F.when(F.col(LATE), F.lit("dead")).otherwise(F.col(STATUS)))
            .withColumn(REASON, F.when(F.col(LATE), late_reason(source)).otherwise(F.col(REASON)))
            .drop(LATE))


def late_reason(source: models.Source, joined: bool = False) -> Column:
    """The dead-letter reason of a late record (``late: …``)."""
    behind = ("the join's watermark (the older of both sources' newest event time minus its allowedLateness)"
              if joined else "the newest event time seen (the watermark)")
    return F.concat(F.lit(f"{LATE_REASON_PREFIX} event time "), F.date_format(EVENT_TIME, "yyyy-MM-dd'T'HH:mm:ss.SSSX"),
                    F.lit(f" is more than eventTime.allowedLateness ({source.event_time.allowed_lateness}) "
                          f"behind {behind}"))


def _join_side(df: DataFrame, source: models.Source, join_keys: Sequence[str],
               judged_late: JudgedLateRanges | None, state_root: str | None, shuffle_partitions: int) -> DataFrame:
    """One join side's ok and dead rows behind the watermark, in the shape the join reads.

    Dead rows (``DEAD``) go through the join too, untouched, so each topic is read and parsed once per
    batch. With deduplication, one JVM operator flags duplicates (``DUPLICATE``) and late rows
    (``LATE``) and passes dead rows. Without, the side has no operator of its own (no shuffle, no state
    store): ``LATE`` is NULL and the join operator decides it against the same watermark. Either way no
    column leaves with the watermark's mark, so Spark drops no late row before the join: they go to the
    dead-letter topic instead, with the reason join.py writes. Dead rows have no event time, so they
    never move the watermark. ``judged_late``: as ``deduplicate`` takes it (a side without deduplication hands it to
    the join operator instead).

    With deduplication.ownState the operator is glasspipe's own after the shuffle by key
    (``jvm.deduplicate_per_kafka_partition``, its state under ``state_root`` in ``shuffle_partitions`` stores), and
    it judges lateness against the batch's watermark as the driver hands it over: the offset log's, the same
    minimum over both sides that the join operator is given.
    """
    lateness_ms = parse_duration_ms(source.event_time.allowed_lateness)
    df = with_dead_flag(df).withWatermark(EVENT_TIME, f"{lateness_ms} milliseconds")
    dedup = source.deduplication
    if dedup is None:
        return (df.withColumn(DUPLICATE, F.lit(False)).withColumn(LATE, F.lit(None).cast("boolean"))
                .withColumn(EVENT_TIME, _without_watermark_mark(F.col(EVENT_TIME))))
    if in_own_state(source):
        if state_root is None or shuffle_partitions < 1:
            raise ValueError("deduplication.ownState on a join's side needs a state root and shuffle partitions")
        # the join dropped the filtered rows before; it counts a row at the watermark late
        out = _in_own_state(df, dedup, state_root, judged_late, shuffle_partitions, filtered=F.lit(False),
                            late_at_watermark=True)
        return out.withColumn(EVENT_TIME, _without_watermark_mark(F.col(EVENT_TIME)))
    from glasspipe_job.jvm import flag_late_before_join

    # the operator's EVENT_TIME comes out as a copy without the mark
    return flag_late_before_join(
        df, list(dedup.keys), EVENT_TIME, parse_duration_ms(dedup.window) / 1000,
        flag_col=DUPLICATE, late_col=LATE, passthrough_col=DEAD, partition_col="_gp_partition",
        offset_col="_gp_offset", warmup_col=WARMUP, judged_late=judged_late)


def _in_own_state(df: DataFrame, dedup: models.Deduplication, state_root: str, judged_late: JudgedLateRanges | None,
                  shuffle_partitions: int, *, filtered: Column, late_at_watermark: bool) -> DataFrame:
    """glasspipe's own deduplication operator (``jvm.deduplicate_per_kafka_partition``) on the job's columns: a
    single source's (``deduplicate``) and a join side's (``_join_side``) differ only in ``filtered`` and
    ``late_at_watermark``; ``shuffle_partitions`` 0 keeps each Kafka partition's rows where they are."""
    from glasspipe_job.jvm import deduplicate_per_kafka_partition

    return deduplicate_per_kafka_partition(
        df, list(dedup.keys), EVENT_TIME, parse_duration_ms(dedup.window) / 1000, flag_col=DUPLICATE,
        late_col=LATE, passthrough_col=DEAD, partition_col="_gp_partition", offset_col="_gp_offset",
        state_root=state_root, filtered=filtered, warmup=F.col(WARMUP), judged_late=judged_late,
        shuffle_partitions=shuffle_partitions, late_at_watermark=late_at_watermark)


def _without_watermark_mark(event_time: Column) -> Column:
    """The same timestamps in a new column: an expression's result does not inherit the watermark's
    metadata, by which a stateful operator would drop the rows at or below the watermark."""
    return F.timestamp_micros(F.unix_micros(event_time))


def with_dead_flag(df: DataFrame) -> DataFrame:
    return df.withColumn(DEAD, F.col(STATUS) == "dead")


def source_rows(parsed: DataFrame, source: models.Source, *, join_keys: Sequence[str] | None = None,
                state_root: str | None = None, judged_late: JudgedLateRanges | None = None,
                shuffle_partitions: int = 0) -> DataFrame:
    """One source's rows after ``parse_and_check``: counted (``observe``), filtered, deduplicated.

    Alone (single-topic path) dead rows pass through flagged and late rows become dead rows; ``state_root``:
    where deduplication per Kafka partition keeps its state. Before a join (``join_keys``: this side's join
    keys) dead rows come out flagged in ``DEAD`` and late rows in ``LATE`` with their reason, for the join
    operator to pass through to the dead-letter topic. ``judged_late`` and ``shuffle_partitions``: as
    ``deduplicate`` takes them.
    """
    if join_keys is None and in_own_state(source):  # its operator counts the rows (deduplicate)
        return deduplicate(parsed, source, dead_letter_late=True, state_root=state_root, judged_late=judged_late,
                           shuffle_partitions=shuffle_partitions)
    rows = observe_counts(parsed, INPUT_OBSERVATION + source.name)
    if join_keys is not None:
        return _join_side(rows.where(F.col(STATUS) != "filtered"), source, join_keys, judged_late, state_root,
                          shuffle_partitions)
    return deduplicate(rows, source, dead_letter_late=True, state_root=state_root, judged_late=judged_late)


def watermark_after_output(collected: DataFrame, source: models.Source) -> DataFrame:
    """The watermark of a source deduplicated per Kafka partition, on the rows the driver collects (``deduplicate``
    leaves it out): the same newest event time, as no row the driver is not sent has one that counts (filtered and
    dead rows have none, late and duplicate rows are sent), but warm-up rows, which move it no more. Its operator
    is not generated code: last in the plan, it ends no stage early."""
    lateness_ms = parse_duration_ms(source.event_time.allowed_lateness)
    return collected.withWatermark(EVENT_TIME, f"{lateness_ms} milliseconds")


def select_output(df: DataFrame, config: JobConfig) -> DataFrame:
    """Output columns cast to the Spark type of their ClickHouse column, plus what the writer needs (the
    Kafka coordinates and value for dead letters, the Kafka timestamp and event time for freshness)."""
    from glasspipe_job.spark_types import spark_type_for_clickhouse

    # try_cast: with ANSI SQL (Spark 4 default) a bad cast would fail the query; NULL goes to the DLQ instead.
    cols = [F.expr(c.sql).try_cast(spark_type_for_clickhouse(c.clickhouse_type)).alias(c.name) for c in config.columns]
    return df.select(*cols, *META_COLUMNS, KEY, STATUS, REASON, DUPLICATE, WARMUP, KAFKA_TIMESTAMP, EVENT_TIME)
