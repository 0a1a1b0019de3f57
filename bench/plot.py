"""PNG plots of the figures the benchmarks append to a JSON-lines file (``--json``): throughput against offered
rate and latency percentiles against offered rate (bench/freshness.py). Needs matplotlib, which the job and
the tests do not: ``pip install matplotlib`` (or ``pip install -e '.[bench]'``).

    python bench/freshness.py --rates 1000,5000,10000 --json /tmp/fresh.jsonl
    python bench/plot.py /tmp/fresh.jsonl --out docs/img
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def delivered_rate(r: dict[str, Any]) -> float:
    """Events the pipeline took in per second: all of them over the time until the last one landed. Where the
    harness's wait ran out first (``firsts_seen`` short of ``firsts``), only the share of the measured window's
    first occurrences that landed counts (the warm-up's landed before them); files from before 2026-11-28
    midday lack those fields and count every event."""
    landed = 1.0
    if r.get("firsts_measured"):
        landed = max(0.0, 1 - (r["firsts"] - r["firsts_seen"]) / r["firsts_measured"])
    return r["offered"] * r["seconds"] * landed / (r["seconds"] + r["drained"])


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
    what = {"partition-probe": "dedup per Kafka partition (probe)",
            "statestore-probe": "dedup per Kafka partition (probe, Spark's state store; 8366640)",
            "dedup-partition": "dedup, perKafkaPartition"}.get(variant, "dedup")
    keys = ", keys scattered" if r.get("scattered_keys") else ""
    return f"{what}, {r.get('trigger', '1s')} trigger, {r.get('window') or '5m'} window{keys}, {warm}"


def below(ax: Any, size: int) -> None:
    """The legend under the axes, where it hides no point however many series there are."""
    ax.legend(fontsize=size, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)


def thousands(ax: Any) -> None:
    """Offered rates as 80k, 2.5k: full numbers run into each other on a narrow axis."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x else "0"))


def fell_behind(r: dict[str, Any]) -> bool:
    """Latency rising through the measured window (the last fifth's median over twice the first's, and a second
    more): the run did not sustain its rate, even where all its events landed soon after the producer stopped."""
    return bool(r["last_fifth"] > 2 * r["first_fifth"] + 1.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", type=Path, nargs="+")
    p.add_argument("--out", type=Path, default=Path("docs/img"))
    p.add_argument("--label", default="", help="added to the plot titles (e.g. the commit)")
    args = p.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench/plot.py needs matplotlib: pip install matplotlib", file=sys.stderr)
        return 2
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in load(args.files):
        if r.get("bench") == "freshness":
            series[series_name(r)].append(r)
    if not series:
        print("no freshness figures in the files", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"\n{args.label}" if args.label else ""
    what = "dedup pipeline" if all(r.get("variant", "dedup") == "dedup" for rs in series.values() for r in rs) \
        else "each variant"

    fig, ax = plt.subplots(figsize=(6, 4.5))
    top = 0.0
    for name, rs in series.items():
        rs.sort(key=lambda r: r["offered"])
        ax.plot([r["offered"] for r in rs], [delivered_rate(r) for r in rs], "o-", label=name)
        top = max(top, *(r["offered"] for r in rs))
    behind = [r for rs in series.values() for r in rs if fell_behind(r)]
    if behind:
        ax.plot([r["offered"] for r in behind], [delivered_rate(r) for r in behind], "rx", markersize=10,
                label="latency rising through the run: not sustained")
    ax.plot([0, top], [0, top], "k:", label="offered = delivered")
    ax.axhline(50_000, color="grey", linestyle="--", linewidth=0.8, label="target: 50,000 ev/s sustained")
    ax.set_xlabel("offered events/s")
    thousands(ax)
    ax.set_ylabel("delivered events/s\n(landed / time to the last row or the wait's end)")
    ax.set_title(f"{what}: delivered vs offered events/s" + suffix, fontsize=9)
    below(ax, 8)
    ax.grid(alpha=0.3)
    fig.savefig(args.out / "throughput-vs-offered.png", dpi=100, bbox_inches="tight")

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, rs in series.items():
        for q, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
            ax.plot([r["offered"] for r in rs], [r[q] for r in rs], style, label=f"{q}, {name}")
    ax.set_xlabel("offered events/s")
    thousands(ax)
    ax.set_ylabel("end-to-end latency, s (produce to visible in ClickHouse)")
    ax.set_yscale("log")
    ax.axhline(2.0, color="grey", linestyle="--", linewidth=0.8, label="target: p99 < 2 s at 10,000 ev/s")
    ax.axhline(0.7, color="grey", linestyle=":", linewidth=0.8, label="target: p95 < 0.7 s at 10,000 ev/s")
    ax.set_title(f"{what}: end-to-end latency percentiles" + suffix, fontsize=9)
    below(ax, 7)
    ax.grid(alpha=0.3, which="both")
    fig.savefig(args.out / "latency-vs-offered.png", dpi=100, bbox_inches="tight")
    print(f"wrote {args.out / 'throughput-vs-offered.png'} and {args.out / 'latency-vs-offered.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
