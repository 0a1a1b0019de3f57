"""What happens to each micro-batch (``foreachBatch``), in this order:

1. a batch already committed in the ClickHouse ledger (a replay after a crash) is neither sent nor written
   again; otherwise the batch is taken to the driver one Spark partition at a time (arrow_parts.py) and
   for each partition:
2. its dead rows are produced to the dead-letter topic (flushed; at least once, with their original bytes
   and Kafka key), unless a newer writer took over (the fence);
3. its kept rows are written to ClickHouse in chunks, idempotently for this batch id (clickhouse/sink.py);
4. the batch is committed in the ledger, and its end offsets (from Spark's offset log) are committed to the
   pipeline's consumer group.

A crash anywhere replays the batch with the same id and rows: step 3 then writes nothing twice.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from glasspipe.api.validation import parse_clickhouse_type
from glasspipe_job.arrow_parts import FirstPartAhead, SparkWorker, arrow_partitions
from glasspipe_job.clean_stop import StopBetweenBatches
from glasspipe_job.clickhouse.ledger import LateRange
from glasspipe_job.clickhouse.sink import ClickHouseSink
from glasspipe_job.config import JobConfig
from glasspipe_job.freshness import epoch_micros
from glasspipe_job.handover import CheckpointFiles, Offsets, left_closed_through_ms, merge_offsets, records_between
from glasspipe_job.jvm import set_batch_watermark
from glasspipe_job.kafka_offsets import ConsumerGroup, not_behind
from glasspipe_job.metrics import JobMetrics
from glasspipe_job.transform import (
    DUPLICATE,
    EVENT_TIME,
    KAFKA_TIMESTAMP,
    KEY,
    LATE_REASON_PREFIX,
    META_COLUMNS,
    REASON,
    STATUS,
    WARMUP,
)

log = logging.getLogger("glasspipe.job")


class DeadLetters:
    """Produces unprocessable records to the dead-letter topic: original key and value bytes, reason and source
    coordinates in headers."""

    def __init__(self, client_conf: dict[str, str], topic: str, pipeline: str) -> None:
        self.topic = topic
        self.pipeline = pipeline
        self.producer = Producer({**client_conf, "enable.idempotence": "true", "linger.ms": "20"})

    def send(self, rows: pa.Table) -> int:
        errors: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        cols = {name: rows.column(name).to_pylist() for name in [*META_COLUMNS, KEY, REASON]}
        for i in range(rows.num_rows):
            headers: list[tuple[str, str | bytes | None]] = [
                ("glasspipe.reason", str(cols[REASON][i]).encode()),
                ("glasspipe.pipeline", self.pipeline.encode()),
                ("glasspipe.source.topic", str(cols["_gp_topic"][i]).encode()),
                ("glasspipe.source.partition", str(cols["_gp_partition"][i]).encode()),
                ("glasspipe.source.offset", str(cols["_gp_offset"][i]).encode()),
            ]
            while True:
                try:
                    self.producer.produce(self.topic, key=cols[KEY][i], value=cols["_gp_value"][i],
                                          headers=headers, on_delivery=on_delivery)
                    break
                except BufferError:
                    self.producer.poll(0.1)
        remaining = self.producer.flush(60)
        if remaining or errors:
            raise RuntimeError(f"dead-letter topic {self.topic}: {remaining} records undelivered, errors: "
                               f"{errors[:3]}; the batch will be retried")
        return rows.num_rows


@dataclass
class _BatchCounts:
    """What the parts of one batch held, gathered while the sink writes them."""

    parts: int = 0
    dead: int = 0
    duplicates: int = 0
    kafka: list[np.ndarray] = field(default_factory=list)
    event: list[np.ndarray] = field(default_factory=list)
    # (topic, partition) -> (lowest offset, highest offset, latest event time ms) of the late rows
    late: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)

    def add_late(self, dead: pa.Table) -> None:
        """Note the late rows among a part's dead rows: the ledger records their ranges with the batch
        (handover.judged_late), so that a successor that reads them again as warm-up keeps them late."""
        late = dead.filter(pc.and_(pc.fill_null(pc.starts_with(dead.column(REASON), LATE_REASON_PREFIX), False),
                                   pc.is_valid(dead.column(EVENT_TIME))))
        if not late.num_rows:
            return
        ms = np.floor_divide(epoch_micros(late.column(EVENT_TIME)), 1000)  # as the operators read event times
        stats = (pa.table({"t": late.column("_gp_topic"), "p": late.column("_gp_partition"),
                           "o": late.column("_gp_offset"), "ms": ms})
                 .group_by(["t", "p"]).aggregate([("o", "min"), ("o", "max"), ("ms", "max")]))
        for t, p, lo, hi, m in zip(*(stats.column(c).to_pylist() for c in ("t", "p", "o_min", "o_max", "ms_max")),
                                   strict=True):
            old = self.late.get((t, p))
            self.late[(t, p)] = (lo, hi, m) if old is None else (min(old[0], lo), max(old[1], hi), max(old[2], m))

    def late_ranges(self) -> list[LateRange]:
        return [LateRange(t, p, lo, hi, m) for (t, p), (lo, hi, m) in sorted(self.late.items())]

    def kafka_micros(self) -> np.ndarray:
        return np.concatenate(self.kafka) if self.kafka else np.zeros(0, dtype=np.int64)

    def event_micros(self) -> np.ndarray:
        return np.concatenate(self.event) if self.event else np.zeros(0, dtype=np.int64)


class BatchWriter:
    """The ``foreachBatch`` function of one pipeline replica."""

    def __init__(self, config: JobConfig, sink: ClickHouseSink, dead_letters: DeadLetters,
                 groups: list[ConsumerGroup], metrics: JobMetrics, checkpoint: str, batch_bound: int = 0,
                 first_start: Offsets | None = None, one_part: bool = False,
                 row_counts: Callable[[], dict[str, int]] | None = None, resume: Offsets | None = None) -> None:
        """``batch_bound``: the records of the largest batch (maxOffsetsPerTrigger); a batch known to be smaller
        is taken in fewer, larger parts (arrow_parts.partitions_per_part). 0: one Spark partition per part (a
        join, whose output may outgrow its input). ``first_start``: where the checkpoint's batch 0 starts (the
        hand-over's ``read_from``, persisted, so a replay sizes it alike); Kafka's "earliest"/"latest" (-2/-1)
        there count as offset 0 at most, which can only overstate the batch, never understate it. ``one_part``:
        every batch in one part (arrow_parts.arrow_partitions). ``row_counts``: the counts of what was read so far,
        for a plan whose operator counts them instead of ``observe`` (jvm.partition_dedup_counts). ``resume``: the
        hand-over's, where the rows its predecessors wrote end; the consumer group is never committed below it."""
        self.config = config
        self.one_part = one_part
        self.row_counts = row_counts
        self._rows_counted: dict[str, int] = {}
        self.batch_bound = batch_bound
        # the previous batch's id and end offsets: the hand-over's start stands for "batch -1"
        self._last_offsets: tuple[int, Sequence[Mapping[str, Mapping[Any, int]]]] | None = (
            None if first_start is None else (-1, [first_start]))
        self.sink = sink
        self.dead_letters = dead_letters
        self.groups = groups
        self.resume: Offsets = resume or {}
        self.metrics = metrics
        self.checkpoint = checkpoint
        self.failure: Exception | None = None  # the error a micro-batch raised (see __call__)
        self.stop_between_batches = StopBetweenBatches()  # a stop asked for ends the query after a whole batch
        self._ahead = SparkWorker()  # computes each batch's first part (arrow_parts.FirstPartAhead)
        self.output_names = [c.name for c in config.columns]
        self.required = [c.name for c in config.columns if not parse_clickhouse_type(c.clickhouse_type).nullable]

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """foreachBatch: Spark hands the driver only its own wrapper of an error raised here, so the error is
        also kept in ``failure`` for the runner to report in its own words."""
        self.stop_between_batches.batch_started()
        try:
            self._write(df, batch_id)
        except Exception as e:
            self.failure = e
            raise
        finally:
            self.stop_between_batches.batch_ended()

    def _write(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        files = CheckpointFiles(df.sparkSession, self.checkpoint)
        offsets, watermark = files.offset_log_and_watermark(batch_id)
        # for deduplication per Kafka partition, whose tasks flag late rows and expire state by it (jvm.py)
        set_batch_watermark(df.sparkSession, watermark)
        seen = _BatchCounts()
        # The batch's Spark job starts now, in the worker, while the sink looks the batch up in its ledger and
        # announces it there.
        tables = FirstPartAhead(self._ahead, df.sparkSession,
                                arrow_partitions(df, self._batch_records(files, batch_id, offsets), self.batch_bound,
                                                 self.one_part))
        try:
            result = self.sink.write_parts(batch_id, self._kept_parts(tables, seen),
                                           json.dumps(offsets, sort_keys=True),
                                           left_closed_through_ms(self.config.spec.join, watermark), seen.late_ranges)
            if result.skipped_replay and not tables.computed():
                # Committed before a crash (its dead letters were sent before that): nothing is sent or written
                # again, but the plan still runs so that Spark's state moves to this batch's version.
                df.write.format("noop").mode("overwrite").save()
        finally:
            tables.close()
        self._count_rows()
        if not result.skipped_replay:  # the batch's ledger row was just written: its rows are committed now
            self.metrics.observe_commit(time.time(), seen.kafka_micros(), seen.event_micros())
        for group, source_offsets in zip(self.groups, offsets, strict=False):
            try:
                group.commit(not_behind(source_offsets, self.resume))
            except RuntimeError as e:  # offsets are also in the checkpoint: the next batch commits again
                log.warning("%s", e)
        m = self.metrics
        self._check_key_partitioning(df)
        m.dead_lettered.inc(seen.dead)
        m.duplicates.inc(seen.duplicates)
        m.rows_written.inc(result.rows_written)
        m.batch_seconds.observe(time.monotonic() - started)
        t = m.totals
        t.dead_lettered += seen.dead
        t.duplicates += seen.duplicates
        t.rows_written += result.rows_written
        t.batches += 1
        t.replayed_batches += int(result.skipped_replay)
        log.info("batch %d: %d written, %d duplicates, %d dead-lettered%s in %d part(s), %.2f s (its first part's "
                 "Spark job %.2f s)", batch_id, result.rows_written, seen.duplicates, seen.dead,
                 " (replay: already committed)" if result.skipped_replay else "", seen.parts,
                 time.monotonic() - started, tables.first_seconds)

    def _count_rows(self) -> None:
        """The batch's counts of what was read, when its operator keeps them: the difference the batch's jobs made."""
        if self.row_counts is None:
            return
        now = self.row_counts()
        self.metrics.count_input({k: n - self._rows_counted.get(k, 0) for k, n in now.items()})
        self._rows_counted = now

    def _batch_records(self, files: CheckpointFiles, batch_id: int,
                       offsets: list[dict[str, dict[str, int]]]) -> int | None:
        """Kafka records in this batch, from its offset log entry and the previous one (kept from the previous
        call or, for batch 0, the hand-over's start; else read); None when unknown."""
        previous, self._last_offsets = self._last_offsets, (batch_id, offsets)
        if self.batch_bound <= 0:
            return None
        if previous is not None and previous[0] == batch_id - 1:
            before = previous[1]
        elif batch_id > 0 and files.exists(f"offsets/{batch_id - 1}"):
            before = files.offset_log(batch_id - 1)
        else:
            return None
        return records_between(merge_offsets(before), merge_offsets(offsets))

    def _kept_parts(self, tables: Iterator[pa.Table], seen: _BatchCounts) -> Iterator[pa.Table]:
        """The batch's rows to write, a part at a time (arrow_parts.py): the driver holds one part, never a
        larger batch. Each part's dead letters are sent (and flushed) before its rows are handed to the sink,
        after a check of the fence: a stale writer woken after a newer layout took over stops before it sends
        them again."""
        for table in tables:
            seen.parts += 1
            dead, kept, duplicates = self.split(table)
            if dead.num_rows:
                seen.add_late(dead)
                self.sink.check_fence()
                self.dead_letters.send(dead)
                for r in dead.column(REASON).to_pylist():
                    self.metrics.count_dead_letter(str(r).split(":")[0])
            seen.dead += dead.num_rows
            seen.duplicates += duplicates
            seen.kafka.append(epoch_micros(kept.column(KAFKA_TIMESTAMP)))
            seen.event.append(epoch_micros(kept.column(EVENT_TIME)))
            yield kept.select(self.output_names)

    def split(self, table: pa.Table) -> tuple[pa.Table, pa.Table, int]:
        """(dead rows, rows to write, duplicates dropped) of a part of a batch."""
        status = table.column(STATUS)
        dup = pc.fill_null(table.column(DUPLICATE), False)
        dead = table.filter(pc.equal(status, "dead"))
        kept = table.filter(pc.and_(pc.equal(status, "ok"), pc.invert(dup)))
        duplicates = int(pc.sum(pc.and_(pc.equal(status, "ok"), dup)).as_py() or 0)
        # A value that could not be cast to its column's type and may not be NULL: dead-letter the row.
        for name in self.required:
            bad = pc.is_null(kept.column(name))
            if pc.any(bad).as_py():
                rejected = kept.filter(bad)
                reason = pa.array([f"cast_failed: column {name} got no value"] * rejected.num_rows)
                rejected = rejected.set_column(rejected.schema.get_field_index(REASON), REASON, reason)
                dead = pa.concat_tables([dead, rejected])
                kept = kept.filter(pc.invert(bad))
        return dead, kept, duplicates

    def collected(self, df: DataFrame) -> DataFrame:
        """What the driver collects of a batch: no warm-up rows (a predecessor wrote them), and the original
        record (``_gp_value``, ~all of a row's bytes), key and topic only of rows that may become dead letters:
        dead rows and rows missing a required column (``cast_failed`` below). Applied to the streaming query
        (runner.start_pipeline), so that it is planned once, not again for every micro-batch (~65 ms of
        py4j calls and planning a batch)."""
        may_die = F.col(STATUS) == "dead"
        for name in self.required:
            may_die = may_die | F.col(name).isNull()
        only_dying = {"_gp_value", "_gp_topic", KEY}
        meta = [F.when(may_die, F.col(c)).alias(c) if c in only_dying else F.col(c) for c in [*META_COLUMNS, KEY]]
        return (df.where(~F.coalesce(F.col(WARMUP), F.lit(False)))
                .select(*self.output_names, *meta, STATUS, REASON, DUPLICATE, KAFKA_TIMESTAMP, EVENT_TIME))

    def _check_key_partitioning(self, df: DataFrame) -> None:
        from glasspipe_job.jvm import keys_in_two_partitions

        seen = keys_in_two_partitions(df.sparkSession)
        if seen > self.metrics.totals.keys_in_two_partitions:
            log.warning("%d key(s) so far were seen again in another Kafka partition within their window: "
                        "deduplication is only exact when producers key the topic by the deduplication key",
                        seen)
        self.metrics.totals.keys_in_two_partitions = seen
        self.metrics.keys_in_two_partitions.set(seen)


