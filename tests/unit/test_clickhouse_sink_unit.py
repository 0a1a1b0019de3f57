"""ClickHouseSink without a server: chunking, markers, mechanism choice, conversion, error classification.

A recording fake stands in for clickhouse_driver.Client so that the SQL and settings the token
mechanism (ClickHouse >= 22.2, not installable here) would send can be checked.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from clickhouse_driver import errors

from glasspipe.api.validation import OutputColumn
from glasspipe_dev.sinks import sink_from_settings
from glasspipe_job.clickhouse.connection import parse_host
from glasspipe_job.clickhouse.errors import SinkError, SinkUnavailable, describe_error, is_transient
from glasspipe_job.clickhouse.mechanism import Mechanism, choose_mechanism
from glasspipe_job.clickhouse.names import LEDGER_TABLE, MARKER_COLUMN, marker_value
from glasspipe_job.clickhouse.sink import ClickHouseSink, chunk_bounds
from glasspipe_job.clickhouse.table import ddl_settings
from glasspipe_job.clickhouse.values import (
    canonical_order,
    canonical_order_arrow,
    convert_arrow_column,
    convert_column,
)

pytestmark = pytest.mark.unit

COLS = [
    OutputColumn("id", "`id`", "Int64", "s.id"),
    OutputColumn("name", "`name`", "Nullable(String)", "s.name"),
]


@dataclass
class Call:
    query: str
    params: Any
    settings: dict[str, Any] | None


class FakeClient:
    """Answers the sink's metadata queries like a server of ``version`` would; records everything."""

    def __init__(
        self,
        version: str,
        engine: str = "MergeTree",
        engine_full: str = "MergeTree ORDER BY id",
        marker: bool = True,
        fail_inserts: list[BaseException] | None = None,
    ) -> None:
        self.version = version
        self.engine, self.engine_full = engine, engine_full
        self.marker = marker
        self.calls: list[Call] = []
        self.ledger: list[tuple[str, int, int, int, str, str]] = []
        self.chunks: dict[str, int] = {}
        self.fail_inserts = list(fail_inserts or [])

    def execute(self, query: str, params: Any = None, **kwargs: Any) -> Any:
        self.calls.append(Call(query, params, kwargs.get("settings")))
        q = query.strip()
        if q == "SELECT version()":
            return [(self.version,)]
        if q.startswith("CREATE"):
            return []
        if "FROM system.tables" in q and "count()" in q:
            return [(1,)]
        if "FROM system.columns" in q and "name = %(c)s" in q:  # the ledger's watermark column
            return [(1,)]
        if "FROM system.columns" in q:
            cols = [("id", "Int64"), ("name", "Nullable(String)")]
            return cols + ([(MARKER_COLUMN, "String")] if self.marker else [])
        if "FROM system.tables" in q:
            return [(self.engine, self.engine_full)]
        if "FROM system.mutations" in q:
            return []
        if q.startswith("SELECT chunks, rows FROM"):
            hit = [r for r in self.ledger if r[0] == params["w"] and r[1] == params["b"] and r[5] == "done"]
            return [(hit[0][2], hit[0][3])] if hit else []
        if q.startswith("SELECT batch_id, chunks, rows, offsets"):
            hit = sorted((r for r in self.ledger if r[0] == params["w"] and r[5] == "done"), key=lambda r: -r[1])
            return [hit[0][1:5]] if hit else []
        if q.startswith(f"SELECT `{MARKER_COLUMN}`, count()"):
            return [(m, n) for m, n in self.chunks.items() if m.startswith(params["p"])]
        if q.startswith("INSERT INTO") and LEDGER_TABLE in q:
            w, b, c, r, o, st, *_left_closed = (col[0] for col in params)
            self.ledger.append((w, b, c, r, o, st))
            return None
        if q.startswith("INSERT INTO"):
            if self.fail_inserts:
                raise self.fail_inserts.pop(0)
            if self.marker:
                self.chunks[params[-1][0]] = self.chunks.get(params[-1][0], 0) + len(params[-1])
            return None
        raise AssertionError(f"unexpected query {q}")

    def disconnect(self) -> None:
        pass

    def inserts(self) -> list[Call]:
        return [c for c in self.calls if c.query.startswith("INSERT INTO `default`.`t`")]


def make_sink(client: FakeClient, **kw: Any) -> ClickHouseSink:
    kw.setdefault("max_rows", 3)
    return sink_from_settings(
        ["127.0.0.1"], "default", "t", COLS, "w0", client_factory=lambda: client, sleep=lambda s: None, **kw
    )


def batch(n: int) -> dict[str, list[Any]]:
    return {"id": list(range(n)), "name": [f"n{i}" if i % 3 else None for i in range(n)]}


# ------------------------------------------------------------------------------------ pure helpers


def test_chunk_bounds() -> None:
    assert chunk_bounds(0, 5) == []
    assert chunk_bounds(5, 5) == [(0, 5)]
    assert chunk_bounds(11, 5) == [(0, 5), (5, 10), (10, 11)]
    with pytest.raises(ValueError):
        chunk_bounds(3, 0)


