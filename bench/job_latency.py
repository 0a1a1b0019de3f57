"""The pipeline's own end-to-end latency histogram (``glasspipe_end_to_end_latency_seconds``, Kafka timestamp to
ClickHouse commit) over a bench run's offered window, beside the latency the bench measures from outside (send to
row visible): what a user's dashboards and the GlassPipeline status show, checked against what happened."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence

import numpy as np

from glasspipe.freshness import Histogram, parse_job_metrics


def metrics_args(ports: Sequence[int], replica: int) -> tuple[str, ...]:
    """``glasspipe run``'s arguments to serve a replica's metrics on its port (none without ports)."""
    return ("--metrics-port", str(ports[replica])) if ports else ()


def read_latency(ports: Sequence[int]) -> Histogram | None:
    """Every replica's end-to-end latency histogram, added up; None without ports."""
    if not ports:
        return None
    counts: dict[float, float] = {}
    total = 0.0
    for port in ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        histogram = parse_job_metrics(text).end_to_end
        for bound, count in histogram.buckets:
            counts[bound] = counts.get(bound, 0.0) + count
        total += histogram.total
    return Histogram(tuple(sorted(counts.items())), total)


def window_summary(before: Histogram | None, after: Histogram | None,
                   measured: np.ndarray) -> dict[str, float] | None:
    """Rows observed between two reads, their p50 / p95 / p99 as Prometheus' ``histogram_quantile`` interpolates
    them within the buckets (linearly, so within a wide bucket an estimate), and the share at or under 1 s, a
    bucket's bound, so exact: beside the share of the ``measured`` latencies under the same bound."""
    if before is None or after is None:
        return None
    window = after.since(before)
    under_1s = next((count for bound, count in window.buckets if bound == 1.0), 0.0)
    return {"rows": window.count, "p50": window.quantile(0.5) or 0.0, "p95": window.quantile(0.95) or 0.0,
            "p99": window.quantile(0.99) or 0.0, "under_1s": under_1s / window.count if window.count else 0.0,
            "measured_under_1s": float(np.count_nonzero(measured <= 1.0)) / len(measured) if len(measured) else 0.0}


def summary_text(job: dict[str, float]) -> str:
    """The line a run prints for the pipeline's own histogram."""
    if not job["rows"]:
        return "  the pipeline's own end-to-end latency histogram observed no row over the offered window"
    return (f"  the pipeline's own end-to-end latency histogram over the offered window (Kafka timestamp to commit, "
            f"interpolated within its buckets): {job['rows']:.0f} rows, p50 {job['p50']:.2f} s, "
            f"p95 {job['p95']:.2f} s, p99 {job['p99']:.2f} s; {100 * job['under_1s']:.1f} % within 1 s"
            + (f" (measured: {100 * job['measured_under_1s']:.1f} %)" if "measured_under_1s" in job else ""))
