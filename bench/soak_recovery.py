"""How long a soak's consumer group took to catch up after each fault (bench/soak.py), from its lag samples.

Pure: the soak samples the group's lag (records between its committed offsets and the topic's ends) every few
seconds beside its faults, and this reckons per fault the peak lag until the next fault and when the lag was back
under a threshold for good.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Recovery:
    at: float  # seconds from the soak's start
    what: str
    peak: int  # the highest lag sampled from the fault to the next one, records
    back_after: float | None  # seconds from the fault until the lag stayed under the threshold; None: not before
    # the next fault (or the soak's end)


def recoveries(faults: Sequence[tuple[float, str]], lags: Sequence[tuple[float, int]], threshold: int,
               end: float) -> list[Recovery]:
    """Per fault (seconds from the start, what), from ``lags`` (seconds from the start, records behind): the peak
    until the next fault (or ``end``), and the first sample under ``threshold`` after the last one above it (0 s
    where none rose above it)."""
    out: list[Recovery] = []
    for i, (at, what) in enumerate(faults):
        until = faults[i + 1][0] if i + 1 < len(faults) else end
        seen = [(t, n) for t, n in lags if at <= t < until]
        above = [k for k, (_, n) in enumerate(seen) if n > threshold]
        back: float | None = 0.0
        if above:
            after = above[-1] + 1
            back = seen[after][0] - at if after < len(seen) else None
        out.append(Recovery(at, what, max((n for _, n in seen), default=0), back))
    return out


def recovery_table(found: Sequence[Recovery], threshold_s: float) -> list[str]:
    """Markdown rows: each fault, its peak lag and how long until the group was back within ``threshold_s`` of
    input."""
    rows = [f"| fault | at s | peak lag, records | back within {threshold_s:g} s of input after s |",
            "|---|---|---|---|"]
    for r in found:
        back = "not before the next fault" if r.back_after is None else f"{r.back_after:.0f}"
        rows.append(f"| {r.what} | {r.at:.0f} | {r.peak} | {back} |")
    return rows
