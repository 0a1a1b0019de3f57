"""bench/targets.py's judgement of issue 15's targets from the figures its checks store or print: a target is reached
only by a run that kept up and was exact at the rate asked, and a check that left no figures reaches nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import targets
from targets import (
    LOOP,
    latency_rows,
    loop_rows,
    rate_rows,
    real_cluster_figures,
    rescale_rows,
    selected,
    state_rows,
)

pytestmark = pytest.mark.unit


def run(**over: Any) -> dict[str, Any]:
    """A freshness.py record of a run that kept up: every first occurrence landed, latency flat, drained at once."""
    record: dict[str, Any] = {
        "bench": "freshness", "variant": "dedup", "offered": 10_000.0, "seconds": 120.0, "exact": True,
        "p50": 0.38, "p95": 0.55, "p99": 0.66, "first_fifth": 0.37, "last_fifth": 0.39, "drained": 0.5,
        "by_minute": [[0, 0.37, 0.55, 0.66], [1, 0.39, 0.56, 0.67]], "firsts": 1_000, "firsts_seen": 1_000,
        "cpu_cores": {"pipeline": 1.14}}
    record.update(over)
    return record


def test_a_fixed_rate_target_needs_the_rate_kept_up_and_exact() -> None:
    rows = rate_rows("dedup sustains >= 50,000 events/s", 50_000, "events/s")
    held = rows([run(offered=49_990.0)])
    assert [r.reached for r in held] == [True]
    assert "49,990 events/s offered for 120 s: kept up, exact" in held[0].figure
    assert "22.8 CPU-s per M" in held[0].figure  # 1.14 cores over 49 990/s
    assert not rows([run(offered=49_990.0, exact=False)])[0].reached
    assert not rows([run(offered=40_000.0)])[0].reached  # kept up, but below the target's rate
    behind = rows([run(offered=50_000.0, last_fifth=3.0)])[0]  # climbing through the run
    assert not behind.reached and "did not keep up" in behind.figure
    assert not rows([run(offered=50_000.0, firsts_seen=999)])[0].reached  # a row never landed


def test_no_figures_reach_nothing() -> None:
    for rows in (rate_rows("t", 1, "events/s")([]), latency_rows([]), state_rows([]), rescale_rows([]),
                 state_rows([{"bench": "dedup_state", "small": 1000, "batch_ms": {"10000": 300.0}}])):
        assert rows and not any(r.reached for r in rows)
        assert all(r.figure.startswith("no figures") for r in rows)


def test_the_latency_targets_are_judged_apart_from_one_run() -> None:
    both = latency_rows([run()])
    assert [(r.target, r.reached) for r in both] == [("p99 < 2 s at 10 000/s", True),
                                                     ("p95 < 700 ms at 10 000/s", True)]
    p95_missed = latency_rows([run(p95=0.82, p99=0.97)])
    assert [r.reached for r in p95_missed] == [True, False]
    assert "p50 / p95 / p99 0.38 / 0.82 / 0.97 s" in p95_missed[0].figure
    assert [r.reached for r in latency_rows([run(p99=2.1)])] == [False, True]
    # a run that fell behind, or lost a row, reaches neither, whatever its percentiles
    assert [r.reached for r in latency_rows([run(last_fifth=1.2)])] == [False, False]
    assert [r.reached for r in latency_rows([run(exact=False)])] == [False, False]


def test_the_state_target_compares_the_most_live_keys_with_the_fewest() -> None:
    # as dedup_state.py --json stores it: the live-key counts become strings in JSON
    record = json.loads(json.dumps({"bench": "dedup_state", "small": 1000,
                                    "batch_ms": {10_000_000: 270.0, 10_000: 314.0}}))
    row, = state_rows([record])
    assert row.reached
    assert row.figure == "a 1,000-row batch's median 314 ms at 10,000 keys, 270 ms at 10,000,000 (0.86x)"
    record["batch_ms"]["10000000"] = 700.0
    assert not state_rows([record])[0].reached  # 2.23x


REAL_CLUSTER_OUT = """\
[real-cluster] scale 2 -> Ready: 25.9 s (load average 3.1)
[real-cluster] figures: cluster cold start 41.0 s; kubectl apply -> Ready 52.3 s; scale 2 -> 3000 exact rows 29.8 s; \
scale 1 -> Ready 22.8 s; scale 1 -> 3800 exact rows 20.9 s
1 passed in 412.00s
"""


def test_the_rescale_figures_are_read_from_the_real_node_tests_closing_line() -> None:
    records = real_cluster_figures(REAL_CLUSTER_OUT)
    assert records[0]["figures"]["scale 2 -> 3000 exact rows"] == 29.8
    assert records[0]["figures"]["cluster cold start"] == 41.0
    row, = rescale_rows(records)
    assert row.reached and row.figure == "scale 2 -> 3000 exact rows 29.8 s; scale 1 -> 3800 exact rows 20.9 s"
    slow = REAL_CLUSTER_OUT.replace("3800 exact rows 20.9 s", "3800 exact rows 61.0 s")
    assert not rescale_rows(real_cluster_figures(slow))[0].reached
    # a test that failed before its closing line printed no figures
    assert real_cluster_figures("[real-cluster] scale 2 -> Ready: 25.9 s\n1 failed") == []


def test_the_loop_target_needs_the_pipelines_sustained_rate_above_the_loops() -> None:
    searches = [run(variant="plain", offered=80_000.0), run(variant="plain", offered=100_000.0, last_fifth=9.0),
                run(variant="plain", offered=90_000.0),
                run(variant="dedup-partition", offered=120_000.0), run(variant="dedup-partition", offered=130_000.0,
                                                                       exact=False)]
    row, = loop_rows(searches)
    assert row.reached and row.figure.endswith("the loop 90,000/s, the pipeline per Kafka partition 120,000/s")
    assert not loop_rows([*searches[:3], run(variant="dedup-partition", offered=90_000.0)])[0].reached
    assert not loop_rows([])[0].reached


def test_the_checks_run_in_order_and_the_loops_search_only_when_asked() -> None:
    assert [c.name for c in selected([], False)] == ["dedup", "dedup-partition", "join", "latency", "state",
                                                      "rescale"]
    assert [c.name for c in selected([], True)][-1] == LOOP.name
    assert [c.name for c in selected(["latency", "dedup"], False)] == ["dedup", "latency"]
    assert [c.name for c in selected(["loop"], True)] == ["loop"]
    opts = targets.Options(seconds=90, warmup=30)
    argv, = selected(["latency"], False)[0].commands(Path("/tmp/x.jsonl"), opts)
    assert argv[1].endswith("bench/freshness.py")
    assert argv[2:] == ["--variant", "dedup", "--rates", "10000", "--seconds", "90", "--warmup", "30",
                        "--trigger", "250ms", "--window", "2m", "--warmup-rate", "0", "--settle", "0",
                        "--json", "/tmp/x.jsonl"]
    assert [a[3] for a in LOOP.commands(Path("/tmp/x.jsonl"), opts)] == ["plain", "dedup-partition"]


def test_a_check_is_judged_on_what_its_commands_stored_or_printed(tmp_path: Path) -> None:
    printing = targets.Check(
        "rescale", "prints", lambda _out, _opts: [[sys.executable, "-c", f"print({REAL_CLUSTER_OUT!r})"]],
        rescale_rows, reads_stdout=True)
    records, _took = targets.run_check(printing, targets.Options(), tmp_path)
    assert [r.reached for r in rescale_rows(records)] == [True]
    stored = json.dumps(run(offered=10_000.0, p95=0.9))
    storing = targets.Check(  # two commands, the later one's record judged
        "latency", "stores", lambda out, _opts: [
            [sys.executable, "-c", f"open({str(out)!r}, 'a').write({json.dumps(run()) + chr(10)!r})"],
            [sys.executable, "-c", f"open({str(out)!r}, 'a').write({stored + chr(10)!r})"]],
        latency_rows)
    records, _took = targets.run_check(storing, targets.Options(), tmp_path)
    assert len(records) == 2 and [r.reached for r in latency_rows(records)] == [True, False]
    failing = targets.Check("state", "stores nothing", lambda _o, _p: [[sys.executable, "-c", "raise SystemExit(3)"]],
                            state_rows)
    assert targets.run_check(failing, targets.Options(), tmp_path)[0] == []
