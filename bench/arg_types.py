"""Argument types the bench scripts share, so a bad value is refused by argparse naming its option (e.g.
``argument --rates: 'abc': ...``) rather than ending in a traceback."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", int, float)


def comma_separated(kind: Callable[[str], T], least: T | None = None,
                    example: str = "1000,10000") -> Callable[[str], list[T]]:
    """An argparse ``type=`` for a comma-separated list of numbers read by ``kind`` (``int`` or ``float``), each at
    least ``least`` where given (a rate or a replica count of 0 would run nothing, or hang); empty items are
    skipped, so ``''`` is the empty list."""
    name = getattr(kind, "__name__", "number")
    bound = "" if least is None else f" of at least {least}"

    def parse(text: str) -> list[T]:
        try:
            values = [kind(item) for item in text.split(",") if item.strip()]
        except ValueError:
            values = None
        if values is None or (least is not None and any(v < least for v in values)):
            raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated {name} values{bound}, e.g. {example}")
        return values

    return parse


def key_value(text: str) -> tuple[str, str]:
    """An argparse ``type=`` for one ``KEY=VALUE`` setting (e.g. a Spark conf), split at the first ``=``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. spark.eventLog.enabled=true")
    return key, value
