"""Facts about the local ClickHouse (18.16) that the exactly-once design depends on.

Run: GLASSPIPE_CACHE=... $VENV/bin/python bench/clickhouse_experiments.py
It starts its own throw-away server and prints one line per finding:
  (a) is one INSERT atomic when the client is SIGKILLed mid-send / right after sending?
  (b) does ALTER TABLE ... DELETE WHERE work?
  (c) what happens to settings the server does not know (insert_deduplication_token)?
  (d) columnar insert throughput with 10k-row blocks.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from glasspipe_dev.clickhouse import ClickHouseServer

if TYPE_CHECKING:
    from clickhouse_driver import Client

ROWS = 100_000
BLOCK = 10_000


def child(port: int, table: str, mode: str, min_squash_rows: int) -> None:
    """Insert ROWS rows in BLOCK-row blocks, then hang at the point named by ``mode`` until killed."""
    from clickhouse_driver import Client
    from clickhouse_driver.connection import Connection

    client = Client(
        "127.0.0.1",
        port=port,
        settings={"insert_block_size": BLOCK, "min_insert_block_size_rows": min_squash_rows},
    )
    sent = 0
    real_send_data = Connection.send_data

    def send_data(self: Connection, block: object, table_name: str = "") -> None:
        nonlocal sent
        real_send_data(self, block, table_name)
        sent += 1
        if mode == "mid" and sent == 5:  # half of the rows are on the wire, the end marker is not
            self.fout.flush()
            print("READY", flush=True)
            time.sleep(3600)

    def receive_end(self: Client) -> None:  # everything incl. the empty end block is sent
        self.connection.fout.flush()
        print("READY", flush=True)
        time.sleep(3600)

    class HalfSocket:
        """Sends half of the first data buffer of the (single, big) block, then hangs: a mid-block crash."""

        def __init__(self, sock: object) -> None:
            self._sock = sock

        def __getattr__(self, name: str) -> object:
            return getattr(self._sock, name)

        def sendall(self, data: bytes) -> None:
            if sent_started and mode == "mid1":
                self._sock.sendall(data[: len(data) // 2])  # type: ignore[attr-defined]
                print("READY", flush=True)
                time.sleep(3600)
            self._sock.sendall(data)  # type: ignore[attr-defined]

    sent_started = False
    real_create = Connection._create_socket

    def create_socket(self: Connection, host: str, port: int) -> object:
        return HalfSocket(real_create(self, host, port))

    def send_data_mid1(self: Connection, block: object, table_name: str = "") -> None:
        nonlocal sent_started
        sent_started = True
        real_send_data(self, block, table_name)

    if mode == "after1":
        client = Client("127.0.0.1", port=port, settings={"insert_block_size": ROWS})
    if mode == "mid1":
        client = Client("127.0.0.1", port=port, settings={"insert_block_size": ROWS})
        Connection._create_socket = create_socket
        Connection.send_data = send_data_mid1
    else:
        Connection.send_data = send_data
    if mode in ("after", "after1"):
        Client.receive_end_of_insert_query = receive_end
    ids = list(range(ROWS))
    client.execute(f"INSERT INTO {table} (id, s) VALUES", [ids, [str(i) for i in ids]], columnar=True)
    print("DONE", flush=True)


def kill_test(server: ClickHouseServer, mode: str, min_squash_rows: int) -> tuple[int, int]:
    table = f"atomic_{mode}_{min_squash_rows}"
    c = server.client()
    c.execute(f"DROP TABLE IF EXISTS {table}")
    c.execute(f"CREATE TABLE {table} (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    p = subprocess.Popen(
        [sys.executable, __file__, "child", str(server.port), table, mode, str(min_squash_rows)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line == "READY", line
    time.sleep(1.0)  # let the server read what is on the wire
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(2.0)  # let the server notice the dead socket and finish/abort the query
    parts = c.execute(f"SELECT count() FROM system.parts WHERE table = '{table}' AND active")[0][0]
    return int(c.execute(f"SELECT count() FROM {table}")[0][0]), int(parts)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with ClickHouseServer() as server:
        print(f"server {'.'.join(map(str, server.version()))} on {server.port}")
        c = server.client()
        # (a) default squashing (min_insert_block_size_rows=1048576) vs. squashing at 10k rows
        for mode, what in (
            ("mid1", "one 100k-row block, killed half-way through sending it"),
            ("mid", "ten 10k-row blocks, killed after 5 blocks were sent"),
            ("after", "ten 10k-row blocks, killed after the end marker, before the server's ack"),
            ("after1", "one 100k-row block, killed after the end marker, before the server's ack"),
        ):
            squash = 1_048_576
            n, parts = kill_test(server, mode, squash)
            print(f"(a) {what}: {n} rows stored in {parts} parts")

        # (b) mutations
        c.execute("DROP TABLE IF EXISTS mut")
        c.execute("CREATE TABLE mut (id UInt64, batch UInt64) ENGINE = MergeTree ORDER BY id")
        c.execute(
            "INSERT INTO mut (id, batch) VALUES",
            [list(range(1000)), [i % 4 for i in range(1000)]],
            columnar=True,
        )
        t = time.monotonic()
        try:
            c.execute("ALTER TABLE mut DELETE WHERE batch = 3")
            deadline = time.monotonic() + 30
            while c.execute("SELECT count() FROM system.mutations WHERE table='mut' AND is_done=0")[0][0]:
                if time.monotonic() > deadline:
                    raise TimeoutError("mutation not done after 30 s")
                time.sleep(0.05)
            left = c.execute("SELECT count(), countIf(batch = 3) FROM mut")[0]
            print(
                f"(b) ALTER TABLE DELETE WHERE: ok, {left[0]} rows left, {left[1]} of batch 3, "
                f"{time.monotonic() - t:.2f} s until is_done"
            )
        except Exception as e:
            print(f"(b) ALTER TABLE DELETE WHERE failed: {e}")

        # (c) unknown settings
        records: list[str] = []

        class Grab(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record.getMessage())

        logging.getLogger("clickhouse_driver").addHandler(Grab())
        c.execute("DROP TABLE IF EXISTS tok")
        c.execute("CREATE TABLE tok (id UInt64) ENGINE = MergeTree ORDER BY id")
        for setting in ("insert_deduplication_token", "async_insert", "glasspipe_no_such_setting"):
            records.clear()
            try:
                c.execute("INSERT INTO tok (id) VALUES", [[1, 2]], columnar=True, settings={setting: "x1"})
                outcome = "insert went through"
            except Exception as e:
                outcome = f"error {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            print(f"(c) setting {setting}: {outcome}; driver log: {records or 'nothing'}")
        print(f"(c) rows in tok: {c.execute('SELECT count() FROM tok')[0][0]} (3 inserts of 2 rows)")
        try:
            c.execute("SET insert_deduplication_token = 'x'")
            print("(c) SET insert_deduplication_token: accepted")
        except Exception as e:
            print(f"(c) SET insert_deduplication_token: {type(e).__name__}: {str(e).splitlines()[0][:120]}")

        # (d) throughput
        c.execute("DROP TABLE IF EXISTS thr")
        c.execute(
            "CREATE TABLE thr (id UInt64, key String, ts DateTime, v Float64, src UInt32) "
            "ENGINE = MergeTree ORDER BY (key, id)"
        )
        for size, blocks in ((BLOCK, 50), (100_000, 10)):
            throughput(c, size, blocks)
        rss = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(server._process.proc.pid)],  # type: ignore[union-attr]
            capture_output=True,
            text=True,
        ).stdout.strip()
        print(f"server RSS after the experiments: {int(rss) // 1024} MiB")


def throughput(c: Client, size: int, blocks: int) -> None:
    """Columnar INSERTs of ``size`` rows each: a typical sink row (key, event time, value, ids)."""
    cols = [
        list(range(size)),
        [f"key-{i % 5000}" for i in range(size)],
        [1_700_000_000 + i for i in range(size)],
        [i * 0.5 for i in range(size)],
        [7] * size,
    ]
    t = time.monotonic()
    for _ in range(blocks):
        c.execute("INSERT INTO thr (id, key, ts, v, src) VALUES", cols, columnar=True)
    dt = time.monotonic() - t
    print(
        f"(d) {blocks} INSERTs x {size} rows (5 cols) columnar: {blocks * size / dt:,.0f} rows/s, "
        f"{dt / blocks * 1000:.1f} ms per INSERT"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main()
