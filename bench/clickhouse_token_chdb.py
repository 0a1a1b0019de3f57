"""Optional check of the token mechanism's SQL against a modern ClickHouse embedded in chdb-core.

Not part of CI: chdb-core is a 530 MB wheel, and Debian only ships ClickHouse 18.16. Run it by hand:
    python -m venv /tmp/chdbvenv && /tmp/chdbvenv/bin/pip install chdb-core
    /tmp/chdbvenv/bin/python bench/clickhouse_token_chdb.py
It executes the DDL the sink generates for a >= 22.2 server, checks that the sink would choose the
token mechanism for the created table, that re-sent chunks and ledger rows carrying the same
insert_deduplication_token are dropped, and that the marker mechanism's presence/delete SQL works.
(chdb has no native-protocol endpoint, so the INSERTs are written as SQL with the same settings.)
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sparkapp"))

from chdb import session

from glasspipe_job.clickhouse.connection import Connection
from glasspipe_job.clickhouse.mechanism import Mechanism, choose_mechanism, parse_version
from glasspipe_job.clickhouse.sink import ClickHouseSink
from glasspipe_job.clickhouse.table import ClickHouseTable


@dataclass(frozen=True)
class Col:
    name: str
    clickhouse_type: str


def main() -> None:
    s = session.Session(tempfile.mkdtemp(prefix="gp-chdb-"))
    version = parse_version(str(s.query("SELECT version()", "TSV")))
    print(f"chdb ClickHouse {'.'.join(map(str, version))}")
    s.query("CREATE DATABASE IF NOT EXISTS db")
    cols = [Col("id", "Int64"), Col("name", "Nullable(String)"), Col("k", "LowCardinality(String)")]
    sink = ClickHouseSink(ClickHouseTable(Connection(["unused"], "db"), "t", cols, create_table=True,
                                          order_by=["k", "id"]), "ns.p_0", 100_000)
    sink.table.version = version
    for sql in (sink.table.create_table_sql(), sink.table.ledger_sql()):
        s.query(sql)
        print("ok:", sql)
    engine, engine_full = (
        str(
            s.query(
                "SELECT engine, engine_full FROM system.tables WHERE database = 'db' AND name = 't'", "TSV"
            )
        )
        .strip()
        .split("\t")
    )
    mech = choose_mechanism(version, engine, engine_full, True, "db.t")
    assert mech is Mechanism.TOKEN, mech
    for _attempt in range(3):  # a chunk re-sent after a lost answer, twice
        for chunk in range(2):
            tok = f"ns.p_0/9/{chunk}"
            s.query(
                "INSERT INTO db.t (id, name, k, _glasspipe_batch) SETTINGS insert_deduplicate = 1, "
                f"insert_deduplication_token = '{tok}' VALUES ({chunk * 2}, 'a', 'x', '{tok}'), "
                f"({chunk * 2 + 1}, NULL, 'y', '{tok}')"
            )
        s.query(
            "INSERT INTO db.glasspipe_ledger (writer, batch_id, chunks, rows, offsets) SETTINGS "
            "insert_deduplicate = 1, insert_deduplication_token = 'ns.p_0/9/ledger' "
            "VALUES ('ns.p_0', 9, 2, 4, 'o9')"
        )
    rows = int(str(s.query("SELECT count() FROM db.t", "TSV")))
    ledger = int(str(s.query("SELECT count() FROM db.glasspipe_ledger", "TSV")))
    print(
        f"token mechanism: 3 x 2 chunk INSERTs -> {rows} rows (expect 4); "
        f"3 ledger INSERTs -> {ledger} (expect 1)"
    )
    assert (rows, ledger) == (4, 1)
    prefix = "ns.p_0/9/"
    present = str(
        s.query(
            f"SELECT `_glasspipe_batch`, count() FROM `db`.`t` WHERE substring(`_glasspipe_batch`, 1, "
            f"{len(prefix)}) = '{prefix}' GROUP BY `_glasspipe_batch` ORDER BY `_glasspipe_batch`",
            "TSV",
        )
    ).split()
    print("presence query:", present)
    s.query(
        "ALTER TABLE `db`.`t` DELETE WHERE `_glasspipe_batch` IN ('ns.p_0/9/1') SETTINGS mutations_sync = 1"
    )
    assert int(str(s.query("SELECT count() FROM db.t", "TSV"))) == 2
    print("all checks passed")


if __name__ == "__main__":
    main()
