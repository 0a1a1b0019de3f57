"""The exactly-once ClickHouse sink against the real local ClickHouse (18.16: the marker mechanism).

Crashes are real where it matters: a child process running the sink is SIGKILLed mid-batch, and the
server itself is stopped for ~10 s while a batch is being written.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest
import yaml

from glasspipe import contract
from glasspipe.api.validation import OutputColumn, validate_spec
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.paths import REPO_ROOT
from glasspipe_dev.sinks import sink_from_settings
from glasspipe_job.clickhouse.errors import SinkError
from glasspipe_job.clickhouse.names import LEDGER_TABLE, MARKER_COLUMN
from glasspipe_job.clickhouse.sink import ClickHouseSink, WriteResult
from sink_rows import COLS, T0, Crash, rows, stats

pytestmark = pytest.mark.integration

def new_table() -> str:
    return "sink_" + uuid.uuid4().hex[:10]


def sink_for(server: ClickHouseServer, table: str, **kw: Any) -> ClickHouseSink:
    kw.setdefault("max_rows", 100)
    kw.setdefault("create_table", True)
    kw.setdefault("writer_id", "default.pipe-0")
    return sink_from_settings([f"{server.host}:{server.port}"], "default", table, COLS, **kw)


def ledger_rows(server: ClickHouseServer, writer: str) -> list[tuple[int, int, int, str]]:
    return [
        tuple(r)
        for r in server.client().execute(
            f"SELECT batch_id, chunks, rows, offsets FROM {LEDGER_TABLE} WHERE writer = %(w)s "
            "AND state = 'done' ORDER BY batch_id",
            {"w": writer},
        )
    ]


def test_replay_of_a_committed_batch_writes_nothing(clickhouse: ClickHouseServer) -> None:
    table = new_table()
    with sink_for(clickhouse, table) as sink:
        assert sink.committed_offsets() is None
        first = sink.write_batch(0, rows(0, 250), '{"topic":{"0":250}}')
        assert first == WriteResult(250, 3, False, 0, 1)
        assert sink.write_batch(0, rows(0, 250), '{"topic":{"0":250}}').skipped_replay
        sink.write_batch(1, rows(250, 300), '{"topic":{"0":300}}')
    # a new driver process after a crash replays batch 1 (same id, same rows, another order)
    with sink_for(clickhouse, table) as again:
        replay = again.write_batch(1, rows(250, 300, shuffle=1), '{"topic":{"0":300}}')
        assert replay.skipped_replay and replay.rows_written == 0
        assert again.committed_offsets() == '{"topic":{"0":300}}'
        assert again.committed_offsets("someone-else") is None
    assert stats(clickhouse, table) == (300, 300)
    assert ledger_rows(clickhouse, "default.pipe-0")[-2:] == [
        (0, 3, 250, '{"topic":{"0":250}}'),
        (1, 1, 50, '{"topic":{"0":300}}'),
    ]
    markers = sorted(clickhouse.client().execute(f"SELECT DISTINCT {MARKER_COLUMN} FROM {table}"))
    assert [m for (m,) in markers] == [
        "default.pipe-0/0/0-100",
        "default.pipe-0/0/100-200",
        "default.pipe-0/0/200-250",
        "default.pipe-0/1/0-50",
    ]


def die_after_chunks(sink: ClickHouseSink, table: str, chunks: int) -> None:
    """Make the sink's process 'die' (raise Crash) when it sends its chunk number ``chunks`` + 1."""
    sink.open()
    connection = sink.table.connection
    real_client = connection.client
    inserts = {"n": 0}

    class Dies:
        def execute(self, query: str, *a: Any, **kw: Any) -> Any:
            if query.startswith(f"INSERT INTO `default`.`{table}`"):
                if inserts["n"] == chunks:
                    raise Crash()
                inserts["n"] += 1
            return real_client.execute(query, *a, **kw)

        def disconnect(self) -> None:
            real_client.disconnect()

    connection._client = Dies()


