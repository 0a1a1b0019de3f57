"""The temporal join operator (io.glasspipe.spark.TemporalJoin) on real local Spark + RocksDB state, without Kafka:
an inner join's buckets (BucketJoinProcessor) match at the window's bounds, pass late rows through, evict keys once
the watermark passes their window, and resume from a checkpoint; a left join's buckets emit an unmatched left row
in the batch whose watermark passes its window, not at the bucket's grid, and a matched one never.

The source is a folder of JSON files read one file per micro-batch, as in test_dedup_operator.py; each step is one
data micro-batch, plus Spark's no-data batch when the watermark moves, which fires the eviction timers.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from glasspipe.contract import STATE_ROW_COUNT_CONF
from glasspipe_job.jvm import JOIN_BOTH, JOIN_LEFT, JOIN_RIGHT, temporal_join
from state_progress import wait_state_rows

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar")]

SCHEMA = "k string, side int, ts timestamp, id string, p int, o long, w boolean, kt timestamp"
WINDOW_S = 60
LATENESS = "10 seconds"


def t(mmss: str) -> str:
    return f"2024-01-01T00:{mmss}Z"


class JoinStream:
    """A JSON file source folder plus a checkpoint; runs an inner (or left) join of its left and right rows by ``k``."""

    def __init__(self, spark: Any, root: Path, left_outer: bool = False,
                 closed_left: dict[int, list[tuple[int, int]]] | None = None,
                 judged_late: tuple[dict[int, list[tuple[int, int, int]]], dict[int, list[tuple[int, int, int]]]]
                 | None = None) -> None:
        self.spark, self.src, self.ckpt = spark, root / "in", root / "ckpt"
        self.left_outer, self.closed_left, self.judged_late = left_outer, closed_left, judged_late
        self.src.mkdir(parents=True)
        self.n = 0
        self.q: Any = None
        self.calls: dict[int, list[tuple[Any, ...]]] = {}
        self.kafka_times: dict[tuple[Any, ...], datetime | None] = {}  # (key, left id, right id) -> Kafka time out

    def start(self) -> None:
        from pyspark.sql import functions as F

        self.spark.conf.set(STATE_ROW_COUNT_CONF, "true")  # the state's keys, read by state_rows()
        src = (self.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(self.src))
               .withWatermark("ts", LATENESS))
        side = F.col("side")
        rows = src.select(
            "k", "side",
            F.timestamp_micros(F.unix_micros("ts")).alias("et"),  # without the watermark's mark: no row dropped
            F.lit(None).cast("boolean").alias("late"), F.coalesce("w", F.lit(False)).alias("warmup"), "p", "o", "kt",
            F.when(side == JOIN_LEFT, F.struct("id")).alias("l"),
            F.when(side == JOIN_RIGHT, F.struct("id")).alias("r"))
        out = temporal_join(rows, ["k"], side_col="side", event_time_col="et", late_col="late", warmup_col="warmup",
                            partition_col="p", offset_col="o", kafka_time_col="kt", left_col="l", right_col="r",
                            window_seconds=WINDOW_S, left_outer=self.left_outer, closed_left=self.closed_left,
                            judged_late=self.judged_late)
        self.q = (out.writeStream.foreachBatch(self._collect).outputMode("append")
                  .option("checkpointLocation", str(self.ckpt)).start())

    def _collect(self, df: Any, batch_id: int) -> None:
        rows = df.collect()
        self.calls[batch_id] = sorted(
            ((r.k, ("joined" if r.side == JOIN_BOTH else "late" if r.late else f"side {r.side}")
              + (" warm-up" if r.warmup else ""),  # a warm-up output row is not written (an earlier writer did)
              r.l.id if r.l else None, r.r.id if r.r else None) for r in rows), key=in_order)
        self.kafka_times.update(((r.k, r.l.id if r.l else None, r.r.id if r.r else None), r.kt) for r in rows)

    def step(self, rows: list[tuple[str | None, int, str, str]]) -> None:
        """One micro-batch of (key or NULL, side, event time, id) rows, in Kafka order (partition 0)."""
        self.step_at([(k, s, ts, i, False, 100 * self.n + j) for j, (k, s, ts, i) in enumerate(rows)])

    def step_at(self, rows: list[tuple[str | None, int, str, str, bool, int]],
                kafka_times: list[str] | None = None) -> None:
        """One micro-batch of (key or NULL, side, event time, id, warm-up, offset) rows (partition 0), with each
        row's Kafka timestamp from ``kafka_times`` (none: NULL)."""
        times: list[str | None] = list(kafka_times) if kafka_times else [None] * len(rows)
        tmp = self.src / f".f{self.n:04d}.json.tmp"
        tmp.write_text("".join(json.dumps({"k": k, "side": s, "ts": ts, "id": i, "p": 0, "o": o, "w": w, "kt": kt})
                               + "\n" for (k, s, ts, i, w, o), kt in zip(rows, times, strict=True)))
        os.rename(tmp, self.src / f"f{self.n:04d}.json")
        self.n += 1
        self.q.processAllAvailable()

    def rows(self) -> list[tuple[Any, ...]]:
        return [row for batch in sorted(self.calls) for row in self.calls[batch]]

    def wait_rows(self, expected: list[tuple[Any, ...]], timeout: float = 60) -> None:
        """Waits for the output to be ``expected``: Spark's no-data batch, which fires the timers, may follow the
        data batch after processAllAvailable returned."""
        deadline = time.monotonic() + timeout
        while self.rows() != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.rows() == expected

    def wait_state_rows(self, expected: int) -> None:
        """Waits for the join's state to hold ``expected`` keys (Spark counts a bucket's map entries)."""
        wait_state_rows(self.q, expected)

    def stop(self) -> None:
        if self.q is not None:
            self.q.stop()
            self.q = None


