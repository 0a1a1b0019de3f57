"""Glasspipe's JVM-side Spark operators (sparkapp/jvm), called from PySpark through py4j.

Why JVM-side: event-time dedup and the temporal join need per-key state. Python ``transformWithState``
runs a state call per key through the Python worker (~1-3k rows/s here), while
``dropDuplicatesWithinWatermark`` and Spark's stream-stream join (state format v2) scan their whole
state every micro-batch to evict. The Java ``StatefulProcessor``s evict with event-time timers instead:
``io.glasspipe.spark.BucketDedupProcessor`` keeps a map of keys and one timer per bucket of keys,
``io.glasspipe.spark.BucketJoinProcessor`` the same for each key's records (a left join also a timer at the
expiry of each left row unmatched on arrival), so a micro-batch costs its own rows plus the expired keys.

The jar is built by ``dev/install/jvm-ops.sh`` into
``$GLASSPIPE_CACHE/jvm-ops/<hash>/glasspipe-spark-ops.jar`` and must be on ``spark.jars`` before
the SparkSession starts. In the Spark container image the jar is copied into the image (or passed
with ``spark.jars``); set ``GLASSPIPE_JVM_OPS_JAR`` to its path there.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from py4j.java_gateway import JavaClass
from pyspark.sql import Column, DataFrame

JAR_NAME = "glasspipe-spark-ops.jar"
JVM_ENTRY = "io.glasspipe.spark.WindowDedup"
INSTALL_SCRIPT = "dev/install/jvm-ops.sh"
_SRC_DIR = Path(__file__).resolve().parents[1] / "jvm" / "src" / "main" / "java"
# A source's warm-up rows its earlier writers found late (handover.judged_late): per Kafka partition, (lowest offset,
# highest offset, latest event time ms) of the late rows of each batch that had any.
JudgedLateRanges = Mapping[int, Sequence[tuple[int, int, int]]]


def _cache_dir() -> Path:
    return Path(os.environ.get("GLASSPIPE_CACHE", Path.home() / ".cache" / "glasspipe"))


def _sources_hash() -> str:
    """The same hash as dev/install/jvm-ops.sh, so a stale jar is never picked up after an edit."""
    import pyspark

    lines = [f"pyspark={pyspark.__version__}\n"]
    for path in sorted("./" + p.relative_to(_SRC_DIR).as_posix() for p in _SRC_DIR.rglob("*.java")):
        digest = hashlib.sha256((_SRC_DIR / path).read_bytes()).hexdigest()
        lines.append(f"{digest}  {path}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()[:16]


def jvm_ops_jar() -> str:
    """Absolute path of the operators jar, to put on ``spark.jars``.

    ``GLASSPIPE_JVM_OPS_JAR`` wins (the Spark image sets it); otherwise the jar built from the
    current sources in the cache. Raises FileNotFoundError naming the install script if missing.
    """
    override = os.environ.get("GLASSPIPE_JVM_OPS_JAR")
    if override:
        if not Path(override).is_file():
            raise FileNotFoundError(f"GLASSPIPE_JVM_OPS_JAR={override} does not exist")
        return override
    if not _SRC_DIR.is_dir():
        raise FileNotFoundError(
            f"no Java sources at {_SRC_DIR} and GLASSPIPE_JVM_OPS_JAR is unset: "
            f"point GLASSPIPE_JVM_OPS_JAR at {JAR_NAME} (built by {INSTALL_SCRIPT})"
        )
    jar = _cache_dir() / "jvm-ops" / _sources_hash() / JAR_NAME
    if not jar.is_file():
        raise FileNotFoundError(f"{jar} is missing or stale: run `bash {INSTALL_SCRIPT}`")
    return str(jar)


def deduplicate_within_window(
    df: DataFrame,
    keys: list[str],
    event_time_col: str,
    window_seconds: float,
    flag_col: str | None = None,
    passthrough_col: str | None = None,
    partition_col: str | None = None,
    offset_col: str | None = None,
    late_col: str | None = None,
    warmup_col: str | None = None,
    judged_late: JudgedLateRanges | None = None,
) -> DataFrame:
    """Event-time dedup: the first row of a key wins; later rows of that key whose event time is
    before first + window are dropped; after the window the key is accepted again (new window).

    ``df`` must be streaming with a watermark on ``event_time_col`` (a TIMESTAMP column); the
    watermark delay is the allowed lateness and drives eviction. The session must use the RocksDB
    state store provider (``transformWithState`` requires it). The result keeps all input columns
    and carries the watermark on ``event_time_col``. With ``flag_col`` set, dropped rows are
    emitted too, with ``flag_col`` = true, so the caller can count duplicates per micro-batch and
    filter them out; without it only kept rows are returned. Rows where the boolean
    ``passthrough_col`` is true bypass the state and come out as kept (dead letters). With
    ``partition_col`` (the Kafka partition), a key seen again in another partition within its window
    is counted: see ``keys_in_two_partitions``; with ``offset_col`` too, ties in event time are broken
    by (partition, offset), so a replayed batch keeps the same rows. With ``late_col`` (needs
    ``flag_col``), late rows are not dropped by Spark but emitted with ``late_col`` = true (for the
    dead-letter topic); the result then carries no watermark, so nothing stateful may follow. A row with the
    boolean ``warmup_col`` true (read again after a hand-over) is late only as the writer that read it first judged
    it (``judged_late``: per Kafka partition, the ranges of handover.judged_late); otherwise it enters the state
    whatever the new writer's watermark (io.glasspipe.spark.FirstOccurrence).
    """
    if not keys:
        raise ValueError("deduplicate_within_window needs at least one key column")
    window_ms = _positive_window_ms(window_seconds)
    return _call_static(df, JVM_ENTRY, "deduplicate", list(keys), event_time_col, window_ms, flag_col,
                        passthrough_col, partition_col, offset_col, late_col, warmup_col,
                        judged_late_text(judged_late or {}))


def deduplicate_per_kafka_partition(
    df: DataFrame,
    keys: list[str],
    event_time_col: str,
    window_seconds: float,
    *,
    flag_col: str,
    late_col: str,
    passthrough_col: str | None,
    partition_col: str,
    offset_col: str,
    state_root: str,
    filtered: Column,
    warmup: Column,
    judged_late: JudgedLateRanges | None = None,
    shuffle_partitions: int = 0,
    late_at_watermark: bool = False,
) -> DataFrame:
    """Deduplication as ``deduplicate_within_window`` (every row kept, flagged in ``flag_col`` and ``late_col``),
    but per Kafka partition in the first stage (``io.glasspipe.spark.PartitionDedup``): no shuffle, no sort, no
    ``transformWithState``; a store of Spark's per Kafka partition under ``state_root``, versioned by batch. Exact
    only when every record of a key is in one Kafka partition; within a partition the first row to arrive wins.
    Late rows are flagged against the batch's watermark, which the driver sets before each batch's job
    (``set_batch_watermark``). It counts the rows it sees (``partition_dedup_counts``): ``filtered`` and ``warmup``
    are BOOLEAN columns of ``df``, a row the filter drops and a row read only to rebuild the state; a warm-up row is
    late only as its first writer judged it (``judged_late``, as ``deduplicate_within_window`` takes it).
    ``late_at_watermark``: a row at the watermark is late too (a join's side, as the join counts it)."""
    if not keys:
        raise ValueError("deduplicate_per_kafka_partition needs at least one key column")
    window_ms = _positive_window_ms(window_seconds)
    return _call_static(df, PARTITION_DEDUP_ENTRY, "deduplicate", list(keys), event_time_col, window_ms, flag_col,
                        passthrough_col, partition_col, offset_col, late_col, state_root, filtered._jc, warmup._jc,
                        judged_late_text(judged_late or {}), shuffle_partitions, late_at_watermark)


def partition_dedup_counts(spark: Any, state_root: str) -> dict[str, int]:
    """What the tasks of ``deduplicate_per_kafka_partition`` under ``state_root`` read so far in this driver, in
    the names ``transform.observe_counts`` gives: records_in, dead, filtered (warm-up rows left out) and warmup."""
    counts = _loaded_class(spark, PARTITION_DEDUP_ENTRY).rowCounts(state_root)
    return dict(zip(("records_in", "dead", "filtered", "warmup"), (int(n) for n in counts), strict=True))


PARTITION_DEDUP_ENTRY = "io.glasspipe.spark.PartitionDedup"
BATCH_WATERMARK_PROPERTY = "glasspipe.batchWatermarkMs"  # io.glasspipe.spark.PartitionDedup.WATERMARK_PROPERTY


def set_batch_watermark(spark: Any, watermark_ms: int) -> None:
    """The batch's watermark for the tasks of the jobs this thread starts (``deduplicate_per_kafka_partition``
    flags rows below it late and expires its state by it): a Spark local property."""
    spark.sparkContext.setLocalProperty(BATCH_WATERMARK_PROPERTY, str(watermark_ms))


def parse_json_values(df: DataFrame, value_col: str, out_col: str, schema: Any, corrupt_col: str) -> DataFrame:
    """``df`` with ``out_col`` = the BINARY ``value_col`` parsed by the struct ``schema``, exactly as
    ``from_json(CAST(value_col AS STRING), schema, {mode: PERMISSIVE, columnNameOfCorruptRecord:
    corrupt_col})`` would (``io.glasspipe.spark.JsonValues``), but from the bytes in place: ``from_json``
    allocates an 8 KB decoder buffer per record."""
    return _call_static(df, JSON_ENTRY, "withParsed", value_col, out_col, schema.json(), corrupt_col)


def json_not_an_object(df: DataFrame, value_col: str) -> Column:
    """A BOOLEAN column: true where the BINARY ``value_col`` of ``df`` is not a JSON object, as
    ``from_json(CAST(value_col AS STRING), 'map<string,string>') IS NULL`` is, with generated code: Spark's
    ``from_json`` has none, and takes its whole projection out of whole-stage code generation."""
    from pyspark.sql.classic.column import Column as ClassicColumn

    return ClassicColumn(_static(df, JSON_ENTRY).notAnObject(df._jdf, value_col))


def flag_late_before_join(
    df: DataFrame,
    keys: list[str],
    event_time_col: str,
    window_seconds: float,
    flag_col: str,
    late_col: str,
    passthrough_col: str | None = None,
    partition_col: str | None = None,
    offset_col: str | None = None,
    warmup_col: str | None = None,
    judged_late: JudgedLateRanges | None = None,
) -> DataFrame:
    """One join side with deduplication: late rows flagged in ``late_col`` instead of dropped by Spark,
    deduplicated as ``deduplicate_within_window`` does. Rows with ``passthrough_col`` true (dead rows)
    pass untouched, neither late nor duplicates; rows with ``warmup_col`` true are late only as their first writer
    judged them (``judged_late``).

    A row is late at or below the watermark, as the join counts it. ``event_time_col`` comes out as a
    copy without the watermark's mark, and no output column carries it: Spark drops no late row before
    the join, and the operator passes the watermark on to it.
    """
    window_ms = _positive_window_ms(window_seconds)
    return _call_static(df, JVM_ENTRY, "flagLateBeforeJoin", list(keys), event_time_col, window_ms, flag_col,
                        passthrough_col, partition_col, offset_col, late_col, warmup_col,
                        judged_late_text(judged_late or {}))


def temporal_join(
    df: DataFrame,
    keys: list[str],
    *,
    side_col: str,
    event_time_col: str,
    late_col: str,
    warmup_col: str,
    partition_col: str,
    offset_col: str,
    left_col: str,
    right_col: str,
    window_seconds: float,
    left_outer: bool,
    kafka_time_col: str | None = None,
    closed_left: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    judged_late: tuple[JudgedLateRanges, JudgedLateRanges] | None = None,
) -> DataFrame:
    """Temporal join of two sides unioned in ``df`` (``io.glasspipe.spark.TemporalJoin``): grouped by
    ``keys``, a left row (``side_col`` = JOIN_LEFT) and a right row (JOIN_RIGHT) match when their event
    times lie within ``window_seconds`` of each other; each pair is emitted once, when its second row
    arrives, as a row with ``side_col`` = JOIN_BOTH and both structs (``left_col``, ``right_col``). Rows
    are evicted by event-time timers once the watermark reaches ``t + window`` (an inner join's timers, a
    bucket of keys each, up to half a window later); with ``left_outer`` a left row that matched
    nothing is emitted then (side JOIN_LEFT, right struct NULL). ``kafka_time_col``: the records' Kafka timestamps; a
    joined row has the later of its two rows' that arrived in its batch (the record that made the pair), an
    unmatched left row NULL (its window's close emits it). Rows with
    ``late_col`` true, or NULL and at or below the watermark, pass through at once (late flag true)
    without entering state. The query must define a watermark upstream, but no column of ``df`` may
    carry its mark (Spark would drop late rows first); the result has ``df``'s columns and no
    watermark, so nothing stateful may follow. ``closed_left``: after a hand-over, per Kafka partition of the left
    side, (end offset, closed event time ms) of each earlier writer (``handover.closed_windows``): a warm-up left row
    one of them read and whose window it closed is dropped, as that writer wrote it. ``judged_late``: the left and
    the right side's ranges of warm-up rows earlier writers found late (``deduplicate_within_window``); such a row of a
    side without deduplication is late again here.
    """
    window_ms = round(window_seconds * 1000)
    if window_ms < 0:
        raise ValueError(f"window_seconds must not be negative, got {window_seconds}")
    return _call_static(df, JOIN_ENTRY, "join", list(keys), side_col, event_time_col, late_col, warmup_col,
                        partition_col, offset_col, kafka_time_col, left_col, right_col, window_ms, left_outer,
                        closed_windows_text(closed_left or {}), *(judged_late_text(j) for j in judged_late or ({}, {})))


def partition_rows_text(rows: Mapping[int, Sequence[tuple[int, ...]]]) -> str:
    """Numbers per Kafka partition as io.glasspipe.spark.PartitionRows parses them: ``p:a@b,a@b;p:...``; a partition
    without rows is left out."""
    return ";".join(f"{p}:" + ",".join("@".join(map(str, row)) for row in steps)
                    for p, steps in sorted(rows.items()) if steps)


def closed_windows_text(closed: Mapping[int, Sequence[tuple[int, int]]]) -> str:
    """``closed_left`` as io.glasspipe.spark.ClosedWindows parses it: ``p:end@w,end@w;p:...``."""
    return partition_rows_text(closed)


def judged_late_text(ranges: JudgedLateRanges) -> str:
    """``judged_late`` as io.glasspipe.spark.JudgedLate parses it: ``p:lo@hi@m,lo@hi@m;p:...``."""
    return partition_rows_text(ranges)


JOIN_ENTRY = "io.glasspipe.spark.TemporalJoin"
JSON_ENTRY = "io.glasspipe.spark.JsonValues"
JOIN_LEFT, JOIN_RIGHT, JOIN_BOTH = 0, 1, 2  # io.glasspipe.spark.TemporalJoin.LEFT / RIGHT / JOINED


_loaded: dict[tuple[int, str], Any] = {}  # (id(JVM view), class name) -> the class, once the jar has it


def _loaded_class(spark: Any, entry: str) -> Any:
    """The ops jar's class ``entry``, or None when the jar is not loaded. Looked up once (read every micro-batch:
    each part of its name is a JVM call); only a class found is kept: py4j resolves a class the classpath lacks to
    a JavaPackage, and a later session may have the jar."""
    jvm = spark.sparkContext._jvm
    cls = _loaded.get((id(jvm), entry))
    if cls is None:
        cls = jvm
        for part in entry.split("."):
            cls = getattr(cls, part)
        if not isinstance(cls, JavaClass):
            return None
        _loaded[(id(jvm), entry)] = cls
    return cls


ARROW_BATCHES_ENTRY = "io.glasspipe.spark.ArrowBatches"


def arrow_batch_rdd(df: DataFrame, large_var_types: bool) -> Any:
    """``df``'s rows as a JavaRDD of serialized Arrow record batches, as ``Dataset.toArrowBatchRdd`` gives them,
    written by the ops jar's ``ArrowBatches`` straight from the rows (Spark's writer was 12.6 % of the tasks'
    time at 80 000 events/s). None when the jar is not loaded or a column has a type it does not fill (an
    array, a map, a struct...): then Spark's writer is the caller's."""
    cls = _loaded_class(df.sparkSession, ARROW_BATCHES_ENTRY)
    if cls is None:
        return None
    jdf = df._jdf
    max_records = int(df.sparkSession.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000") or 10000)
    return cls.batches(jdf.queryExecution().executedPlan(), jdf.schema(), max_records, large_var_types)


QUERY_END_ENTRY = "io.glasspipe.spark.QueryEnd"


class QueryEnd:
    """The ops jar's QueryEnd for one started query (a pyspark StreamingQuery): ends it between micro-batches,
    interrupting nothing (clean_stop.py). Without the jar nothing can be marked, and only ``stop()`` ends it."""

    def __init__(self, spark: Any, query: Any) -> None:
        self._cls = _loaded_class(spark, QUERY_END_ENTRY)
        self._jquery = query._jsq

    def after_batch_in_flight(self) -> bool:
        return self._cls is not None and bool(self._cls.afterBatchInFlight(self._jquery))

    def if_waiting_for_trigger(self) -> bool:
        return self._cls is not None and bool(self._cls.ifWaitingForTrigger(self._jquery))

    def thread_ended(self, seconds: float) -> bool:
        """Thread.join(0) would wait for ever: at least 1 ms."""
        return self._cls is not None and bool(self._cls.threadEnded(self._jquery, max(1, round(seconds * 1000))))


def keys_in_two_partitions(spark: Any) -> int:
    """How many times this driver saw a key again in another Kafka partition within its window (0 when the jar
    is not loaded: no dedup ran), in Spark's engine and in own state after the shuffle by key."""
    counted = (_loaded_class(spark, entry) for entry in ("io.glasspipe.spark.WindowDedup", PARTITION_DEDUP_ENTRY))
    return sum(int(cls.keysInTwoPartitions()) for cls in counted if cls is not None)


def _positive_window_ms(window_seconds: float) -> int:
    """A window in whole milliseconds, as the JVM operators take it; raises ValueError unless positive."""
    window_ms = round(window_seconds * 1000)
    if window_ms <= 0:
        raise ValueError(f"window_seconds must be positive, got {window_seconds}")
    return window_ms


def _static(df: DataFrame, entry: str) -> Any:
    """The ops jar's class ``entry`` in ``df``'s JVM. Raises RuntimeError naming the install step if the jar
    is not on the classpath (py4j then resolves the name to a JavaPackage)."""
    jvm = df.sparkSession.sparkContext._jvm
    assert jvm is not None
    target: Any = jvm
    for part in entry.split("."):
        target = getattr(target, part)
    if not isinstance(target, JavaClass):
        raise RuntimeError(
            f"{entry} is not on the Spark classpath: add jvm_ops_jar() to spark.jars "
            f"before the session starts (build it with `bash {INSTALL_SCRIPT}`)"
        )
    return target


def _call_static(df: DataFrame, entry: str, method: str, *args: Any) -> DataFrame:
    """``entry.method(df._jdf, *args)`` of the ops jar, as a DataFrame."""
    return DataFrame(getattr(_static(df, entry), method)(df._jdf, *args), df.sparkSession)
