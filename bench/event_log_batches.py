"""Where a streaming micro-batch's time goes, read from Spark's event log: print medians per batch.

Run the pipeline with Spark's event log on, for example::

    python bench/freshness.py --rates 10000 --seconds 120 --warmup 180 --warmup-rate 0 --settle 0 \\
        --trigger 250ms --window 2m --spark-conf spark.eventLog.enabled=true \\
        --spark-conf spark.eventLog.dir=file:///tmp/ev
    python bench/event_log_batches.py /tmp/ev --from-batch 700

For each batch that ran a Spark job, the script splits the trigger (Spark's ``durationMs.triggerExecution``)
into: the driver's time from the trigger's start to its first job (``latestOffset``, ``walCommit``,
``queryPlanning``, then what ``addBatch`` spends before the job: ``foreachBatch``'s set-up), the time of each
stage (wall, and its tasks' run and CPU times summed), and the time after the last job. Spark's query progress
alone gives ``addBatch`` as one figure. A ``.zstd`` log (Spark 4's default) is read through the ``zstd`` tool;
``--spark-conf spark.eventLog.compress=false`` writes plain JSON lines instead.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from summary_stats import percentile

PROGRESS_EVENT = "QueryProgressEvent"


@dataclass
class _Job:
    batch: int | None
    start: int
    stages: list[int]
    end: int | None = None


@dataclass
class _Stage:
    submitted: int | None
    completed: int | None
    tasks: int
    run_ms: list[int] = field(default_factory=list)
    deserialize_ms: list[int] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    launched: list[int] = field(default_factory=list)


def _epoch_ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


def batch_breakdowns(events: Iterable[dict[str, Any]], from_batch: int = 0) -> list[dict[str, float]]:
    """One dict of millisecond figures per streaming batch (from ``from_batch`` on) that ran a Spark job."""
    jobs: dict[int, _Job] = {}
    stages: dict[int, _Stage] = {}
    progress: dict[int, dict[str, Any]] = {}
    for e in events:
        kind = e.get("Event", "")
        if kind == "SparkListenerJobStart":
            batch = (e.get("Properties") or {}).get("streaming.sql.batchId")
            jobs[e["Job ID"]] = _Job(int(batch) if batch is not None else None, e["Submission Time"], e["Stage IDs"])
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]].end = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            stage = stages.setdefault(info["Stage ID"], _Stage(None, None, 0))
            stage.submitted, stage.completed = info.get("Submission Time"), info.get("Completion Time")
            stage.tasks = info["Number of Tasks"]
        elif kind == "SparkListenerTaskEnd":
            stage = stages.setdefault(e["Stage ID"], _Stage(None, None, 0))
            metrics = e.get("Task Metrics") or {}
            stage.run_ms.append(metrics.get("Executor Run Time", 0))
            stage.deserialize_ms.append(metrics.get("Executor Deserialize Time", 0))
            stage.cpu_ms.append(metrics.get("Executor CPU Time", 0) / 1e6)
            stage.launched.append(e["Task Info"]["Launch Time"])
        elif kind.endswith(PROGRESS_EVENT):
            p = e["progress"]
            progress[p["batchId"]] = p
    by_batch: dict[int, list[tuple[int, int, list[int]]]] = defaultdict(list)  # (start, end, stage ids)
    for job in jobs.values():
        if job.batch is not None and job.end is not None:
            by_batch[job.batch].append((job.start, job.end, job.stages))
    out = []
    for batch, p in sorted(progress.items()):
        ran = sorted(by_batch.get(batch, []))
        if batch < from_batch or not ran:
            continue
        durations = p.get("durationMs") or {}
        start = _epoch_ms(p["timestamp"])
        total = float(durations.get("triggerExecution", 0))
        before_add = sum(float(durations.get(k, 0)) for k in ("latestOffset", "getBatch", "walCommit",
                                                             "queryPlanning"))
        to_job = ran[0][0] - start
        row = {"trigger": total, "to first job": to_job, "of it before addBatch": before_add,
               "of it in addBatch": to_job - before_add, "jobs": float(len(ran)),
               "jobs' wall": float(sum(end - begin for begin, end, _ in ran)),
               "after last job": start + total - max(end for _, end, _ in ran),
               "addBatch": float(durations.get("addBatch", 0))}
        done = [(stages[s], submitted, completed) for _, _, ids in ran for s in sorted(ids)
                if s in stages and (submitted := stages[s].submitted) is not None
                and (completed := stages[s].completed) is not None]
        for i, (stage, submitted, completed) in enumerate(done):
            row[f"stage {i}: tasks"] = float(stage.tasks)
            row[f"stage {i}: wall"] = float(completed - submitted)
            row[f"stage {i}: tasks' run"] = float(sum(stage.run_ms))
            row[f"stage {i}: tasks' CPU"] = sum(stage.cpu_ms)
            row[f"stage {i}: deserialising"] = float(sum(stage.deserialize_ms))
            row[f"stage {i}: to first task"] = float(min(stage.launched) - submitted if stage.launched else 0)
        out.append(row)
    return out


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one log: ``path`` is a file, or a directory holding one application's log (Spark's rolling
    ``eventlog_v2_*`` directory, or a single file)."""
    files = _log_files(path)
    for f in files:
        if f.suffix == ".zstd":
            zstd = shutil.which("zstd")
            if zstd is None:
                raise SystemExit(f"{f} is zstd-compressed and the zstd tool is not installed: install it, or run "
                                 "the pipeline with --spark-conf spark.eventLog.compress=false")
            text = subprocess.run([zstd, "-dc", str(f)], check=True, capture_output=True).stdout.decode()
            lines: Iterable[str] = text.splitlines()
        elif f.suffix in (".lz4", ".snappy", ".lzf"):
            raise SystemExit(f"{f}: {f.suffix} event logs are not read here; run the pipeline with "
                             "--spark-conf spark.eventLog.compress=false or spark.eventLog.compression.codec=zstd")
        else:
            lines = f.read_text().splitlines()
        for line in lines:
            if line.strip():
                yield json.loads(line)


