"""Issue 15's reference loop, with no deduplication: one confluent-kafka consumer, ``json.loads``, a columnar
clickhouse-driver INSERT of up to 100 000 rows (``--block``), the consumer's offsets committed after each INSERT.

bench/baselines.py runs it inside its own process over a topic's N records. bench/freshness.py
(``--variant plain``) runs this script continuously at a fixed offered rate: an INSERT goes out once it holds
``--block`` rows or ``--max-delay`` seconds after its first row (as glasspipe's ``batching.maxDelay``), until
SIGTERM, which writes what it holds and stops.

    python bench/plain_loop.py --bootstrap 127.0.0.1:9092 --topic sms --clickhouse 127.0.0.1:9000 --table t
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_driver import Client
from confluent_kafka import Consumer, KafkaException

BLOCK = 100_000  # rows per INSERT, as the loop
TOP_VERSION = 1 << 63
FIELDS = ("sms_id", "status", "phone", "provider", "sent_at", "seq")
IDLE_LIMIT_S = 120  # a bounded run fails when no record came for this long


@dataclass(frozen=True)
class LoopRun:
    records: int
    inserts: int
    first_after: float  # seconds from the start to the first records


def columns(versioned: bool, sent_ms: bool) -> list[str]:
    """The loop's INSERT columns: the document's fields, then ``ver`` (2^63 - offset: a ReplacingMergeTree
    keeps the first occurrence) and ``sent_ms`` (``sent_at`` in epoch milliseconds) when asked."""
    return [*FIELDS, *(["ver"] if versioned else []), *(["sent_ms"] if sent_ms else [])]


def run_loop(bootstrap: str, topic: str, group: str, client: Client, table: str, *, versioned: bool = False,
             sent_ms: bool = False, stop_after: int | None = None, max_delay: float | None = None,
             stop: threading.Event | None = None, block: int = BLOCK) -> LoopRun:
    """Poll, ``json.loads``, INSERT, commit; until ``stop_after`` records (failing after IDLE_LIMIT_S without
    any) or until ``stop`` is set. A block is written once it holds ``block`` rows; with ``max_delay`` also that
    long after its first row at the latest (and at the end)."""
    names = columns(versioned, sent_ms)
    insert = f"INSERT INTO {table} ({', '.join(names)}) VALUES"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    cols: list[list[Any]] = [[] for _ in names]
    got = inserts = 0
    idle_since = entered = time.monotonic()
    first = 0.0
    oldest = 0.0  # when the held block's first row came
    timeout = min(1.0, max_delay / 4) if max_delay else 1.0

    def flush() -> None:
        nonlocal cols, inserts
        if cols[0]:
            client.execute(insert, cols, columnar=True)
            consumer.commit(asynchronous=False)
            cols, inserts = [[] for _ in names], inserts + 1

    try:
        while (stop_after is None or got < stop_after) and not (stop is not None and stop.is_set()):
            msgs = consumer.consume(10_000, timeout=timeout)
            now = time.monotonic()
            if msgs:
                idle_since = now
                first = first or now - entered
                oldest = oldest if cols[0] else now
                got += len(msgs)
                append_rows(msgs, cols, versioned, sent_ms)
            elif stop_after is not None and now - idle_since > IDLE_LIMIT_S:
                raise RuntimeError(f"plain loop: no records for {IDLE_LIMIT_S} s after {got} of {stop_after}")
            if len(cols[0]) >= block or (max_delay and cols[0] and now - oldest >= max_delay):
                flush()
        flush()
    finally:
        consumer.close()
    return LoopRun(got, inserts, first)


def append_rows(msgs: list[Any], cols: list[list[Any]], versioned: bool, sent_ms: bool) -> None:
    """Each record's fields onto the block's columns (``columns``' order)."""
    sms_id, status, phone, provider, sent_at, seq = cols[:6]
    extra = cols[6:]
    for m in msgs:
        if m.error() is not None:
            raise KafkaException(m.error())
        d = json.loads(m.value() or b"null")
        sms_id.append(d["sms_id"])
        status.append(d.get("status"))
        phone.append(d.get("phone"))
        provider.append((d.get("meta") or {}).get("provider"))
        at = datetime.fromisoformat(d["sent_at"])
        sent_at.append(at)
        seq.append(d.get("seq"))
        if versioned:
            extra[0].append(TOP_VERSION - (m.offset() or 0))
        if sent_ms:
            extra[-1].append(round(at.timestamp() * 1000))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="plain-loop")
    p.add_argument("--clickhouse", required=True, help="HOST:PORT of ClickHouse's native protocol")
    p.add_argument("--table", required=True, help="an existing table with the columns of columns(sent_ms=True)")
    p.add_argument("--max-delay", type=float, default=1.0, help="seconds a row waits for its INSERT at most")
    p.add_argument("--block", type=int, default=BLOCK, help="rows an INSERT holds at most")
    args = p.parse_args()
    host, port = args.clickhouse.rsplit(":", 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run = run_loop(args.bootstrap, args.topic, args.group, Client(host=host, port=int(port)), args.table,
                   sent_ms=True, max_delay=args.max_delay, stop=stop, block=args.block)
    print(f"plain loop: {run.records} records, {run.inserts} INSERTs", flush=True)


if __name__ == "__main__":
    main()