def test_marker_value_and_hosts() -> None:
    assert marker_value("ns.pipe-0", 42, 300, 400) == "ns.pipe-0/42/300-400"
    assert parse_host("ch1", False) == ("ch1", 9000)
    assert parse_host("ch1", True) == ("ch1", 9440)
    assert parse_host("ch1.example:9001", True) == ("ch1.example", 9001)
    with pytest.raises(ValueError, match="no '/'"):
        sink_from_settings(["h"], "default", "t", COLS, "a/b")


def test_canonical_order_is_independent_of_input_order() -> None:
    ids = [3, 1, 2, 1, None]
    vals = [0.5, math.nan, 1.0, 2.0, None]
    order = canonical_order([ids, vals])
    rows = sorted(zip(ids, vals, strict=True), key=lambda r: (r[0] is None, r[0] or 0, str(r[1])))
    shuffled = [rows[i] for i in (4, 2, 0, 3, 1)]
    order2 = canonical_order([[r[0] for r in shuffled], [r[1] for r in shuffled]])
    a = [(ids[i], str(vals[i])) for i in order]
    b = [(shuffled[i][0], str(shuffled[i][1])) for i in order2]
    assert a == b
    assert a[-1] == (None, "None")


# ------------------------------------------------------------------------------------ mechanism choice


@pytest.mark.parametrize(
    ("version", "engine", "engine_full", "marker", "expected"),
    [
        ((18, 16, 1), "MergeTree", "MergeTree ORDER BY id", True, Mechanism.MARKER),
        (
            (21, 8),
            "ReplicatedMergeTree",
            "ReplicatedMergeTree('/p', 'r') ORDER BY id",
            True,
            Mechanism.MARKER,
        ),
        (
            (22, 2),
            "ReplicatedMergeTree",
            "ReplicatedMergeTree('/p', 'r') ORDER BY id",
            False,
            Mechanism.TOKEN,
        ),
        (
            (24, 8, 4),
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 10000",
            False,
            Mechanism.TOKEN,
        ),
        (
            (24, 8),
            "MergeTree",
            "MergeTree ORDER BY id SETTINGS index_granularity = 8192",
            True,
            Mechanism.MARKER,
        ),
        (
            (24, 8),
            "ReplacingMergeTree",
            "ReplacingMergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 100",
            True,
            Mechanism.TOKEN,
        ),
    ],
)
def test_mechanism_by_version_and_table(
    version: tuple[int, ...], engine: str, engine_full: str, marker: bool, expected: Mechanism
) -> None:
    assert choose_mechanism(version, engine, engine_full, marker, "`d`.`t`") is expected


def test_old_server_without_marker_says_how_to_fix() -> None:
    with pytest.raises(SinkError) as e:
        choose_mechanism((18, 16, 1), "MergeTree", "MergeTree ORDER BY id", False, "`d`.`t`")
    assert f"ALTER TABLE `d`.`t` ADD COLUMN {MARKER_COLUMN} String DEFAULT ''" in str(e.value)
    assert "22.2" in str(e.value)


def test_modern_plain_mergetree_without_window_or_marker_is_refused() -> None:
    with pytest.raises(SinkError, match="MODIFY SETTING non_replicated_deduplication_window = 10000"):
        choose_mechanism((24, 8), "MergeTree", "MergeTree ORDER BY id", False, "`d`.`t`")


def test_non_mergetree_engine_is_refused() -> None:
    with pytest.raises(SinkError, match="Distributed"):
        choose_mechanism((24, 8), "Distributed", "Distributed(c, d, t)", True, "`d`.`t`")


# ------------------------------------------------------------------------------------ error classification


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (errors.NetworkError("Connection refused (127.0.0.1:9000)"), True),
        (errors.SocketTimeoutError("timed out"), True),
        (EOFError("Unexpected EOF while reading bytes"), True),
        (ConnectionResetError(104, "reset"), True),
        (
            errors.ServerException("Too many parts (300). Merges are processing significantly slower", 252),
            True,
        ),
        (errors.ServerException("Too many partitions for single INSERT block (more than 100)", 252), False),
        (errors.ServerException("Timeout exceeded", 159), True),
        (errors.ServerException("Memory limit (for query) exceeded", 241), True),
        (errors.ServerException("Table is in readonly mode", 242), True),
        (errors.ServerException("Table default.t doesn't exist.", 60), False),
        (errors.ServerException("No such column x in table default.t", 16), False),
        (errors.ServerException("Type mismatch", 53), False),
        (errors.ServerException("Wrong password for user default", 193), False),
        (errors.ServerException("Syntax error", 62), False),
        (errors.TypeMismatchError("Type mismatch in VALUES section"), False),
        (errors.NetworkError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"), False),
        (ValueError("bad"), False),
    ],
)
def test_error_classification(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_permanent_error_message_names_table_and_fix() -> None:
    msg = describe_error(
        errors.ServerException("DB::Exception: Table db.t doesn't exist.. Stack trace:\n0. x", 60), "db", "t"
    )
    assert "`db`.`t`" in msg and "createTable: true" in msg and "Stack trace" not in msg
    msg = describe_error(errors.ServerException("Wrong password for user bob", 193), "db", "t")
    assert "Wrong password for user bob" in msg and "spec.sink.clickhouse.passwordSecretRef" in msg
    tls = describe_error(errors.NetworkError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable "
                                             "to get local issuer certificate (127.0.0.1:9440)"), "db", "t")
    assert "spec.sink.clickhouse.caSecretRef" in tls and "127.0.0.1:9440" in tls
    # a roll-back deletes chunks: the rights named include ALTER DELETE on the data table, not only INSERT
    denied = describe_error(errors.ServerException("bob: Not enough privileges. To execute this query it's "
                                                   "necessary to have grant ALTER DELETE ON db.t", 497), "db", "t")
    assert "ALTER DELETE ON `db`.`t`" in denied and "`db`.glasspipe_ledger" in denied