def test_batch_whose_first_chunks_landed_before_a_crash(clickhouse: ClickHouseServer) -> None:
    table = new_table()
    writer = "default.crashy-0"
    dead = sink_for(clickhouse, table, writer_id=writer)
    die_after_chunks(dead, table, 2)
    with pytest.raises(Crash):
        dead.write_batch(0, rows(0, 550), "o0")
    assert stats(clickhouse, table) == (200, 200) and ledger_rows(clickhouse, writer) == []

    # the restarted job replays batch 0 with the rows in another order
    with sink_for(clickhouse, table, writer_id=writer) as sink:
        res = sink.write_batch(0, rows(0, 550, shuffle=7), "o0")
    assert (res.rows_written, res.chunks, res.chunks_skipped) == (350, 6, 2)
    assert stats(clickhouse, table) == (550, 550)
    assert ledger_rows(clickhouse, writer) == [(0, 6, 550, "o0")]


_CHILD = textwrap.dedent(
    """
    import sys, datetime as dt
    from glasspipe.api.validation import OutputColumn
    from glasspipe_job.clickhouse.connection import Connection
    from glasspipe_job.clickhouse.sink import ClickHouseSink
    from glasspipe_job.clickhouse.table import ClickHouseTable
    port, table, batch = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    cols = [OutputColumn("id", "`id`", "Int64", None), OutputColumn("key", "`key`", "String", None),
            OutputColumn("ts", "`ts`", "DateTime", None), OutputColumn("v", "`v`", "Nullable(Float64)", None)]
    n = 400_000
    ids = list(range(batch * n, (batch + 1) * n))
    t0 = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    data = {"id": ids, "key": [f"k{i % 97}" for i in ids], "ts": [t0 + dt.timedelta(seconds=i) for i in ids],
            "v": [None if i % 10 == 0 else i / 4 for i in ids]}
    connection = Connection([f"127.0.0.1:{port}"], "default", insert_block_size=40_000)
    sink = ClickHouseSink(ClickHouseTable(connection, table, cols, create_table=True), "default.killed-0",
                          40_000).open()
    print("WRITING", flush=True)
    sink.write_batch(batch, data, f"o{batch}")
    print("DONE", flush=True)
    """
)


def test_successor_rolls_back_the_batch_a_stopped_writer_never_finished(clickhouse: ClickHouseServer) -> None:
    """Rescaling: writer A dies after 2 of 6 chunks and never comes back (its layout is gone); writer B
    takes over A's partitions, rolls A's abandoned batch back and writes those records itself."""
    table = new_table()
    a = sink_for(clickhouse, table, writer_id="default.pipe.0of1-aaaa")
    a.write_batch(0, rows(0, 300), '[{"t":{"0":300}}]')
    die_after_chunks(a, table, 2)
    with pytest.raises(Crash):
        a.write_batch(1, rows(300, 850), '[{"t":{"0":850}}]')
    assert stats(clickhouse, table) == (500, 500)  # batch 0 and 2 chunks of batch 1

    from glasspipe_job.handover import abandoned_batches, ledger_progress

    with sink_for(clickhouse, table, writer_id="default.pipe.0of2-bbbb") as b:
        ledger = b.ledger.pipeline_rows("default.pipe.")
        assert ledger_progress(ledger) == {"t": {0: 300}}  # where B resumes: batch 1 never finished
        abandoned = abandoned_batches(ledger, {"t": {0: 0}}, b.writer_id)
        assert [(w, n) for w, n, _ in abandoned] == [("default.pipe.0of1-aaaa", 1)]
        assert b.ledger.roll_back(*abandoned[0]) == 200
        assert stats(clickhouse, table) == (300, 300)
        b.write_batch(0, rows(300, 850), '[{"t":{"0":850}}]')  # B re-reads from offset 300
        assert abandoned_batches(b.ledger.pipeline_rows("default.pipe."), {"t": {0: 0}}, b.writer_id) == []
    assert stats(clickhouse, table) == (850, 850)


def test_a_pipeline_never_reads_the_ledger_of_a_pipeline_whose_name_extends_its_own(
    clickhouse: ClickHouseServer,
) -> None:
    """Issue #14: pipeline `orders` (prefix `default.orders.`) read the rows of `orders.v2`."""
    table = new_table()
    with sink_for(clickhouse, table, writer_id="default.orders.v2.0of1-cccc") as v2:
        v2.write_batch(0, rows(0, 10), '[{"t":{"0":10}}]')
    with sink_for(clickhouse, table, writer_id="default.orders.0of1-dddd") as orders:
        orders.write_batch(0, rows(10, 15), '[{"t":{"0":5}}]')
        assert {w for w, *_ in orders.ledger.pipeline_rows("default.orders.")} == {"default.orders.0of1-dddd"}
        assert {w for w, *_ in orders.ledger.pipeline_rows("default.orders.v2.")} == {"default.orders.v2.0of1-cccc"}


