"""PNG plots of the figures bench/freshness.py appends to a JSON-lines file (``--json``): delivered rate and
latency percentiles against offered rate; with ``--by-variant``, each variant's sustained rate and its latency
percentiles at 1 000/s and 10 000/s (where the file has runs at them) and at that rate (a variant with
``--replicas`` N is its own bar; the join's rates are matched pairs); with ``--by-minute``, each run's latency
percentiles minute by minute (a long run's shape). Needs matplotlib, which the job and the tests do not:
``pip install matplotlib`` (or ``pip install -e '.[bench]'``).

    python bench/freshness.py --rates 1000,5000,10000 --json /tmp/fresh.jsonl
    python bench/plot.py /tmp/fresh.jsonl --out docs/img
    python bench/plot.py docs/img/matrix-2026-12-04.jsonl --by-variant --out /tmp/plots
    python bench/plot.py docs/img/peer-shape-soak-2026-12-06.jsonl --by-minute --tag peer-shape-soak-2026-12-06
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from freshness_runs import (
    conf_suffix,
    cpu_us_per_event,
    delivered_rate,
    freshness_runs,
    kept_up,
    keys_outlive_run,
    keys_suffix,
    replicas_suffix,
    window_of,
)

from glasspipe.api.durations import parse_duration_ms


def series_name(r: dict[str, Any]) -> str:
    """Runs that differ only in the offered rate share a line: same variant (bench/freshness.py --variant), trigger,
    window and kind of warm-up."""
    same = abs(r["warmup_rate"] - r["offered"]) < 0.05 * r["offered"]
    warm = "warmed up at the rate" if same else f"warm-up at {r['warmup_rate']:.0f} ev/s"
    variant = r.get("variant", "dedup")
    if variant == "plain":
        return f"plain loop, {r.get('trigger', '1s')} max delay, {warm}"
    if variant == "nodedup":
        return f"no dedup, {r.get('trigger', '1s')} trigger, {warm}"
    what = {"partition-probe": "dedup per Kafka partition (probe)", "dedup-own": "dedup, ownState",
            "statestore-probe": "dedup per Kafka partition (probe, Spark's state store; 8366640)",
            "dedup-partition": "dedup, perKafkaPartition",
            "join": "join (rates in matched pairs)"}.get(variant, "dedup")
    keys = keys_suffix(r) + conf_suffix(r)
    replicas = replicas_suffix(r.get("replicas", 1))
    return f"{what}{replicas}, {r.get('trigger', '1s')} trigger, {window_of(r)} window{keys}, {warm}"


def below(ax: Any, size: int) -> None:
    """The legend under the axes, where it hides no point however many series there are."""
    ax.legend(fontsize=size, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)


def thousands(ax: Any) -> None:
    """Offered rates as 80k, 2.5k: full numbers run into each other on a narrow axis."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0"))


VARIANTS = {"plain": "plain loop", "nodedup": "pipeline,\nno dedup", "dedup-partition": "dedup per\nKafka partition",
            "dedup-own": "dedup in\nown state", "dedup": "dedup, default\nengine",
            "join": "join orders +\nusers (pairs/s)"}
SHORT = {"plain": "plain\nloop", "nodedup": "no\ndedup", "dedup-partition": "per\npartition", "dedup-own": "own\nstate",
         "dedup": "default\nengine", "join": "join\n(pairs)"}
TARGET_RATE = 10_000  # the latency targets are set at this offered rate


