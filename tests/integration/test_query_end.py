"""Ending a streaming query after its micro-batch in flight (io.glasspipe.spark.QueryEnd, clean_stop.py) on real
local Spark: the batch that marks it runs to its end, Spark jobs in it included, and commits; no batch starts
after it; the query ends as a stopped one, with no exception, once its thread does (Spark's awaitTermination
answers from the mark alone). StreamingQuery.stop() at the same point interrupts the batch instead
(tests/integration/test_job_dedup.py's signal test saw it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from glasspipe_job.jvm import QueryEnd

pytestmark = pytest.mark.integration


def _commits(checkpoint: Path) -> list[str]:
    """The batches Spark's commit log holds."""
    return sorted(p.name for p in (checkpoint / "commits").iterdir() if not p.name.startswith("."))


def test_a_marked_query_ends_after_its_batch_in_flight(spark: Any, tmp_path: Path) -> None:
    """Batch 1 marks the query, then runs on for 3 s and runs Spark jobs: had the mark interrupted the batch (as
    stop() does), they would fail and batch 1 would not commit; had it not ended the query, batch 2 would run."""
    seen: list[tuple[int, int]] = []
    holder: dict[str, Any] = {}
    marked = threading.Event()

    def each_batch(df: Any, batch_id: int) -> None:
        if batch_id == 1:
            assert QueryEnd(spark, holder["query"]).after_batch_in_flight()
            marked.set()
            time.sleep(3)
        df.count()  # the batch's own plan, then another job
        seen.append((batch_id, int(spark.range(200_000).selectExpr("sum(id)").first()[0])))

    checkpoint = tmp_path / "ckpt"
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
              .writeStream.option("checkpointLocation", str(checkpoint)).foreachBatch(each_batch)
              .trigger(processingTime="100 milliseconds"))
    holder["query"] = query = stream.start()
    try:
        assert marked.wait(60), f"batch 1 never came: {seen}"
        assert query.awaitTermination(1) and len(seen) == 1, "Spark says the query ended while batch 1 runs"
        assert QueryEnd(spark, query).thread_ended(60), f"the query's thread did not end: {seen}"
        assert seen == [(0, 19_999_900_000), (1, 19_999_900_000)], seen  # batch 1 ran to its end
        time.sleep(1)  # a batch 2 would have started by now
    finally:
        query.stop()
    assert seen == [(0, 19_999_900_000), (1, 19_999_900_000)], seen
    assert query.exception() is None
    assert _commits(checkpoint) == ["0", "1"]


def test_a_query_asleep_until_its_next_trigger_is_ended_at_once(spark: Any, tmp_path: Path) -> None:
    """With a 30 s trigger, the thread sleeps most of the time: the mark wakes it, so the query ends within a
    second, not at its next trigger. While a batch runs, nothing is marked."""
    seen: list[int] = []
    during_batch: list[bool] = []
    holder: dict[str, Any] = {}

    def each_batch(df: Any, batch_id: int) -> None:
        # from another thread, as the runner asks: the stream thread is in this batch, not asleep
        asker = threading.Thread(target=lambda: during_batch.append(holder["end"].if_waiting_for_trigger()))
        asker.start()
        asker.join()
        df.count()
        seen.append(batch_id)

    checkpoint = tmp_path / "ckpt"
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
              .writeStream.option("checkpointLocation", str(checkpoint)).foreachBatch(each_batch)
              .trigger(processingTime="30 seconds"))
    query = stream.start()
    holder["end"] = end = QueryEnd(spark, query)
    try:
        deadline = time.monotonic() + 60
        while not end.if_waiting_for_trigger():
            assert time.monotonic() < deadline, f"the thread never slept until a trigger: {seen}"
            time.sleep(0.05)
        marked = time.monotonic()
        assert end.thread_ended(10), "the query's thread did not end"
        ended_after = time.monotonic() - marked
    finally:
        query.stop()
    assert ended_after < 2, ended_after
    # batch 0, and batch 1 too when batch 0 ended past a 30 s boundary of the clock (Spark's trigger times)
    assert seen in ([0], [0, 1]) and during_batch == [False] * len(seen), (seen, during_batch)
    assert query.exception() is None
    assert _commits(checkpoint) == [str(b) for b in seen]