def test_sigkilled_writer_then_replay_is_exactly_once(clickhouse: ClickHouseServer) -> None:
    """A real crash: the process running write_batch is SIGKILLed at several points of a 10-chunk batch."""
    table = new_table()
    outcomes = []
    watcher = clickhouse.client()
    for batch, delay in enumerate((0.0, 0.05, 0.2)):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(clickhouse.port), table, str(batch)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "WRITING"
        # kill it while it sends chunks: once the first chunk of this batch is visible, plus `delay`
        deadline = time.monotonic() + 60
        while watcher.execute(f"SELECT count() FROM {table}")[0][0] <= batch * 400_000:
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.005)
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        time.sleep(0.5)  # the server finishes (or drops) the insert it was receiving
        landed = stats(clickhouse, table)[0] - batch * 400_000
        n = 400_000
        data = rows(batch * n, (batch + 1) * n, shuffle=batch)  # same rows as the child's, another order
        with sink_for(clickhouse, table, writer_id="default.killed-0", max_rows=40_000) as sink:
            res = sink.write_batch(batch, data, f"o{batch}")
        outcomes.append((landed, res.chunks_skipped, res.rows_written))
        assert landed % 40_000 == 0, f"a chunk landed partially: {landed} rows"  # one block: all or nothing
        assert res.rows_written + landed == n or res.skipped_replay
        assert stats(clickhouse, table) == ((batch + 1) * n, (batch + 1) * n)
    print("rows landed before each kill, chunks skipped, rows written on replay:", outcomes)
    assert any(0 < landed < 400_000 for landed, _, _ in outcomes), outcomes


def test_clickhouse_down_for_10s_during_write_batch(clickhouse: ClickHouseServer) -> None:
    table = new_table()
    writer = "default.outage-0"
    with sink_for(clickhouse, table, writer_id=writer, max_rows=20_000) as sink:
        sink.write_batch(0, rows(0, 10), "o0")
        data = rows(10, 400_010)
        result: list[WriteResult | BaseException] = []

        def write() -> None:
            try:
                result.append(sink.write_batch(1, data, "o1"))
            except BaseException as e:
                result.append(e)

        worker = threading.Thread(target=write)
        worker.start()
        watcher = clickhouse.client()
        deadline = time.monotonic() + 60
        while not watcher.execute(f"SELECT count() FROM {table} WHERE {MARKER_COLUMN} LIKE '%/1/%'")[0][0]:
            assert time.monotonic() < deadline and worker.is_alive(), result
            time.sleep(0.02)
        watcher.disconnect()
        t_stop = time.monotonic()
        clickhouse.stop()
        time.sleep(10)
        clickhouse.start()
        worker.join(120)
        assert not worker.is_alive()
        took = time.monotonic() - t_stop
    res = result[0]
    assert isinstance(res, WriteResult), res
    assert res.attempts > 1 and res.rows_written + 20_000 * res.chunks_skipped == 400_000
    assert stats(clickhouse, table) == (400_010, 400_010)
    assert ledger_rows(clickhouse, writer) == [(0, 1, 10, "o0"), (1, 20, 400_000, "o1")]
    print(f"outage: write_batch finished {took:.1f} s after the stop, in {res.attempts} attempts")


def test_partial_chunk_is_deleted_and_rewritten(clickhouse: ClickHouseServer) -> None:
    """A chunk stored only in part (a server crash between the parts of one INSERT) is replaced."""
    table = new_table()
    writer = "default.partial-0"
    sink_for(clickhouse, table, writer_id=writer).open().close()
    c = clickhouse.client()
    part = rows(0, 40)
    c.execute(
        f"INSERT INTO {table} (id, key, ts, v, {MARKER_COLUMN}) VALUES",
        [
            part["id"],
            part["key"],
            [int(t.timestamp()) for t in part["ts"]],
            part["v"],
            [f"{writer}/0/0"] * 40,
        ],
        columnar=True,
    )
    with sink_for(clickhouse, table, writer_id=writer) as sink:
        res = sink.write_batch(0, rows(0, 150), "o0")
    assert res.rows_written == 150  # the wait for the delete is not an insert attempt (res.attempts)
    assert stats(clickhouse, table) == (150, 150)


