"""Temporal joins of two Kafka topics end to end on real Kafka, Spark and ClickHouse: matches within
the window in either arrival order, many-to-many, left joins after the window, dedup before the join,
dead letters of both sides, offsets of both topics, and exactly-once across SIGKILLs.

Each section of docs/semantics.md "Joins" names the test that checks it."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.crashes import kill_mid_stream
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import (
    consume_all,
    dumps,
    duplicates_dropped,
    group_lag,
    load_example,
    produce,
    run_to_end,
    start_continuous,
    totals,
    write_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar", "spark_jars")]
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)  # the examples' join window


def order(order_id: str, user_id: str, at: datetime, amount: float = 1.0) -> tuple[bytes, bytes]:
    doc = {"order_id": order_id, "user_id": user_id, "amount": amount, "created_at": at.isoformat()}
    return user_id.encode(), dumps(doc)


def user(user_id: str, country: str, at: datetime, plan: str = "free") -> tuple[bytes, bytes]:
    doc = {"user_id": user_id, "country": country, "plan": plan, "updated_at": at.isoformat()}
    return user_id.encode(), dumps(doc)


class Join:
    """One of the join examples on fresh topics and a fresh table."""

    def __init__(self, tmp_path: Path, kafka: KafkaServer, ch: ClickHouseServer, example: str, *,
                 join_type: str | None = None, join_window: str | None = None, lateness: str | None = None,
                 partitions: int = 2,
                 max_per_trigger: int | None = None,
                 extra_columns: list[dict[str, str]] | None = None, without_dedup: Sequence[str] = (),
                 own_state: Sequence[str] = (), **batching: Any) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.kafka, self.ch, self.tmp = kafka, ch, tmp_path
        self.orders, self.users, self.table = f"orders-{suffix}", f"users-{suffix}", f"enriched_{suffix}"
        self.dlq = f"join-{suffix}-dlq"
        for topic in (self.orders, self.users):
            kafka.create_topic(topic, partitions)
        kafka.create_topic(self.dlq, 1)
        doc = load_example(example)
        self.name = f"join-{suffix}"
        doc["metadata"]["name"] = self.name
        spec = doc["spec"]
        spec["sources"][0]["kafka"]["topic"] = self.orders
        spec["sources"][1]["kafka"]["topic"] = self.users
        for s in spec["sources"]:
            if s["name"] in without_dedup:
                del s["deduplication"]
            elif s["name"] in own_state:
                s["deduplication"]["ownState"] = True
        if lateness:
            for s in spec["sources"]:
                s["eventTime"]["allowedLateness"] = lateness
        if max_per_trigger:
            for s in spec["sources"]:
                s["kafka"]["maxOffsetsPerTrigger"] = max_per_trigger
        if join_type:
            spec["join"]["type"] = join_type
        if join_window:
            spec["join"]["window"] = join_window
        spec["sink"]["clickhouse"]["table"] = self.table
        spec["sink"]["clickhouse"]["columns"] += extra_columns or []
        spec["sink"]["clickhouse"].setdefault("batching", {}).update(batching)
        spec["deadLetter"]["topic"] = self.dlq
        self.path = write_pipeline(doc, tmp_path)
        self.ckpt = tmp_path / "ckpt"

    def produce(self, orders: Sequence[tuple[bytes, bytes]] = (), users: Sequence[tuple[bytes, bytes]] = ()) -> None:
        if orders:
            produce(self.kafka.bootstrap, self.orders, orders)
        if users:
            produce(self.kafka.bootstrap, self.users, users)

    def run(self) -> str:
        started = time.monotonic()
        done = run_to_end(self.path, self.kafka.bootstrap, f"127.0.0.1:{self.ch.port}", self.ckpt)
        self.last_log = done.stderr
        print(f"{totals(done.stdout)} in {time.monotonic() - started:.1f} s")
        return totals(done.stdout)

    def rows(self) -> list[tuple[Any, ...]]:
        return self.ch.client().execute(
            f"SELECT order_id, user_id, country, plan FROM {self.table} ORDER BY order_id, country")

    def count(self) -> int:
        try:
            return int(self.ch.client().execute(f"SELECT count() FROM {self.table}")[0][0])
        except Exception:  # the table is created by the job's first batch
            return 0


def test_inner_join_matches_within_the_window_in_either_arrival_order(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    label = {"name": "label", "expression": "concat(orders.user_id, '/', country, '/', amount * 100)",
             "type": "Nullable(String)"}  # fields of both sides in one expression
    j = Join(tmp_path, kafka, clickhouse, "orders-users-join.yaml", extra_columns=[label])
    # run 1: o1's user has not arrived yet; u2 arrives before its order
    j.produce(
        orders=[order("o1", "u1", T0 + timedelta(minutes=10)),
                order("o4", "u4", T0 + timedelta(minutes=5)),          # u4 only outside the window
                order("o5", "u5", T0 + timedelta(minutes=20))],        # u5 twice: many-to-many
        users=[user("u2", "FR", T0 + timedelta(minutes=30)),
               user("u4", "XX", T0 + timedelta(minutes=5) - HOUR - timedelta(seconds=1)),  # 1h00m01s earlier
               user("u5", "DE", T0 + timedelta(minutes=1)), user("u5", "AT", T0 + timedelta(minutes=39))],
    )
    first = j.run()
    assert j.rows() == [("o5", "u5", "AT", "free"), ("o5", "u5", "DE", "free")], first
    # run 2 (later micro-batches, from the checkpoint; event times above the watermark of run 1, which
    # is min over both sides of newest - 1m = T0+19m): u1 arrives after its order (event time 1 h
    # later: exactly the window, matches); o2 arrives after its user (event time 5 min before it)
    # o6 is late (T0+10m, below that watermark): a dead letter with reason 'late', although u2 would match it
    j.produce(orders=[order("o2", "u2", T0 + timedelta(minutes=25)), order("o3", "u3", T0 + timedelta(minutes=20)),
                      order("o6", "u2", T0 + timedelta(minutes=10))],
              users=[user("u1", "US", T0 + timedelta(minutes=10) + HOUR),
                     user("u3", "PL", T0 + timedelta(minutes=20) + HOUR + timedelta(milliseconds=1))])  # just outside
    second = j.run()
    assert j.rows() == [("o1", "u1", "US", "free"), ("o2", "u2", "FR", "free"),
                        ("o5", "u5", "AT", "free"), ("o5", "u5", "DE", "free")], second
    assert ("rows written 2," in second and "late dropped 0," in second
            and "dead-lettered 1 {'late': 1}" in second), second
    [late] = consume_all(kafka.bootstrap, j.dlq, expected=1)
    headers = {k: v.decode() for k, v in late.headers()}
    assert b'"o6"' in late.value() and headers["glasspipe.source.topic"] == j.orders, headers
    assert headers["glasspipe.reason"].startswith(
        "late: event time 2026-11-01T08:10:00.000Z is more than eventTime.allowedLateness (1m) behind "
        "the join's watermark"), headers
    assert clickhouse.client().execute(f"SELECT label FROM {j.table} WHERE order_id = 'o1'") == [("u1/US/100.0",)]
    # both topics' offsets are committed to the pipeline's consumer group
    group = default_consumer_group("default", j.name)
    for topic, n in ((j.orders, 6), (j.users, 6)):
        lag = group_lag(kafka.bootstrap, group, topic)
        assert sum(end for _, end in lag.values()) == n and all(c == e for c, e in lag.values()), (topic, lag)


def test_left_join_emits_unmatched_orders_with_nulls_after_the_window(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    j = Join(tmp_path, kafka, clickhouse, "orders-users-join.yaml", join_type="left")
    j.produce(orders=[order("o1", "u1", T0), order("o2", "nobody", T0 + timedelta(minutes=1))],
              users=[user("u1", "US", T0 + timedelta(minutes=30))])
    first = j.run()
    # the match lands at once; the unmatched order waits for the window (a user may still come)
    assert j.rows() == [("o1", "u1", "US", "free")], first
    # event time moves past o2 + window + allowed lateness (1m) on both topics: the watermark passes
    later = T0 + timedelta(minutes=1) + HOUR + timedelta(minutes=2)
    j.produce(orders=[order("o9", "u9", later)], users=[user("u9", "SE", later)])
    second = j.run()  # its last (no-data) micro-batch runs with the advanced watermark
    rows = j.rows()
    assert rows == [("o1", "u1", "US", "free"), ("o2", "nobody", None, None), ("o9", "u9", "SE", "free")], second
    nulls = clickhouse.client().execute(
        f"SELECT toTypeName(country), toTypeName(plan) FROM {j.table} LIMIT 1")[0]
    assert nulls == ("Nullable(String)", "Nullable(String)")


def test_dedup_then_join_writes_no_duplicate_joined_rows_and_dead_letters_both_sides(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    j = Join(tmp_path, kafka, clickhouse, "dedup-then-join.yaml")  # a left join
    orders = [order(f"o{i}", f"u{i % 10}", T0 + timedelta(seconds=i)) for i in range(100)]
    users = [user(f"u{i}", "NL", T0 + timedelta(minutes=1)) for i in range(10)]
    rng = random.Random(3)
    dup_orders = [orders[rng.randrange(100)] for _ in range(30)]  # the same records again (producer retries)
    dup_users = users[:5] * 2
    bad_orders = [(b"x", b"{broken"), (b"y", dumps({"order_id": "o-nouser", "created_at": T0.isoformat()}))]
    bad_users = [(b"z", dumps({"user_id": "u-notime", "country": "NL"}))]
    j.produce(orders=orders[:60] + dup_orders[:10] + bad_orders, users=users + dup_users[:5] + bad_users)
    first = j.run()
    j.produce(orders=orders[60:] + dup_orders[10:], users=dup_users[5:])  # duplicates in a later batch too
    second = j.run()
    got = clickhouse.client().execute(f"SELECT count(), uniqExact(order_id), countIf(country != 'NL') "
                                      f"FROM {j.table}")[0]
    assert got == (100, 100, 0), (first, second)
    dropped = sum(duplicates_dropped(s) for s in (first, second))
    assert dropped == 30 + 10, (first, second)
    dead = consume_all(kafka.bootstrap, j.dlq, expected=3)
    by_topic = sorted((dict(m.headers())["glasspipe.source.topic"].decode(),
                       dict(m.headers())["glasspipe.reason"].decode()) for m in dead)
    assert by_topic == sorted([(j.orders, "malformed_json: not a JSON object"),
                               (j.orders, "missing_required_field: user_id"),
                               (j.users, "missing_key: updated_at")]), by_topic
    assert "dead-lettered 3" in first, first


def kill_repeatedly(j: Join, rng: random.Random, total: int) -> list[int]:
    """Run the join continuously and SIGKILL it six times mid-stream (kill_mid_stream); the rows after each kill."""
    return kill_mid_stream(
        lambda: start_continuous(j.path, j.kafka.bootstrap, f"127.0.0.1:{j.ch.port}", j.ckpt, j.tmp / "job.log"),
        j.count, rng, total)


def test_sigkill_at_random_moments_joined_output_exact(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    j = Join(tmp_path, kafka, clickhouse, "dedup-then-join.yaml", join_type="inner", partitions=2,
             max_per_trigger=600, maxRows=500, maxDelay="200ms")
    rng = random.Random(7)
    n_orders, n_users = 12_000, 2_000
    users = [user(f"u{i}", f"c{i % 7}", T0 + timedelta(milliseconds=150 * i)) for i in range(n_users)]
    orders: list[tuple[bytes, bytes]] = []
    for i in range(n_orders):
        orders.append(order(f"o{i:06d}", f"u{rng.randrange(n_users)}", T0 + timedelta(milliseconds=25 * i)))
        if i > 10 and rng.random() < 0.08:  # a repeat of a recent order (inside the dedup window)
            orders.append(orders[-rng.randrange(2, 10)])
    j.produce(orders=orders, users=users)
    counts = kill_repeatedly(j, rng, n_orders)
    summary = j.run()
    rows, distinct, unmatched = clickhouse.client().execute(
        f"SELECT count(), uniqExact(order_id), countIf(country IS NULL) FROM {j.table}")[0]
    print(f"rows after each kill: {counts}, final: {summary}")
    assert (rows, distinct, unmatched) == (n_orders, n_orders, 0)
    expected = {f"o{i:06d}" for i in range(n_orders)}
    landed = {r[0] for r in clickhouse.client().execute(f"SELECT order_id FROM {j.table}")}
    assert landed == expected


@pytest.mark.parametrize("own_state", [(), ("orders",)], ids=["default", "orders-in-own-state"])
def test_sigkill_at_random_moments_left_join_output_exact(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, own_state: tuple[str, ...]
) -> None:
    """A left join with a 10 s window and 30 s lateness over 5 minutes of event time, SIGKILLed six times:
    orders whose user never comes are emitted with NULLs while the stream runs (their windows close
    mid-stream, so kills fall between a key's pending timer and its bucket's sweep), each exactly once, and
    every matched order once with its own user's country. Also with the orders (and their repeats) deduplicated in
    own state and the users in transformWithState, each side judging lateness by the same watermark."""
    j = Join(tmp_path, kafka, clickhouse, "dedup-then-join.yaml", join_type="left", join_window="10s",
             lateness="30s", partitions=2, max_per_trigger=600, maxRows=500, own_state=own_state, maxDelay="200ms")
    rng = random.Random(11)
    n_orders, n_users = 12_000, 2_000
    users = [user(f"u{i}", f"c{i % 7}", T0 + timedelta(milliseconds=150 * i)) for i in range(n_users)]
    orders: list[tuple[bytes, bytes]] = []
    want: dict[str, str | None] = {}  # order_id -> the country it must land with (None: no user)
    for i in range(n_orders):
        oid = f"o{i:06d}"
        if rng.random() < 0.1:
            uid, want[oid] = f"ghost{i}", None
        else:  # a user whose update lies within a second of the order: always inside the 10 s window
            u = min(max(i // 6 + rng.randrange(-3, 4), 0), n_users - 1)
            uid, want[oid] = f"u{u}", f"c{u % 7}"
        orders.append(order(oid, uid, T0 + timedelta(milliseconds=25 * i)))
        if i > 10 and rng.random() < 0.08:  # a repeat of a recent order (inside the dedup window)
            orders.append(orders[-rng.randrange(2, 10)])
    j.produce(orders=orders, users=users)
    counts = kill_repeatedly(j, rng, n_orders)
    mid = clickhouse.client().execute(f"SELECT countIf(country IS NULL) FROM {j.table}")[0][0]
    # An hour later on both topics: the watermark passes every window, and the last ghosts come out.
    flush = T0 + timedelta(hours=1)
    j.produce(orders=[order("z-flush", "u-flush", flush)], users=[user("u-flush", "cz", flush)])
    summary = j.run()
    want["z-flush"] = "cz"
    got = clickhouse.client().execute(f"SELECT order_id, country FROM {j.table}")
    print(f"rows after each kill: {counts}; NULL rows before the flush: {mid}; final: {summary}")
    assert len(got) == len(want), f"{len(got)} rows for {len(want)} orders"
    assert dict(got) == want
    assert mid > 0, "no unmatched order was emitted while the job was being killed: the test proves less"


@pytest.mark.parametrize(("dedup_on", "own_state"), [(("orders", "users"), ()), (("orders",), ()), ((), ()),
                                                     (("orders", "users"), ("orders", "users"))],
                         ids=["both", "left-only", "none", "both-in-own-state"])
def test_late_records_of_both_sides_are_dead_letters_with_reason_late(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, dedup_on: tuple[str, ...],
    own_state: tuple[str, ...]
) -> None:
    """Issue #14: a join used to drop late records with only a counter. Now every record of a join
    pipeline ends written or dead-lettered with a reason, late ones too, on both sides (deduplicated
    ones included), and a late record neither matches nor disturbs the matches of the others.

    A side with deduplication flags its late rows in its own operator; a side without has none and
    the join operator flags them: each side either way, and one of each (left-only). A side deduplicating in
    own state judges them by the watermark the driver hands it, a row at the watermark late as the join has it."""
    j = Join(tmp_path, kafka, clickhouse, "dedup-then-join.yaml",  # a left join
             without_dedup=[s for s in ("orders", "users") if s not in dedup_on], own_state=own_state)
    orders_dedup = "orders" in dedup_on
    future = T0.replace(year=2099)
    orders = [order(f"o{i:02d}", f"u{i % 5}", T0 + timedelta(minutes=i)) for i in range(20)]
    j.produce(orders=[*orders, order("o-nobody", "nobody", T0 + timedelta(minutes=20)),
                      order("o-2099", "u1", future), (b"x", b"{broken")],
              users=[*[user(f"u{i}", "NL", T0 + timedelta(minutes=30)) for i in range(5)],
                     user("u3", "FUTURE", future)])
    first = j.run()
    # watermark after run 1: min(orders T0+20m, users T0+30m) - 1m allowed lateness = T0+19m
    assert ("rows written 20," in first and "late dropped 0," in first
            and "dead-lettered 3 {'event_time_in_future': 2, 'malformed_json': 1}" in first), first
    j.produce(orders=[order("o-late-5m", "u1", T0 + timedelta(minutes=5)),      # u1 would match it
                      order("o-late-19m", "u2", T0 + timedelta(minutes=19)),    # at the watermark: late
                      orders[3],                                                 # a late repeat of o03
                      order("o21", "u2", T0 + timedelta(minutes=40)),
                      order("o21", "u2", T0 + timedelta(minutes=40))],           # a repeat: dropped
              users=[user("u1", "LATE", T0 + timedelta(minutes=2)),             # would match o00-o19
                     user("u9", "LATE", T0 + timedelta(minutes=10))])
    second = j.run()
    # without dedup on orders, o21's repeat is a second joined row
    written, dropped = (1, 1) if orders_dedup else (2, 0)
    assert (f"rows written {written}," in second and f"duplicates dropped {dropped}," in second
            and "late dropped 0," in second and "dead-lettered 5 {'late': 5}" in second), second
    # event time moves on both topics past o-nobody + window + lateness: the unmatched order is written
    later = T0 + timedelta(hours=3)
    j.produce(orders=[order("o99", "u99", later)], users=[user("u99", "SE", later)])
    third = j.run()
    assert "rows written 2," in third and "dead-lettered 0 {}" in third, third
    expected: list[tuple[str, str, str | None, str | None]] = [
        (f"o{i:02d}", f"u{i % 5}", "NL", "free") for i in range(20)]
    expected += [("o-nobody", "nobody", None, None), ("o21", "u2", "NL", "free"), ("o99", "u99", "SE", "free")]
    expected += [] if orders_dedup else [("o21", "u2", "NL", "free")]
    assert j.rows() == sorted(expected, key=lambda r: (r[0], r[2] or "")), (first, second, third)
    dead = consume_all(kafka.bootstrap, j.dlq, expected=8)
    # each dead letter is its record: topic, key and value byte for byte, late ones included
    got = sorted((dict(m.headers())["glasspipe.source.topic"].decode(),
                  dict(m.headers())["glasspipe.reason"].decode().split(":")[0], m.key(), m.value()) for m in dead)
    assert got == sorted([
        (j.orders, "event_time_in_future", *order("o-2099", "u1", future)),
        (j.orders, "malformed_json", b"x", b"{broken"),
        (j.users, "event_time_in_future", *user("u3", "FUTURE", future)),
        (j.orders, "late", *order("o-late-5m", "u1", T0 + timedelta(minutes=5))),
        (j.orders, "late", *order("o-late-19m", "u2", T0 + timedelta(minutes=19))),
        (j.orders, "late", *orders[3]),
        (j.users, "late", *user("u1", "LATE", T0 + timedelta(minutes=2))),
        (j.users, "late", *user("u9", "LATE", T0 + timedelta(minutes=10))),
    ]), got
    # both topics are consumed to the end
    group = default_consumer_group("default", j.name)
    for topic in (j.orders, j.users):
        lag = group_lag(kafka.bootstrap, group, topic)
        assert all(c == e for c, e in lag.values()), (topic, lag)


def test_a_checkpoint_of_the_earlier_join_plan_is_set_aside_and_pairs_straddling_the_upgrade_match(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Upgrading from Spark's stream-stream join (docs/operations.md, Upgrading glasspipe): a join
    checkpoint whose hand-over record names no plan is set aside and a new one started from the ledger,
    with warm-up, so a pair whose records straddle the upgrade matches and nothing is written twice."""
    j = Join(tmp_path, kafka, clickhouse, "orders-users-join.yaml")
    j.produce(orders=[order("o1", "u1", T0 + timedelta(minutes=10)), order("o2", "u2", T0 + timedelta(minutes=20))],
              users=[user("u2", "FR", T0 + timedelta(minutes=25))])
    first = j.run()
    assert j.rows() == [("o2", "u2", "FR", "free")], first
    [record] = list(j.ckpt.glob("**/glasspipe-handover.json"))
    doc = json.loads(record.read_text())
    plan, digest = doc.pop("plan").split(":")
    assert plan == "glasspipe-temporal-join/2+join-buckets/2+packed-rows/1" and len(digest) == 12, doc
    record.write_text(json.dumps(doc))  # as written before plans were recorded
    record.with_name(f".{record.name}.crc").unlink(missing_ok=True)  # Hadoop's local checksum of the old text
    j.produce(users=[user("u1", "US", T0 + timedelta(minutes=30))])  # o1's match, after the upgrade
    second = j.run()
    assert "holds the state of another plan" in j.last_log, j.last_log[-3000:]
    assert list(j.ckpt.glob("*.superseded-0")), list(j.ckpt.iterdir())
    assert "rows written 1," in second and "warm-up rows 3," in second, second
    assert j.rows() == [("o1", "u1", "US", "free"), ("o2", "u2", "FR", "free")], second