L, R = JOIN_LEFT, JOIN_RIGHT


def in_order(row: tuple[Any, ...]) -> tuple[str, ...]:
    """A batch's output rows in order, a NULL (key or side) first."""
    return tuple("" if v is None else str(v) for v in row)


def test_an_inner_join_matches_at_the_windows_bounds_and_evicts_past_them(spark: Any, tmp_path: Path) -> None:
    s = JoinStream(spark, tmp_path)
    s.start()
    try:
        s.step([("a", L, t("00:00"), "la"), ("b", R, t("00:05"), "rb"), ("c", L, t("00:00"), "lc")])
        # a: right rows exactly a window after la (matches) and a second past it (does not), in either side's
        # order; b: a left row 1 s before rb; c: nothing to match
        s.step([("a", R, t("01:01"), "ra-61s"), ("a", R, t("01:00"), "ra-60s"), ("b", L, t("00:04"), "lb"),
                ("a", L, t("00:59"), "la2")])
        assert s.rows() == [("a", "joined", "la", "ra-60s"), ("a", "joined", "la2", "ra-60s"),
                            ("a", "joined", "la2", "ra-61s"), ("b", "joined", "lb", "rb")]
        s.wait_state_rows(3)  # a, b, c
        # Event time jumps to 10:00: watermark 09:50, past every window above (at most 02:01) and the grid step
        # (30 s) after it: all their keys go, z stays.
        s.step([("z", L, t("10:00"), "lz")])
        s.wait_state_rows(1)
        # a late right row of a passes through flagged and touches no state; z's right row matches
        s.step([("a", R, t("00:30"), "ra-late"), ("z", R, t("10:30"), "rz")])
        assert s.rows()[4:] == [("a", "late", None, "ra-late"), ("z", "joined", "lz", "rz")]
        s.wait_state_rows(1)
    finally:
        s.stop()


