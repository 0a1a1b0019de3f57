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


def cel_duration(expr: str) -> str:
    """A CEL expression turning the duration string ``expr`` into a CEL duration (CEL has no ``d``)."""
    return (
        f"({expr}.endsWith('d') ? duration(string(int({expr}.substring(0, {expr}.size() - 1)) * 24) + 'h')"
        f" : duration({expr}))"
    )