def test_values_of_every_spark_type_round_trip(clickhouse: ClickHouseServer) -> None:
    table = new_table()
    cols = [
        OutputColumn("s", "`s`", "LowCardinality(String)", None),
        OutputColumn("flag", "`flag`", "UInt8", None),
        OutputColumn("n", "`n`", "Nullable(Int32)", None),
        OutputColumn("f", "`f`", "Float32", None),
        OutputColumn("amount", "`amount`", "Decimal(18, 4)", None),
        OutputColumn("ts", "`ts`", "DateTime", None),
        OutputColumn("day", "`day`", "Date", None),
        OutputColumn("txt", "`txt`", "Nullable(String)", None),
    ]
    naive = dt.datetime(2024, 5, 1, 12, 30, 15)
    aware = dt.datetime(2024, 5, 1, 14, 30, 16, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    data: dict[str, list[Any]] = {
        "s": ["a", "b"],
        "flag": [True, False],
        "n": [None, 7],
        "f": [1.5, 2],
        "amount": [Decimal("12.3456"), Decimal("-1.0001")],
        "ts": [naive, aware],
        "day": [dt.date(2024, 5, 1), dt.datetime(2024, 5, 2, 23, 0, tzinfo=dt.UTC)],
        "txt": [None, 42],
    }
    with sink_from_settings(
        [f"127.0.0.1:{clickhouse.port}"],
        "default",
        table,
        cols,
        "default.types-0",
        create_table=True,
        order_by=["s"],
    ) as sink:
        sink.write_batch(0, data, "o")
    got = clickhouse.client().execute(
        f"SELECT s, flag, n, f, amount, toUnixTimestamp(ts), day, txt FROM {table} ORDER BY s"
    )
    assert got == [
        ("a", 1, None, 1.5, Decimal("12.3456"), 1714566615, dt.date(2024, 5, 1), None),
        ("b", 0, 7, 2.0, Decimal("-1.0001"), 1714566616, dt.date(2024, 5, 2), "42"),
    ]
    types = dict(
        clickhouse.client().execute(
            f"SELECT name, type FROM system.columns WHERE database = 'default' AND table = '{table}'"
        )
    )
    assert types["s"] == "LowCardinality(String)" and types[MARKER_COLUMN] == "String"


def test_permanent_errors_say_what_to_fix(clickhouse: ClickHouseServer) -> None:
    c = clickhouse.client()
    missing = new_table()
    with pytest.raises(SinkError, match=r"does not exist.*createTable: true"):
        sink_for(clickhouse, missing, create_table=False).open()

    no_marker = new_table()
    c.execute(
        f"CREATE TABLE {no_marker} (id Int64, key String, ts DateTime, v Nullable(Float64)) "
        "ENGINE = MergeTree ORDER BY id"
    )
    with pytest.raises(SinkError) as e:
        sink_for(clickhouse, no_marker, create_table=False).open()
    assert f"ALTER TABLE `default`.`{no_marker}` ADD COLUMN {MARKER_COLUMN} String DEFAULT ''" in str(e.value)
    assert "22.2" in str(e.value)

    lacks_v = new_table()
    c.execute(
        f"CREATE TABLE {lacks_v} (id Int64, key String, ts DateTime, {MARKER_COLUMN} String) "
        "ENGINE = MergeTree ORDER BY id"
    )
    with pytest.raises(SinkError, match=r"lacks column\(s\) v.*ADD COLUMN `v` Nullable\(Float64\)"):
        sink_for(clickhouse, lacks_v, create_table=False).open()

    wrong_type = new_table()
    c.execute(
        f"CREATE TABLE {wrong_type} (id Int64, key UInt32, ts DateTime, v Nullable(Float64), "
        f"{MARKER_COLUMN} String) ENGINE = MergeTree ORDER BY id"
    )
    with (
        sink_for(clickhouse, wrong_type, create_table=False, writer_id="default.wrong-0") as sink,
        pytest.raises(SinkError, match=r"column 'key' \(UInt32\): cannot convert value 'k0'"),
    ):
        sink.write_batch(0, rows(0, 5), "o")

    with pytest.raises(SinkError, match=r"code 193|code 516|wrong password|credentialsSecretRef"):
        sink_for(clickhouse, new_table(), password="nope").open()


def test_a_table_whose_dedup_key_column_is_nullable_is_created(clickhouse: ClickHouseServer) -> None:
    """A dedup key field left nullable (the default) gives a Nullable column, which ClickHouse refuses in a sorting
    key: the job's table is then sorted by its first column that is not Nullable instead of failing to start."""
    from glasspipe_job.config import load_job_config
    from glasspipe_job.runner import make_table

    doc = yaml.safe_load((REPO_ROOT / "examples" / "sms-dedup.yaml").read_text())
    spec = doc["spec"]
    spec["sources"][0]["schema"]["fields"][0]["nullable"] = True  # sms_id: Nullable(String)
    del spec["sink"]["clickhouse"]["orderBy"]
    table = new_table()
    spec["sink"]["clickhouse"].update(hosts=[f"{clickhouse.host}:{clickhouse.port}"], table=table)
    config = load_job_config(contract.write_job_config("default", "nullable-key", validate_spec(spec)[0], 0))
    made = make_table(config)
    try:
        made.open()
    finally:
        made.close()
    [(ddl,)] = clickhouse.client().execute(f"SHOW CREATE TABLE {table}")
    assert "sms_id Nullable(String)" in ddl and "ORDER BY sent_at" in ddl, ddl


def test_arrow_chunks_sent_as_native_bytes_store_what_the_driver_path_stores(clickhouse: ClickHouseServer) -> None:
    """The same Arrow rows through the Native encoding (native_block.py) and through the driver's Python values:
    the same table contents, for strings of every varint width, NULLs, numbers, times and dates; a column type
    without an encoding sends the chunk the driver's way."""
    import pyarrow as pa

    cols = [
        OutputColumn("id", "`id`", "Int64", None),
        OutputColumn("txt", "`txt`", "String", None),
        OutputColumn("maybe", "`maybe`", "Nullable(String)", None),
        OutputColumn("n", "`n`", "Nullable(Int32)", None),
        OutputColumn("flag", "`flag`", "UInt8", None),
        OutputColumn("f", "`f`", "Float32", None),
        OutputColumn("ts", "`ts`", "DateTime", None),
        OutputColumn("day", "`day`", "Date", None),
    ]
    n = 1000
    texts = ["", "é", "x" * 127, "y" * 128, "z" * 20_000, "日本語"]
    data = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "txt": pa.array([texts[i % len(texts)] + str(i) for i in range(n)]),
        "maybe": pa.array([None if i % 3 == 0 else f"m{i}" for i in range(n)]),
        "n": pa.array([None if i % 4 == 0 else i - 500 for i in range(n)], pa.int32()),
        "flag": pa.array([i % 2 == 0 for i in range(n)]),
        "f": pa.array([i / 8 for i in range(n)], pa.float64()),
        "ts": pa.array([T0 + dt.timedelta(seconds=i, microseconds=999_999) for i in range(n)],
                       pa.timestamp("us", tz="UTC")),
        "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)], pa.date32()),
    })
    contents = []
    for native in (True, False):
        table = new_table()
        with sink_from_settings([f"127.0.0.1:{clickhouse.port}"], "default", table, cols,
                            f"default.native-{int(native)}", max_rows=300, create_table=True, order_by=["id"]) as sink:
            sink._native = native
            res = sink.write_batch(0, data, "o")
        assert (res.rows_written, res.chunks, res.native_chunks) == (n, 4, 4 if native else 0)
        contents.append(clickhouse.client().execute(
            f"SELECT id, txt, maybe, n, flag, f, toUnixTimestamp(ts), day, "
            f"replaceRegexpOne({MARKER_COLUMN}, '^[^/]*/', '') FROM {table} ORDER BY id"))
    assert contents[0] == contents[1]
    assert len(contents[0]) == n and contents[0][4][1] == "z" * 20_000 + "4" and contents[0][3][2] is None

    lc = new_table()  # LowCardinality(String) has no encoding here: the driver's way, the same rows
    lc_cols = [OutputColumn("id", "`id`", "Int64", None), OutputColumn("s", "`s`", "LowCardinality(String)", None)]
    with sink_from_settings([f"127.0.0.1:{clickhouse.port}"], "default", lc, lc_cols, "default.native-lc",
                        create_table=True, order_by=["id"]) as sink:
        res = sink.write_batch(0, pa.table({"id": [1, 2], "s": ["a", "b"]}), "o")
    assert (res.rows_written, res.native_chunks) == (2, 0)
    assert clickhouse.client().execute(f"SELECT id, s FROM {lc} ORDER BY id") == [(1, "a"), (2, "b")]