def test_a_joined_row_has_the_later_kafka_time_of_its_batchs_rows_and_an_unmatched_left_row_none(
        spark: Any, tmp_path: Path) -> None:
    """The Kafka timestamp a joined row carries (its end-to-end latency's start) is that of the record whose arrival
    made the pair: the state keeps none, so a pair with a kept row has the fresh row's, a pair of two fresh rows the
    later one's (whichever side); a left row emitted when its window closes has none."""
    s = JoinStream(spark, tmp_path, left_outer=True)
    s.start()
    try:
        s.step_at([("a", L, t("00:00"), "la", False, 0), ("b", L, t("00:00"), "lb", False, 1)],
                  kafka_times=["2026-01-01T12:00:01Z", "2026-01-01T12:00:02Z"])
        s.step_at([("a", R, t("00:10"), "ra", False, 100)], kafka_times=["2026-01-01T12:00:05Z"])
        s.step_at([("c", L, t("00:20"), "lc", False, 200), ("c", R, t("00:21"), "rc", False, 201),
                   ("d", L, t("00:20"), "ld", False, 202), ("d", R, t("00:22"), "rd", False, 203)],
                  kafka_times=["2026-01-01T12:00:09Z", "2026-01-01T12:00:08Z",
                               "2026-01-01T12:00:06Z", "2026-01-01T12:00:07Z"])
        s.step_at([("z", L, t("10:00"), "lz", False, 300)], kafka_times=["2026-01-01T12:00:10Z"])
        s.wait_rows([("a", "joined", "la", "ra"), ("c", "joined", "lc", "rc"), ("d", "joined", "ld", "rd"),
                     ("b", "side 0", "lb", None)])
    finally:
        s.stop()

    def utc(hms: str) -> datetime:
        return datetime.fromisoformat(f"2026-01-01T{hms}+00:00")

    got = {k: (v.astimezone(UTC) if v else None) for k, v in s.kafka_times.items()}
    assert got == {("a", "la", "ra"): utc("12:00:05"), ("c", "lc", "rc"): utc("12:00:09"),
                   ("d", "ld", "rd"): utc("12:00:07"), ("b", "lb", None): None}, got


def test_an_inner_joins_buckets_resume_from_the_checkpoint(spark: Any, tmp_path: Path) -> None:
    """Rows kept before a restart match rows after it; several keys of one batch share the buckets' map."""
    s = JoinStream(spark, tmp_path)
    s.start()
    try:
        s.step([(f"k{i}", L, t("00:00"), f"l{i}") for i in range(50)])
        s.stop()
        s.start()
        s.step([(f"k{i}", R, t("00:30"), f"r{i}") for i in range(0, 50, 2)])
        assert s.rows() == sorted((f"k{i}", "joined", f"l{i}", f"r{i}") for i in range(0, 50, 2))
        s.wait_state_rows(50)
    finally:
        s.stop()


def keys_in_one_bucket(spark: Any) -> tuple[str, str]:
    """Two keys that share a bucket of the join (``pmod(hash(k), 1024)``, as KeyBuckets groups them)."""
    seen: dict[int, str] = {}
    for row in spark.range(3000).selectExpr("concat('k', id) AS k", "pmod(hash(concat('k', id)), 1024) AS b").collect():
        if row.b in seen:
            return seen[row.b], row.k
        seen[row.b] = row.k
    raise AssertionError("3 000 keys in 1 024 buckets without two in one")


