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


def burn_as(name: str, seconds: float, burned: threading.Event, sampled: threading.Event) -> threading.Thread:
    """A thread of this process, named ``name`` as Linux knows it (what the JVM's RocksDB threads set), on a CPU for
    ``seconds`` of its own CPU time; then it sets ``burned`` and lives on, idle, until ``sampled``: a sample on a
    busy machine sees the whole of its CPU and sees it still there, however the threads were scheduled."""
    def run() -> None:
        Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/comm").write_text(name)
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        burned.set()
        sampled.wait(30)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def sample_after(name: str, seconds: float) -> dict[str, float]:
    """Sample this process, let a thread named ``name`` burn ``seconds`` of CPU, and sample again while it lives."""
    before: dict[int, float] = {}
    assert set(spark_threads(os.getpid(), before).values()) == {0.0}  # the first sample: where the threads stand
    burned, sampled = threading.Event(), threading.Event()
    thread = burn_as(name, seconds, burned, sampled)
    assert burned.wait(30)
    seen = spark_threads(os.getpid(), before)
    sampled.set()
    thread.join()
    return seen


def test_a_compaction_thread_counts_as_rocksdb_not_as_tasks() -> None:
    seen = sample_after("rocksdb:low", 0.3)
    assert 0.25 <= seen["spark_rocksdb"] < 0.5  # born after the first sample: counted from zero (/proc: 10 ms ticks)
    assert seen["spark_tasks"] == seen["spark_gc"] == seen["spark_maintenance"] == 0.0


def test_a_task_thread_counts_as_tasks() -> None:
    seen = sample_after("Executor task l", 0.3)
    assert 0.25 <= seen["spark_tasks"] < 0.5 and seen["spark_rocksdb"] == 0.0