def test_a_table_whose_types_changed_under_the_sink_gets_the_driver_path(clickhouse: ClickHouseServer) -> None:
    """The server's sample block, not the types read at open, decides: a column altered after the sink opened
    makes the Native INSERT end with no rows and the chunk go as the driver's values, converted to the new type."""
    import pyarrow as pa

    table = new_table()
    cols = [OutputColumn("id", "`id`", "Int64", None), OutputColumn("v", "`v`", "Int32", None)]
    with sink_from_settings([f"127.0.0.1:{clickhouse.port}"], "default", table, cols, "default.altered-0",
                        create_table=True, order_by=["id"]) as sink:
        first = sink.write_batch(0, pa.table({"id": [1], "v": pa.array([10], pa.int32())}), "o")
        clickhouse.client().execute(f"ALTER TABLE {table} MODIFY COLUMN v Int64")
        second = sink.write_batch(1, pa.table({"id": [2], "v": pa.array([20], pa.int32())}), "o")
    assert (first.native_chunks, second.native_chunks) == (1, 0)
    assert clickhouse.client().execute(f"SELECT id, v FROM {table} ORDER BY id") == [(1, 10), (2, 20)]


def test_a_ledger_made_before_left_closed_gains_the_column_and_reports_how_far_each_writer_closed(
    clickhouse: ClickHouseServer,
) -> None:
    """A left join's hand-over reads, per earlier writer, its newest done batch's offsets and the latest event time
    up to which it closed left windows. A ledger created before batches recorded it gets the column when a sink
    opens it; its old rows read as 0 (unknown). A batch rolled back does not count, even if its stale writer wrote done
    after the roll-back."""
    db = "wm_" + uuid.uuid4().hex[:8]
    admin = clickhouse.client()
    admin.execute(f"CREATE DATABASE {db}")
    admin.execute(f"CREATE TABLE {db}.{LEDGER_TABLE} (writer String, batch_id UInt64, chunks UInt32, rows UInt64, "
                  "offsets String, state String DEFAULT 'done', written_at DateTime DEFAULT now()) "
                  "ENGINE = MergeTree ORDER BY (writer, batch_id)")  # as created before left_closed_ms
    admin.execute(f"INSERT INTO {db}.{LEDGER_TABLE} (writer, batch_id, chunks, rows, offsets, state) VALUES",
                  [("default.pipe.0of1-0dd", 0, 1, 5, '[{"t":{"0":5}}]', "done")])
    table = new_table()
    with sink_from_settings([f"{clickhouse.host}:{clickhouse.port}"], db, table, COLS, max_rows=100, create_table=True,
                        writer_id="default.pipe.0of1-aaaa") as a:
        a.write_batch(0, rows(5, 10), '[{"t":{"0":10}}]', left_closed_ms=5000)
        a.write_batch(1, rows(10, 20), '[{"t":{"0":20}}]', left_closed_ms=9000)
        a.ledger.insert(a.writer_id, 2, 0, 0, '[{"t":{"0":30}}]', state="pending")
        a.ledger.insert(a.writer_id, 2, 0, 0, '[{"t":{"0":30}}]', state="rolledback")
        a.ledger.insert(a.writer_id, 2, 1, 10, '[{"t":{"0":30}}]', left_closed_ms=99_000)  # stale, after the roll-back
        got = sorted(a.ledger.left_closed("default.pipe."))
    assert [tuple(r) for r in got] == [("default.pipe.0of1-0dd", '[{"t":{"0":5}}]', 0),
                                       ("default.pipe.0of1-aaaa", '[{"t":{"0":20}}]', 9000)]
    columns = dict(admin.execute(f"SELECT name, type FROM system.columns WHERE database = '{db}' "
                                 f"AND table = '{LEDGER_TABLE}'"))
    assert columns["left_closed_ms"] == "Int64", columns
    admin.execute(f"DROP DATABASE {db}")