def test_a_bucket_timer_evicts_the_keys_that_are_due_and_keeps_the_others_whole(spark: Any, tmp_path: Path) -> None:
    """A bucket's timer evicts the keys whose window has passed; the other key of the bucket keeps its rows,
    matches after the timer fired, and goes when the timer set for it fires."""
    old, new = keys_in_one_bucket(spark)
    s = JoinStream(spark, tmp_path)
    s.start()
    try:
        s.step([(old, L, t("00:00"), "lo")])
        # watermark 01:35: past old's window (01:00) and the bucket's grid point after it (a half window, 30 s, at
        # most 01:30), not new's (02:45)
        s.step([(new, L, t("01:45"), "ln")])
        s.wait_state_rows(1)
        s.step([(new, R, t("02:10"), "rn"), (old, R, t("01:40"), "ro")])  # ro: its left row has gone
        assert s.rows() == [(new, "joined", "ln", "rn")]
        s.wait_state_rows(2)  # new, and old again with ro only
        s.step([("z", L, t("10:00"), "lz")])
        s.wait_state_rows(1)
    finally:
        s.stop()


def key_with_grid_point_after(spark: Any, expiry_s: int, at_least_s: int) -> str:
    """A key whose bucket's sweep timer for a row expiring at ``expiry_s`` falls ``at_least_s`` or more after it
    (KeyBuckets.timerFor: the bucket's phase ``bucket * grid / 1024`` on a grid of half the window)."""
    grid_ms = WINDOW_S * 1000 // 2
    for row in spark.range(200).selectExpr("concat('k', id) AS k", "pmod(hash(concat('k', id)), 1024) AS b").collect():
        phase = row.b * grid_ms // 1024
        timer = phase + -(-(expiry_s * 1000 - phase) // grid_ms) * grid_ms
        if timer - expiry_s * 1000 >= at_least_s * 1000:
            return str(row.k)
    raise AssertionError("no key of 200 in a bucket whose grid point is late enough")


def test_a_left_join_emits_an_unmatched_row_when_the_watermark_passes_its_window_not_at_the_grid(
    spark: Any, tmp_path: Path
) -> None:
    """An unmatched left row is due when the watermark passes t + window (docs/semantics.md), exactly, though its
    bucket sweeps only on a grid of half a window: its own timer emits it. A left row unmatched on arrival that
    matches later is emitted joined and never unmatched; both keys leave the state."""
    k = key_with_grid_point_after(spark, 60, 15)  # la's bucket sweeps 15-30 s after la's window ends (01:00)
    s = JoinStream(spark, tmp_path, left_outer=True)
    s.start()
    try:
        s.step([(k, L, t("00:00"), "la"), ("m", L, t("00:00"), "lm")])
        s.step([("m", R, t("00:40"), "rm")])  # lm matches a batch after it arrived
        s.wait_rows([("m", "joined", "lm", "rm")])
        # watermark 01:05: past la's and lm's window (01:00), before la's bucket's sweep (01:15 or later)
        s.step([("z", L, t("01:15"), "lz")])
        s.wait_rows([("m", "joined", "lm", "rm"), (k, "side 0", "la", None)])
        s.step([("z", R, t("01:20"), "rz"), ("y", L, t("05:00"), "ly")])  # watermark 04:50: every window above ends
        s.wait_rows([("m", "joined", "lm", "rm"), (k, "side 0", "la", None), ("z", "joined", "lz", "rz")])
        # left: y's key, y's row waiting for its window (pending) and its bucket's sweep timer (a value)
        s.wait_state_rows(3)
    finally:
        s.stop()


def test_a_left_joins_waiting_rows_that_share_a_slot_are_each_emitted_in_the_batch_that_passes_their_window(
    spark: Any, tmp_path: Path
) -> None:
    """A bucket's waiting left rows share a pending timer a slot of expiry (BucketJoinProcessor.SLOT_MS, 4 s; the
    slots here start at 01:00 and 01:04), set at the slot's earliest expiry: a row added later with an earlier expiry
    moves it, and when it fires the rows not yet due stay with the timer set again at the earliest of them. Each row
    is still emitted in the batch whose watermark passes its window, and one matched meanwhile never."""
    k1, k2 = keys_in_one_bucket(spark)
    s = JoinStream(spark, tmp_path, left_outer=True)
    s.start()
    try:
        s.step([(k2, L, t("00:02"), "lb"), (k2, L, t("00:03"), "lb2")])  # expiries 01:02 and 01:03: timer 01:02
        s.step([(k1, L, t("00:00"), "la")])  # expiry 01:00, the same slot: the timer moves to 01:00
        s.step([("z", L, t("01:11"), "lz")])  # watermark 01:01: la is due, lb and lb2 are not
        s.wait_rows([(k1, "side 0", "la", None)])
        s.step([(k2, R, t("01:02.500"), "rb")])  # within lb2's window (59.5 s), a half second past lb's
        s.wait_rows([(k1, "side 0", "la", None), (k2, "joined", "lb2", "rb")])
        s.step([("z", L, t("01:12.500"), "lz2")])  # watermark 01:02.5: lb is due (its re-set timer), lb2 matched
        s.wait_rows([(k1, "side 0", "la", None), (k2, "joined", "lb2", "rb"), (k2, "side 0", "lb", None)])
        s.step([("y", L, t("05:00"), "ly")])  # watermark 04:50: z's rows are due, y waits
        s.wait_rows([(k1, "side 0", "la", None), (k2, "joined", "lb2", "rb"), (k2, "side 0", "lb", None),
                     ("z", "side 0", "lz", None), ("z", "side 0", "lz2", None)])
        s.wait_state_rows(3)  # y's key, its pending slot and its bucket's sweep timer
    finally:
        s.stop()


def test_a_left_joins_unmatched_rows_are_emitted_after_a_restart_and_a_null_key_at_once(
    spark: Any, tmp_path: Path
) -> None:
    """The keys waiting for their window (and their timers) are in the checkpoint: rows kept before a restart are
    emitted unmatched after it, once, and those that matched after it are not. A NULL key matches nothing: its left
    row is emitted at once."""
    s = JoinStream(spark, tmp_path, left_outer=True)
    s.start()
    try:
        s.step([(f"k{i}", L, t("00:00"), f"l{i}") for i in range(20)])
        s.stop()
        s.start()
        s.step([(f"k{i}", R, t("00:30"), f"r{i}") for i in range(0, 20, 2)] + [(None, L, t("00:30"), "lnull")])
        first = sorted([(None, "side 0", "lnull", None),
                        *((f"k{i}", "joined", f"l{i}", f"r{i}") for i in range(0, 20, 2))], key=in_order)
        s.wait_rows(first)
        s.step([("z", L, t("03:00"), "lz")])  # watermark 02:50: every window above ends
        s.wait_rows([*first, *sorted(((f"k{i}", "side 0", f"l{i}", None) for i in range(1, 20, 2)), key=in_order)])
        s.wait_state_rows(3)  # z's key, its pending row and its bucket's sweep timer
    finally:
        s.stop()


def test_a_left_join_after_a_hand_over_drops_the_warm_up_rows_an_earlier_writer_closed(
    spark: Any, tmp_path: Path
) -> None:
    """A new writer re-reads the last window of the left side as warm-up. A warm-up left row that a writer before the
    hand-over read (its end offset is above the row's) and evicted (its watermark passed t + window) was written by
    that writer: it is dropped, so it is neither written unmatched again nor paired with a fresh right row. The
    others stay: one whose window no earlier writer closed is written unmatched once its window ends, or joined; a
    NULL key's warm-up row was written on arrival, so it comes out flagged warm-up (not written)."""
    closed = {w: int(datetime.fromisoformat(t(w)).timestamp() * 1000) - WINDOW_S * 1000 for w in ("00:40", "01:05")}
    # the writer that read offsets below 3 reached watermark 00:40, the one that read up to 15 reached 01:05: they
    # closed the windows of left rows up to a window before (handover.closed_windows records t + window <= W as t)
    s = JoinStream(spark, tmp_path, left_outer=True, closed_left={0: [(3, closed["00:40"]), (15, closed["01:05"])]})
    s.start()
    try:
        s.step_at([("a", L, t("00:00"), "la", True, 0),  # read below 3 and below 15: 01:05 closed it
                   ("b", L, t("00:30"), "lb", True, 1),  # window to 01:30: open
                   (None, L, t("00:10"), "lnull", True, 2),
                   ("d", L, t("00:00"), "ld", True, 5),  # read by the second writer: closed
                   ("c", L, t("00:20"), "lc", True, 20)])  # no earlier writer read it: open
        s.wait_rows([(None, "side 0 warm-up", "lnull", None)])
        s.step_at([("a", R, t("00:55"), "ra", False, 100), ("b", R, t("01:20"), "rb", False, 101)])
        s.wait_rows([(None, "side 0 warm-up", "lnull", None), ("b", "joined", "lb", "rb")])
        s.step([("z", L, t("03:00"), "lz")])  # watermark 02:50: every window above ends
        s.wait_rows([(None, "side 0 warm-up", "lnull", None), ("b", "joined", "lb", "rb"),
                     ("c", "side 0", "lc", None)])
    finally:
        s.stop()


def test_a_warm_up_row_below_the_new_writers_watermark_is_kept_not_late(spark: Any, tmp_path: Path) -> None:
    """A new writer reads its warm-up over many micro-batches, and its watermark rises with the partition furthest
    ahead: a warm-up row of a partition behind falls below it. That row was on time for the writer that read it
    first, so it is not late here: it enters the state, matches a fresh row, and an unmatched left row is written
    with NULLs when its window ends (before, it was dropped as late and neither happened)."""
    s = JoinStream(spark, tmp_path, left_outer=True)
    s.start()
    try:
        s.step_at([("a", L, t("03:00"), "la", True, 0)])  # warm-up ahead in event time: watermark 02:50
        s.step_at([("b", L, t("02:30"), "lb", True, 1), ("c", L, t("02:20"), "lc", True, 2)])  # below it
        s.step_at([("b", R, t("03:00"), "rb", False, 100)])  # fresh: within lb's window
        s.wait_rows([("b", "joined", "lb", "rb")])
        s.step([("z", L, t("06:00"), "lz")])  # watermark 05:50: la's and lc's windows end, unmatched
        s.wait_rows([("b", "joined", "lb", "rb"), ("a", "side 0", "la", None), ("c", "side 0", "lc", None)])
    finally:
        s.stop()



def test_a_warm_up_right_row_its_first_writer_found_late_does_not_match_an_open_left_row(
    spark: Any, tmp_path: Path
) -> None:
    """A right row that was late for the writer that read it first went to the dead-letter topic, and the left row it
    would have matched stayed open there. A new writer that reads both again as warm-up must keep that right row late
    (handover.judged_late: the batch that read offsets 10-12 dead-lettered rows up to 01:00): else it marks the left
    row matched, and that row, which no writer has written yet, is never written. A warm-up row in the same range but
    after 01:00 was on time there: it joins as before."""
    up_to = int(datetime.fromisoformat(t("01:00")).timestamp() * 1000)
    s = JoinStream(spark, tmp_path, left_outer=True, judged_late=({}, {0: [(10, 12, up_to)]}))
    s.start()
    try:
        s.step_at([("a", L, t("01:30"), "la", True, 5), ("b", L, t("01:30"), "lb", True, 6),
                   ("a", R, t("01:00"), "ra", True, 11),  # late for its first writer
                   ("b", R, t("01:40"), "rb", True, 12)])  # on time for it
        s.wait_rows([("a", "late warm-up", None, "ra"), ("b", "joined warm-up", "lb", "rb")])
        s.step([("z", L, t("03:00"), "lz")])  # watermark 02:50: la's window (to 02:30) ends, unmatched
        s.wait_rows([("a", "late warm-up", None, "ra"), ("b", "joined warm-up", "lb", "rb"),
                     ("a", "side 0", "la", None)])
    finally:
        s.stop()
