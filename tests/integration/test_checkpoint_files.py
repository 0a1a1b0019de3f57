"""glasspipe's checkpoint file manager (io.glasspipe.spark.LocalCheckpointFileManager) on real local Spark:
the atomic-write contract Spark's offset log and state stores rely on, and a checkpoint that moves
between the job's settings (that manager, state rows not counted) and Spark's defaults in both directions
without a batch replayed or lost."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glasspipe.contract import CHECKPOINT_FILE_MANAGER_CONF as MANAGER_CONF
from glasspipe.contract import REQUIRED_SPARK_CONF, STATE_ROW_COUNT_CONF

pytestmark = pytest.mark.integration

MANAGER = "io.glasspipe.spark.LocalCheckpointFileManager"


def test_the_job_runs_with_the_local_manager_and_uncounted_state_rows() -> None:
    assert REQUIRED_SPARK_CONF[MANAGER_CONF] == MANAGER
    assert REQUIRED_SPARK_CONF[STATE_ROW_COUNT_CONF] == "false"


@pytest.fixture
def manager(spark: Any, tmp_path: Path) -> Any:
    jvm = spark.sparkContext._jvm
    return jvm.io.glasspipe.spark.LocalCheckpointFileManager(
        jvm.org.apache.hadoop.fs.Path(str(tmp_path)), spark._jsc.hadoopConfiguration())


def _write(spark: Any, manager: Any, path: Path, data: bytes, overwrite: bool) -> None:
    out = manager.createAtomic(spark.sparkContext._jvm.org.apache.hadoop.fs.Path(str(path)), overwrite)
    out.write(bytearray(data))
    out.close()


def _java_exception(e: BaseException) -> str:
    return str(e.java_exception.getClass().getName())  # type: ignore[attr-defined]


def test_writes_are_atomic_and_do_not_overwrite_unless_asked(spark: Any, manager: Any, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError

    assert manager.isLocal()
    target = tmp_path / "17"
    _write(spark, manager, target, b"first", overwrite=False)
    assert target.read_bytes() == b"first"
    assert sorted(os.listdir(tmp_path)) == ["17"], "the temporary file is renamed, and no checksum file written"

    # a second writer of the same batch fails as Spark's default manager does, and the file keeps the first
    with pytest.raises(Py4JJavaError) as failed:
        _write(spark, manager, target, b"second", overwrite=False)
    assert _java_exception(failed.value) == "org.apache.hadoop.fs.FileAlreadyExistsException"
    assert target.read_bytes() == b"first"

    # overwrite replaces it, and drops a checksum file an older writer left beside it
    (tmp_path / ".17.crc").write_bytes(b"stale")
    _write(spark, manager, target, b"third", overwrite=True)
    assert target.read_bytes() == b"third"
    assert not (tmp_path / ".17.crc").exists()
    stream = manager.open(spark.sparkContext._jvm.org.apache.hadoop.fs.Path(str(target)))
    assert bytes(spark.sparkContext._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)) == b"third"
    stream.close()


def test_a_cancelled_write_leaves_nothing(spark: Any, manager: Any, tmp_path: Path) -> None:
    out = manager.createAtomic(spark.sparkContext._jvm.org.apache.hadoop.fs.Path(str(tmp_path / "5")), False)
    out.write(bytearray(b"partial"))
    out.cancel()
    assert os.listdir(tmp_path) == []


class CountingQuery:
    """A file-source query counting words (a state store) whose foreachBatch records each batch id and
    its updated counts."""

    def __init__(self, spark: Any, root: Path) -> None:
        self.spark, self.src, self.ckpt = spark, root / "in", root / "ckpt"
        self.src.mkdir()
        self.batches: list[tuple[int, list[tuple[str, int]]]] = []
        self.n = 0

    def put(self, word: str) -> None:
        tmp = self.src / f".{self.n}.tmp"
        tmp.write_text(word + "\n")
        os.rename(tmp, self.src / f"{self.n:03d}.txt")
        self.n += 1

    def _record(self, df: Any, batch_id: int) -> None:
        self.batches.append((batch_id, sorted((r.value, r["count"]) for r in df.collect())))

    def run_once(self, manager: str | None, count_rows: bool) -> None:
        """Start with ``manager`` (None: Spark's default) and the state's rows counted or not, process what
        is there, stop."""
        if manager is None:
            self.spark.conf.unset(MANAGER_CONF)
        else:
            self.spark.conf.set(MANAGER_CONF, manager)
        self.spark.conf.set(STATE_ROW_COUNT_CONF, str(count_rows).lower())
        q = (self.spark.readStream.option("maxFilesPerTrigger", 1).text(str(self.src))
             .groupBy("value").count()  # a state store too, so its files move between managers
             .writeStream.outputMode("update")
             .foreachBatch(self._record)
             .option("checkpointLocation", str(self.ckpt)).start())
        try:
            q.processAllAvailable()
        finally:
            q.stop()


@pytest.fixture
def counting(spark: Any, tmp_path: Path) -> Iterator[CountingQuery]:
    before = {k: spark.conf.get(k, None) for k in (MANAGER_CONF, STATE_ROW_COUNT_CONF)}
    yield CountingQuery(spark, tmp_path)
    for k, v in before.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def test_a_checkpoint_moves_between_the_default_manager_and_glasspipes(counting: CountingQuery) -> None:
    """An upgrade and a rollback: Spark's defaults (its manager, rows counted), then the job's settings,
    then the defaults again, on one checkpoint."""
    counting.put("a")
    counting.run_once(None, count_rows=True)  # Spark's own manager writes the first batch
    counting.put("b")
    counting.run_once(MANAGER, count_rows=False)  # glasspipe's continues it
    counting.put("a")
    counting.run_once(None, count_rows=True)  # and Spark's takes it back
    assert counting.batches == [(0, [("a", 1)]), (1, [("b", 1)]), (2, [("a", 2)])], \
        "every batch once, in order, none replayed, and the state carried across (a counted twice)"
    state_files = sorted(p.name for p in (counting.ckpt / "state" / "0").rglob("*") if p.is_file())
    assert any(n.endswith((".delta", ".changelog", ".zip")) for n in state_files), state_files
