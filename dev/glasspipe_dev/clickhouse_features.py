"""Which ClickHouse features glasspipe may use, by server version (pure: no I/O).

Local tests run Debian's ClickHouse 18.16, production clusters run something newer. The sink picks
its exactly-once mechanism and column types from the version it detects at runtime; this table
says what each version offers and, when a feature is missing, what glasspipe does instead.

Thresholds come from ClickHouse's changelogs (docs/en/whats-new/changelog/20xx.md):
``insert_deduplication_token`` 22.2; ``non_replicated_deduplication_window`` 21.5 (PR #22514);
``async_insert`` 21.11; ``DateTime64`` 20.1; ``Map`` 21.1 (experimental flag needed until it was
made GA; the flag is an obsolete no-op later, so it is sent up to 21.8 to be safe); ``Bool`` 21.12;
``JSON`` experimental 24.8, GA 25.3 (the older ``Object('json')`` of 22.3 is not used);
``LowCardinality`` 18.12 behind ``allow_experimental_low_cardinality_type`` (obsolete no-op since 19.x,
so sending it to any version is harmless).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

Version = tuple[int, ...]


@dataclass(frozen=True)
class Feature:
    """One capability glasspipe cares about."""

    name: str
    since: Version
    what: str
    # What glasspipe does on a server that lacks the feature.
    fallback: str
    # Session settings to send when creating tables / inserting, for versions below `flag_until`.
    flag_settings: dict[str, int] = field(default_factory=dict)
    flag_until: Version = (0,)


FEATURES: tuple[Feature, ...] = (
    Feature(
        "insert_deduplication_token",
        (22, 2),
        "per-INSERT deduplication token (setting insert_deduplication_token)",
        "glasspipe uses its marker-column exactly-once mechanism",
    ),
    Feature(
        "non_replicated_deduplication_window",
        (21, 5),
        "insert-block deduplication on plain MergeTree (table setting non_replicated_deduplication_window)",
        "a retried INSERT into plain MergeTree is stored twice: "
        "glasspipe uses its marker-column exactly-once mechanism",
    ),
    Feature(
        "async_insert",
        (21, 11),
        "server-side buffering of small inserts (setting async_insert)",
        "glasspipe batches rows itself (one INSERT per micro-batch block)",
    ),
    Feature(
        "datetime64",
        (20, 1),
        "sub-second timestamps (DateTime64)",
        "timestamps go to DateTime (whole seconds) or an Int64 epoch-milliseconds column",
    ),
    Feature(
        "map",
        (21, 1),
        "the Map(K, V) type",
        "maps go to two parallel Array columns (keys, values) or a JSON String",
        flag_settings={"allow_experimental_map_type": 1},
        flag_until=(21, 8),
    ),
    Feature(
        "bool",
        (21, 12),
        "the Bool type",
        "booleans go to UInt8",
    ),
    Feature(
        "json",
        (25, 3),
        "the JSON type (GA; experimental since 24.8)",
        "JSON documents go to String",
    ),
    Feature(
        "low_cardinality",
        (18, 12),
        "LowCardinality(T) dictionary-encoded columns",
        "columns use the plain type",
        flag_settings={"allow_experimental_low_cardinality_type": 1},
        flag_until=(19, 3),
    ),
)

_BY_NAME = {f.name: f for f in FEATURES}


def format_version(version: Sequence[int]) -> str:
    return ".".join(str(p) for p in version)


@dataclass(frozen=True)
class ClickHouseFeatures:
    """What one server version offers; build it with :func:`features_for`."""

    version: Version
    available: frozenset[str]

    def has(self, name: str) -> bool:
        if name not in _BY_NAME:
            raise KeyError(f"unknown ClickHouse feature {name!r}; known: {sorted(_BY_NAME)}")
        return name in self.available

    # Named shortcuts for the features the sink branches on.
    @property
    def insert_deduplication_token(self) -> bool:
        return self.has("insert_deduplication_token")

    @property
    def non_replicated_deduplication_window(self) -> bool:
        return self.has("non_replicated_deduplication_window")

    @property
    def async_insert(self) -> bool:
        return self.has("async_insert")

    @property
    def datetime64(self) -> bool:
        return self.has("datetime64")

    @property
    def map_type(self) -> bool:
        return self.has("map")

    @property
    def bool_type(self) -> bool:
        return self.has("bool")

    @property
    def json_type(self) -> bool:
        return self.has("json")

    @property
    def low_cardinality(self) -> bool:
        return self.has("low_cardinality")

    def missing(self) -> list[Feature]:
        return [f for f in FEATURES if f.name not in self.available]

    def required_settings(self, *names: str) -> dict[str, int]:
        """Settings to send so that the named (available) features work on this version.

        E.g. LowCardinality on 18.16 needs allow_experimental_low_cardinality_type=1.
        """
        out: dict[str, int] = {}
        for name in names or tuple(self.available):
            feature = _BY_NAME[name]
            if name in self.available and self.version < feature.flag_until:
                out.update(feature.flag_settings)
        return out

    def message(self, name: str) -> str:
        """A one-line explanation for logs and status conditions."""
        f = _BY_NAME[name]
        v = format_version(self.version)
        if name in self.available:
            return f"ClickHouse {v} has {f.name} ({f.what})"
        return f"ClickHouse {v} lacks {f.name} (needs {format_version(f.since)}+): {f.fallback}"

    def messages(self) -> list[str]:
        """One line per missing feature (empty on a modern server)."""
        return [self.message(f.name) for f in self.missing()]


def features_for(version: Sequence[int]) -> ClickHouseFeatures:
    """The feature set of a server of this version, e.g. ``features_for((18, 16, 1))``."""
    v = tuple(int(p) for p in version)
    if not v:
        raise ValueError("empty ClickHouse version")
    return ClickHouseFeatures(v, frozenset(f.name for f in FEATURES if v >= f.since))