def plot_vs_offered(plt: Any, runs: list[dict[str, Any]], out: Path, suffix: str, tag: str) -> list[Path]:
    """Rate sweeps: delivered and latency percentiles against offered events/s, a line per series_name."""
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        series[series_name(r)].append(r)
    what = "dedup pipeline" if all(r.get("variant", "dedup") == "dedup" for r in runs) else "each variant"

    fig, ax = plt.subplots(figsize=(6, 4.5))
    top = 0.0
    for name, rs in series.items():
        rs.sort(key=lambda r: r["offered"])
        ax.plot([r["offered"] for r in rs], [delivered_rate(r) for r in rs], "o-", label=name)
        top = max(top, *(r["offered"] for r in rs))
    behind = [r for rs in series.values() for r in rs if not kept_up(r)]
    if behind:
        ax.plot([r["offered"] for r in behind], [delivered_rate(r) for r in behind], "rx", markersize=10,
                label="did not keep up (latency rising, rows missing or late): not sustained")
    ax.plot([0, top], [0, top], "k:", label="offered = delivered")
    ax.axhline(50_000, color="grey", linestyle="--", linewidth=0.8, label="target: 50,000 ev/s sustained")
    ax.set_xlabel("offered events/s")
    thousands(ax)
    ax.set_ylabel("delivered events/s\n(landed / time to the last row or the wait's end)")
    ax.set_title(f"{what}: delivered vs offered events/s" + suffix, fontsize=9)
    below(ax, 8)
    ax.grid(alpha=0.3)
    fig.savefig(out / f"throughput-vs-offered{tag}.png", dpi=100, bbox_inches="tight")

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for i, (name, rs) in enumerate(series.items()):
        for q, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):  # a colour a series, a style a percentile
            ax.plot([r["offered"] for r in rs], [r[q] for r in rs], style, color=f"C{i}", label=f"{q}, {name}")
    ax.set_xlabel("offered events/s")
    thousands(ax)
    ax.set_ylabel("end-to-end latency, s (produce to visible in ClickHouse)")
    ax.set_yscale("log")
    ax.axhline(2.0, color="grey", linestyle="--", linewidth=0.8, label="target: p99 < 2 s at 10,000 ev/s")
    ax.axhline(0.7, color="grey", linestyle=":", linewidth=0.8, label="target: p95 < 0.7 s at 10,000 ev/s")
    ax.set_title(f"{what}: end-to-end latency percentiles" + suffix, fontsize=9)
    below(ax, 7)
    ax.grid(alpha=0.3, which="both")
    fig.savefig(out / f"latency-vs-offered{tag}.png", dpi=100, bbox_inches="tight")
    return [out / f"throughput-vs-offered{tag}.png", out / f"latency-vs-offered{tag}.png"]


Scenario = tuple[str, int]  # a variant (bench/freshness.py --variant) and its replicas (--replicas)


def scenario_of(r: dict[str, Any]) -> Scenario:
    return r.get("variant", "dedup"), int(r.get("replicas", 1))


def scenario_label(s: Scenario, *, short: bool = False) -> str:
    """The variant's name (VARIANTS', or SHORT's under a narrow bar) and its replicas where more than one."""
    variant, replicas = s
    if short:
        return SHORT[variant] + (f"\nx{replicas}" if replicas > 1 else "")
    return VARIANTS[variant] + replicas_suffix(replicas)


def scenario_order(s: Scenario) -> tuple[int, int]:
    return list(VARIANTS).index(s[0]), s[1]


def sustained_runs(runs: list[dict[str, Any]]) -> dict[Scenario, dict[str, Any]]:
    """Each scenario's run at the highest offered rate that kept up (freshness_runs.kept_up), in VARIANTS' order
    and then by replicas."""
    best: dict[Scenario, dict[str, Any]] = {}
    for r in runs:
        s = scenario_of(r)
        if s[0] in VARIANTS and kept_up(r) and (s not in best or r["offered"] > best[s]["offered"]):
            best[s] = r
    return {s: best[s] for s in sorted(best, key=scenario_order)}


Panel = tuple[str, dict[Scenario, dict[str, Any]], bool]  # a title, its runs by scenario, whether at a fixed rate


def latency_panels(runs: list[dict[str, Any]], best: dict[Scenario, dict[str, Any]]) -> list[Panel]:
    """The latency figure's panels: one for 1 000/s and one for 10 000/s where the runs include that rate (a
    sustained-rate search runs neither), then each scenario's run at its sustained rate (``best``)."""
    at_rates = [(f"{rate:,}/s offered", {scenario_of(r): r for r in runs if abs(r["offered"] - rate) < 0.05 * rate})
                for rate in (1_000, TARGET_RATE)]
    return [(title, by, True) for title, by in at_rates if by] + [("each one's sustained rate", best, False)]


