"""Sustained temporal join on local Spark: throughput and join state size (the whole job: Kafka ->
parse/check -> JVM join operator -> exactly-once ClickHouse sink).

Run: $GLASSPIPE_CACHE/venv/bin/python bench/join_state.py [--rate 10000] [--seconds 90] [--window 30s]

Starts its own throw-away Kafka and ClickHouse, runs examples/orders-users-join.yaml (an inner join, or
with ``--type left`` a left join; window ``--window``, allowed lateness ``--lateness`` on both sides) in this
process's Spark (local[2]), and a generator process that produces ``--rate`` orders and ``--rate`` user events per
second with event time = now, each order matching exactly one user event (``--rate`` matched pairs/s), or with
``--unmatched SHARE`` that share of the orders naming a user that never comes (a left join keeps each until its
window closes and writes it with NULLs; an inner join drops it). ``--dedup WINDOW`` deduplicates both sides first,
as examples/dedup-then-join.yaml does (orders by ``order_id``, user events by ``user_id`` and ``updated_at``), and
``--duplicates SHARE`` then sends that share of the pairs twice, the pair again right after it.
Every 5 s it prints the query progress: input and processed rows/s, the join's state rows
(``numRowsTotal``: 0 unless ``--conf spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows=true``,
which the job turns off for speed) and RocksDB memory (``memoryUsedBytes``), rows landed in ClickHouse,
and Kafka lag.
Expected steady state: each side holds ~rate x (window + lateness + batch interval) rows. At the end
it prints every micro-batch's progress (records read, durations, state rows, RocksDB memory, the join's
update / eviction / commit times) and the sustained rate. ``--conf k=v`` adds Spark settings, e.g.
``--conf spark.sql.streaming.join.stateFormatV4.enabled=true --conf spark.sql.streaming.join.stateFormatVersion=4``
(Spark 4.2's time-indexed join state; these apply to checkouts before the JVM join operator, which
ran Spark's stream-stream join: the script runs whichever checkout it lives in). Results:
docs/benchmarks.md and docs/semantics.md, Joins.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for sub in ("dev", "operator", "sparkapp"):
    sys.path.insert(0, str(ROOT / sub))

from arg_types import key_value  # noqa: E402

from glasspipe.api.durations import parse_duration_ms  # noqa: E402
from glasspipe.contract import STATE_ROW_COUNT_CONF  # noqa: E402
from glasspipe_dev.clickhouse import ClickHouseServer  # noqa: E402
from glasspipe_dev.kafka import KafkaServer  # noqa: E402
from glasspipe_dev.pipelines import STRICT_CODEGEN_CONF, load_example  # noqa: E402


def generate(bootstrap: str, orders: str, users: str, rate: int, seconds: float, produced: Any,
             partitions: int = 1, hot_share: float | None = None, unmatched: float = 0.0,
             close_ms: int = 0, duplicates: float = 0.0) -> None:
    """Produce ``rate`` orders and ``rate`` user events per second in 50 ms ticks; event time = the tick's wall
    clock. ``unmatched``: the share of orders whose user never comes (every 100 orders, the first that many).
    Records go to the partition of their key, or with ``hot_share`` that share of them to partition 0 and the rest
    evenly to the others (a skewed topic). ``close_ms``: then one more matched pair (``o-close``) that far ahead,
    event time and Kafka timestamp, whose watermark passes every window of the offer: a left join then writes the
    last window's unmatched orders with NULLs too, so every order can be counted. ``duplicates``: that share of the
    pairs (every 100, the last that many) is sent twice, the pair again right after it."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4"})
    tick = 0.05
    per_tick = max(1, int(rate * tick))
    start = time.monotonic()
    k = 0
    hot = -1 if hot_share is None else round(hot_share * 100)
    ghosts = round(unmatched * 100)
    repeats = round(duplicates * 100)
    while time.monotonic() - start < seconds:
        due = start + (k // per_tick) * tick
        if (delay := due - time.monotonic()) > 0:
            time.sleep(delay)
        now = datetime.now(UTC).isoformat()
        for _ in range(per_tick):
            uid = f"u{k}"
            key = uid.encode()
            part = -1 if hot < 0 else 0 if k % 100 < hot else 1 + k % max(partitions - 1, 1)
            oid = uid if k % 100 >= ghosts else f"g{k}"  # a ghost: no user event with its key
            user = f'{{"user_id":"{uid}","country":"c{k % 50}","plan":"pro","updated_at":"{now}"}}'.encode()
            order = f'{{"order_id":"o{k}","user_id":"{oid}","amount":{k % 1000},"created_at":"{now}"}}'.encode()
            order_key = oid.encode()
            for _ in range(2 if k % 100 >= 100 - repeats else 1):
                while True:
                    try:
                        p.produce(users, key=key, value=user, partition=part)
                        p.produce(orders, key=order_key, value=order, partition=part)
                        break
                    except BufferError:
                        p.poll(0.05)
            k += 1
        p.poll(0)
        produced.value = k
    if close_ms:
        at = datetime.now(UTC).timestamp() * 1000 + close_ms
        when = datetime.fromtimestamp(at / 1000, UTC).isoformat()
        p.produce(users, key=b"u-close", timestamp=int(at), value=(
            f'{{"user_id":"u-close","country":"c0","plan":"pro","updated_at":"{when}"}}').encode())
        p.produce(orders, key=b"u-close", timestamp=int(at), value=(
            f'{{"order_id":"o-close","user_id":"u-close","amount":0,"created_at":"{when}"}}').encode())
    p.flush(60)
    produced.value = k


def records_read(progress: dict[str, Any]) -> int:
    """Kafka records a micro-batch consumed (end - start offsets per source). ``numInputRows`` counts
    each source twice: the job scans a batch's records once for the join and once for dead letters."""
    seen: dict[str, int] = {}
    for src in progress.get("sources") or []:
        start = src.get("startOffset")
        start = (json.loads(start) if isinstance(start, str) else start) or {}  # "null" on the first batch
        end = src.get("endOffset")
        end = (json.loads(end) if isinstance(end, str) else end) or {}
        n = sum(int(o) - int(start.get(t, {}).get(p, o)) for t, parts in end.items() for p, o in parts.items())
        seen[src.get("description", "")] = n
    return sum(seen.values())


def rows_or_dash(rows: float, counted: bool, width: int = 0) -> str:
    """A state's row count, or "-" where RocksDB did not count it (numRowsTotal is then 0, not the size)."""
    return f"{rows:{width},.0f}" if counted else "-".rjust(width)


def join_operators(progress: dict[str, Any]) -> list[dict[str, Any]]:
    """The join's state operators in a progress: Spark's stream-stream join if the plan has one, else
    every stateful operator (the JVM join and the sides' transformWithState operators)."""
    ops = progress.get("stateOperators") or []
    return [o for o in ops if "Join" in o.get("operatorName", "")] or ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=10_000, help="matched pairs per second produced")
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--window", default="30s")
    ap.add_argument("--lateness", default="5s")
    ap.add_argument("--type", choices=("inner", "left"), default="inner",
                    help="join.type; every order has its user, so a left join emits the same pairs and no NULL rows")
    ap.add_argument("--unmatched", type=float, default=0.0,
                    help="share of the orders whose user never comes (0 to 1): a left join's pending rows")
    ap.add_argument("--dedup", metavar="WINDOW", help="deduplicate both sides first within WINDOW "
                    "(examples/dedup-then-join.yaml's keys)")
    ap.add_argument("--own-state", action="store_true",
                    help="the sides deduplicate in glasspipe's own state (deduplication.ownState; needs --dedup)")
    ap.add_argument("--duplicates", type=float, default=0.0,
                    help="share of the pairs sent twice, the pair again right after (needs --dedup)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--hot-share", type=float, help="share of the records on partition 0 (a skewed topic; the "
                    "rest evenly on the others); default: each on its key's partition")
    ap.add_argument("--trigger", default="1s", help="batching.maxDelay (micro-batch interval)")
    ap.add_argument("--max-per-trigger", type=int, default=30_000,
                    help="maxOffsetsPerTrigger per source (bounds a micro-batch; 0: unbounded)")
    ap.add_argument("--conf", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                    help="extra Spark setting (spec.spark.conf), e.g. spark.sql.streaming.join.stateFormatVersion=4")
    args = ap.parse_args()
    if args.hot_share is not None and (args.partitions < 2 or not 0 <= args.hot_share <= 1):
        ap.error("--hot-share takes a share from 0 to 1 and needs --partitions 2 or more")
    if args.own_state and not args.dedup:
        ap.error("--own-state needs --dedup")
    if args.duplicates and not (args.dedup and 0 < args.duplicates <= 1):
        ap.error("--duplicates takes a share from 0 to 1 and needs --dedup (without it a repeat joins again)")

    from glasspipe_job.config import config_from_resource, load_job_config
    from glasspipe_job.metrics import offsets_behind
    from glasspipe_job.runner import start_pipeline
    from glasspipe_job.session import local_session

    # the checkpoint (~0.5 GB after 3 minutes at 22 000 pairs/s) goes with the run
    with (tempfile.TemporaryDirectory(prefix="gp-bench-join-", ignore_cleanup_errors=True) as scratch,
          KafkaServer(long_running=True) as kafka, ClickHouseServer() as ch):
        tmp = Path(scratch)
        suffix = uuid.uuid4().hex[:6]
        orders, users, table = f"orders-{suffix}", f"users-{suffix}", f"bench_join_{suffix}"
        for t in (orders, users):
            kafka.create_topic(t, args.partitions)
        kafka.create_topic(f"{orders}-dlq", 1)
        doc = load_example("orders-users-join.yaml")
        spec = doc["spec"]
        dedup_keys = {s["name"]: s["deduplication"]["keys"]
                      for s in load_example("dedup-then-join.yaml")["spec"]["sources"]}
        for s, topic in zip(spec["sources"], (orders, users), strict=True):
            s["kafka"].update(topic=topic, bootstrapServers=kafka.bootstrap)
            s["eventTime"]["allowedLateness"] = args.lateness
            if args.max_per_trigger:
                s["kafka"]["maxOffsetsPerTrigger"] = args.max_per_trigger
            if args.dedup:
                s["deduplication"] = {"keys": dedup_keys[s["name"]], "window": args.dedup,
                                      **({"ownState": True} if args.own_state else {})}
        spec["join"].update(window=args.window, type=args.type)
        spec["sink"]["clickhouse"].update(hosts=[f"127.0.0.1:{ch.port}"], table=table,
                                          batching={"maxDelay": args.trigger})
        spec["deadLetter"]["topic"] = f"{orders}-dlq"
        spec["checkpoint"]["location"] = (tmp / "ckpt").as_uri()
        conf = spec.setdefault("spark", {}).setdefault("conf", {})
        # every batch's progress for the printout below (Spark keeps the last 100): one a trigger, and the catch-up
        conf["spark.sql.streaming.numRecentProgressUpdates"] = str(
            int((args.seconds + 120) * 1000 / max(parse_duration_ms(args.trigger), 1)) + 100)
        conf.update(STRICT_CODEGEN_CONF)  # a run interpreted for a compile error measures nothing
        conf.update(args.conf)
        config = load_job_config(config_from_resource(doc))
        spark = local_session("glasspipe-bench-join", config.spark_conf)
        # glasspipe turns RocksDB's row count off (a read per write): then numRowsTotal is 0, not the state's size
        counted = config.spark_conf.get(STATE_ROW_COUNT_CONF, "").lower() == "true"
        if not counted:
            print(f"state rows are not counted (shown as -): --conf {STATE_ROW_COUNT_CONF}=true counts them")
        running = start_pipeline(spark, config)
        produced = mp.Value("q", 0)
        # a left join with unmatched orders writes the last window's only once the watermark passes it
        closing = args.type == "left" and args.unmatched > 0
        close_ms = parse_duration_ms(args.window) + parse_duration_ms(args.lateness) + 2000 if closing else 0
        gen = mp.Process(target=generate, args=(kafka.bootstrap, orders, users, args.rate, args.seconds, produced,
                                                args.partitions, args.hot_share, args.unmatched, close_ms,
                                                args.duplicates))
        started = time.monotonic()
        gen.start()
        client = ch.client()
        expected_state = 2 * args.rate * (parse_duration_ms(args.window) + parse_duration_ms(args.lateness)) / 1000
        print(f"{args.type} join, rate {args.rate} orders/s ({args.unmatched:.0%} of them unmatched) for "
              f"{args.seconds:.0f} s, window {args.window}, "
              f"{f'sides deduplicated within {args.dedup} ({args.duplicates:.0%} sent twice), ' if args.dedup else ''}"
              f"lateness {args.lateness}, "
              f"{args.partitions} partitions, trigger {args.trigger}; expected steady join state "
              f"~{expected_state:,.0f} rows (+ one batch interval)")
        print(f"{'t[s]':>5} {'produced':>9} {'written':>9} {'in/s':>7} {'proc/s':>7} {'batch ms':>8} "
              f"{'state rows':>10} {'state MB':>8} {'lag':>8}")
        samples: list[dict[str, float]] = []
        last_written, last_t, moved = 0, started, started
        try:
            # a minute past the offer, and on while rows still land or a batch runs (o-close's batch emits a whole
            # window's NULL rows at once), for at most 15 minutes more
            while (gen.is_alive() or time.monotonic() - started < args.seconds + 60
                   or (time.monotonic() - started < args.seconds + 960
                       and (time.monotonic() - moved < 60 or running.query.status.get("isTriggerActive")))):
                time.sleep(5)
                now = time.monotonic()
                try:
                    written = int(client.execute(f"SELECT count() FROM {table}")[0][0])
                except Exception:
                    written = 0
                p: dict[str, Any] = running.query.lastProgress or {}
                join_ops = join_operators(p)
                state_rows = sum(int(o.get("numRowsTotal") or 0) for o in join_ops)
                mem = sum(int(o.get("memoryUsedBytes") or 0) for o in join_ops)
                lag = sum(offsets_behind(src.get("endOffset"), src.get("latestOffset"))
                          for src in p.get("sources") or [])
                s = {"t": now - started, "produced": produced.value, "written": written,
                     "in": float(p.get("inputRowsPerSecond") or 0), "proc": float(p.get("processedRowsPerSecond") or 0),
                     "batch_ms": float((p.get("durationMs") or {}).get("triggerExecution") or 0),
                     "state": state_rows, "mem": mem / 1e6, "lag": lag,
                     "write_rate": (written - last_written) / (now - last_t)}
                samples.append(s)
                moved = now if written != last_written else moved
                last_written, last_t = written, now
                state = rows_or_dash(s["state"], counted, 10)
                print(f"{s['t']:5.0f} {s['produced']:9,.0f} {s['written']:9,.0f} {s['in']:7,.0f} {s['proc']:7,.0f} "
                      f"{s['batch_ms']:8,.0f} {state} {s['mem']:8,.1f} {s['lag']:8,.0f}")
                if not gen.is_alive() and written >= produced.value + closing:
                    break
        finally:
            gen.join(5)
        total = samples[-1]["written"] if samples else 0
        left = samples[-1]["lag"] if samples else 0  # records not yet read when the harness stopped waiting
        print("\nper micro-batch (query progress): records read, total / addBatch / planning ms, state rows, "
              "RocksDB MB, updates / removals / commit ms, rows dropped by watermark, and for the JVM join "
              "operator (transformWithState) timers fired and timer ms. Spark's join: its operator; the "
              "JVM plan: all stateful operators (the sides' late-flag operators keep no state without dedup)")
        for prog in running.query.recentProgress:
            ops = join_operators(prog)
            d = prog.get("durationMs") or {}

            def op_sum(key: str, ops: list[dict[str, Any]] = ops) -> int:
                return sum(int(o.get(key) or 0) for o in ops)

            def custom(key: str, ops: list[dict[str, Any]] = ops) -> int:
                return sum(int((o.get("customMetrics") or {}).get(key) or 0) for o in ops)

            state = rows_or_dash(op_sum("numRowsTotal"), counted, 10)
            print(f"{prog['batchId']:5} {records_read(prog):9,} {d.get('triggerExecution', 0):7,} "
                  f"{d.get('addBatch', 0):7,} {d.get('queryPlanning', 0):6,} {state} "
                  f"{op_sum('memoryUsedBytes') / 1e6:7,.1f} {op_sum('allUpdatesTimeMs'):7,} "
                  f"{op_sum('allRemovalsTimeMs'):7,} {op_sum('commitTimeMs'):7,} "
                  f"{op_sum('numRowsDroppedByWatermark'):6,} {custom('numExpiredTimers'):8,} "
                  f"{custom('timerProcessingTimeMs'):6,}")
        progress = [p for p in running.query.recentProgress if p["numInputRows"]][2:]  # skip start-up batches
        if progress:
            rows = sum(records_read(p) for p in progress)
            ms = sum((p.get("durationMs") or {}).get("triggerExecution", 0) for p in progress)
            states = [sum(int(o.get("numRowsTotal") or 0) for o in p.get("stateOperators") or []) for p in progress]
            mems = [sum(int(o.get("memoryUsedBytes") or 0) for o in p.get("stateOperators") or []) for p in progress]
            per_s = rows / max(ms, 1) * 1000
            orders_s = per_s / 2 / (1 + args.duplicates)  # each order and user event is read 1 + duplicates times
            print(f"\nbatches {progress[0]['batchId']}..{progress[-1]['batchId']}: {rows:,} Kafka records in "
                  f"{ms / 1000:.1f} s = {per_s:,.0f} records/s = {orders_s:,.0f} orders/s, "
                  f"{orders_s * (1 - args.unmatched):,.0f} matched pairs/s "
                  f"(produced {args.rate:,}/s); join state max {rows_or_dash(max(states), counted)} rows, "
                  f"RocksDB memory max "
                  f"{max(mems) / 1e6:,.1f} MB; lag at the end {left:,} records")
        running.query.stop()
        running.close()
        # a shortfall with records still to read is a run cut short; one with none left would be a loss
        ghosts = sum(1 for k in range(produced.value) if k % 100 < round(args.unmatched * 100))
        expected = produced.value - (ghosts if args.type == "inner" else 0) + closing
        if total == expected:
            landed = ("every order" + (", and o-close, whose watermark closed the last window" if closing else "")
                      if args.type == "left" else "all matched pairs")
        elif total > expected:
            landed = f"{total - expected:,} rows MORE than expected: repeats or duplicate writes"
        elif left:
            landed = f"NOT all matched pairs yet: {left:,} records still to read when the harness stopped waiting"
        else:
            landed = "NOT all matched pairs, and no records left to read"
        print(f"produced {produced.value:,} orders ({ghosts:,} unmatched){' + o-close' if closing else ''}, "
              f"{total:,} rows in ClickHouse ({landed})")


if __name__ == "__main__":
    main()
