"""The pure part of the rescale hand-over: what the ledger says, and what a starting replica decides from it."""

import json
from pathlib import Path

import pytest
import yaml

from glasspipe.api.durations import parse_duration_ms
from glasspipe.api.validation import validate_resource
from glasspipe_job.clickhouse.ledger import LateRange
from glasspipe_job.handover import (
    Handover,
    abandoned_batches,
    claimed_starts,
    closed_windows,
    is_superseded,
    judged_late,
    ledger_progress,
    merge_offsets,
    new_start,
    parse_offset_log,
    resumable,
    warmup_lookback_ms,
)
from glasspipe_job.kafka_offsets import EARLIEST, LATEST, not_behind, owned_partitions

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.unit

LEDGER = [
    ("ns.p.0of1-a", 0, "pending", '[{"t":{"0":10,"1":12}}]'),
    ("ns.p.0of1-a", 0, "done", '[{"t":{"0":10,"1":12}}]'),
    ("ns.p.0of1-a", 1, "pending", '[{"t":{"0":20,"1":25}}]'),  # never finished: the writer died
    ("ns.p.0of2-b", 0, "pending", '[{"t":{"0":30}}]'),
    ("ns.p.0of2-b", 0, "done", '[{"t":{"0":30}}]'),
    ("ns.p.1of2-c", 0, "pending", '[{"t":{"1":40}}]'),
    ("ns.p.1of2-c", 0, "rolledback", '[{"t":{"1":40}}]'),
]


def test_progress_is_the_furthest_done_offset_per_partition() -> None:
    assert ledger_progress(LEDGER) == {"t": {0: 30, 1: 12}}


def test_abandoned_batches_touching_owned_partitions() -> None:
    assert abandoned_batches(LEDGER, {"t": {1: 0}}, "ns.p.1of2-new") == [
        ("ns.p.0of1-a", 1, '[{"t":{"0":20,"1":25}}]')]
    assert abandoned_batches(LEDGER, {"t": {5: 0}}, "ns.p.x") == []  # not our partitions
    assert abandoned_batches(LEDGER, {"t": {0: 0}}, "ns.p.0of1-a") == []  # never our own


def test_a_checkpoint_overtaken_by_another_layout_is_superseded() -> None:
    assert is_superseded({"t": {0: 10}}, {"t": {0: 30, 1: 12}})
    assert not is_superseded({"t": {0: 30, 1: 12}}, {"t": {0: 30, 1: 12}})
    assert not is_superseded({"t": {7: 0}}, {"t": {0: 30}})  # a partition nobody else wrote
    # killed before its first commit: it still holds where it started, -2 (earliest); nobody else wrote
    assert not is_superseded({"t": {0: -2, 1: -2}}, {})
    assert not is_superseded({"t": {0: -2}}, {"t": {1: 5}})
    assert is_superseded({"t": {0: -2}}, {"t": {0: 0}})  # another writer wrote its partition meanwhile


def test_an_uncommitted_batch_that_another_layout_wrote_makes_the_checkpoint_superseded() -> None:
    """Issue #14: writer a planned batch 0 to offset 100 and died; b wrote 0..100; a must not replay it."""
    rows = [("ns.p.0of1-a", 0, "pending", '[{"t":{"0":100}}]'), ("ns.p.0of1-a", 0, "rolledback", '[{"t":{"0":100}}]'),
            ("ns.p.0of3-b", 0, "done", '[{"t":{"0":100}}]')]
    committed = {"t": {0: 0}}  # nothing committed: where writer a started
    assert is_superseded(committed, ledger_progress(rows, except_writer="ns.p.0of1-a"))


def test_own_done_batches_beyond_the_commit_do_not_supersede() -> None:
    """A crash after the ledger's done row, before Spark's commit: the replay is recognised by the sink."""
    rows = [("ns.p.0of1-a", 4, "done", '[{"t":{"0":80}}]'), ("ns.p.0of1-a", 5, "done", '[{"t":{"0":100}}]')]
    assert not is_superseded({"t": {0: 80}}, ledger_progress(rows, except_writer="ns.p.0of1-a"))
    assert ledger_progress(rows) == {"t": {0: 100}}


