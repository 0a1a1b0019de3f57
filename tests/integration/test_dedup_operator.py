"""Event-time dedup operator (io.glasspipe.spark.BucketDedupProcessor) on real local Spark + RocksDB state.

The source is a folder of JSON files read one file per micro-batch; each test step writes one file
and waits with processAllAvailable(), so each step is exactly one data micro-batch (plus Spark's
no-data batch when the watermark moves, which is what fires the eviction timers).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glasspipe.contract import STATE_ROW_COUNT_CONF
from glasspipe_job.jvm import deduplicate_within_window
from state_progress import state_rows, wait_state_rows

pytestmark = pytest.mark.integration

SCHEMA = "k string, ts timestamp, payload string"
WINDOW_S = 60
LATENESS = "10 seconds"


class Stream:
    """A JSON file source folder plus a checkpoint; runs the dedup query into a memory table."""

    def __init__(self, spark: Any, root: Path, late_col: str | None = None) -> None:
        self.spark = spark
        self.late_col = late_col
        self.src = root / "in"
        self.ckpt = root / "ckpt"
        self.src.mkdir(parents=True)
        self.n = 0
        self.q: Any = None
        self.calls: list[tuple[int, list[tuple[Any, ...]]]] = []

    def put(self, rows: list[tuple[str, str, str]]) -> None:
        tmp = self.src / f".f{self.n:04d}.json.tmp"
        tmp.write_text("".join(json.dumps({"k": k, "ts": t, "payload": p}) + "\n" for k, t, p in rows))
        os.rename(tmp, self.src / f"f{self.n:04d}.json")
        self.n += 1

    def start(self) -> None:
        # these tests read the state's row count (numRowsTotal), which the job leaves off for speed
        self.spark.conf.set(STATE_ROW_COUNT_CONF, "true")
        src = (
            self.spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(str(self.src))
            .withWatermark("ts", LATENESS)
        )
        out = deduplicate_within_window(src, ["k"], "ts", WINDOW_S, flag_col="dup", late_col=self.late_col)
        # foreachBatch (not the memory sink, which cannot restart from a checkpoint in append
        # mode) records what each micro-batch emitted, per batch id, including replays.
        self.q = (
            out.writeStream.foreachBatch(self._collect)
            .outputMode("append")
            .option("checkpointLocation", str(self.ckpt))
            .start()
        )

    def _collect(self, df: Any, batch_id: int) -> None:
        # One action only, sorted here: df.orderBy() would sample the input first, i.e. run the
        # stateful operator twice for the same batch.
        got = sorted(df.collect(), key=lambda r: (r.ts, r.payload))
        extra = (lambda r: (r[self.late_col],)) if self.late_col else (lambda r: ())
        self.calls.append((batch_id, [(r.k, r.payload, r.dup, *extra(r)) for r in got]))

    def step(self, rows: list[tuple[str, str, str]]) -> None:
        self.put(rows)
        self.q.processAllAvailable()

    def rows(self) -> list[tuple[Any, ...]]:
        """(key, payload, dropped[, late]) of everything emitted (last run of each batch), in batch order."""
        last = dict(self.calls)
        return [row for batch in sorted(last) for row in last[batch]]

    def state_rows(self) -> int:
        """Live keys in the dedup state (value rows; timers are not counted) after the last batch."""
        return state_rows(self.q)

    def wait_state_rows(self, expected: int, timeout: float = 60.0) -> None:
        wait_state_rows(self.q, expected, timeout)

    def stop(self) -> None:
        if self.q is not None:
            self.q.stop()
            self.q = None


def _stopped_after(s: Stream, root: Path) -> Iterator[Stream]:
    try:
        yield s
    finally:
        s.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def stream(spark_dedup: Any, tmp_path: Path) -> Iterator[Stream]:
    yield from _stopped_after(Stream(spark_dedup, tmp_path), tmp_path)


@pytest.fixture
def late_stream(spark_dedup: Any, tmp_path: Path) -> Iterator[Stream]:
    """The job's single-topic path: late rows flagged in ``late``, not dropped."""
    yield from _stopped_after(Stream(spark_dedup, tmp_path, late_col="late"), tmp_path)