def plot_by_variant(plt: Any, runs: list[dict[str, Any]], out: Path, suffix: str, tag: str) -> list[Path]:
    """A matrix of variants at fixed rates (docs/benchmarks.md's scenario table) or their sustained-rate searches:
    each variant's sustained rate, and its latency percentiles in latency_panels' panels."""
    best = sustained_runs(runs)
    if not best:
        print("no run kept up: nothing to draw by variant", file=sys.stderr)
        return []
    fig, ax = plt.subplots(figsize=(7, max(4.0, 0.5 * len(best) + 0.5)))
    names = [scenario_label(s) for s in best]
    ax.barh(names, [r["offered"] for r in best.values()], color="tab:blue")
    for i, r in enumerate(best.values()):
        settings = "" if r["variant"] == "plain" else f", {window_of(r)} window, {r['max_rows']:,} rows"
        cpu = cpu_us_per_event(r, "pipeline")
        unit = " pairs/s" if r["variant"] == "join" else "/s"
        ax.text(r["offered"], i, f" {round(r['offered'], -2):,.0f}{unit}{settings};\n {cpu:.1f} CPU-s per M, "
                f"p99 {r['p99']:.2f} s", va="center", fontsize=7)
    ax.axvline(50_000, color="grey", linestyle="--", linewidth=0.8, label="target: 50,000 ev/s (dedup)")
    if any(s[0] == "join" for s in best):
        ax.axvline(20_000, color="grey", linestyle=":", linewidth=0.8, label="target: 20,000 pairs/s (join)")
    ax.invert_yaxis()
    ax.set_xlim(0, max(r["offered"] for r in best.values()) * 1.7)
    thousands(ax)
    ax.set_xlabel("highest offered events/s that kept up (all landed, exactly; latency flat)")
    ax.set_title("sustained rate by variant, two cores" + suffix, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(out / f"sustained-by-variant{tag}.png", dpi=100, bbox_inches="tight")

    panels = latency_panels(runs, best)
    most = max(len(by) for _, by, _ in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(4.0 * len(panels), 2.1 * most), 4), sharey=True,
                             squeeze=False)
    width = 0.27
    for ax, (title, by, at_rate) in zip(axes[0], panels, strict=True):
        shown = sorted((s for s in by if s[0] in VARIANTS), key=scenario_order)
        for k, (q, colour) in enumerate((("p50", "tab:green"), ("p95", "tab:orange"), ("p99", "tab:red"))):
            ax.bar([i + (k - 1) * width for i in range(len(shown))], [by[v][q] for v in shown], width,
                   color=colour, label=q)
        ax.set_xticks(range(len(shown)), [scenario_label(s, short=True) for s in shown], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        if at_rate:
            ax.axhline(2.0, color="grey", linestyle="--", linewidth=0.8, label="target at 10,000/s: p99 < 2 s")
            ax.axhline(0.7, color="grey", linestyle=":", linewidth=0.8, label="target at 10,000/s: p95 < 0.7 s")
    axes[0][0].set_ylabel("end-to-end latency, s (produce to visible in ClickHouse)")
    legend = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(list(legend.values()), list(legend), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=5, frameon=False)
    fig.suptitle("latency percentiles by variant" + suffix.replace("\n", ", "), fontsize=9)
    fig.savefig(out / f"latency-by-variant{tag}.png", dpi=100, bbox_inches="tight")
    return [out / f"sustained-by-variant{tag}.png", out / f"latency-by-variant{tag}.png"]


def window_s(run: dict[str, Any]) -> float | None:
    """The run's deduplication window in seconds; None where it is not a duration as a GlassPipeline writes one."""
    try:
        return parse_duration_ms(window_of(run)) / 1000
    except ValueError:
        return None


def live_keys_axis(ax: Any, runs: list[dict[str, Any]]) -> None:
    """Over the minutes, the live dedup keys at each minute's end (millions), where every run made the same keys and
    none expired (a window longer than the run): the warm-up's, then the measured window's at an even pace."""
    first = runs[0]
    same = all((r.get("firsts"), r.get("firsts_measured"), round(r["seconds"])) ==
               (first.get("firsts"), first.get("firsts_measured"), round(first["seconds"])) for r in runs)
    if not same or not first.get("firsts") or not all(r.get("variant", "dedup").startswith("dedup") for r in runs):
        return
    if not all(keys_outlive_run(window_s(r), r["seconds"]) for r in runs):
        return
    warm, per_minute = first["firsts"] - first["firsts_measured"], first["firsts_measured"] * 60 / first["seconds"]
    top = ax.secondary_xaxis("top", functions=(lambda m: (warm + (m + 1) * per_minute) / 1e6,
                                               lambda k: k * 1e6 / per_minute - warm / per_minute - 1))
    top.set_xlabel("live dedup keys at the minute's end, millions (none expire)", fontsize=8)


def latency_scale(runs: list[dict[str, Any]]) -> str:
    """``log`` where a minute's p50 is over ten times the fastest minute's (a run far behind, its median at tens of
    seconds, would press the runs that held into the bottom of a linear axis), else ``linear``: a p99 spike alone
    does not change the axis."""
    p50s = [p50 for r in runs for _, p50, _, _ in r["by_minute"]]
    return "log" if min(p50s) > 0 and max(p50s) > 10 * min(p50s) else "linear"


def latency_axis(ax: Any, runs: list[dict[str, Any]]) -> None:
    """The y axis of latency by minute: linear from zero, or log with seconds as 1, 2, 5, 10, 20 ... where
    ``latency_scale`` says a run fell far behind."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_ylabel("end-to-end latency, s (produce to visible in ClickHouse)")
    if latency_scale(runs) == "linear":
        ax.set_ylim(bottom=0)
        return
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_by_minute(plt: Any, runs: list[dict[str, Any]], out: Path, suffix: str, tag: str) -> list[Path]:
    """Each run's p50 and p99 by minute of its measured window (freshness.py's ``by_minute``), a colour a run: whether
    a long run held flat, and from when it did not."""
    timed = [r for r in runs if r.get("by_minute")]
    if not timed:
        print("no run has figures by minute (bench/freshness.py writes them since d8d4ded)", file=sys.stderr)
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(timed):
        minutes = [m for m, *_ in r["by_minute"]]
        name = f"{series_name(r)}, {r['offered']:,.0f}/s"
        ax.plot(minutes, [p50 for _, p50, _, _ in r["by_minute"]], "o-", markersize=3, color=f"C{i}",
                label=f"p50, {name}")
        ax.plot(minutes, [p99 for *_, p99 in r["by_minute"]], "^:", markersize=3, color=f"C{i}",
                label=f"p99, {name}")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_xlabel("minute of the measured window")
    live_keys_axis(ax, timed)
    latency_axis(ax, timed)
    ax.set_title("latency percentiles by minute" + suffix, fontsize=9)
    below(ax, 7)
    ax.grid(alpha=0.3, which="both")
    fig.savefig(out / f"latency-by-minute{tag}.png", dpi=100, bbox_inches="tight")
    return [out / f"latency-by-minute{tag}.png"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=Path("docs/img"))
    p.add_argument("--label", default="", help="added to the plot titles (e.g. the commit)")
    p.add_argument("--tag", default="",
                   help="added to the file names: --tag 2026-12-04 writes latency-by-variant-2026-12-04.png")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--by-variant", action="store_true", help="runs of several variants at a few fixed rates "
                     "(a matrix): bars by variant, not lines by rate")
    how.add_argument("--by-minute", action="store_true", help="each run's latency minute by minute, not by rate")
    args = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench/plot.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    runs = freshness_runs(args.files)
    if not runs:
        print("no freshness figures in the files", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"\n{args.label}" if args.label else ""
    draw = plot_by_variant if args.by_variant else plot_by_minute if args.by_minute else plot_vs_offered
    written = draw(plt, runs, args.out, suffix, f"-{args.tag}" if args.tag else "")
    if written:
        print("wrote " + " and ".join(str(w) for w in written))
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
