"""Durations as users write them in a GlassPipeline (``500ms``, ``30s``, ``5m``, ``1h``, ``7d``).

One integer and one unit keeps the CRD's pattern and CEL bound simple and the meaning obvious.
"""

from __future__ import annotations

import re

DURATION_PATTERN = r"^[0-9]{1,9}(ms|s|m|h|d)$"
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RE = re.compile(DURATION_PATTERN)


def parse_duration_ms(text: str) -> int:
    """Milliseconds in ``text``; ValueError says what form is expected."""
    m = _RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"{text!r} is not a duration: write a whole number and a unit, e.g. 500ms, 30s, 5m, 1h, 7d")
    unit = m.group(1)
    return int(text.strip()[: -len(unit)]) * _UNIT_MS[unit]


def cel_duration_ms(expr: str) -> str:
    """A CEL expression for the milliseconds in the duration string ``expr`` (an int).

    Integer arithmetic keeps the API server's estimated rule cost low (parsing through
    ``duration(string(...) + 'h')`` exceeds the CRD's cost budget), and a quoted literal is folded here.
    """
    if len(expr) > 2 and expr[0] == expr[-1] == "'" and _RE.match(expr[1:-1]):
        return str(parse_duration_ms(expr[1:-1]))
    unit = (f"({expr}.endsWith('ms') ? 1 : {expr}.endsWith('s') ? 1000 : {expr}.endsWith('m') ? 60000"
            f" : {expr}.endsWith('h') ? 3600000 : 86400000)")
    return f"(int({expr}.substring(0, {expr}.size() - ({expr}.endsWith('ms') ? 2 : 1))) * {unit})"
