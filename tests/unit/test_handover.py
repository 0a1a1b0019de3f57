"""The pure part of the rescale hand-over: what the ledger says about progress and abandoned batches."""

import pytest

from glasspipe_job.handover import Handover, abandoned_batches, is_superseded, ledger_progress
from glasspipe_job.kafka_offsets import owned_partitions

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


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_ownership_is_disjoint_and_covering(n: int) -> None:
    parts = list(range(12))
    owned = [owned_partitions(parts, i, n) for i in range(n)]
    assert sorted(p for o in owned for p in o) == parts