# ------------------------------------------------------------------------------------ value conversion


def test_value_conversion_for_driver() -> None:
    utc = dt.UTC
    aware = dt.datetime(2024, 5, 1, 12, 0, 1, 250_000, tzinfo=utc)
    naive = dt.datetime(2024, 5, 1, 12, 0, 1, 250_000)
    plus2 = dt.datetime(2024, 5, 1, 14, 0, 1, 250_000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    epoch = 1714564801
    assert convert_column("ts", "DateTime", [aware, naive, plus2, epoch]) == [epoch] * 4
    assert convert_column("ts", "Nullable(DateTime)", [None, dt.date(2024, 5, 1)]) == [None, 1714521600]
    assert convert_column("ts", "DateTime64(3)", [aware]) == [epoch * 1000 + 250]
    assert convert_column("ts", "DateTime64(6, 'UTC')", [naive]) == [epoch * 1_000_000 + 250_000]
    assert convert_column("d", "Date", [aware, dt.date(2024, 1, 2), "2024-01-03"]) == [
        dt.date(2024, 5, 1),
        dt.date(2024, 1, 2),
        dt.date(2024, 1, 3),
    ]
    assert convert_column("b", "UInt8", [True, False, 1]) == [1, 0, 1]
    assert all(type(v) is int for v in convert_column("b", "UInt8", [True, False]))
    assert convert_column("b", "Bool", [1, 0, True]) == [True, False, True]
    assert convert_column("f", "Float64", [1, Decimal("2.5")]) == [1.0, 2.5]
    assert convert_column("x", "Decimal(18, 4)", [Decimal("1.2345"), 3, 0.1]) == [
        Decimal("1.2345"),
        3,
        Decimal("0.1"),
    ]
    assert convert_column(
        "s", "LowCardinality(Nullable(String))", [None, 5, True, Decimal("1E+2"), aware]
    ) == [None, "5", "true", "100", "2024-05-01 12:00:01.250000"]
    src = ["a", "b"]
    out = convert_column("s", "String", src)
    assert out == src and out is not src


def test_arrow_conversion_matches_the_list_path() -> None:
    """The job's Arrow path gives the driver what the list path gives, for every type it has a fast path for."""
    utc = dt.UTC
    stamps = [dt.datetime(2024, 5, 1, 12, 0, 1, 250_999, tzinfo=utc), None,
              dt.datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=utc)]
    for unit in ("s", "ms", "us", "ns"):
        for tz in (None, "UTC"):
            arr = pa.array(stamps, pa.timestamp("us", tz)).cast(pa.timestamp(unit, tz), safe=False)
            pylist = arr.to_pylist()
            for ch in ("Nullable(DateTime)", "Nullable(DateTime64(3))", "Nullable(DateTime64(6, 'UTC'))",
                       "Nullable(DateTime64(9))", "Nullable(DateTime64(0))", "Nullable(String)"):
                got = convert_arrow_column("ts", ch, pa.chunked_array([arr[:1], arr[1:]]))
                assert got == convert_column("ts", ch, pylist), (unit, tz, ch)
                assert all(type(v) in (int, str, type(None)) for v in got)
    assert convert_arrow_column("n", "Int64", pa.array([1, 2])) == [1, 2]
    assert convert_arrow_column("s", "String", pa.array(["a", "é"])) == ["a", "é"]
    with pytest.raises(SinkError, match=r"column 'ts' \(DateTime\) got NULL \(first at row 1"):
        convert_arrow_column("ts", "DateTime", pa.array(stamps, pa.timestamp("us")))


def test_arrow_canonical_order_is_the_list_order() -> None:
    """Chunk k holds the same rows whichever path computed the order (a replay after an upgrade too)."""
    import random

    rng = random.Random(3)
    ids = [rng.choice([None, *range(5)]) for _ in range(300)]
    vals = [rng.choice([None, math.nan, -1.5, 0.0, 2.0]) for _ in range(300)]
    names = [rng.choice([None, "a", "b", "é", "ab", ""]) for _ in range(300)]
    stamps = [rng.choice([None, dt.datetime(2024, 1, 1), dt.datetime(2023, 1, 1)]) for _ in range(300)]
    cols = [ids, vals, names, stamps]
    table = pa.table({"i": ids, "v": vals, "n": names, "t": pa.array(stamps, pa.timestamp("us"))})
    order = canonical_order_arrow(table)
    assert order is not None

    def rows(o: list[int]) -> list[tuple[str, ...]]:
        return [tuple(repr(c[i]) for c in cols) for i in o]

    assert rows(order) == rows(canonical_order(cols))
    assert canonical_order_arrow(pa.table({"l": [[1], [0]]})) is None  # lists: the caller falls back


