"""What a benchmark reads back from the job's log: each micro-batch's progress (Spark's durations) and the driver's
hand-over times, for bench/freshness.py's phases and bench/restart.py's batches. The log is read once a
``JobLog.read``; the figures are computed from that reading."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

PROGRESS = re.compile(r"progress of batch (\d+): (\d+) input rows, durations ms (\{.*\})")
WRITTEN = re.compile(r"batch (\d+): .* ([\d.]+) s \(its first part's Spark job ([\d.]+) s\)")


def fifths(items: list[T]) -> list[list[T]]:
    """``items`` in five consecutive parts as even as they go; none for fewer than five items."""
    return [items[i * len(items) // 5:(i + 1) * len(items) // 5] for i in range(5)] if len(items) >= 5 else []


@dataclass(frozen=True)
class JobLog:
    # (batch, input rows, Spark's durationMs by phase) of every micro-batch the job logged, in order
    progress: list[tuple[int, int, dict[str, float]]]
    # batch -> (its foreachBatch, of it the Spark job computing the batch), in s
    written: dict[int, tuple[float, float]]

    @classmethod
    def read(cls, log: Path) -> JobLog:
        text = log.read_text(errors="replace")
        return cls([(int(m.group(1)), int(m.group(2)), json.loads(m.group(3))) for m in PROGRESS.finditer(text)],
                   {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in WRITTEN.finditer(text)})

    def last_batch(self) -> int:
        """The newest micro-batch the job logged, -1 before the first."""
        return max((b for b, _, _ in self.progress), default=-1)

    def phases(self, first: int) -> dict[str, float]:
        """Median per phase (Spark's durationMs) of the batches from ``first`` on that read records."""
        rows = [d for b, n, d in self.progress if b >= first and n > 0]
        keys = sorted({k for d in rows for k in d})
        out: dict[str, float] = {k: statistics.median(float(d.get(k, 0)) for d in rows) for k in keys}
        out["batches"] = len(rows)
        return out

    def phases_by_fifth(self, first: int) -> list[tuple[float, float, float]]:
        """For each fifth of the batches from ``first`` on that read records, in order: the median trigger (the
        whole batch, Spark's ``triggerExecution``), the median ``foreachBatch`` and, of it, the median Spark job
        computing the batch (the driver's hand-over to ClickHouse is the rest), in ms. A pipeline that falls behind
        shows which of them grew."""
        jobs = self.written
        rows = [(b, d) for b, n, d in self.progress if b >= first and n > 0 and b in jobs]
        return [(statistics.median(float(d.get("triggerExecution", 0)) for _, d in part),
                 statistics.median(jobs[b][0] * 1000 for b, _ in part),
                 statistics.median(jobs[b][1] * 1000 for b, _ in part)) for part in fifths(rows)]

    def batches_read(self, first: int = 0) -> list[tuple[int, float]]:
        """(input rows, the trigger's ms) of each batch from ``first`` on that read records, in order."""
        return [(n, float(d.get("triggerExecution", 0))) for b, n, d in self.progress if b >= first and n > 0]

    def cost_by_live_keys(self, firsts: int, step: int = 10_000_000) -> list[tuple[int, float]]:
        """For each ``step`` of live deduplication keys, the trigger's µs an input row of the batches that started
        there: whether a row costs more as the state grows. The keys before a batch are the rows read before it times
        the share of first occurrences (``firsts`` of all the rows the job read), so only where no key expired and
        every row was read once (a fresh run, no replay). Each entry is (the step's upper bound, µs a row)."""
        rows = self.batches_read()
        share = firsts / max(sum(n for n, _ in rows), 1)
        steps: dict[int, tuple[float, int]] = {}
        read = 0
        for n, ms in rows:
            at = int(read * share) // step
            total_ms, total_rows = steps.get(at, (0.0, 0))
            steps[at] = (total_ms + ms, total_rows + n)
            read += n
        return [((at + 1) * step, 1000 * ms / n) for at, (ms, n) in sorted(steps.items())]

    def cost_by_fifth(self, first: int) -> list[tuple[float, int]]:
        """For each fifth of the batches from ``first`` on that read records: the trigger's µs an input row over
        them and their median rows a batch. A pipeline behind takes larger batches, each longer (up to
        ``maxOffsetsPerTrigger`` rows): their ms alone read as a cost that grew, their µs a row tell whether it did."""
        rows = self.batches_read(first)
        return [(1000 * sum(ms for _, ms in part) / sum(n for n, _ in part), int(statistics.median(n for n, _ in part)))
                for part in fifths(rows)]
