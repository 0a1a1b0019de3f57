"""What a benchmark reads back from the job's log: each micro-batch's progress (Spark's durations) and the driver's
hand-over times, for bench/freshness.py's phases and bench/restart.py's batches."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

PROGRESS = re.compile(r"progress of batch (\d+): (\d+) input rows, durations ms (\{.*\})")


def batch_progress(log: Path) -> list[tuple[int, int, dict[str, float]]]:
    """(batch, input rows, Spark's durationMs by phase) of every micro-batch the job logged, in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if m := PROGRESS.search(line):
            out.append((int(m.group(1)), int(m.group(2)), json.loads(m.group(3))))
    return out


WRITTEN = re.compile(r"batch (\d+): .* ([\d.]+) s \(its first part's Spark job ([\d.]+) s\)")


def phases_by_fifth(log: Path, first: int) -> list[tuple[float, float, float]]:
    """For each fifth of the batches from ``first`` on that read records, in order: the median trigger (the
    whole batch, Spark's ``triggerExecution``), the median ``foreachBatch`` and, of it, the median Spark job
    computing the batch (the driver's hand-over to ClickHouse is the rest), in ms. A pipeline that falls behind
    shows which of them grew."""
    text = log.read_text(errors="replace")
    jobs = {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in WRITTEN.finditer(text)}
    rows = [(b, d) for b, n, d in batch_progress(log) if b >= first and n > 0 and b in jobs]
    if len(rows) < 5:
        return []
    out = []
    for i in range(5):
        part = rows[i * len(rows) // 5:(i + 1) * len(rows) // 5]
        out.append((statistics.median(float(d.get("triggerExecution", 0)) for _, d in part),
                    statistics.median(jobs[b][0] * 1000 for b, _ in part),
                    statistics.median(jobs[b][1] * 1000 for b, _ in part)))
    return out


def last_batch(log: Path) -> int:
    """The newest micro-batch the job logged, -1 before the first."""
    return max((b for b, _, _ in batch_progress(log)), default=-1)


def batch_phases(log: Path, first: int) -> dict[str, float]:
    """Median per phase (Spark's durationMs) of the batches from ``first`` on that read records."""
    rows = [d for b, n, d in batch_progress(log) if b >= first and n > 0]
    keys = sorted({k for d in rows for k in d})
    out: dict[str, float] = {k: statistics.median(float(d.get(k, 0)) for d in rows) for k in keys}
    out["batches"] = len(rows)
    return out
