"""Version thresholds of the ClickHouse features the sink branches on."""

from __future__ import annotations

import pytest

from glasspipe_dev.clickhouse import parse_version
from glasspipe_dev.clickhouse_features import FEATURES, features_for
from glasspipe_job.clickhouse.errors import SinkError

pytestmark = pytest.mark.unit


def test_debian_18_16_lacks_the_modern_dedup_features() -> None:
    f = features_for((18, 16, 1))
    assert not f.insert_deduplication_token
    assert not f.non_replicated_deduplication_window
    assert not f.async_insert
    assert not f.datetime64
    assert not f.map_type
    assert not f.bool_type
    assert not f.json_type
    assert f.low_cardinality
    assert f.required_settings("low_cardinality") == {"allow_experimental_low_cardinality_type": 1}


def test_message_names_version_threshold_and_fallback() -> None:
    msg = features_for((18, 16, 1)).message("insert_deduplication_token")
    assert msg == (
        "ClickHouse 18.16.1 lacks insert_deduplication_token (needs 22.2+): "
        "glasspipe uses its marker-column exactly-once mechanism"
    )
    assert len(features_for((18, 16)).messages()) == 7  # all but LowCardinality


@pytest.mark.parametrize(
    ("name", "before", "at"),
    [
        ("insert_deduplication_token", (22, 1, 9), (22, 2)),
        ("non_replicated_deduplication_window", (21, 4, 7), (21, 5, 1)),
        ("async_insert", (21, 10), (21, 11, 3)),
        ("datetime64", (19, 17), (20, 1)),
        ("map", (20, 12), (21, 1)),
        ("bool", (21, 11), (21, 12)),
        ("json", (25, 2), (25, 3)),
        ("low_cardinality", (18, 10), (18, 12)),
    ],
)
def test_thresholds(name: str, before: tuple[int, ...], at: tuple[int, ...]) -> None:
    assert not features_for(before).has(name)
    assert features_for(at).has(name)


def test_modern_server_has_everything_and_needs_no_flags() -> None:
    f = features_for((25, 8, 2, 29))
    assert f.missing() == [] and f.messages() == []
    assert f.required_settings() == {}
    assert "has insert_deduplication_token" in f.message("insert_deduplication_token")


def test_experimental_map_flag_only_on_early_21() -> None:
    assert features_for((21, 3)).required_settings("map") == {"allow_experimental_map_type": 1}
    assert features_for((18, 16)).required_settings("map") == {}  # not available at all


def test_unknown_feature_is_an_error() -> None:
    with pytest.raises(KeyError):
        features_for((22, 2)).has("transactions")
    with pytest.raises(ValueError):
        features_for(())


def test_every_feature_has_a_fallback() -> None:
    assert all(f.fallback and f.since for f in FEATURES)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("18.16.1", (18, 16, 1)), ("24.8.4.13", (24, 8, 4, 13)), ("25.3.1.2-lts", (25, 3, 1, 2))],
)
def test_parse_version(text: str, expected: tuple[int, ...]) -> None:
    assert parse_version(text) == expected
    with pytest.raises(SinkError, match="cannot parse"):
        parse_version("unknown")
