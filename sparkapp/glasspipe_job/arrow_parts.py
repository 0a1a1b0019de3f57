"""A micro-batch taken to the driver one Spark partition at a time, as Arrow (``df.toArrow()`` would gather the
whole batch in the driver's heap at once: the catch-up of a long backlog ran out of memory).

When a batch takes several parts, one Spark job first computes every partition in parallel into Spark's
block store on local disk, and each part is then one job reading its partitions from there
(``PythonRDD.runJob``): every row is computed once, as with a single collect, and the stateful tasks run
side by side. A part is one Spark partition, or several consecutive ones when the batch is known to be
smaller than the largest one (``partitions_per_part``): fewer parts, fewer jobs, and each job's fixed cost
(~200 ms) was most of a small batch's latency. A part's
content does not depend on the order tasks finish in: the same batch replayed gives the same parts with the
same rows (the order of rows inside a part may differ; the sink sorts them).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
from pyspark.serializers import NoOpSerializer
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.util import _load_from_socket

from glasspipe_job.jvm import arrow_batch_rdd


def _large_var_types(df: DataFrame) -> bool:
    return df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"


def arrow_schema(df: DataFrame, large: bool | None = None) -> pa.Schema:
    """``df``'s Arrow schema; ``large``: 64-bit string offsets (read from the session's conf when None)."""
    return to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                           prefers_large_types=_large_var_types(df) if large is None else large)


def serialized_batches(df: DataFrame, large: bool) -> Any:
    """A JavaRDD of ``df``'s rows as serialized Arrow record batches (``arrow_schema(df, large)``'s layout): the ops
    jar's writer where it fills every column, else Spark's."""
    ours = arrow_batch_rdd(df, large)
    return ours if ours is not None else df._jdf.toArrowBatchRdd().toJavaRDD()


def partitions_per_part(batch_rows: int | None, batch_bound: int, partitions: int) -> int:
    """How many consecutive Spark partitions one part (one job, held in the driver at once) takes: a part is
    expected to hold no more rows than one partition of a full batch (``batch_bound`` records spread over
    ``partitions``), which is what the driver held before, one partition at a time. So a batch of
    ``batch_rows`` takes ``batch_bound // batch_rows`` partitions a part; 1 when its size is unknown. Pure: a
    replay with the same offsets and bound gets the same parts."""
    if batch_rows is None or partitions <= 1:
        return 1
    return max(1, min(partitions, batch_bound // max(batch_rows, 1)))


def arrow_partitions(df: DataFrame, batch_rows: int | None = None, batch_bound: int = 0,
                     one_part: bool = False) -> Iterator[pa.Table]:
    """The rows of ``df``, one Arrow table per part (``partitions_per_part`` consecutive Spark partitions, one
    without ``batch_rows``), in partition order; only the part being read is held in the driver (plus what
    the caller keeps).

    With more than one part, every partition is first computed in one job, in parallel, into Spark's block
    store on local disk (``DISK_ONLY``: nothing of it on the heap); each part is then read from there. One job
    per part used to run the last stage's tasks (the stateful ones) one after another on one core."""
    spark = df.sparkSession
    sc = spark.sparkContext
    jvm = sc._jvm
    assert jvm is not None
    large = _large_var_types(df)  # one read of the conf for both: the schema and the batches must agree
    schema = arrow_schema(df, large)
    rdd = serialized_batches(df, large)
    n = rdd.getNumPartitions()
    # one_part: the whole batch at once, for a plan whose partitions may come in another order when the batch is
    # replayed (deduplication per Kafka partition: Spark orders the Kafka source's ranges as its offsets map does);
    # the sink puts a part's rows in a canonical order, so a replayed batch's chunks hold the same rows.
    # A batch may have no partitions at all (Spark runs one without data to move the watermark on): no part.
    step = max(n, 1) if one_part else partitions_per_part(batch_rows, batch_bound, n)
    staged = step < n
    if staged:
        rdd.persist(jvm.org.apache.spark.storage.StorageLevel.DISK_ONLY())
    try:
        if staged:
            rdd.count()  # one job: all partitions computed in parallel and stored
        for first in range(0, n, step):
            sock = jvm.PythonRDD.runJob(sc._jsc.sc(), rdd, list(range(first, min(first + step, n))))
            with _load_from_socket(sock, NoOpSerializer()) as stream:
                batches = [pa.ipc.read_record_batch(pa.py_buffer(b), schema) for b in stream]
            yield pa.Table.from_batches(batches, schema=schema)
    finally:
        if staged:
            rdd.unpersist(False)


class SparkWorker:
    """One daemon thread that runs Spark work for the thread that submits it, with that thread's Spark local
    properties: a streaming query's job group (so that stopping the query cancels the job) and its SQL
    execution. The thread lives as long as the process; it idles between micro-batches."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, spark: Any, work: Callable[[], Any]) -> Future[Any]:
        jsc = spark.sparkContext._jsc.sc()
        properties = jsc.getLocalProperties().clone()

        def run() -> Any:
            jsc.setLocalProperties(properties)
            return work()

        done: Future[Any] = Future()
        self._work.put((done, run))
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="glasspipe-batch-ahead", daemon=True)
            self._thread.start()
        return done

    def _serve(self) -> None:
        while True:
            done, run = self._work.get()
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(run())
                except BaseException as e:  # handed to whoever waits on it
                    done.set_exception(e)


class FirstPartAhead(Iterator[pa.Table]):
    """The parts of a batch (``arrow_partitions``), the first of them computed by ``worker`` from the moment this
    is made: that is the batch's Spark job, which then runs while the caller does what need not wait for it
    (the ClickHouse ledger's lookup and announcement). The later parts are read in the caller's thread."""

    def __init__(self, worker: SparkWorker, spark: Any, parts: Iterator[pa.Table]) -> None:
        self._parts = parts
        self._made = time.monotonic()
        self.first_seconds = 0.0  # from this being made to the first part computed: the batch's Spark job
        self._first = worker.submit(spark, self._compute_first)
        self._taken = False

    def _compute_first(self) -> pa.Table | None:
        first = next(self._parts, None)
        self.first_seconds = time.monotonic() - self._made
        return first

    def __next__(self) -> pa.Table:
        if not self._taken:
            self._taken = True
            first = self._first.result()
            if first is None:
                raise StopIteration
            return first
        return next(self._parts)

    def computed(self) -> bool:
        """Wait for the first part; whether there was one (then its job computed every partition of the
        batch, so the query's state moved to this batch). Raises the job's error."""
        return self._first.result() is not None

    def close(self) -> None:
        """Wait for the first part's job (its error, if any, is the caller's to raise or not) and release
        what the parts hold (the block store's copy of a staged batch)."""
        self._first.exception()
        close = getattr(self._parts, "close", None)
        if close is not None:
            close()
