"""Issue 15's join scenario for bench/freshness.py (``--variant join``): examples/orders-users-join.yaml fed with
matched pairs at a fixed rate, so that the join's freshness and CPU are measured as the deduplication's are.

Pair k is a user event ``u<k>`` and then its order ``o<k>``, both keyed by ``u<k>`` (the same partition of each
topic), made ahead of time like bench/workload.py's plans; each carries the moment it was produced as its event time
(``updated_at``, ``created_at``). The joined row carries ``seq`` = k (from the order id) and ``sent_ms`` = the
order's ``created_at`` in milliseconds, the columns bench/freshness.py's poller reads: a row's latency runs from the
order, the later of its two records, to the poll that first saw the row.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from exact_check import check_every_event
from workload import Plan

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.pipelines import load_example, write_pipeline

# Everything of a record up to its event time's value (workload.TAIL closes it), as json.dumps(separators=(",", ":"))
USER_HEAD = '{"user_id":"u%d","country":"c%d","plan":"pro","updated_at":"'
ORDER_HEAD = '{"order_id":"o%d","user_id":"u%d","amount":%d,"created_at":"'
EXAMPLE_JOIN_WINDOW = "1h"  # examples/orders-users-join.yaml's join.window, issue 15's
COUNTRIES = 50  # user k's country is c<k mod 50>: the check below reads it back from each joined row
RECORDS_A_PAIR = 2


def users_topic(orders: str) -> str:
    """The user events' topic beside ``orders`` (whose ``-dlq`` takes both sides' dead letters)."""
    return f"{orders}-users"


@dataclass
class PairWorkload:
    """Matched pairs, numbered from 1; ``firsts``: the pairs made so far, i.e. the rows the join writes for them (the
    name bench/workload.Workload gives its first occurrences, so that bench/freshness.py counts both alike)."""

    orders: str
    firsts: int = 0

    def plan(self, n: int, rate: float) -> Plan:
        """The next ``n`` records (``n // 2`` pairs, a user event before its order). ``rate`` is unused: a pair's
        records carry the moment they are produced, and nothing else in them depends on the pace."""
        users = users_topic(self.orders)
        keys: list[bytes] = []
        heads: list[bytes] = []
        topics: list[str] = []
        for k in range(self.firsts + 1, self.firsts + n // RECORDS_A_PAIR + 1):
            key = b"u%d" % k
            keys += [key, key]
            heads += [(USER_HEAD % (k, k % COUNTRIES)).encode(), (ORDER_HEAD % (k, k, k % 1000)).encode()]
            topics += [users, self.orders]
        self.firsts += len(keys) // RECORDS_A_PAIR
        return Plan(keys, heads, repeats=len(keys) // RECORDS_A_PAIR, topics=topics)


def join_pipeline_file(tmp: Path, orders: str, table: str, trigger: str, spark_conf: dict[str, str],
                       max_rows: int, window: str | None) -> Path:
    """examples/orders-users-join.yaml (an inner join within ``window``; None: the example's) on ``orders`` and its
    users' topic into ``table``, sorted by seq (the poller's ``seq > n`` then reads the newest rows only)."""
    doc = load_example("orders-users-join.yaml")
    name = table.replace("_", "-")
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    for source, topic in zip(spec["sources"], (orders, users_topic(orders)), strict=True):
        source["kafka"]["topic"] = topic
    if window is not None:  # else the example's, EXAMPLE_JOIN_WINDOW
        spec["join"]["window"] = window
    sink = spec["sink"]["clickhouse"]
    sink.update(table=table, orderBy=["seq"], batching={"maxRows": max_rows, "maxDelay": trigger})
    sink["columns"] += [{"name": "seq", "expression": "cast(substring(orders.order_id, 2) AS BIGINT)", "type": "Int64"},
                        {"name": "sent_ms", "expression": "unix_millis(orders.created_at)", "type": "Int64"}]
    spec["deadLetter"]["topic"] = f"{orders}-dlq"
    spec.setdefault("spark", {}).setdefault("conf", {}).update(spark_conf)
    return write_pipeline(doc, tmp, f"{name}.yaml")


def check_joined(ch: ClickHouseServer, table: str, pairs: int) -> tuple[bool, str]:
    """(exact, what was counted): every pair's row once, each with its own user's country."""
    exact, rows, seqs = check_every_event(ch, table, pairs, pairs)
    [(wrong,)] = ch.client().execute(
        f"SELECT countIf(country IS NULL OR country != concat('c', toString(seq % {COUNTRIES}))) FROM {table}")
    return (exact and wrong == 0,
            f"{rows} rows of {pairs} pairs, {seqs} distinct pairs, {wrong} rows with another user's fields")
