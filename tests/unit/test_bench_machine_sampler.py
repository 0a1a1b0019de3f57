"""bench/machine_sampler.py's Spark threads by kind: a second's CPU lands in the kind its thread's name says, from
the second sample of a process on (the first only reads where its threads stand)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from machine_sampler import spark_threads


def burn_as(name: str, seconds: float, started: threading.Event) -> threading.Thread:
    """A thread of this process, named ``name`` as Linux knows it (what the JVM's RocksDB threads set), on a CPU for
    ``seconds``."""
    def run() -> None:
        Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/comm").write_text(name)
        started.set()
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def sample_while(name: str, seconds: float) -> dict[str, float]:
    """Sample this process, burn a thread named ``name`` for ``seconds``, and sample again while it still runs."""
    before: dict[int, float] = {}
    assert set(spark_threads(os.getpid(), before).values()) == {0.0}  # the first sample: where the threads stand
    started = threading.Event()
    thread = burn_as(name, seconds, started)
    started.wait(5)
    time.sleep(seconds / 2)
    seen = spark_threads(os.getpid(), before)
    thread.join()
    return seen


def test_a_compaction_thread_counts_as_rocksdb_not_as_tasks() -> None:
    seen = sample_while("rocksdb:low", 0.8)
    assert 0.2 < seen["spark_rocksdb"] < 0.8  # born after the first sample: counted from zero
    assert seen["spark_tasks"] == seen["spark_gc"] == seen["spark_maintenance"] == 0.0


def test_a_task_thread_counts_as_tasks() -> None:
    seen = sample_while("Executor task l", 0.8)
    assert 0.2 < seen["spark_tasks"] < 0.8 and seen["spark_rocksdb"] == 0.0