def _log_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise SystemExit(f"{path}: no such event log (give spark.eventLog.dir's path, or a file in it)")
    apps = sorted(p for p in path.iterdir() if p.name.startswith(("eventlog_v2_", "local-", "app-")))
    if len(apps) > 1:
        names = ", ".join(p.name for p in apps)
        raise SystemExit(f"{path} holds {len(apps)} applications' logs ({names}): give one of them")
    root = apps[0] if apps else path
    if root.is_file():
        return [root]
    parts = sorted((p for p in root.iterdir() if p.name.startswith("events_")),
                   key=lambda p: int(p.name.split("_")[1]))
    if not parts:
        raise SystemExit(f"{root}: no events_* files in it")
    return parts


def print_medians(rows: list[dict[str, float]]) -> None:
    print(f"{len(rows)} batches with a Spark job; milliseconds, tasks' times summed over a stage's tasks")
    print(f"{'':28s} {'median':>8s} {'mean':>8s} {'p90':>8s}")
    for key in rows[0]:
        values = [r.get(key, 0.0) for r in rows]
        print(f"{key:28s} {statistics.median(values):8.1f} {statistics.fmean(values):8.1f} "
              f"{percentile(values, 0.9):8.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path, help="spark.eventLog.dir's directory (one application in it) or a log file")
    p.add_argument("--from-batch", type=int, default=0,
                   help="the first batch to count (skip the warm-up's; the job logs each batch's id)")
    args = p.parse_args()
    rows = batch_breakdowns(read_events(args.log), args.from_batch)
    if not rows:
        print(f"no batch from {args.from_batch} on ran a Spark job in {args.log}", file=sys.stderr)
        return 1
    print_medians(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