def t(mmss: str) -> str:
    return f"2024-01-01T00:{mmss}Z"


def test_first_wins_window_and_reaccept(stream: Stream) -> None:
    stream.start()
    # Same micro-batch: a1 wins over a2 (later event time, 30 s into a1's window).
    stream.step([("a", t("00:30"), "a2"), ("a", t("00:00"), "a1"), ("b", t("00:05"), "b1")])
    # Next batch: a3 still inside a1's window; a4 at 61 s is past it and opens a new window,
    # which a5 (within 60 s of a4) falls into.
    stream.step([("a", t("00:50"), "a3"), ("a", t("01:01"), "a4"), ("a", t("01:30"), "a5")])
    assert stream.rows() == [
        ("a", "a1", False),
        ("b", "b1", False),
        ("a", "a2", True),
        ("a", "a3", True),
        ("a", "a4", False),
        ("a", "a5", True),
    ]
    # The watermark is now 01:20 (max event time 01:30 - 10 s): b's window (ended 01:05) is evicted,
    # a's new window (a4, until 02:01) is live.
    stream.wait_state_rows(1)


def test_watermark_evicts_state_and_key_is_accepted_again(stream: Stream) -> None:
    stream.start()
    stream.step([("a", t("00:00"), "a1"), ("b", t("00:05"), "b1")])
    stream.wait_state_rows(2)
    # Event time jumps to 10:00 -> watermark 09:50, past both windows (01:00, 01:05): the timers
    # fire (in the no-data batch Spark runs after the watermark moved) and a and b are evicted.
    stream.step([("c", t("10:00"), "c1")])
    stream.wait_state_rows(1)
    # b again, above the watermark and far outside its old window: a new first occurrence.
    # b at 00:20 is below the watermark: Spark drops it as late (never emitted).
    stream.step([("b", t("09:55"), "b2"), ("b", t("00:20"), "b-late"), ("c", t("10:30"), "c2")])
    assert stream.rows() == [
        ("a", "a1", False),
        ("b", "b1", False),
        ("c", "c1", False),
        ("b", "b2", False),
        ("c", "c2", True),
    ]
    stream.wait_state_rows(2)  # b (new window) and c


def test_late_rows_come_out_flagged_and_no_batch_compiles_a_watermark_check(late_stream: Stream) -> None:
    """The job's single-topic path: a late row is emitted with its late flag (for the dead-letter topic),
    and the plan holds no check of emitted event times, whose predicate holds the batch's watermark as a
    literal and so was compiled anew every micro-batch."""
    s = late_stream
    s.start()
    s.step([("a", t("00:00"), "a1")])
    s.step([("c", t("10:00"), "c1")])  # watermark 09:50 from the next batch on
    s.step([("b", t("00:20"), "b-late"), ("a", t("09:55"), "a2"), ("c", t("10:30"), "c2")])
    assert s.rows() == [
        ("a", "a1", False, False),
        ("c", "c1", False, False),
        ("b", "b-late", False, True),
        ("a", "a2", False, False),
        ("c", "c2", True, False),
    ]
    plan = s.q._jsq.explainInternal(False)  # what StreamingQuery.explain() prints
    assert "TransformWithState" in plan and "UpdateEventTimeColumn" not in plan, plan


def test_state_survives_restart_and_replay_is_identical(stream: Stream) -> None:
    stream.start()
    stream.step([("a", t("00:00"), "a1"), ("b", t("00:01"), "b1")])
    stream.step([("a", t("00:10"), "a2"), ("c", t("00:12"), "c1"), ("c", t("00:13"), "c2")])
    replayed = max(p["batchId"] for p in stream.q.recentProgress if p["numInputRows"] > 0)
    stream.stop()
    original = dict(stream.calls)[replayed]
    assert original == [("a", "a2", True), ("c", "c1", False), ("c", "c2", True)]

    # Replay: forget the last data micro-batch (its commit, and any no-data batch after it); the
    # restarted query must run it again against the state as of before it, with the same result.
    for log in ("commits", "offsets"):
        for p in (stream.ckpt / log).iterdir():
            batch = p.name.lstrip(".").split(".")[0]
            if batch.isdigit() and (int(batch) > replayed or (log == "commits" and int(batch) == replayed)):
                p.unlink()
    n_calls = len(stream.calls)
    stream.start()
    stream.q.processAllAvailable()
    assert stream.calls[n_calls] == (replayed, original)

    # New input after the restart: keys seen before the restart are still deduplicated.
    stream.step([("a", t("00:20"), "a3"), ("b", t("00:30"), "b2"), ("d", t("00:31"), "d1")])
    last_data = max(p["batchId"] for p in stream.q.recentProgress if p["numInputRows"] > 0)
    assert dict(stream.calls)[last_data] == [("a", "a3", True), ("b", "b2", True), ("d", "d1", False)]


