"""SIGKILL a running job again and again, each time mid-stream, whatever its speed.

A kill after the stream's last row proves nothing about a crash. Killing at a random time after a run's first row
left that to the job's speed: a faster job wrote the whole stream within six kills and the test failed (one inner
join run in three: rows after each kill 177, 2 209, 4 427, 7 226, 10 017, 12 000). Here each kill waits for a row
count drawn within its own stretch of the stream, so the last kill still leaves a stretch to the final run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from glasspipe_dev.process import ServerProcess


def kill_mid_stream(start: Callable[[], ServerProcess], count: Callable[[], int], rng: random.Random, total: int,
                    kills: int = 6, jitter_s: float = 1.0, timeout_s: float = 180.0) -> list[int]:
    """Start the job ``kills`` times and SIGKILL each run; returns the rows ``count()`` saw after each kill.

    The output (``total`` rows once the stream is done) is cut into ``kills + 2`` stretches: the k-th kill comes once
    this run has written something and the count has passed a row drawn within stretch k, then after up to
    ``jitter_s`` more (so kills fall at any phase of a batch: mid-INSERT, between INSERTs, mid-commit). The last two
    stretches are left for the run after the last kill. Fails if a run dies by itself, writes nothing in
    ``timeout_s``, or a kill lands after the last row.
    """
    stretch = total / (kills + 2)
    counts: list[int] = []
    for k in range(kills):
        job = start()
        try:
            before = count()
            target = max(before, int(stretch * (k + rng.random())))
            deadline = time.monotonic() + timeout_s
            while count() <= target:
                if not job.alive():
                    raise AssertionError(f"job died by itself (kill {k + 1}):\n{job.log_tail(60)}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no row past {target} within {timeout_s:.0f} s (kill {k + 1}, rows "
                                         f"after each kill {counts}):\n{job.log_tail(60)}")
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, jitter_s))
        finally:
            job.kill()
        counts.append(count())
        if counts[-1] >= total:
            raise AssertionError(f"kill {k + 1} came after the last row: {counts}")
    return counts