def test_null_in_non_nullable_column_is_a_clear_error() -> None:
    with pytest.raises(SinkError, match=r"column 'id' \(Int64\) got NULL .*row 1.*Nullable\(Int64\)"):
        convert_column("id", "Int64", [1, None])


def test_unconvertible_value_names_column() -> None:
    with pytest.raises(SinkError, match=r"column 'n' \(Int32\): cannot convert value 'abc'"):
        convert_column("n", "Int32", [1, "abc"])


# ------------------------------------------------------------------------------------ protocol, fake server


def test_marker_mechanism_chunks_markers_and_ledger() -> None:
    fake = FakeClient("18.16.1")
    sink = make_sink(fake)
    res = sink.write_batch(7, batch(7), '{"t":{"0":7}}')
    assert sink.mechanism is Mechanism.MARKER
    assert (res.rows_written, res.chunks, res.skipped_replay) == (7, 3, False)
    inserts = fake.inserts()
    assert [len(c.params[0]) for c in inserts] == [3, 3, 1]
    assert [c.params[-1][0] for c in inserts] == ["w0/7/0-3", "w0/7/3-6", "w0/7/6-7"]
    assert all(set(c.params[-1]) == {c.params[-1][0]} for c in inserts)
    assert inserts[0].query == "INSERT INTO `default`.`t` (`id`, `name`, `_glasspipe_batch`) VALUES"
    assert all("insert_deduplication_token" not in (c.settings or {}) for c in fake.calls)
    assert inserts[-1].settings == {"insert_block_size": 1}
    # announced before the chunks (so a successor can roll back an abandoned batch), closed after
    # the pending row is written before the parts are read: their rows and chunks are in the done row
    assert fake.ledger == [("w0", 7, 0, 0, '{"t":{"0":7}}', "pending"), ("w0", 7, 3, 7, '{"t":{"0":7}}', "done")]
    # the first batch of a fresh sink looked for chunks of a crashed predecessor; the next one does not
    res2 = sink.write_batch(8, batch(2), "o8")
    assert res2.rows_written == 2
    looks = [c for c in fake.calls if c.query.startswith(f"SELECT `{MARKER_COLUMN}`")]
    assert len(looks) == 1 and looks[0].params == {"n": len("w0/7/"), "p": "w0/7/"}
    assert sink.committed_offsets() == "o8"


def test_replay_of_committed_batch_writes_nothing() -> None:
    fake = FakeClient("18.16.1")
    sink = make_sink(fake)
    sink.write_batch(1, batch(4), "o1")
    before = len(fake.inserts())
    res = make_sink(fake).write_batch(1, batch(4), "o1")
    assert res.skipped_replay and res.rows_written == 0 and res.chunks == 2
    assert len(fake.inserts()) == before and [r[5] for r in fake.ledger] == ["pending", "done"]


def test_chunks_of_crashed_predecessor_are_skipped() -> None:
    fake = FakeClient("18.16.1")
    fake.chunks = {"w0/5/0-3": 3, "w0/5/3-6": 3}  # two full chunks landed, then the job died
    res = make_sink(fake).write_batch(5, batch(7), "o5")
    assert (res.rows_written, res.chunks_skipped) == (1, 2)
    assert [c.params[-1][0] for c in fake.inserts()] == ["w0/5/6-7"]


def deletes_apply_at_once(fake: FakeClient) -> list[Any]:
    """Makes the fake's chunk DELETEs take effect at once (no mutation to wait for); returns the list the
    deleted markers of each DELETE are appended to."""
    deleted: list[Any] = []
    orig = fake.execute

    def execute(query: str, params: Any = None, **kw: Any) -> Any:
        if query.startswith("ALTER TABLE"):
            deleted.append(params["m"])
            for m in params["m"]:
                fake.chunks.pop(m)
            fake.calls.append(Call(query, params, None))
            return []
        return orig(query, params, **kw)

    fake.execute = execute  # type: ignore[method-assign]
    return deleted


def test_partial_chunk_is_deleted_then_rewritten() -> None:
    fake = FakeClient("18.16.1")
    fake.chunks = {"w0/5/0-3": 2, "w0/5/0-4": 4, "w0/5/9": 3}  # a partial chunk, one of another maxRows, an old format
    deleted = deletes_apply_at_once(fake)
    res = make_sink(fake).write_batch(5, batch(4), "o5")
    assert deleted == [("w0/5/0-3", "w0/5/0-4", "w0/5/9")]
    assert res.rows_written == 4 and res.attempts == 1  # the wait for the delete is not an insert attempt
    assert fake.chunks == {"w0/5/0-3": 3, "w0/5/3-4": 1}


def parts_of(ids: list[list[int]]) -> list[pa.Table]:
    return [pa.table({"id": pa.array(p, pa.int64()), "name": pa.array([f"n{i}" for i in p], pa.string())})
            for p in ids]


