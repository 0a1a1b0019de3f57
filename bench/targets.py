"""Issue 15's targets measured again with one command, on the real local servers: each check runs the bench script
that measures its target (docs/benchmarks.md, "In short", gives the same commands, some of them longer), reads the
figures that script stores (its ``--json`` line; the real-node test's printed figures), and prints the figure, the
target and whether it was reached.

    python bench/targets.py                      # every check but the loop's: ~25-30 min on 2 cores
    python bench/targets.py --only latency,join  # some of them
    python bench/targets.py --with-loop          # and the plain loop's sustained rate beside the pipeline's (~1 h)

It exits 1 when a target was not reached (or a check printed no figures), else 0.

What each check runs and how it judges the figures is pure (``CHECKS``, the ``*_rows`` functions; unit-tested);
running them is the scripts themselves in subprocesses, so every figure here is also printed above it by the script
that measured it. One run a check: a run at a target's edge can go either way, and the machine's speed varies by day
(docs/benchmarks.md, "The machine").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from freshness_runs import cpu_us_per_event, kept_up, load

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
DEDUP_RATE = 50_000  # events/s the deduplication must sustain
JOIN_RATE = 20_000  # matched pairs/s the join must sustain
LATENCY_RATE = 10_000  # events/s at which the latency targets hold
P95_TARGET_S, P99_TARGET_S = 0.7, 2.0
STATE_SIZES = (10_000, 10_000_000)  # live deduplication keys: a batch at the second within STATE_RATIO of the first
STATE_RATIO = 2.0
RESCALE_TARGET_S = 60.0
RESCALE_FIGURES = ("scale 2 -> 3000 exact rows", "scale 1 -> 3800 exact rows")  # e2e/test_real_cluster.py's names
REAL_CLUSTER_FIGURES = "[real-cluster] figures: "
GAUGE_CODE = ("import time\nt = time.process_time()\ns = 0\nfor i in range(20_000_000):\n    s += i\n"
              "print(time.process_time() - t)")  # machine_gauge's loop
RATE_SHORTFALL = 0.99  # an offered rate counts as the one asked for within this (the producer's pacing)


@dataclass(frozen=True)
class Row:
    """One target's line: what was asked, what was measured, and whether it was reached."""

    target: str
    figure: str
    reached: bool


@dataclass(frozen=True)
class Options:
    """How long each freshness run measures, after how long a warm-up."""

    seconds: int = 120
    warmup: int = 60


@dataclass(frozen=True)
class Check:
    """A target's measurement: its commands, run one after another (given the file their figures go to), and how
    their figures are judged."""

    name: str
    about: str
    commands: Callable[[Path, Options], list[list[str]]]
    rows: Callable[[list[dict[str, Any]]], list[Row]]
    reads_stdout: bool = False  # the figures are printed (the real-node test), not stored with --json


def _freshness_argv(out: Path, variant: str, *args: str) -> list[str]:
    """bench/freshness.py as the checks run it: offered at the measured rate from the warm-up on, no settle period,
    each run's record appended to the check's file."""
    return [sys.executable, str(BENCH / "freshness.py"), "--variant", variant, *args, "--warmup-rate", "0",
            "--settle", "0", "--json", str(out)]


def freshness(variant: str, rate: int, *extra: str) -> Callable[[Path, Options], list[list[str]]]:
    """bench/freshness.py at one offered rate."""
    def commands(out: Path, opts: Options) -> list[list[str]]:
        return [_freshness_argv(out, variant, "--rates", str(rate), "--seconds", str(opts.seconds), "--warmup",
                                str(opts.warmup), *extra)]
    return commands


def sustained_searches(out: Path, opts: Options) -> list[list[str]]:
    """bench/freshness.py's search for the sustained rate of the plain loop, then of the pipeline per Kafka
    partition, as docs/benchmarks.md ran them (three-minute runs)."""
    return [_freshness_argv(out, variant, "--rates", "80000", "--find-sustained", "20000", "--refine", "1",
                            "--seconds", "180", "--warmup", str(opts.warmup), "--trigger", "1s", "--window", "8h")
            for variant in ("plain", "dedup-partition")]


