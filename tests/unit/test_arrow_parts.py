"""How a micro-batch is cut into the parts the driver takes one at a time (arrow_parts.partitions_per_part), and
the batch size it is decided from (handover.records_between)."""

from collections.abc import Iterator

import pytest

from glasspipe_job.arrow_parts import partitions_per_part
from glasspipe_job.handover import records_between

pytestmark = pytest.mark.unit


def test_a_batch_of_unknown_size_goes_one_spark_partition_at_a_time() -> None:
    assert partitions_per_part(None, 233_016, 4) == 1


def test_a_small_batch_is_one_part() -> None:
    assert partitions_per_part(1_500, 233_016, 4) == 4
    assert partitions_per_part(58_254, 233_016, 4) == 4  # a quarter of the bound: one partition of a full batch


def test_a_larger_batch_takes_as_many_partitions_as_one_partition_of_a_full_batch_holds() -> None:
    assert partitions_per_part(60_000, 233_016, 4) == 3  # 45,000 rows expected a part, 58,254 before
    assert partitions_per_part(120_000, 233_016, 4) == 1
    assert partitions_per_part(65_536, 65_536, 4) == 1  # a full batch of the memory test: as before


def test_a_single_partition_is_one_part_whatever_the_size() -> None:
    assert partitions_per_part(10**9, 1, 1) == 1
    assert partitions_per_part(0, 1_000, 1) == 1


def test_records_between_two_offset_logs() -> None:
    start = {"t": {0: 10, 1: 0}}
    assert records_between(start, {"t": {0: 15, 1: 3}}) == 8
    assert records_between(start, start) == 0


def test_a_partition_without_a_start_makes_the_size_unknown() -> None:
    assert records_between({"t": {0: 10}}, {"t": {0: 15, 1: 3}}) is None


class _OffsetLog:
    """Stands in for handover.CheckpointFiles: the offset log entries of a checkpoint, counting reads."""

    def __init__(self, entries: dict[int, list[dict[str, dict[str, int]]]]) -> None:
        self.entries = entries
        self.reads: list[int] = []

    def exists(self, rel: str) -> bool:
        return int(rel.split("/")[1]) in self.entries

    def offset_log(self, batch_id: int) -> list[dict[str, dict[str, int]]]:
        self.reads.append(batch_id)
        return self.entries[batch_id]


def test_the_writer_sizes_a_batch_from_the_previous_offsets_it_saw_and_reads_them_only_when_it_did_not() -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from glasspipe_job.batch_writer import BatchWriter
    from glasspipe_job.config import JobConfig
    from glasspipe_job.handover import CheckpointFiles

    log = _OffsetLog({4: [{"t": {"0": 100}}], 5: [{"t": {"0": 160}}], 6: [{"t": {"0": 200}}]})
    files = cast(CheckpointFiles, log)
    config = cast(JobConfig, SimpleNamespace(columns=[]))
    no: Any = None
    writer = BatchWriter(config, no, no, [], no, "ckpt", batch_bound=1_000)
    assert writer._batch_records(files, 5, log.entries[5]) == 60
    assert log.reads == [4]  # a restarted writer reads the previous entry
    assert writer._batch_records(files, 6, log.entries[6]) == 40
    assert log.reads == [4]  # the next batch uses what the writer saw
    assert BatchWriter(config, no, no, [], no, "ckpt", 1_000)._batch_records(
        files, 9, [{"t": {"0": 300}}]) is None


def test_the_first_batch_of_a_checkpoint_is_sized_from_where_the_hand_over_started_it() -> None:
    """Batch 0 has no previous offset log entry: its start is the hand-over's read_from (a rescale's warm-up
    start). Kafka's -2/-1 there overstate the batch (safe: smaller parts), never understate it."""
    from types import SimpleNamespace
    from typing import Any, cast

    from glasspipe_job.batch_writer import BatchWriter
    from glasspipe_job.config import JobConfig
    from glasspipe_job.handover import CheckpointFiles

    log = _OffsetLog({})
    files = cast(CheckpointFiles, log)
    no: Any = None

    def writer(first: Any, bound: int = 1_000) -> BatchWriter:
        return BatchWriter(cast(JobConfig, SimpleNamespace(columns=[])), no, no, [], no, "ckpt", bound, first)

    end = [{"t": {"0": 700, "1": 900}}]
    assert writer({"t": {0: 500, 1: 850}})._batch_records(files, 0, end) == 250
    assert writer({"t": {0: -2, 1: -1}})._batch_records(files, 0, end) == 702 + 901
    assert writer({"t": {0: 500}})._batch_records(files, 0, end) is None  # a partition without a start
    assert writer(None)._batch_records(files, 0, end) is None
    assert writer({"t": {0: 500, 1: 850}}, bound=0)._batch_records(files, 0, end) is None  # a join
    assert log.reads == []