def test_parts_are_cut_into_chunks_named_by_their_rows_in_the_batch() -> None:
    """Issue #14: the job hands a batch over one Spark partition at a time; a chunk never spans two parts and
    is named by its rows' range in the batch, so a replay whose parts hold the same rows (in any order inside
    a part) finds every chunk under the same name with the same rows."""
    fake = FakeClient("18.16.1")
    res = make_sink(fake).write_parts(4, parts_of([[5, 1, 3, 2], [], [9, 8]]), "o4")
    assert (res.rows_written, res.chunks) == (6, 3)
    inserts = fake.inserts()
    assert [c.params[-1][0] for c in inserts] == ["w0/4/0-3", "w0/4/3-4", "w0/4/4-6"]
    # sorted inside a part of several chunks (a one-chunk part is the same rows in any order)
    assert [c.params[0] for c in inserts] == [[1, 2, 3], [5], [9, 8]]
    assert fake.ledger[-1] == ("w0", 4, 3, 6, "o4", "done")
    # a crash after the first chunk: the replay (other order inside the parts) writes the rest only
    fake2 = FakeClient("18.16.1")
    fake2.chunks = {"w0/4/0-3": 3}
    res = make_sink(fake2).write_parts(4, parts_of([[2, 5, 3, 1], [], [8, 9]]), "o4")
    assert (res.rows_written, res.chunks_skipped) == (3, 1)
    assert [sorted(c.params[0]) for c in fake2.inserts()] == [[5], [8, 9]]


def test_a_partial_chunk_the_user_may_not_delete_stops_the_sink_naming_the_right_and_writes_nothing() -> None:
    """A sink user with INSERT but no ALTER DELETE: the partial chunk of a crashed batch cannot go, so the sink
    raises a SinkError that names the right to grant, and writes no chunk over it (which would double its rows)."""
    fake = FakeClient("18.16.1")
    fake.chunks = {"w0/5/0-3": 2}
    orig = fake.execute

    def execute(query: str, params: Any = None, **kw: Any) -> Any:
        if query.startswith("ALTER TABLE"):
            raise errors.ServerException("sink: Not enough privileges. To execute this query it's necessary to "
                                         "have grant ALTER DELETE ON default.t", 497)
        return orig(query, params, **kw)

    fake.execute = execute  # type: ignore[method-assign]
    with pytest.raises(SinkError) as err:
        make_sink(fake).write_batch(5, batch(4), "o5")
    assert "ALTER DELETE ON `default`.`t`" in str(err.value) and "code 497" in str(err.value)
    assert fake.inserts() == [] and fake.chunks == {"w0/5/0-3": 2}


def test_parts_of_a_replay_cut_otherwise_replace_the_stale_chunks() -> None:
    """A replay split otherwise (another maxRows or Spark partitioning): stored chunks that meet a part's rows
    but are not its chunks are deleted before that part is written; those past the batch's end at the end."""
    fake = FakeClient("18.16.1")
    fake.chunks = {"w0/4/0-2": 2, "w0/4/2-4": 2, "w0/4/6-9": 3}
    deleted = deletes_apply_at_once(fake)
    res = make_sink(fake).write_parts(4, parts_of([[1, 2, 3], [4, 5]]), "o4")
    assert deleted == [("w0/4/0-2", "w0/4/2-4"), ("w0/4/6-9",)]
    assert fake.chunks == {"w0/4/0-3": 3, "w0/4/3-5": 2} and res.rows_written == 5


def test_parts_are_read_lazily_and_not_at_all_for_a_committed_batch() -> None:
    fake = FakeClient("18.16.1")
    sink = make_sink(fake)
    sink.write_batch(1, batch(2), "o1")
    read: list[int] = []

    def parts() -> Any:
        read.append(1)
        yield from parts_of([[1]])

    assert sink.write_parts(1, parts(), "o1").skipped_replay and read == []


def test_transient_error_rechecks_presence_before_reinserting() -> None:
    fake = FakeClient("18.16.1")
    sink = make_sink(fake)
    sink.write_batch(1, batch(1), "o1")  # sink is no longer fresh

    # chunk 1's INSERT landed but the answer was lost: the sink must not write it again
    orig = fake.execute
    state = {"n": 0}

    def execute(query: str, params: Any = None, **kw: Any) -> Any:
        if query.startswith("INSERT INTO `default`.`t`"):
            state["n"] += 1
            if state["n"] == 2:
                orig(query, params, **kw)
                raise errors.NetworkError("Connection reset by peer")
        return orig(query, params, **kw)

    fake.execute = execute  # type: ignore[method-assign]
    res = sink.write_batch(2, batch(7), "o2")
    assert res.attempts == 2 and res.rows_written == 7  # chunk 1 landed once, counted once
    assert fake.chunks == {"w0/1/0-1": 1, "w0/2/0-3": 3, "w0/2/3-6": 3, "w0/2/6-7": 1}
    assert res.chunks_skipped == 0