def _run_text(run: dict[str, Any], unit: str) -> str:
    """How a fixed-rate run went, in one phrase."""
    held = "kept up" if kept_up(run) else "did not keep up"
    return (f"{run['offered']:,.0f} {unit} offered for {run['seconds']:.0f} s: {held}, "
            f"{'exact' if run['exact'] else 'NOT exact'}, "
            f"p50 / p95 / p99 {run['p50']:.2f} / {run['p95']:.2f} / {run['p99']:.2f} s, "
            f"{cpu_us_per_event(run, 'pipeline'):.1f} CPU-s per M")


def _last(records: list[dict[str, Any]], bench: str) -> dict[str, Any] | None:
    return next((r for r in reversed(records) if r.get("bench") == bench), None)


def _missing(target: str, what: str) -> list[Row]:
    return [Row(target, f"no figures: {what} (its output is above)", False)]


def rate_rows(target: str, rate: int, unit: str) -> Callable[[list[dict[str, Any]]], list[Row]]:
    """A fixed-rate run: reached when it kept up (bench/freshness_runs.py's rule, exactness included) at the rate."""
    def rows(records: list[dict[str, Any]]) -> list[Row]:
        run = _last(records, "freshness")
        if run is None:
            return _missing(target, "bench/freshness.py stored no run")
        return [Row(target, _run_text(run, unit), kept_up(run) and run["offered"] >= rate * RATE_SHORTFALL)]
    return rows


def latency_rows(records: list[dict[str, Any]]) -> list[Row]:
    """The two latency targets, from one run at LATENCY_RATE; a run that fell behind or lost rows reaches neither."""
    p99_target, p95_target = f"p99 < {P99_TARGET_S:g} s at 10 000/s", f"p95 < {P95_TARGET_S * 1000:.0f} ms at 10 000/s"
    run = _last(records, "freshness")
    if run is None:
        return _missing(p99_target, "bench/freshness.py stored no run") + _missing(p95_target, "the same")
    sound = kept_up(run) and run["offered"] >= LATENCY_RATE * RATE_SHORTFALL
    text = _run_text(run, "events/s")
    return [Row(p99_target, text, sound and run["p99"] < P99_TARGET_S),
            Row(p95_target, text, sound and run["p95"] < P95_TARGET_S)]


def state_rows(records: list[dict[str, Any]]) -> list[Row]:
    """A 1 000-row batch's median at the most live keys within STATE_RATIO of the one at the fewest."""
    target = f"per-batch cost at {STATE_SIZES[1]:,} live keys within {STATE_RATIO:g}x of {STATE_SIZES[0]:,}"
    run = _last(records, "dedup_state")
    if run is None or len(run["batch_ms"]) < 2:
        return _missing(target, "bench/dedup_state.py stored no batch times")
    by_keys = sorted((int(keys), ms) for keys, ms in run["batch_ms"].items())
    (few, few_ms), (many, many_ms) = by_keys[0], by_keys[-1]
    ratio = many_ms / few_ms
    return [Row(target, f"a {run['small']:,}-row batch's median {few_ms:,.0f} ms at {few:,} keys, {many_ms:,.0f} ms at "
                        f"{many:,} ({ratio:.2f}x)", ratio <= STATE_RATIO)]


def real_cluster_figures(stdout: str) -> list[dict[str, Any]]:
    """e2e/test_real_cluster.py's closing line of figures ("name 12.3 s; ..."), as a record."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(REAL_CLUSTER_FIGURES)), None)
    if line is None:
        return []
    figures = {}
    for item in line.removeprefix(REAL_CLUSTER_FIGURES).split("; "):
        name, seconds, _unit = item.rsplit(" ", 2)
        figures[name] = float(seconds)
    return [{"bench": "real_cluster", "figures": figures}]


def rescale_rows(records: list[dict[str, Any]]) -> list[Row]:
    """kubectl scale 1 -> 2 and 2 -> 1 on the real node, each to the new layout's rows exact, under the target."""
    target = f"rescale to the new layout writing in < {RESCALE_TARGET_S:.0f} s (real node, kubectl scale)"
    run = _last(records, "real_cluster")
    if run is None or not all(name in run["figures"] for name in RESCALE_FIGURES):
        return _missing(target, "e2e/test_real_cluster.py printed no rescale figures")
    times = {name: run["figures"][name] for name in RESCALE_FIGURES}
    return [Row(target, "; ".join(f"{name} {s:.1f} s" for name, s in times.items()),
                all(s < RESCALE_TARGET_S for s in times.values()))]