def test_handover_round_trips_and_names_warmup_partitions() -> None:
    h = Handover("ns.p.0of2-b", {"t": {0: 30, 2: 5}}, {"t": {0: 12, 2: 5}})
    assert Handover.from_json(h.to_json()) == h
    assert h.warmup_partitions() == {"t": {0: 30}}
    joined = Handover("ns.p.0of1-c", {"t": {0: 3}}, {"t": {0: 3}}, plan="glasspipe-temporal-join/1")
    assert Handover.from_json(joined.to_json()) == joined
    left = Handover("ns.p.0of1-d", {"t": {0: 30}}, {"t": {0: 12}}, closed={"t": {0: [(20, 5000), (30, 7000)]}})
    assert Handover.from_json(left.to_json()) == left
    assert "closed" not in json.loads(joined.to_json())  # records without it read as before
    late = Handover("ns.p.0of1-e", {"t": {0: 30}}, {"t": {0: 12}}, late={"t": {0: [(13, 15, 4000), (20, 20, 6000)]}})
    assert Handover.from_json(late.to_json()) == late
    assert "late" not in json.loads(joined.to_json())


def test_a_record_written_before_plans_were_recorded_reads_as_plan_empty() -> None:
    """Join checkpoints of Spark's stream-stream join have such records: runner.prepare_handover sets them
    aside (docs/operations.md, Upgrading glasspipe)."""
    old = Handover.from_json('{"readFrom": {"t": {"0": 1}}, "resume": {"t": {"0": 4}}, "writerId": "ns.p.0of1-a"}')
    assert old == Handover("ns.p.0of1-a", {"t": {0: 4}}, {"t": {0: 1}}, plan="")


@pytest.mark.parametrize("text", ["", '{"readFrom": {"t": {"0": 1}}, "resume": {"t"', "[]", '{"resume": {}}', "null"])
def test_a_record_cut_short_by_a_kill_reads_as_none(text: str) -> None:
    """runner.prepare_handover sets such a checkpoint aside, as one without a record, instead of failing the job
    at every start (a replica killed while writing it left an empty file in a CI run)."""
    assert Handover.from_record(text) is None


def test_a_whole_record_reads_as_itself() -> None:
    h = Handover("ns.p.0of2-b", {"t": {0: 30}}, {"t": {0: 12}}, plan="dedup-per-kafka-partition/2/window=60000ms")
    assert Handover.from_record(h.to_json()) == h


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_ownership_is_disjoint_and_covering(n: int) -> None:
    parts = list(range(12))
    owned = [owned_partitions(parts, i, n) for i in range(n)]
    assert sorted(p for o in owned for p in o) == parts


def test_a_warm_up_batch_commits_no_offset_below_the_resume_point() -> None:
    resume = {"t": {0: 500, 1: 40}}
    # the offset log's partitions are strings; a warm-up batch ends at 120 on partition 0, before its resume (500)
    assert not_behind({"t": {"0": 120, "1": 90}}, resume) == {"t": {0: 500, 1: 90}}
    assert not_behind({"u": {"3": 7}}, resume) == {"u": {3: 7}}  # no floor for a partition the hand-over lacks


def test_a_checkpoint_is_resumed_only_with_its_record_and_while_not_overtaken() -> None:
    previous = Handover("ns.p.0of1-a", {"t": {0: 30, 1: 12}}, {"t": {0: 30, 1: 12}})
    assert resumable(previous, {"t": {0: 30, 1: 12}}, LEDGER)
    assert not resumable(previous, {"t": {0: 10}}, LEDGER)  # another layout wrote partition 0 since
    assert resumable(previous, None, LEDGER)  # no batch committed yet: where it resumed counts
    assert not resumable(None, {"t": {0: 30}}, LEDGER)  # a checkpoint without a hand-over record


def test_a_new_start_rolls_back_abandoned_batches_and_resumes_ledger_then_group_then_fallback() -> None:
    start = new_start("ns.p.1of2-new", LEDGER, {"t": {1: 0, 3: 0, 5: 0}}, {"t": {3: 7, 1: 2}}, {"t": EARLIEST}, {})
    assert start.writer_id == "ns.p.1of2-new"
    assert start.roll_back == [("ns.p.0of1-a", 1, '[{"t":{"0":20,"1":25}}]')]
    assert start.resume == {"t": {1: 12, 3: 7, 5: EARLIEST}}