@pytest.mark.parametrize("seed", range(40))
def test_retry_deadline_gives_up_with_sink_unavailable(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the jitter draws (seeded here, so that a failure repeats), no wait crosses the deadline."""
    monkeypatch.setattr(random, "uniform", random.Random(seed).uniform)
    now = [0.0]
    fake = FakeClient("18.16.1", fail_inserts=[errors.NetworkError("Connection refused")] * 100)
    sink = sink_from_settings(
        ["h"],
        "default",
        "t",
        COLS,
        "w0",
        max_rows=3,
        client_factory=lambda: fake,
        retry_deadline=30,
        sleep=lambda s: now.__setitem__(0, now[0] + s),
        clock=lambda: now[0],
    )
    with pytest.raises(SinkUnavailable, match="retry deadline 30 s"):
        sink.write_batch(1, batch(2), "o")
    assert 30 - 12 < now[0] <= 30  # it gives up when the next wait (at most 10 s, +20 % jitter) would cross 30 s


def test_backoff_is_exponential_and_capped() -> None:
    sleeps: list[float] = []
    fake = FakeClient("18.16.1", fail_inserts=[errors.ServerException("Too many parts", 252)] * 12)
    sink = sink_from_settings(
        ["h"], "default", "t", COLS, "w0", max_rows=3, client_factory=lambda: fake, sleep=sleeps.append
    )
    res = sink.write_batch(1, batch(2), "o")
    assert res.attempts == 13 and res.rows_written == 2
    assert sleeps[0] < 0.3 and sleeps[1] > sleeps[0] and max(sleeps) <= 12.0 and sleeps[-1] > 8


def test_permanent_error_raises_sink_error_immediately() -> None:
    fake = FakeClient("18.16.1", fail_inserts=[errors.ServerException("No such column foo in table t", 16)])
    with pytest.raises(SinkError, match=r"`default`\.`t`.*ADD COLUMN"):
        make_sink(fake).write_batch(1, batch(2), "o")


def test_token_mechanism_sends_dedup_tokens_and_creates_window() -> None:
    fake = FakeClient(
        "24.8.4.13",
        engine_full="MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 10000",
        marker=False,
    )
    sink = make_sink(fake, create_table=True, order_by=["id"])
    res = sink.write_batch(9, batch(5), "o9")
    assert sink.mechanism is Mechanism.TOKEN and res.rows_written == 5
    creates = [c.query for c in fake.calls if c.query.startswith("CREATE")]
    assert creates[0] == (
        "CREATE TABLE IF NOT EXISTS `default`.`t` (`id` Int64, `name` Nullable(String), "
        "`_glasspipe_batch` String DEFAULT '') ENGINE = MergeTree ORDER BY (`id`) "
        "SETTINGS non_replicated_deduplication_window = 10000"
    )
    assert creates[1].endswith(
        "ORDER BY (writer, batch_id) SETTINGS non_replicated_deduplication_window = 10000"
    )
    inserts = fake.inserts()
    assert inserts[0].query == "INSERT INTO `default`.`t` (`id`, `name`) VALUES"
    assert [c.settings for c in inserts] == [
        {"insert_block_size": 3, "insert_deduplicate": 1, "insert_deduplication_token": "w0/9/0-3"},
        {"insert_block_size": 2, "insert_deduplicate": 1, "insert_deduplication_token": "w0/9/3-5"},
    ]
    ledger_inserts = [c for c in fake.calls if c.query.startswith(f"INSERT INTO `default`.`{LEDGER_TABLE}`")]
    assert [c.settings for c in ledger_inserts] == [
        {"insert_deduplicate": 1, "insert_deduplication_token": "w0/9/ledger-pending"},
        {"insert_deduplicate": 1, "insert_deduplication_token": "w0/9/ledger-done"},
    ]
    assert not any(c.query.startswith(f"SELECT `{MARKER_COLUMN}`") for c in fake.calls)


def test_token_mechanism_resends_same_token_after_lost_answer() -> None:
    fake = FakeClient(
        "23.3",
        engine="ReplicatedMergeTree",
        engine_full="ReplicatedMergeTree('/t', 'r1') ORDER BY id",
        marker=False,
        fail_inserts=[errors.SocketTimeoutError("timed out")],
    )
    res = make_sink(fake).write_batch(3, batch(2), "o3")
    tokens = [c.settings["insert_deduplication_token"] for c in fake.inserts() if c.settings]
    assert tokens == ["w0/3/0-2", "w0/3/0-2"] and res.attempts == 2


def test_create_table_on_18_16_needs_low_cardinality_flag_and_skips_nullable_keys() -> None:
    fake = FakeClient("18.16.1")
    cols = [
        OutputColumn("maybe", "`maybe`", "Nullable(String)", None),
        OutputColumn("k", "`k`", "LowCardinality(String)", None),
    ]
    sink = sink_from_settings(["h"], "default", "t", cols, "w0", create_table=True, client_factory=lambda: fake)
    sink.table.version = (18, 16, 1)
    assert sink.table.create_table_sql() == (
        "CREATE TABLE IF NOT EXISTS `default`.`t` (`maybe` Nullable(String), `k` LowCardinality(String), "
        "`_glasspipe_batch` String DEFAULT '') ENGINE = MergeTree ORDER BY (`k`)"
    )
    assert ddl_settings((18, 16, 1), cols) == {"allow_experimental_low_cardinality_type": 1}
    assert ddl_settings((19, 3), cols) == {}


def test_batch_shape_is_checked() -> None:
    sink = make_sink(FakeClient("18.16.1"))
    with pytest.raises(SinkError, match="missing"):
        sink.write_batch(1, {"id": [1]}, "o")
    with pytest.raises(SinkError, match="different lengths"):
        sink.write_batch(1, {"id": [1], "name": []}, "o")


def test_same_sink_retrying_a_failed_batch_checks_presence_again() -> None:
    """Spark retries a batch whose write_batch raised with the same sink object: no chunk twice."""
    now = [0.0]
    fake = FakeClient("18.16.1")
    sink = sink_from_settings(
        ["h"],
        "default",
        "t",
        COLS,
        "w0",
        max_rows=3,
        client_factory=lambda: fake,
        retry_deadline=5,
        sleep=lambda s: now.__setitem__(0, now[0] + s),
        clock=lambda: now[0],
    )
    sink.write_batch(1, batch(2), "o1")
    orig = fake.execute
    state = {"inserts": 0, "down": True}

    def execute(query: str, params: Any = None, **kw: Any) -> Any:
        if query.startswith("INSERT INTO `default`.`t`") and state["down"]:
            state["inserts"] += 1
            if state["inserts"] > 1:  # chunk 0 lands, then ClickHouse goes away
                raise errors.NetworkError("Connection refused")
        return orig(query, params, **kw)

    fake.execute = execute  # type: ignore[method-assign]
    with pytest.raises(SinkUnavailable):
        sink.write_batch(2, batch(7), "o2")
    assert fake.chunks.get("w0/2/0-3") == 3
    state["down"] = False
    res = sink.write_batch(2, batch(7), "o2")
    assert (res.rows_written, res.chunks_skipped) == (4, 1)
    assert fake.chunks == {"w0/1/0-2": 2, "w0/2/0-3": 3, "w0/2/3-6": 3, "w0/2/6-7": 1}


def test_mutation_deadline_and_message() -> None:
    from glasspipe_job.clickhouse.mutations import Mutation, MutationStuck, MutationWatch, overdue

    assert not overdue(10.0, 20.0, None) and not overdue(10.0, 20.0, 10.0) and overdue(10.0, 20.5, 10.0)
    now = [0.0]
    blocking = [Mutation("mutation_2.txt", "DELETE WHERE throwIf(1)", 3), Mutation("mutation_4.txt", "DELETE x", 3)]
    watch = MutationWatch(lambda: None, "db", "t", "`db`.`t`", "rolling back batch w/1/", 60.0, lambda: now[0])
    watch.issued()
    now[0] = 59.0
    assert "waiting 59 s" in str(watch.pending(blocking)) and not isinstance(watch.pending(blocking), MutationStuck)
    now[0] = 61.0
    err = watch.pending(blocking)
    assert isinstance(err, MutationStuck) and isinstance(err, SinkError)
    assert str(err).startswith("rolling back batch w/1/: the DELETE on `db`.`t` has not finished after 61 s")
    assert "mutation_id = 'mutation_2.txt'" in str(err) and "restart this replica" in str(err)
    assert "has not finished after 61 s (spec.sink.clickhouse.mutationTimeout is 60 s)" in str(err)
    assert "raise spec.sink.clickhouse.mutationTimeout" in str(err)


def test_the_stuck_message_fits_a_termination_message_and_is_heard_by_the_table() -> None:
    """Hundreds of queued mutations with long commands: the message keeps its fix within the kubelet's 4 KiB,
    and the table keeps the error for the job (a foreachBatch error reaches the driver wrapped by Spark)."""
    from glasspipe_job.clickhouse.connection import Connection
    from glasspipe_job.clickhouse.mutations import MAX_DESCRIBED, Mutation, MutationStuck, describe
    from glasspipe_job.clickhouse.table import ClickHouseTable
    from glasspipe_job.failure import MAX_TERMINATION_MESSAGE

    many = [Mutation(f"mutation_{i}.txt", "DELETE WHERE " + "x" * 1000, 2) for i in range(300)]
    assert describe(many).endswith(f"; and {300 - MAX_DESCRIBED} more") and describe([]) == "none"
    now = [0.0]
    conn = Connection(["ch:9000"], "db", mutation_deadline=4.0, client_factory=lambda: None,  # type: ignore[arg-type,return-value]
                      clock=lambda: now[0])
    table = ClickHouseTable(conn, "t", [OutputColumn("id", "`id`", "Int64", "s.id")])
    watch = table.mutation_watch("deleting partial/stale chunks of batch 3 of w")
    watch.issued()
    now[0] = 3.0
    assert not isinstance(watch.pending(many), MutationStuck) and table.stuck is None
    now[0] = 5.0
    err = watch.pending(many)
    assert isinstance(err, MutationStuck) and table.stuck is err
    msg = str(err)
    assert len(msg.encode()) < MAX_TERMINATION_MESSAGE, len(msg.encode())
    assert "mutation_0.txt" in msg and "mutation_5.txt" not in msg and "and 295 more" in msg
    assert "`db`.`t`" in msg and "(spec.sink.clickhouse.mutationTimeout is 4 s)" in msg
    assert msg.endswith("Rows of the delete are visible to readers until it finishes")


def test_the_main_loops_fence_check_never_shares_the_connection_with_a_running_batch() -> None:
    """The cold clean run of 2026-11-23: a batch's ledger lookup ran outside the writer lock while the main
    loop's fence check read the ledger on the same connection ("Simultaneous queries on single
    connection detected"), and the replica died. Now the whole batch holds the lock, from the lookup on."""
    import threading

    in_lookup, release = threading.Event(), threading.Event()

    class SlowLookup(FakeClient):
        def execute(self, query: str, params: Any = None, **kwargs: Any) -> Any:
            if query.strip().startswith("SELECT chunks, rows FROM"):
                in_lookup.set()
                assert release.wait(10), "the test never released the lookup"
            return super().execute(query, params, **kwargs)

    class CountingFence:
        checks = 0

        def check(self) -> None:
            CountingFence.checks += 1

    sink = make_sink(SlowLookup("18.16.1"))
    sink.fence = CountingFence()  # type: ignore[assignment]
    writer = threading.Thread(target=sink.write_batch, args=(0, batch(4), "{}"))
    writer.start()
    assert in_lookup.wait(10)
    sink.check_fence_between_batches()  # the batch is in its ledger lookup: skipped, no query
    assert CountingFence.checks == 0
    release.set()
    writer.join(10)
    assert not writer.is_alive()
    checks_during_batch = CountingFence.checks  # the batch's own fence checks
    sink.check_fence_between_batches()  # between batches: checked
    assert CountingFence.checks == checks_during_batch + 1


def test_after_a_failed_query_the_sink_reads_the_fence_once_more() -> None:
    """superseded_after_failure: a newer claim found then is remembered (every later write refuses); no newer
    claim, or a ledger it cannot read, leaves the query's own failure to be reported."""
    from glasspipe_job.clickhouse.ledger import Superseded

    class CheckedFence:
        def __init__(self, outcome: BaseException | None) -> None:
            self.outcome, self.checks = outcome, 0

        def check(self) -> None:
            self.checks += 1
            if self.outcome is not None:
                raise self.outcome

    sink = make_sink(FakeClient("18.16.1"))
    assert sink.superseded_after_failure() is None  # no fence (a local run with no ledger claims)
    for outcome in (None, ConnectionError("ClickHouse refused the connection")):
        fence = CheckedFence(outcome)
        sink.fence = fence  # type: ignore[assignment]
        assert sink.superseded_after_failure() is None
        assert fence.checks == 1 and sink.superseded is None
    why = "writer w0 (generation 1) is superseded by writer w1 (generation 2)"
    fence = CheckedFence(Superseded(why))
    sink.fence = fence  # type: ignore[assignment]
    assert sink.superseded_after_failure() == why
    assert sink.superseded_after_failure() == sink.superseded == why and fence.checks == 1
    with pytest.raises(Superseded):
        sink.check_fence()  # what the job checks before sending a batch's dead letters
    assert fence.checks == 1


def test_the_last_fence_check_gives_up_on_an_unreachable_clickhouse_and_leaves_the_retry_deadline_as_it_was() -> None:
    """The job's connection retries until ClickHouse is back; the check after a failed query must not hold the
    replica up that long: it gives up after FENCE_AFTER_FAILURE_SECONDS, and the query's own error is reported."""
    from glasspipe_job.clickhouse.sink import FENCE_AFTER_FAILURE_SECONDS

    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    sink = make_sink(FakeClient("18.16.1"), clock=lambda: now[0])
    sink.table.connection._sleep = sleep  # the sink's sleep, keeping the fake clock in step

    class UnreachableLedger:
        attempts = 0

        def check(self) -> None:
            def claims(_attempt: int) -> None:
                UnreachableLedger.attempts += 1
                if UnreachableLedger.attempts > 200:  # still retrying long past the bound: end the test, not hang
                    raise ValueError("no bound on the retries")
                raise EOFError("Unexpected EOF while reading bytes")  # a socket closed: transient

            sink.table.retrying("reading the pipeline's claims", claims)

    sink.fence = UnreachableLedger()  # type: ignore[assignment]
    assert sink.superseded_after_failure() is None
    assert UnreachableLedger.attempts >= 3 and now[0] <= FENCE_AFTER_FAILURE_SECONDS, (UnreachableLedger.attempts, now)
    assert sink.table.connection.retry_deadline is None and sink.superseded is None


def test_a_ledger_the_sink_may_not_alter_keeps_its_rows_and_a_warning_names_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ledger created before left_closed_ms, and a sink user without the ALTER right: the sink writes its
    batches as before (no such column in its ledger rows) and says which statement an admin runs."""

    class NoAlter(FakeClient):
        def execute(self, query: str, params: Any = None, **kwargs: Any) -> Any:
            q = query.strip()
            if "FROM system.columns" in q and "name = %(c)s" in q:
                return [(0,)]
            if q.startswith(f"ALTER TABLE `default`.`{LEDGER_TABLE}`"):
                raise errors.ServerException("Not enough privileges", 497)
            return super().execute(query, params, **kwargs)

    client = NoAlter("24.8.1")
    with caplog.at_level("WARNING"):
        make_sink(client).write_batch(0, batch(4), '[{"t":{"0":4}}]', left_closed_ms=1234)
    ledger_inserts = [c.query for c in client.calls if c.query.startswith("INSERT") and LEDGER_TABLE in c.query]
    assert ledger_inserts and all("left_closed_ms" not in q for q in ledger_inserts), ledger_inserts
    assert [r[5] for r in client.ledger] == ["pending", "done"]
    assert f"ALTER TABLE `default`.`{LEDGER_TABLE}` ADD COLUMN left_closed_ms Int64 DEFAULT 0" in caplog.text