def loop_rows(records: list[dict[str, Any]]) -> list[Row]:
    """Each sustained-rate search's highest rate that kept up: the pipeline per Kafka partition above the loop's."""
    target = "dedup above the plain loop, each one's sustained rate searched for"
    held = {variant: max((r["offered"] for r in records if r.get("variant") == variant and kept_up(r)), default=0.0)
            for variant in ("plain", "dedup-partition")}
    figure = (f"sustained: the loop {held['plain']:,.0f}/s, the pipeline per Kafka partition "
              f"{held['dedup-partition']:,.0f}/s")
    return [Row(target, figure, held["dedup-partition"] > held["plain"] > 0)]


CHECKS: tuple[Check, ...] = (
    Check("dedup", "the default engine in the peer's load-test shape (10 % repeats, 8 h window, 5 000-row INSERTs, "
          "random ids) at 50 000/s",
          freshness("dedup", DEDUP_RATE, "--trigger", "1s", "--window", "8h", "--max-rows", "5000",
                    "--scattered-keys"),
          rate_rows(f"dedup (default engine) sustains >= {DEDUP_RATE:,} events/s", DEDUP_RATE, "events/s")),
    Check("dedup-partition", "deduplication per Kafka partition (a topic keyed by the deduplication key), 8 h window, "
          "at 50 000/s",
          freshness("dedup-partition", DEDUP_RATE, "--trigger", "1s", "--window", "8h"),
          rate_rows(f"dedup per Kafka partition sustains >= {DEDUP_RATE:,} events/s", DEDUP_RATE, "events/s")),
    Check("join", "the orders + users join, 1 h window, at 20 000 pairs/s",
          freshness("join", JOIN_RATE, "--trigger", "1s"),
          rate_rows(f"join sustains >= {JOIN_RATE:,} matched pairs/s, latency flat as its state grows", JOIN_RATE,
                    "pairs/s")),
    Check("latency", "the default engine at 10 000/s, 250 ms trigger, 2 m window",
          freshness("dedup", LATENCY_RATE, "--trigger", "250ms", "--window", "2m"), latency_rows),
    Check("state", "a 1 000-row batch over 10 000 and 10 M live keys, the JVM operator alone (no Kafka, ClickHouse)",
          lambda out, _opts: [[sys.executable, str(BENCH / "dedup_state.py"), "--impl", "jvm", "--sizes",
                               ",".join(str(n) for n in STATE_SIZES), "--json", str(out)]],
          state_rows),
    Check("rescale", "the real node and the real spark-operator: apply, scale 1 -> 2 -> 1, delete a driver pod",
          lambda _out, _opts: [[sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
                                "e2e/test_real_cluster.py"]],
          rescale_rows, reads_stdout=True),
)
LOOP = Check("loop", "the sustained rate searched for: the plain loop, then the pipeline per Kafka partition",
             sustained_searches, loop_rows)


def machine_gauge() -> float:
    """CPU-seconds of a fixed Python loop run at a module's top level, as docs/benchmarks.md's journal gauges the
    machine ("The machine": 1.04 on a quiet day; the same code's figures move with it). In a fresh interpreter: inside
    a function the loop's names are locals and it runs over twice as fast, which is not the gauge the docs quote."""
    out = subprocess.run([sys.executable, "-c", GAUGE_CODE], check=True, capture_output=True, text=True).stdout
    return float(out)