def test_a_partition_no_writer_read_resumes_where_one_claimed_it_else_at_earliest_if_added_since_the_first_start(
) -> None:
    """startingOffsets: latest. A writer claimed partitions 0-1 at resolved end offsets (the topic had 2), then
    died before its first batch; partition 2 was added since. A new writer must read all three from where records
    arrived after the pipeline started: partition 0 and 1 at the claimed offsets, partition 2 from its start
    (LATEST would skip every record appended to it before this writer's start)."""
    rows = [("ns.p.0of1-a", 1, "claimed", '[{"t":{"0":40,"1":55}}]'),
            ("ns.p.0of1-a", 0, "pending", '[{"t":{"0":90,"1":95}}]'),
            ("ns.p.0of2-b", 2, "claimed", '[{"t":{"0":-1}}]'),  # an earlier version's unresolved LATEST
            ("ns.p.1of2-b", 2, "claimed", '[{"t":{"1":60}}]')]
    assert claimed_starts(rows) == {"t": {0: 40, 1: 55}}
    start = new_start("ns.p.0of1-c", rows, {"t": {0: 0, 1: 0, 2: 0}}, {}, {"t": LATEST}, {"t": 2})
    assert start.resume == {"t": {0: 40, 1: 55, 2: EARLIEST}}
    assert start.roll_back == [("ns.p.0of1-a", 0, '[{"t":{"0":90,"1":95}}]')]
    # the ledger's progress and the group's offsets come first; a topic the claims did not count keeps startingOffsets
    done = [*rows, ("ns.p.0of1-a", 0, "done", '[{"t":{"0":90,"1":95}}]')]
    start = new_start("ns.p.0of1-c", done, {"t": {0: 0, 1: 0, 2: 0}, "u": {5: 0}}, {"t": {2: 3}},
                      {"t": LATEST, "u": LATEST}, {"t": 2})
    assert start.resume == {"t": {0: 90, 1: 95, 2: 3}, "u": {5: LATEST}}
    # the first start of a pipeline: nothing claimed, nothing counted
    assert new_start("ns.p.0of1-c", [], {"t": {0: 0, 4: 0}}, {}, {"t": LATEST}, {}).resume == {
        "t": {0: LATEST, 4: LATEST}}
    # an EARLIEST claim is the earliest point of all
    assert claimed_starts([*rows, ("ns.p.0of1-d", 3, "claimed", '[{"t":{"1":-2}}]')]) == {"t": {0: 40, 1: EARLIEST}}


def test_a_resumed_record_names_the_partitions_added_since_at_earliest() -> None:
    """Spark takes specific starting offsets only when they name every partition it reads."""
    previous = Handover("ns.p.0of2-a", {"t": {0: 30}}, {"t": {0: 12}}, "plan")
    resumed = previous.with_partitions_added({"t": {0: 0, 2: 0}})
    assert resumed.read_from == {"t": {0: 12, 2: EARLIEST}} and resumed.resume == {"t": {0: 30, 2: EARLIEST}}
    assert resumed.warmup_partitions() == {"t": {0: 30}}  # the added partition has no warm-up
    assert (resumed.writer_id, resumed.plan) == (previous.writer_id, previous.plan)
    assert previous.with_partitions_added({"t": {0: 0}}) == previous


def test_warm_up_reaches_back_the_longest_window_plus_the_lateness() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "dedup-then-join.yaml").read_text())
    spec, _ = validate_resource(doc)
    orders = spec.source("orders")
    assert orders.deduplication is not None and spec.join is not None
    lateness = parse_duration_ms(orders.event_time.allowed_lateness)
    longest = max(parse_duration_ms(orders.deduplication.window), parse_duration_ms(spec.join.window))
    assert warmup_lookback_ms(orders, spec.join) == longest + lateness
    plain = orders.model_copy(update={"deduplication": None})
    assert warmup_lookback_ms(plain, None) is None


