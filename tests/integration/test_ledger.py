"""Ledger protocol edge cases against the real ClickHouse (issue #14, point 5): a batch whose announcement
failed once, a restart with another ``maxRows`` mid-batch, a roll-back mutation that cannot finish, and a
stale writer that wakes up after its successor took over."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from clickhouse_driver import Client

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.sinks import sink_from_settings
from glasspipe_job import handover as ho
from glasspipe_job.clickhouse.errors import SinkError
from glasspipe_job.clickhouse.names import LEDGER_TABLE, MARKER_COLUMN
from glasspipe_job.clickhouse.sink import ClickHouseSink
from sink_rows import COLS, Crash, rows, stats

pytestmark = pytest.mark.integration


def new_table() -> str:
    return "ledger_" + uuid.uuid4().hex[:10]


class Faulty:
    """A real clickhouse-driver client; ``hook(query, n)`` may raise before query number n is sent."""

    def __init__(self, real: Client, hook: Callable[[str], None]) -> None:
        self.real, self.hook = real, hook

    def execute(self, query: str, *a: Any, **kw: Any) -> Any:
        self.hook(query)
        return self.real.execute(query, *a, **kw)

    def disconnect(self) -> None:
        self.real.disconnect()


def sink_with(server: ClickHouseServer, table: str, writer: str, max_rows: int,
              hook: Callable[[str], None] | None = None, **kw: Any) -> ClickHouseSink:
    def factory() -> Any:
        real = Client(host=server.host, port=server.port, database="default",
                      settings={"insert_block_size": max_rows})
        return Faulty(real, hook) if hook else real

    return sink_from_settings([f"{server.host}:{server.port}"], "default", table, COLS, writer, max_rows=max_rows,
                          create_table=True, client_factory=factory, max_backoff=0.2, **kw)


def configured_sink(server: ClickHouseServer, table: str, writer: str, mutation_timeout: str) -> ClickHouseSink:
    """The sink as a replica builds it from the pipeline YAML (``glasspipe run``, the operator's job config):
    runner.make_table's connection, with spec.sink.clickhouse.mutationTimeout as its mutation deadline."""
    from glasspipe_job.config import config_from_resource, load_job_config
    from glasspipe_job.runner import make_table

    doc = {"apiVersion": "glasspipe.io/v1alpha1", "kind": "GlassPipeline", "metadata": {"name": f"stuck-{table}"},
           "spec": {"sources": [{"name": "s", "kafka": {"bootstrapServers": "unused:9092", "topic": "t"},
                                 "schema": {"fields": [{"name": "id", "type": "long", "nullable": False},
                                                       {"name": "key", "type": "string", "nullable": False},
                                                       {"name": "ts", "type": "timestamp", "nullable": False},
                                                       {"name": "v", "type": "double"}]}}],
                    "sink": {"clickhouse": {"hosts": [f"{server.host}:{server.port}"], "table": table,
                                            "mutationTimeout": mutation_timeout}},
                    "deadLetter": {"topic": "dlq"}, "checkpoint": {"location": "file:///unused"}}}
    config = load_job_config(config_from_resource(doc))
    assert [(c.name, c.clickhouse_type) for c in config.columns] == [(c.name, c.clickhouse_type) for c in COLS]
    return ClickHouseSink(make_table(config), writer, config.spec.sink.clickhouse.batching.max_rows)


def take_over(server: ClickHouseServer, table: str, prefix: str, writer: str, owned: ho.Offsets) -> ClickHouseSink:
    """What runner.prepare_handover does for a new checkpoint: roll back abandoned batches, resume."""
    sink = sink_with(server, table, writer, 100).open()
    ledger_rows = sink.ledger.pipeline_rows(prefix)
    start = ho.new_start(writer, ledger_rows, owned, {}, {t: 0 for t in owned}, {})
    for w, b, offsets in start.roll_back:
        sink.ledger.roll_back(w, b, offsets)
    return sink


def test_a_batch_whose_announcement_failed_once_can_still_be_rolled_back(clickhouse: ClickHouseServer) -> None:
    """The `pending` row was written on the first attempt only: when that INSERT failed (transient), the
    retry wrote the chunks unannounced, and a successor could not find them after the writer died."""
    table = new_table()
    prefix = f"default.announce-{table}."
    state = {"pending_failed": False, "chunks": 0}

    def hook(query: str) -> None:
        if query.startswith(f"INSERT INTO `default`.`{LEDGER_TABLE}`") and not state["pending_failed"]:
            state["pending_failed"] = True
            raise ConnectionResetError("connection reset by peer (injected before the pending row was sent)")
        if query.startswith(f"INSERT INTO `default`.`{table}`"):
            if state["chunks"] == 2:
                raise Crash()  # the driver dies after 2 of 3 chunks of its retry
            state["chunks"] += 1

    a = sink_with(clickhouse, table, prefix + "0of1-aaaa", 100, hook)
    with pytest.raises(Crash):
        a.write_batch(0, rows(0, 300), '[{"t":{"0":300}}]')
    assert state["pending_failed"] and stats(clickhouse, table) == (200, 200)

    b = take_over(clickhouse, table, prefix, prefix + "0of2-bbbb", {"t": {0: 0}})
    b.write_batch(0, rows(0, 300), '[{"t":{"0":300}}]')  # the successor reads the partition from offset 0
    assert stats(clickhouse, table) == (300, 300)


@pytest.mark.parametrize("n,first,crash_after,then", [(300, 100, 2, 200), (500, 100, 3, 200), (600, 200, 2, 150)])
def test_restart_with_another_max_rows_mid_batch_writes_each_row_once(
    n: int, first: int, crash_after: int, then: int, clickhouse: ClickHouseServer
) -> None:
    """A chunk was recognised by marker and row count only: 300 rows in chunks of 100 (crash after two of
    them), replayed in chunks of 200, kept the stored chunk 1 (rows 100-199, 100 rows) as the new chunk 1
    (rows 200-299, also 100 rows): rows 100-199 twice, 200-299 never."""
    table = new_table()
    writer = f"default.maxrows-{table}.0of1-aaaa"
    sent = {"n": 0}

    def hook(query: str) -> None:
        if query.startswith(f"INSERT INTO `default`.`{table}`"):
            if sent["n"] == crash_after:
                raise Crash()
            sent["n"] += 1

    dead = sink_with(clickhouse, table, writer, first, hook)
    with pytest.raises(Crash):
        dead.write_batch(0, rows(0, n), f'[{{"t":{{"0":{n}}}}}]')
    landed = stats(clickhouse, table)[0]
    assert landed == crash_after * first
    with sink_with(clickhouse, table, writer, then) as sink:  # the restarted job, maxRows changed
        sink.write_batch(0, rows(0, n, shuffle=5), f'[{{"t":{{"0":{n}}}}}]')
    got = sorted(i for (i,) in clickhouse.client().execute(f"SELECT id FROM {table}"))
    assert got == list(range(n)), f"{len(got)} rows, {len(set(got))} distinct, {landed} landed before the crash"
    markers = clickhouse.client().execute(f"SELECT DISTINCT {MARKER_COLUMN} FROM {table}")
    assert all(m.startswith(f"{writer}/0/") for (m,) in markers)


def test_a_delete_behind_a_mutation_that_cannot_finish_stops_with_its_name(clickhouse: ClickHouseServer) -> None:
    """A stuck mutation held the stream for ever with no word: now the wait ends at the pipeline's
    sink.clickhouse.mutationTimeout with an error naming the blocking mutation, what to do and the field to
    raise (both for stale chunks and for a roll-back)."""
    table = new_table()
    writer = f"default.stuck-{table}.0of1-aaaa"
    sink_with(clickhouse, table, writer, 100).open().close()
    c = clickhouse.client()
    part = rows(0, 40)
    c.execute(f"INSERT INTO {table} (id, key, ts, v, {MARKER_COLUMN}) VALUES",
              [part["id"], part["key"], [int(t.timestamp()) for t in part["ts"]], part["v"],
               [f"{writer}/0/0-100"] * 40], columnar=True)  # a partial chunk: the sink must delete it
    c.execute(f"ALTER TABLE {table} DELETE WHERE throwIf(id >= 0) = 1")  # fails on every part, for ever
    try:
        for attempt in ("stale chunk", "roll-back"):
            sink = configured_sink(clickhouse, table, writer, "4s")
            assert sink.table.connection.mutation_deadline == 4.0
            outcome: list[BaseException | None] = []

            def run(sink: ClickHouseSink = sink, attempt: str = attempt,
                    outcome: list[BaseException | None] = outcome) -> None:
                try:
                    if attempt == "stale chunk":
                        sink.write_batch(0, rows(0, 150), '[{"t":{"0":150}}]')
                    else:
                        sink.open()
                        sink.ledger.roll_back(writer, 0, '[{"t":{"0":150}}]')
                    outcome.append(None)
                except BaseException as e:
                    outcome.append(e)

            started = time.monotonic()
            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            worker.join(90)
            took = time.monotonic() - started
            assert not worker.is_alive(), f"{attempt}: still waiting for the delete after {took:.0f} s"
            err = outcome[0]
            assert isinstance(err, SinkError), (attempt, err)
            msg = str(err)
            assert "has not finished after" in msg and "throwIf" in msg and "mutation_" in msg, msg
            assert "KILL MUTATION" in msg and table in msg and "restart this replica" in msg, msg
            assert "(spec.sink.clickhouse.mutationTimeout is 4 s)" in msg and "raise spec.sink.clickhouse" in msg, msg
            assert 4 <= took < 40, took
        assert stats(clickhouse, table)[0] == 40  # nothing written while the delete could not run
    finally:
        c.execute(f"DROP TABLE {table}")


def test_a_paused_writer_that_wakes_after_its_successor_took_over_removes_its_rows_and_stops(
    clickhouse: ClickHouseServer,
) -> None:
    """Writer A (generation 1) pauses after 2 of 3 chunks of batch 1. B claims A's partition (generation 2),
    rolls A's batch back and writes those records. A wakes up, sends its third chunk (after B's DELETE, so
    that DELETE does not cover it), and must notice B before it commits: it removes its chunks and stops."""
    from glasspipe_job.clickhouse.ledger import Fence, Ledger, Superseded, next_generation

    table = new_table()
    prefix = f"default.paused-{table}."
    owned = frozenset({("t", 0)})
    paused, resume = threading.Event(), threading.Event()
    sent = {"n": 0}

    def hook(query: str) -> None:
        if query.startswith(f"INSERT INTO `default`.`{table}`") and sent["n"] >= 0:
            sent["n"] += 1
            if sent["n"] == 4:  # batch 0 is 1 chunk; batch 1 pauses before its third chunk
                paused.set()
                assert resume.wait(60)

    a = sink_with(clickhouse, table, prefix + "0of1-aaaa", 100, hook).open()
    a_gen = next_generation(a.ledger.claims(prefix))
    a.ledger.claim(prefix, a.writer_id, a_gen, '[{"t":{"0":0}}]', {"t": 1})
    a.fence = Fence(Ledger(a.table), prefix, a.writer_id, a_gen, owned)
    a.write_batch(0, rows(0, 100), '[{"t":{"0":100}}]')
    outcome: list[BaseException | None] = []

    def run_a() -> None:
        try:
            a.write_batch(1, rows(100, 400), '[{"t":{"0":400}}]')
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    worker = threading.Thread(target=run_a, daemon=True)
    worker.start()
    assert paused.wait(60)
    assert stats(clickhouse, table) == (300, 300)  # batch 0 and 2 chunks of batch 1

    b = sink_with(clickhouse, table, prefix + "0of2-bbbb", 100).open()
    ledger_rows = b.ledger.handover_rows(prefix)
    b_gen = next_generation([*ledger_rows, *b.ledger.claims(prefix)])
    b.ledger.claim(prefix, b.writer_id, b_gen, '[{"t":{"0":100}}]', {"t": 1})  # B claims before it rolls anything back
    start = ho.new_start(b.writer_id, ledger_rows, {"t": {0: 0}}, {}, {"t": 0}, {})
    assert start.resume == {"t": {0: 100}} and [(w, n) for w, n, _ in start.roll_back] == [(a.writer_id, 1)]
    for w, n, o in start.roll_back:
        b.ledger.roll_back(w, n, o)
    b.write_batch(0, rows(100, 400, shuffle=2), '[{"t":{"0":400}}]')
    assert stats(clickhouse, table) == (400, 400)

    resume.set()  # A wakes up
    worker.join(60)
    assert not worker.is_alive()
    err = outcome[0]
    assert isinstance(err, Superseded), err
    assert f"superseded by writer {b.writer_id}" in str(err) and a.superseded == str(err)
    assert stats(clickhouse, table) == (400, 400)  # A's late chunk was removed again
    with pytest.raises(Superseded):  # and A writes nothing more
        a.write_batch(2, rows(400, 450), '[{"t":{"0":450}}]')
    assert stats(clickhouse, table) == (400, 400)
    # a later successor resumes at B's progress, not at A's rolled-back batch
    assert ho.ledger_progress(b.ledger.pipeline_rows(prefix)) == {"t": {0: 400}}


def test_a_replica_start_reads_only_the_ledger_rows_its_hand_over_decides_on(clickhouse: ClickHouseServer) -> None:
    """A long-running pipeline's ledger holds two rows per batch. handover_rows must reach the same decisions
    as every row (resume offsets, batches to roll back, next generation) from a handful of rows: here an
    old writer whose newest ``done`` was rolled back (a stale writer's late ``done``), an abandoned batch,
    claims old and new, a pipeline whose name extends this one's, and 60 000 batches of three replicas."""
    from glasspipe_job.clickhouse.ledger import Ledger, next_generation

    table = new_table()
    prefix = f"default.long-{table}."
    sink = sink_with(clickhouse, table, prefix + "0of3-cccc", 100).open()
    ledger = Ledger(sink.table)
    led = sink.table.ledger_table
    old, other = prefix + "0of2-aaaa", prefix + "1of2-aaaa"
    edge = [(old, 1, "claimed", '[{"t":{"0":0,"1":0}}]'), (old, 1, "pending", '[{"t":{"0":10,"1":10}}]'),
            (old, 1, "done", '[{"t":{"0":10,"1":10}}]'), (old, 2, "pending", '[{"t":{"0":20,"1":20}}]'),
            (old, 2, "done", '[{"t":{"0":20,"1":20}}]'), (old, 2, "rolledback", '[{"t":{"0":20,"1":20}}]'),
            (other, 1, "claimed", '[{"t":{"2":0,"3":0}}]'), (other, 1, "pending", '[{"t":{"2":7,"3":7}}]'),
            (other, 1, "done", '[{"t":{"2":7,"3":7}}]'), (other, 2, "pending", '[{"t":{"2":17,"3":17}}]'),
            (f"default.long-{table}.v2.0", 9, "done", '[{"t":{"0":999}}]')]
    sink.table.connection.client.execute(f"INSERT INTO {led} (writer, batch_id, state, offsets) VALUES", edge)
    sink.table.connection.client.execute(
        f"INSERT INTO {led} (writer, batch_id, chunks, rows, offsets, state) SELECT concat(%(p)s, "
        "toString(modulo(number, 3)), 'of3-cccc'), intDiv(number, 6), 1, 100, concat('[{\"t\":{\"', "
        "toString(modulo(number, 3) + 4), '\":', toString(intDiv(number, 6) * 100), '}}]'), "
        "if(modulo(number, 2) = 0, 'pending', 'done') FROM numbers(360000)", {"p": prefix})
    for writer, gen in ((prefix + "0of3-cccc", 3), (prefix + "1of3-cccc", 3), (prefix + "2of3-cccc", 3)):
        ledger.claim(prefix, writer, gen, f'[{{"t":{{"{int(writer[-6]) + 4}":0}}}}]', {"t": 8})

    every = ledger.pipeline_rows(prefix)
    few = ledger.handover_rows(prefix)
    assert len(every) == len(edge) - 1 + 360_000 + 3 and len(few) < 30, len(few)
    owned = {"t": {p: 0 for p in range(7)}}
    assert ho.ledger_progress(few) == ho.ledger_progress(every) == {
        "t": {0: 10, 1: 10, 2: 7, 3: 7, 4: 5_999_900, 5: 5_999_900, 6: 5_999_900}}
    assert ho.ledger_progress(few, except_writer=prefix + "1of3-cccc") == ho.ledger_progress(
        every, except_writer=prefix + "1of3-cccc")
    assert ho.abandoned_batches(few, owned, "x") == ho.abandoned_batches(every, owned, "x") == [
        (other, 2, '[{"t":{"2":17,"3":17}}]')]
    assert next_generation(few) == next_generation(every) == 4
    # the claims key holds the claims made through Ledger.claim only, read by primary key
    assert sorted((w, g) for w, g, _st, _o in ledger.claims(prefix)) == [
        (prefix + "0of3-cccc", 3), (prefix + "1of3-cccc", 3), (prefix + "2of3-cccc", 3)]
    assert ledger.handover_rows(f"default.none-{table}.") == []
