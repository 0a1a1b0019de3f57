"""The local ClickHouse starts, stores columnar inserts, reports its version and survives a restart."""

from __future__ import annotations

import pytest

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.clickhouse_features import features_for

pytestmark = pytest.mark.integration

N = 10_000


def test_columnar_insert_and_select(clickhouse: ClickHouseServer) -> None:
    c = clickhouse.client()
    c.execute("DROP TABLE IF EXISTS smoke_cols")
    c.execute(
        "CREATE TABLE smoke_cols (id UInt64, name String, ts DateTime, v Nullable(Float64)) "
        "ENGINE = MergeTree ORDER BY id"
    )
    ids = list(range(N))
    names = [f"n{i}" for i in ids]
    ts = [1_700_000_000 + i for i in ids]
    vs = [None if i % 10 == 0 else i / 2 for i in ids]
    c.execute("INSERT INTO smoke_cols (id, name, ts, v) VALUES", [ids, names, ts, vs], columnar=True)
    assert c.execute("SELECT count(), sum(id), countIf(v IS NULL) FROM smoke_cols") == [
        (N, N * (N - 1) // 2, N // 10)
    ]
    rows = c.execute("SELECT id, name, toUnixTimestamp(ts), v FROM smoke_cols ORDER BY id LIMIT 2")
    assert rows == [(0, "n0", 1_700_000_000, None), (1, "n1", 1_700_000_001, 0.5)]


def test_version_detected_at_runtime(clickhouse: ClickHouseServer) -> None:
    version = clickhouse.version()
    assert len(version) >= 2 and version >= (18, 16)
    # Debian bookworm ships 18.16.1; features_for must agree with what the server rejects.
    if version[:2] == (18, 16):
        assert not features_for(version).insert_deduplication_token
        names = {r[0] for r in clickhouse.client().execute("SELECT name FROM system.settings")}
        assert "insert_deduplication_token" not in names
        assert "allow_experimental_low_cardinality_type" in names


def test_stop_start_keeps_ports_and_data(clickhouse: ClickHouseServer) -> None:
    c = clickhouse.client()
    c.execute("DROP TABLE IF EXISTS smoke_restart")
    c.execute("CREATE TABLE smoke_restart (k UInt32) ENGINE = MergeTree ORDER BY k")
    c.execute("INSERT INTO smoke_restart (k) VALUES", [list(range(100))], columnar=True)
    port, http_port = clickhouse.port, clickhouse.http_port

    clickhouse.stop()
    assert not clickhouse.running()
    clickhouse.start()
    assert (clickhouse.port, clickhouse.http_port) == (port, http_port)
    assert c.execute("SELECT count() FROM smoke_restart") == [(100,)]  # the old client reconnects

    clickhouse.kill()  # a crash, not a shutdown: committed parts must survive it too
    clickhouse.start()
    assert clickhouse.client().execute("SELECT count() FROM smoke_restart") == [(100,)]
