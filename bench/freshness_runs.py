"""Reading bench/freshness.py's figures (its ``--json`` lines): what a run delivered and whether it kept up. One
place for every reader: the Markdown table (freshness_table.py), the plots (plot.py) and freshness.py's own search
for the sustained rate (``SustainedSearch``), so that all three judge "kept up" alike. Stdlib only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A run keeps up when every first occurrence landed, the latency of the run's last fifth is not above its first
# fifth's by more than this (a pipeline falling behind climbs through the run: seconds a minute)...
RISE_ALLOWED_S = 0.5
# ... no whole minute's median above the first fifth's by more than this, where the run kept its minutes (``by_minute``:
# freshness.py since 2026-12-06), for a long run can fall behind for minutes and catch up before its last fifth...
MINUTE_RISE_ALLOWED_S = 1.0
# ... and the last event's row landed within this many of the run's p99 after it was produced, or within
# DRAIN_FLOOR_S (at low latency three p99s is about a second: one slow poll of the table must not count as behind).
DRAIN_OVER_P99 = 3.0
DRAIN_FLOOR_S = 2.0
# deduplication.window of the sms-dedup example, which a run without --window keeps (its "window" is then null)
EXAMPLE_WINDOW = "5m"
# A run's warm-up and catch-up take at most this long beyond its measured window
WARMUP_ALLOWANCE_S = 600


def load(paths: list[Path]) -> list[dict[str, Any]]:
    """Every run's figures in the files, in order (a file may hold other benchmarks' lines: see ``bench``)."""
    rows = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def freshness_runs(paths: list[Path]) -> list[dict[str, Any]]:
    """The bench/freshness.py runs among the lines (older files lack the ``bench`` field: they are all freshness)."""
    return [r for r in load(paths) if r.get("bench", "freshness") == "freshness"]


def window_of(run: dict[str, Any]) -> str:
    """The run's deduplication window."""
    return str(run.get("window") or EXAMPLE_WINDOW)


def keys_outlive_run(window_s: float | None, seconds: float) -> bool:
    """Whether no deduplication key expires during a run of ``seconds`` measured (its warm-up allowed for): every key
    made is live at the end, so the state's size is the keys made so far."""
    return window_s is not None and window_s >= seconds + WARMUP_ALLOWANCE_S


def replicas_suffix(replicas: int) -> str:
    """", N replicas" after a run's name where it ran more than one (bench/freshness.py --replicas), else nothing."""
    return f", {replicas} replicas" if replicas > 1 else ""


def keys_suffix(run: dict[str, Any]) -> str:
    """", keys scattered" after the name of a ``--scattered-keys`` run (random ids: RocksDB's reads and writes spread
    over the whole key space), else nothing."""
    return ", keys scattered" if run.get("scattered_keys") else ""


def conf_suffix(run: dict[str, Any]) -> str:
    """", name=value" after a run's name for each ``--spark-conf`` setting it ran with (the last part of the name:
    ``compression=none``), else nothing."""
    settings = sorted((run.get("spark_conf") or {}).items())
    return "".join(f", {name.rsplit('.', 1)[-1]}={value}" for name, value in settings)