def test_a_left_joins_right_side_is_read_back_one_join_window_further() -> None:
    """A left row still open at the resume point may have matched a right row up to a window before it: the new
    writer must read that right row again to know the left row matched (else it writes it with NULLs too)."""
    doc = yaml.safe_load((ROOT / "examples" / "orders-users-join.yaml").read_text())
    doc["spec"]["join"]["type"] = "left"
    spec, _ = validate_resource(doc)
    assert spec.join is not None
    window = parse_duration_ms(spec.join.window)
    orders, users = spec.source("orders"), spec.source("users")
    assert warmup_lookback_ms(orders, spec.join) == window + parse_duration_ms(orders.event_time.allowed_lateness)
    assert warmup_lookback_ms(users, spec.join) == 2 * window + parse_duration_ms(users.event_time.allowed_lateness)
    inner = spec.join.model_copy(update={"type": "inner"})
    assert warmup_lookback_ms(users, inner) == window + parse_duration_ms(users.event_time.allowed_lateness)


def test_closed_windows_lists_the_earlier_writers_that_read_past_the_warm_up_start() -> None:
    """Per left partition with warm-up rows: each earlier writer's end offset and closed event time, if it read a
    warm-up row (ended past the warm-up start) and the time is known (not 0, as before the ledger recorded it)."""
    closes = [
        ("ns.p.0of1-a", '[{"orders":{"0":10,"1":8}},{"users":{"0":4}}]', 5000),  # ended before p0's warm-up
        ("ns.p.0of2-b", '[{"orders":{"0":30}},{"users":{"0":9}}]', 9000),
        ("ns.p.1of2-c", '[{"orders":{"1":25}}]', 8000),
        ("ns.p.0of2-d", '[{"orders":{"0":20}}]', 0),  # none recorded
        ("ns.p.0of1-e", '[{"orders":{"2":7}}]', 6000),  # p2: no warm-up rows (read from the resume point)
    ]
    got = closed_windows(closes, "orders", read_from={0: 12, 1: 5, 2: 7}, resume={0: 30, 1: 25, 2: 7})
    assert got == {0: [(30, 9000)], 1: [(8, 5000), (25, 8000)]}
    assert closed_windows(closes, "users", read_from={0: 2}, resume={0: 9}) == {0: [(4, 5000), (9, 9000)]}


def test_a_new_writer_takes_the_late_ranges_that_reach_its_warm_up_but_a_rolled_back_batchs() -> None:
    """Which late ranges the ledger kept a new writer takes: those of partitions it warms up that reach into
    [read_from, resume), but a batch's that was rolled back (a stale writer's commit after a successor's roll-back)."""
    recorded = [LateRange("orders", 0, 3, 9, 5000, "w-a", 4), LateRange("orders", 0, 20, 25, 9000, "w-b", 2),
                LateRange("orders", 0, 26, 28, 9500, "w-b", 3),  # rolled back
                LateRange("orders", 1, 40, 52, 7000, "w-a", 4), LateRange("users", 0, 8, 8, 100, "w-a", 4)]
    rows = [("w-b", 3, "rolledback", "[]"), ("w-b", 3, "done", "[]")]
    got = judged_late(recorded, rows, read_from={"orders": {0: 5, 1: 60}, "users": {0: 2}},
                      resume={"orders": {0: 30, 1: 70}, "users": {0: 2}})
    # orders 0: [3, 9] reaches past 5 and [20, 25] lies inside; orders 1 ends before 60; users 0 has no warm-up rows
    assert got == {"orders": {0: [(3, 9, 5000), (20, 25, 9000)]}}


def test_the_offset_log_keeps_one_entry_per_source_in_order() -> None:
    text = 'v1\n{"batchWatermarkMs":0}\n{"orders":{"0":5,"1":7}}\n-\n{"users":{"0":3}}\n'
    entries = parse_offset_log(text)
    assert entries == [{"orders": {"0": 5, "1": 7}}, {}, {"users": {"0": 3}}]
    assert merge_offsets(entries) == {"orders": {0: 5, 1: 7}, "users": {0: 3}}