class _LocalProperties:
    """Stands in for SparkContext's JVM side: the local properties of the thread that calls it."""

    def __init__(self) -> None:
        import threading

        self.of_thread: dict[str, dict[str, str]] = {}
        self.current = threading.current_thread

    def getLocalProperties(self) -> "_LocalProperties._Props":
        return self._Props(dict(self.of_thread.get(self.current().name, {})))

    def setLocalProperties(self, props: "_LocalProperties._Props") -> None:
        self.of_thread[self.current().name] = dict(props.values)

    class _Props:
        def __init__(self, values: dict[str, str]) -> None:
            self.values = values

        def clone(self) -> "_LocalProperties._Props":
            return _LocalProperties._Props(dict(self.values))


def _spark(jvm: _LocalProperties) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(sparkContext=SimpleNamespace(_jsc=SimpleNamespace(sc=lambda: jvm)))


def test_a_batchs_first_part_is_computed_in_the_worker_with_the_callers_job_group_and_the_rest_by_the_caller() -> None:
    import threading

    from glasspipe_job.arrow_parts import FirstPartAhead, SparkWorker

    jvm = _LocalProperties()
    jvm.of_thread[threading.current_thread().name] = {"spark.jobGroup.id": "query-run-1"}
    computed_by: list[tuple[int, str, dict[str, str]]] = []
    first_started = threading.Event()
    release = threading.Event()
    closed: list[bool] = []

    def parts() -> Iterator[str]:
        try:
            for i in range(3):
                name = threading.current_thread().name
                computed_by.append((i, name, jvm.of_thread.get(name, {})))
                if i == 0:
                    first_started.set()
                    release.wait(10)
                yield f"part {i}"
        finally:
            closed.append(True)

    ahead = FirstPartAhead(SparkWorker(), _spark(jvm), parts())
    # the first part's job starts before anyone asks for it (the sink's ledger work goes on meanwhile)
    assert first_started.wait(10)
    release.set()
    assert list(ahead) == ["part 0", "part 1", "part 2"]
    me = threading.current_thread().name
    assert [(i, name) for i, name, _ in computed_by] == [(0, "glasspipe-batch-ahead"), (1, me), (2, me)]
    assert computed_by[0][2] == {"spark.jobGroup.id": "query-run-1"}  # stopping the query cancels it too
    assert ahead.computed()
    ahead.close()
    assert closed == [True]


def test_a_failed_first_part_raises_where_it_is_asked_for_and_close_waits_for_it_without_raising() -> None:
    from glasspipe_job.arrow_parts import FirstPartAhead, SparkWorker

    def parts() -> Iterator[str]:
        raise RuntimeError("Job aborted: stage failure")
        yield "never"

    worker = SparkWorker()
    ahead = FirstPartAhead(worker, _spark(_LocalProperties()), parts())
    with pytest.raises(RuntimeError, match="stage failure"):
        next(ahead)
    with pytest.raises(RuntimeError, match="stage failure"):
        ahead.computed()
    ahead.close()  # the caller already has the error (or one of its own): close only waits
    # the worker goes on serving the next batches
    later = FirstPartAhead(worker, _spark(_LocalProperties()), iter(["next batch"]))
    assert list(later) == ["next batch"]


def test_a_batch_without_parts_computed_nothing_so_a_replay_still_runs_its_plan() -> None:
    from glasspipe_job.arrow_parts import FirstPartAhead, SparkWorker

    ahead = FirstPartAhead(SparkWorker(), _spark(_LocalProperties()), iter([]))
    assert not ahead.computed()
    assert list(ahead) == []
    ahead.close()
