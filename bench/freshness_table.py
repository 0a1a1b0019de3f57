"""A Markdown table of bench/freshness.py's figures (the ``--json`` lines), one row a run: what docs/benchmarks.md's
scenario table is printed from, so that a rerun gives the same columns. Stdlib only (the
rule for "kept up" is freshness_runs.kept_up).

    python bench/freshness.py --variant dedup-partition --rates 1000,10000 --json /tmp/m.jsonl
    python bench/freshness_table.py /tmp/m.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from freshness_runs import (
    conf_suffix,
    cpu_us_per_event,
    freshness_runs,
    kept_up,
    keys_suffix,
    replicas_suffix,
    window_of,
)


def spaced(n: float) -> str:
    """A whole number with thin groups of three, as the docs write them: 120 000."""
    return f"{n:,.0f}".replace(",", " ")


def settings(run: dict[str, Any]) -> str:
    """The pipeline's window, trigger and INSERT size; the plain loop has none of them (its own 100 000-row blocks)."""
    if run["variant"] == "plain":
        return "none (the loop's own)"
    return f"{window_of(run)}, {run['trigger']}, {spaced(run['max_rows'])} rows"


def variant_cell(run: dict[str, Any]) -> str:
    """The variant, what its rates count (the join's: matched pairs), its replicas if more than one, its keys if
    scattered, and its ``--spark-conf`` settings."""
    cell = "join (a matched pair: 2 records)" if run["variant"] == "join" else run["variant"]
    return cell + replicas_suffix(run.get("replicas", 1)) + keys_suffix(run) + conf_suffix(run)


def row(run: dict[str, Any]) -> str:
    servers = cpu_us_per_event(run, "Kafka") + cpu_us_per_event(run, "ClickHouse")
    cells = [
        variant_cell(run),
        settings(run),
        f"{spaced(run['offered'])} ({run['seconds']:.0f} s)",
        "yes" if kept_up(run) else "**no**",
        f"{run['p50']:.2f} / {run['p95']:.2f} / {run['p99']:.2f}",
        f"{run['first_fifth']:.2f} → {run['last_fifth']:.2f}",
        f"{run['drained']:.1f}",
        f"{cpu_us_per_event(run, 'pipeline'):.1f}",
        f"{servers:.1f}",
        f"{run['cpu_cores'].get('pipeline', 0.0):.2f}",
        "yes" if run["exact"] else "**no**",
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| variant | window, trigger, INSERT rows | offered events/s (measured s) | kept up "
          "| latency p50 / p95 / p99 s | median latency, first → last fifth s | last row landed after s "
          "| pipeline CPU-s per M events "
          "| Kafka + ClickHouse CPU-s per M events | pipeline cores | exact |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path, help="JSON-lines files of bench/freshness.py --json")
    args = p.parse_args()
    print(HEADER)
    for run in freshness_runs(args.files):
        print(row(run))


if __name__ == "__main__":
    main()
