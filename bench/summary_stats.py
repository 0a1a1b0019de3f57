"""Order statistics the bench scripts print, stdlib only (a script that reads logs needs no servers' clients)."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The value at rank ``q`` (0-1) of ``values``, nearest rank from below; NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