def worst_minute_rise(run: dict[str, Any]) -> float:
    """How far the slowest whole minute's median latency rose above the run's first fifth's, in seconds (0 for a run
    without its minutes; a last minute cut short by the run's end does not count)."""
    whole = int(run["seconds"] // 60)
    medians = [p50 for minute, p50, *_ in run.get("by_minute") or [] if minute < whole]
    return max((p50 - run["first_fifth"] for p50 in medians), default=0.0)


def kept_up(run: dict[str, Any]) -> bool:
    """Whether the pipeline kept pace with the offered rate: all landed, latency flat, the backlog gone at once."""
    all_landed = run.get("firsts_seen", 0) >= run.get("firsts", 0)
    flat = (run["last_fifth"] <= run["first_fifth"] + RISE_ALLOWED_S
            and worst_minute_rise(run) <= MINUTE_RISE_ALLOWED_S)
    drained = run["drained"] <= max(DRAIN_OVER_P99 * run["p99"], DRAIN_FLOOR_S)
    return bool(all_landed and flat and drained and run["exact"])


def delivered_rate(r: dict[str, Any]) -> float:
    """Events the pipeline took in per second: all of them over the time until the last one landed. Where the
    harness's wait ran out first (``firsts_seen`` short of ``firsts``), only the share of the measured window's
    first occurrences that landed counts (the warm-up's landed before them); files from before 2026-11-28
    midday lack those fields and count every event."""
    landed = 1.0
    if r.get("firsts_measured"):
        landed = max(0.0, 1 - (r["firsts"] - r["firsts_seen"]) / r["firsts_measured"])
    return r["offered"] * r["seconds"] * landed / (r["seconds"] + r["drained"])


def cpu_us_per_event(run: dict[str, Any], who: str) -> float:
    """CPU-microseconds an offered event, i.e. CPU-seconds per million events, of one process (cores over events/s)."""
    return float(run["cpu_cores"].get(who, 0.0)) / run["offered"] * 1e6


class SustainedSearch:
    """The sustained rate's search (freshness.py ``--find-sustained``): from a first rate, up by ``step`` while each
    run keeps up (down while none has), until a rate that kept up and one ``step`` above it that did not; then
    ``refine`` halvings of that gap, each at its middle (rounded to ``grain``). One run a rate, as the matrix's
    sustained rates were found: a run at the edge can go either way, so the answer is the bracket, not a point."""

    def __init__(self, start: float, step: float, refine: int = 1, grain: float = 1000.0) -> None:
        if start <= 0 or step <= 0 or refine < 0 or grain <= 0:
            raise ValueError("the search needs a first rate and a step above 0, and refine of 0 or more")
        self.start, self.step, self.refine, self.grain = start, step, refine, grain
        self.tried: list[tuple[float, bool]] = []  # (rate, kept up) of each run, in order

    def record(self, rate: float, ok: bool) -> None:
        """What the run at ``rate`` did."""
        self.tried.append((rate, ok))

    @property
    def held(self) -> float | None:
        """The highest rate that kept up so far."""
        return max((rate for rate, ok in self.tried if ok), default=None)

    @property
    def failed(self) -> float | None:
        """The lowest rate that did not keep up so far."""
        return min((rate for rate, ok in self.tried if not ok), default=None)

    def next_rate(self) -> float | None:
        """The next rate to run, or None when the search is done."""
        if not self.tried:
            return self.start
        held, failed = self.held, self.failed
        if failed is None:
            assert held is not None
            return held + self.step
        if held is None:
            lower = failed - self.step
            return lower if lower > 0 else None
        # the runs before the bracket stepped one way, so their results all agree; the halvings follow the first change
        halvings = len(self.tried) - next(i for i, (_, ok) in enumerate(self.tried) if ok != self.tried[0][1]) - 1
        if halvings >= self.refine:
            return None
        middle = round((held + failed) / 2 / self.grain) * self.grain
        return middle if held < middle < failed else None

    def rates(self) -> Iterator[float]:
        """Each rate to run, the next one asked for once the last one's run is recorded."""
        while (rate := self.next_rate()) is not None:
            yield rate

    def verdict(self, unit: str = "events/s") -> str:
        """One line: the highest rate that kept up and the lowest that did not, as far as the runs went."""
        runs = ", ".join(f"{rate:.0f} {'held' if ok else 'behind'}" for rate, ok in self.tried)
        if self.held is None:
            return f"sustained: no rate kept up ({runs})"
        above = f"; {self.failed:.0f} did not" if self.failed is not None else ""
        return f"sustained: {self.held:.0f} {unit}, the highest offered rate that kept up{above} ({runs})"