def test_a_local_checkpoints_files_are_read_directly_and_others_through_hadoop(tmp_path: Path) -> None:
    """The offset log is read at every micro-batch: on ``file:`` straight from the disk (a Hadoop read is a
    dozen JVM calls), percent-escapes decoded as Hadoop's local file system decodes them."""
    from typing import Any

    from glasspipe_job.handover import CheckpointFiles

    folder = tmp_path / "check point"
    (folder / "offsets").mkdir(parents=True)
    (folder / "offsets" / "7").write_text('v1\n{}\n{"t":{"0":42}}\n')
    no_jvm: Any = None
    files = CheckpointFiles.__new__(CheckpointFiles)
    files.jvm, files.conf, files.root = no_jvm, no_jvm, folder.as_uri()  # file:///.../check%20point
    assert files.offset_log(7) == [{"t": {"0": 42}}]
    files.root = f"file:{folder}"
    assert files._local_file("offsets/7") == folder / "offsets" / "7"
    for remote in ("s3a://bucket/ckpt", "hdfs://nn:8020/ckpt", "file://otherhost/ckpt", "/no/scheme/ckpt"):
        files.root = remote
        assert files._local_file("offsets/7") is None


def test_claims_rank_writers_by_generation_then_id() -> None:
    from glasspipe_job.clickhouse.ledger import LedgerRow, next_generation, superseded_by

    rows = [LedgerRow("p.0of1-a", 1, "claimed", '[{"t":{"0":0,"1":0}}]'),
            LedgerRow("p.0of1-a", 1, "done", '[{"t":{"0":5,"1":5}}]'),
            LedgerRow("p.0of2-b", 2, "claimed", '[{"t":{"0":5}}]'),
            LedgerRow("p.1of2-c", 2, "claimed", '[{"t":{"1":5}}]')]
    assert next_generation([]) == 1 and next_generation(rows) == 3
    assert superseded_by(rows, "p.0of1-a", 1, {("t", 0), ("t", 1)}) == (2, "p.1of2-c")
    assert superseded_by(rows, "p.0of2-b", 2, {("t", 0)}) is None  # its peer owns other partitions
    assert superseded_by(rows, "p.0of2-b", 2, {("t", 0), ("t", 1)}) == (2, "p.1of2-c")  # same generation: by id
    assert superseded_by(rows, "p.1of2-c", 2, {("t", 0), ("t", 1)}) is None
    # the same writer id restarted elsewhere (a zombie driver and its replacement): the newer claim wins
    assert superseded_by([*rows, LedgerRow("p.0of1-a", 3, "claimed", '[{"t":{"0":5}}]')], "p.0of1-a", 1,
                         {("t", 0)}) == (3, "p.0of1-a")


def test_a_pipelines_claims_key_and_key_range_hold_its_writers_only() -> None:
    """The claims key is no writer id of this or any pipeline; the range [prefix, upper) holds exactly the
    strings that start with the prefix, byte-wise as ClickHouse compares (UTF-8 included)."""
    import re

    from glasspipe_job.clickhouse.ledger import WRITER_SUFFIX_PATTERN, claims_key, prefix_upper_bound

    prefix = "default.orders."
    assert not re.match(WRITER_SUFFIX_PATTERN, claims_key(prefix)[len(prefix):])
    upper = prefix_upper_bound(prefix).encode()
    inside = [prefix + s for s in ("", "0", "0of3-abcdef12", "#claims", "v2.0", "\U0010ffff", "\xff\xff")]
    outside = ["default.orders", "default.orders/", "default.ordert.", "default.orders-x.0", "e"]
    assert all(prefix.encode() <= w.encode() < upper for w in inside)
    assert not any(prefix.encode() <= w.encode() < upper for w in outside)
    assert prefix_upper_bound("ns.caf\u00e9") == "ns.caf\u00ea"


def test_a_rolled_back_batch_is_no_progress_even_if_its_writer_wrote_done_later() -> None:
    rows = [("w1", 0, "done", '[{"t":{"0":10}}]'), ("w1", 1, "pending", '[{"t":{"0":20}}]'),
            ("w1", 1, "rolledback", "[]"), ("w1", 1, "done", '[{"t":{"0":20}}]')]
    from glasspipe_job.handover import ledger_progress

    assert ledger_progress(rows) == {"t": {0: 10}}


def test_a_batch_watermark_is_read_from_its_offset_log_entry() -> None:
    from glasspipe_job.handover import parse_batch_watermark

    entry = ('v1\n{"batchWatermarkMs":1795790000123,"batchTimestampMs":1795790060000,"conf":{}}\n'
             '{"sms":{"0":42}}\n')
    assert parse_batch_watermark(entry) == 1_795_790_000_123
    assert parse_batch_watermark('v1\n{"batchTimestampMs":1}\n{"sms":{"0":42}}\n') == 0  # no event time yet