def run_check(check: Check, opts: Options, scratch: Path) -> tuple[list[dict[str, Any]], float]:
    """Run one check's commands, their output shown as it comes; the figures they stored or printed, and how long
    they took."""
    out = scratch / f"{check.name}.jsonl"
    out.touch()
    t0 = time.monotonic()
    printed: list[str] = []
    for argv in check.commands(out, opts):
        print(f"\n=== {check.name}: {' '.join(argv)}", flush=True)
        with subprocess.Popen(argv, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE if check.reads_stdout else None) as proc:
            for line in proc.stdout or ():  # shown as it comes, and kept
                print(line, end="", flush=True)
                printed.append(line)
    records = real_cluster_figures("".join(printed)) if check.reads_stdout else load([out])
    return records, time.monotonic() - t0


def table(results: list[tuple[Check, list[Row], float]]) -> str:
    """The closing table: one line a target."""
    lines = ["| target | reached | figure | check (minutes) |", "|---|---|---|---|"]
    for check, rows, took in results:
        for row in rows:
            lines.append(f"| {row.target} | {'yes' if row.reached else 'NO'} | {row.figure} | {check.name} "
                         f"({took / 60:.1f}) |")
    return "\n".join(lines)


def selected(only: list[str], with_loop: bool) -> list[Check]:
    """The checks to run, in CHECKS' order (the loop's last)."""
    every = list(CHECKS) + ([LOOP] if with_loop else [])
    return [c for c in every if not only or c.name in only]


def main() -> int:
    names = [c.name for c in CHECKS] + [LOOP.name]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="checks:\n" + "\n".join(f"  {c.name}: {c.about}" for c in (*CHECKS, LOOP)))
    p.add_argument("--only", type=lambda text: [n for n in text.split(",") if n], default=[],
                   help=f"run only these checks ({', '.join(names)})")
    p.add_argument("--with-loop", action="store_true", help="also search the plain loop's and the pipeline's "
                   "sustained rates (about an hour more)")
    p.add_argument("--seconds", type=int, default=Options.seconds, help="seconds each fixed-rate run measures")
    p.add_argument("--warmup", type=int, default=Options.warmup, help="seconds of warm-up before each run")
    p.add_argument("--json", type=Path, help="append every figure the checks stored (freshness.py's runs and the "
                   "rest, each with its check's name) and the closing table's rows to this file, one JSON object a "
                   "line (bench/freshness_table.py and plot.py read its freshness runs)")
    args = p.parse_args()
    unknown = sorted(set(args.only) - set(names))
    if unknown:
        p.error(f"--only: no check named {', '.join(unknown)}; the checks are {', '.join(names)}")
    if args.seconds < 60 or args.warmup < 0:
        p.error("--seconds: at least 60 (a run is judged by its fifths and minutes); --warmup: 0 or more")
    opts = Options(args.seconds, args.warmup)
    gauges = [machine_gauge()]
    print(f"machine gauge {gauges[0]:.2f} CPU-s (a fixed Python loop; 1.04 on a quiet day)", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="gp-targets-") as d:
        for check in selected(args.only, args.with_loop or LOOP.name in args.only):
            records, took = run_check(check, opts, Path(d))
            results.append((check, check.rows(records), took))
            if args.json:  # as each check ends: an interrupted run keeps what it measured
                with args.json.open("a") as out:
                    out.writelines(json.dumps({**r, "targets_check": check.name}) + "\n" for r in records)
    gauges.append(machine_gauge())
    print(f"\n{table(results)}\nmachine gauge before / after: {gauges[0]:.2f} / {gauges[1]:.2f} CPU-s", flush=True)
    if args.json:
        with args.json.open("a") as out:
            for check, rows, took in results:
                for row in rows:
                    out.write(json.dumps({"bench": "targets", "check": check.name, "target": row.target,
                                          "figure": row.figure, "reached": row.reached, "seconds": round(took),
                                          "gauges": [round(g, 2) for g in gauges]}) + "\n")
    return 0 if all(row.reached for _check, rows, _took in results for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