def test_a_key_of_several_columns_of_other_types(spark_dedup: Any, tmp_path: Path) -> None:
    """The state's map is keyed by the key columns' values (BucketDedupProcessor): a key of a long and a timestamp
    matches only on both, and a second batch still finds the first batch's keys."""
    src = tmp_path / "in"
    src.mkdir()
    spark_dedup.conf.set(STATE_ROW_COUNT_CONF, "true")
    ts = "2024-01-01T00:00:00Z"
    batches = [
        [(1, ts, t("00:00"), "x1"), (1, ts, t("00:10"), "x2"), (1, t("00:01"), t("00:05"), "y1"),
         (2, ts, t("00:20"), "z1")],
        [(1, ts, t("00:30"), "x3"), (2, t("00:01"), t("00:31"), "w1"), (3, ts, t("00:32"), "v1")],
    ]
    calls: dict[int, list[tuple[str, bool]]] = {}
    df = (spark_dedup.readStream.schema("n long, at timestamp, ts timestamp, payload string")
          .option("maxFilesPerTrigger", 1).json(str(src)).withWatermark("ts", LATENESS))
    out = deduplicate_within_window(df, ["n", "at"], "ts", WINDOW_S, flag_col="dup")

    def collect(batch: Any, batch_id: int) -> None:
        calls[batch_id] = sorted((r.payload, r.dup) for r in batch.collect())

    q = out.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt")).start()
    try:
        for i, rows in enumerate(batches):
            (src / f"f{i}.json").write_text(
                "".join(json.dumps({"n": n, "at": at, "ts": e, "payload": p}) + "\n" for n, at, e, p in rows))
            q.processAllAvailable()
        emitted = [row for b in sorted(calls) for row in calls[b]]
        assert emitted == [("x1", False), ("x2", True), ("y1", False), ("z1", False),
                           ("v1", False), ("w1", False), ("x3", True)]
        assert int(q.recentProgress[-1]["stateOperators"][0]["numRowsTotal"]) == 5  # the keys of x1 y1 z1 v1 w1
    finally:
        q.stop()


def test_own_state_drops_filtered_rows_before_its_shuffle_and_computes_its_input_once(
        spark_dedup: Any, tmp_path: Path) -> None:
    """deduplication.ownState (PartitionDedup after the shuffle by key) counts and drops the source filter's rows
    before the shuffle. Its verdict must not be a filter that Spark pushes below the input's projections: the
    condition then computed them again (the job's JSON parse twice a row, a third more task CPU)."""
    from pyspark.sql import functions as F

    from glasspipe_job.jvm import deduplicate_per_kafka_partition

    df = (spark_dedup.range(8).select(
        F.col("id").cast("string").alias("k"), F.timestamp_seconds(F.col("id")).alias("ts"),
        F.lit(0).alias("p"), F.col("id").alias("o"))
        .withColumn("digest", F.sha2(F.col("k"), 256)))  # stands for the parse: not cheap, so never inlined twice
    out = deduplicate_per_kafka_partition(
        df, ["k"], "ts", 60, flag_col="dup", late_col="late", passthrough_col=None, partition_col="p",
        offset_col="o", state_root=str(tmp_path / "state"), filtered=F.col("digest").startswith("0"),
        warmup=F.lit(False), shuffle_partitions=2)
    plan = out._jdf.queryExecution().executedPlan().toString()
    before_shuffle = plan[plan.index("Exchange"):]
    assert "FilteredCounter" in before_shuffle and "kept" in before_shuffle, plan
    assert plan.count("sha2(") == 1, plan