def test_a_join_whose_source_gains_a_field_sets_its_checkpoint_aside_and_reads_each_kept_record_anew(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """The join keeps each side's fields as the bytes of their struct type, which its plan names: a field added to a
    source's schema starts a new checkpoint from the ledger with warm-up, so records kept under the old schema are
    parsed again with the new one. A kept order and a kept user event each pair after the change, nothing twice."""
    j = Join(tmp_path, kafka, clickhouse, "orders-users-join.yaml")
    j.produce(orders=[order("o1", "u1", T0 + timedelta(minutes=10)), order("o2", "u2", T0 + timedelta(minutes=20))],
              users=[user("u2", "FR", T0 + timedelta(minutes=25)), user("u3", "DE", T0 + timedelta(minutes=26))])
    first = j.run()
    assert j.rows() == [("o2", "u2", "FR", "free")], first
    doc = yaml.safe_load(j.path.read_text())
    users = doc["spec"]["sources"][1]
    assert users["name"] == "users"
    users["schema"]["fields"].insert(1, {"name": "tier", "type": "string"})  # before the fields the sink reads
    write_pipeline(doc, tmp_path)
    j.produce(orders=[order("o3", "u3", T0 + timedelta(minutes=31))],  # the kept user event u3's match
              users=[user("u1", "US", T0 + timedelta(minutes=30))])  # the kept order o1's
    second = j.run()
    assert "holds the state of another plan" in j.last_log, j.last_log[-3000:]
    assert list(j.ckpt.glob("*.superseded-0")), list(j.ckpt.iterdir())
    assert "rows written 2," in second and "warm-up rows 4," in second, second
    assert j.rows() == [("o1", "u1", "US", "free"), ("o2", "u2", "FR", "free"), ("o3", "u3", "DE", "free")], second


def test_a_left_join_handed_over_to_a_new_writer_writes_each_order_once(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """A rescale or a plan change starts a new writer, which re-reads each side from the last window plus lateness
    before its resume point, by Kafka timestamp. The orders here reached Kafka long after their event time (a
    backfill), so all are re-read as warm-up: o-ghost, which its predecessor wrote with NULLs, is dropped (the
    ledger says that writer closed its window); o-m, still open, matched a user 55 minutes before it,
    and the users' Kafka timestamps are as far apart as their event times, so that user is found again only because
    a left join's right side is read back one join window further; o-m is not written with NULLs. Every order lands
    once."""
    j = Join(tmp_path, kafka, clickhouse, "orders-users-join.yaml", join_type="left", lateness="5m", partitions=1)

    base = datetime.now(UTC) - timedelta(hours=6)  # T0 on the users' Kafka clock (older records: retention)

    def event_ms(_key: bytes | None, value: bytes | None) -> int:
        event = datetime.fromisoformat(json.loads(value or b"{}")["updated_at"])
        return int((base + (event - T0)).timestamp() * 1000)

    def send(orders: Sequence[tuple[bytes, bytes]], users: Sequence[tuple[bytes, bytes]]) -> None:
        produce(kafka.bootstrap, j.orders, orders)
        produce(kafka.bootstrap, j.users, users, timestamp_of=event_ms)

    minutes = [timedelta(minutes=m) for m in range(300)]
    send(orders=[order("o-ghost", "ghost", T0 + minutes[60]), order("o-m", "u-m", T0 + minutes[105]),
                 order("o-late", "u-late", T0 + minutes[140])],
         users=[user("u-m", "NL", T0 + minutes[50]), user("u-late", "SE", T0 + minutes[140])])
    first = j.run()  # watermark 02:15: o-ghost's window (to 02:00) closes, o-m's (to 02:45) does not
    assert j.rows() == [("o-ghost", "ghost", None, None), ("o-late", "u-late", "SE", "free"),
                        ("o-m", "u-m", "NL", "free")], first
    closed_ms = int((T0 + minutes[135] - HOUR).timestamp() * 1000)  # the watermark, less the join window
    recorded = clickhouse.client().execute(
        "SELECT max(left_closed_ms) FROM default.glasspipe_ledger WHERE state = 'done' AND startsWith(writer, %(p)s)",
        {"p": f"default.{j.name}."})[0][0]
    assert recorded == closed_ms, recorded
    [record] = list(j.ckpt.glob("**/glasspipe-handover.json"))
    doc = json.loads(record.read_text())
    doc["plan"] = "an earlier plan"  # the path a rescale takes too: set aside, new writer, warm-up
    record.write_text(json.dumps(doc))
    record.with_name(f".{record.name}.crc").unlink(missing_ok=True)
    send(orders=[order("o-new", "u-new", T0 + minutes[240])], users=[user("u-new", "FR", T0 + minutes[240])])
    second = j.run()  # watermark 03:55: every window above closes
    assert "holds the state of another plan" in j.last_log, j.last_log[-3000:]
    [new_record] = [r for r in j.ckpt.glob("**/glasspipe-handover.json") if "superseded" not in str(r)]
    closed = json.loads(new_record.read_text())["closed"]
    assert closed == {j.orders: {"0": [[3, closed_ms]]}}, closed
    # warm-up: the three orders and both users (u-m is 90 minutes before u-late: within 2 windows + lateness)
    assert "rows written 1," in second and "warm-up rows 5," in second, second
    assert j.rows() == [("o-ghost", "ghost", None, None), ("o-late", "u-late", "SE", "free"),
                        ("o-m", "u-m", "NL", "free"), ("o-new", "u-new", "FR", "free")], second


def test_a_user_late_for_its_first_writer_does_not_take_an_open_orders_match_from_the_next_writer(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """u-x came late for the writer that read it first (below its watermark): a dead letter, so o-x, whose window
    was still open, stays unmatched there and is written with NULLs when its window closes. A new writer that reads
    both again as warm-up, at a watermark of its own that has not risen yet, must keep u-x late (the first writer's
    batch recorded its late rows in the ledger): else u-x marks o-x matched, and o-x, which no writer has written
    yet, is never written."""
    j = Join(tmp_path, kafka, clickhouse, "orders-users-join.yaml", join_type="left", lateness="5m", partitions=1)
    minutes = [timedelta(minutes=m) for m in range(400)]
    j.produce(orders=[order("o-x", "u-x", T0 + minutes[200]), order("o-hi", "u-hi", T0 + minutes[230])],
              users=[user("u-hi", "NL", T0 + minutes[230])])
    first = j.run()  # watermark 03:45: o-x's window (to 04:20) stays open
    assert j.rows() == [("o-hi", "u-hi", "NL", "free")], first
    j.produce(users=[user("u-x", "SE", T0 + minutes[190])])  # within o-x's window, but below the watermark
    second = j.run()  # the same writer: u-x is a dead letter
    assert "dead-lettered 1 {" in second and "rows written 0," in second, second
    [record] = list(j.ckpt.glob("**/glasspipe-handover.json"))
    doc = json.loads(record.read_text())
    doc["plan"] = "an earlier plan"  # the path a rescale takes too: set aside, new writer, warm-up
    record.write_text(json.dumps(doc))
    record.with_name(f".{record.name}.crc").unlink(missing_ok=True)
    j.produce(orders=[order("o-new", "u-new", T0 + minutes[300])], users=[user("u-new", "FR", T0 + minutes[300])])
    third = j.run()  # watermark 04:55: o-x's window closes, unmatched
    [new_record] = [r for r in j.ckpt.glob("**/glasspipe-handover.json") if "superseded" not in str(r)]
    late_ms = int((T0 + minutes[190]).timestamp() * 1000)
    assert json.loads(new_record.read_text())["late"] == {j.users: {"0": [[1, 1, late_ms]]}}
    assert "warm-up rows 4," in third and "rows written 2," in third and "dead-lettered 0 {" in third, third
    assert j.rows() == [("o-hi", "u-hi", "NL", "free"), ("o-new", "u-new", "FR", "free"),
                        ("o-x", "u-x", None, None)], third
    assert [json.loads(m.value())["user_id"] for m in consume_all(kafka.bootstrap, j.dlq, expected=1)] == ["u-x"]


@pytest.mark.parametrize(("join_type", "own_state"), [("inner", False), ("left", False), ("left", True)],
                         ids=["inner", "left", "left-sides-in-own-state"])
def test_a_join_rescaled_1_2_1_writes_each_order_once(
    join_type: str, own_state: bool, tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """A join through replica layouts 1 -> 2 -> 1 (stop-first, each replica its own run), a third of the stream each,
    on two partitions keyed by the user: every layout closes the windows of most of what it read (a left join writes
    the orders whose user never comes with NULLs then), and each new writer re-reads what its predecessors read (all
    of it: these records reach Kafka within seconds of each other), so pairs that straddle a rescale match. The last
    layout's writer takes partition 0 from two earlier writers. Every order lands once, with its own user's country
    (or, in a left join, with NULLs). With both sides deduplicated in own state, each layout also gets repeats of
    orders and users an earlier layout read: the new writers' warm-up rebuilds the sides' state, and no repeat
    lands."""
    j = Join(tmp_path, kafka, clickhouse, "dedup-then-join.yaml" if own_state else "orders-users-join.yaml",
             join_type=join_type, join_window="10s", lateness="30s", partitions=2,
             own_state=("orders", "users") if own_state else ())
    rng = random.Random(5)
    n_orders, n_users = 9_000, 1_500
    want: dict[str, str | None] = {}
    phases: list[tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]] = [([], []) for _ in range(3)]
    for i in range(n_users):
        phases[i * 3 // n_users][1].append(user(f"u{i}", f"c{i % 7}", T0 + timedelta(milliseconds=150 * i)))
    for i in range(n_orders):
        oid = f"o{i:05d}"
        if rng.random() < 0.1:
            uid, want[oid] = f"ghost{i}", None
        else:  # a user whose update lies within a second of the order: inside the 10 s window
            u = min(max(i // 6 + rng.randrange(-3, 4), 0), n_users - 1)
            uid, want[oid] = f"u{u}", f"c{u % 7}"
        phases[i * 3 // n_orders][0].append(order(oid, uid, T0 + timedelta(milliseconds=25 * i)))
    flush = T0 + timedelta(hours=1)  # with the last third: the watermark passes every window on both topics
    if own_state:  # repeats, first in the next layout, of the last records the one before read
        for phase in (1, 2):
            before_orders, before_users = phases[phase - 1]
            phases[phase] = (before_orders[-150:] + phases[phase][0], before_users[-50:] + phases[phase][1])
    phases[2][0].append(order("z-flush", "u-flush", flush))
    phases[2][1].append(user("u-flush", "cz", flush))
    want["z-flush"] = "cz"
    ch = f"127.0.0.1:{clickhouse.port}"
    nulls, dropped = [], 0
    for (orders, users), replicas in zip(phases, (1, 2, 1), strict=True):
        j.produce(orders=orders, users=users)
        for replica in range(replicas):
            done = run_to_end(j.path, kafka.bootstrap, ch, j.ckpt, "--replica", str(replica), "--replicas",
                              str(replicas))
            print(f"layout {replica}/{replicas}: {totals(done.stdout)}")
            dropped += duplicates_dropped(totals(done.stdout))
        nulls.append(clickhouse.client().execute(f"SELECT countIf(country IS NULL) FROM {j.table}")[0][0])
    if join_type == "inner":
        want = {o: c for o, c in want.items() if c is not None}
    got = clickhouse.client().execute(f"SELECT order_id, country FROM {j.table}")
    print(f"NULL rows after each layout: {nulls}")
    counts: dict[str, int] = {}
    for oid, _ in got:
        counts[oid] = counts.get(oid, 0) + 1
    twice = sorted(o for o, n in counts.items() if n > 1)
    assert not twice and len(got) == len(want), f"{len(got)} rows for {len(want)} orders; twice: {twice[:10]}"
    assert dict(got) == want
    if join_type == "left":
        assert 0 < nulls[0] < nulls[1] < nulls[2], nulls  # every layout wrote unmatched orders
    if own_state:  # the repeats met the state the new writers rebuilt, not a late watermark; each counted once
        assert dropped == 2 * (150 + 50), dropped
