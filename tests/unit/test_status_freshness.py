"""Freshness in the GlassPipeline status: the job's metrics text -> replicaStatuses[].freshness (pure parts),
and the operator's refresh rule (an observation per interval, carried over in between)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from unittest import mock

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from glasspipe import freshness as fr
from glasspipe.controller import job_metrics
from glasspipe.controller.reconcile import Reconciler
from glasspipe_job.metrics import JobMetrics

pytestmark = pytest.mark.unit

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def job_text(commits: Sequence[tuple[float, list[float], list[float]]] = ()) -> str:
    """The /metrics text the real job serves after these commits (commit time, Kafka and event times in s)."""
    m = JobMetrics("pay", 0, registry=CollectorRegistry())
    for committed_at, kafka_s, event_s in commits:
        m.observe_commit(committed_at, np.asarray([int(t * 1e6) for t in kafka_s], dtype=np.int64),
                         np.asarray([int(t * 1e6) for t in event_s], dtype=np.int64))
    return generate_latest(m.registry).decode()


# ------------------------------------------------------------------------------ parsing the job's metrics


def test_the_job_s_own_metrics_parse_before_and_after_a_commit() -> None:
    before = fr.parse_job_metrics(job_text())
    assert before.last_committed_event_time is None  # the gauge's 0 is "nothing committed yet"
    assert before.end_to_end.count == 0 and before.end_to_end.quantile(0.95) is None

    after = fr.parse_job_metrics(job_text([(T0 + 10, [T0 + 9.9] * 95 + [T0 + 7] * 5, [T0 + 5, T0 + 8.25])]))
    assert after.last_committed_event_time == pytest.approx(T0 + 8.25)
    assert after.end_to_end.count == 100 and after.event_time_lag.count == 2
    assert after.end_to_end.total == pytest.approx(95 * 0.1 + 5 * 3.0, rel=1e-3)
    # 95 rows of 0.1 s: the 95th percentile is in the (0.05, 0.1] bucket
    assert 0.05 < (after.end_to_end.quantile(0.95) or 0) <= 0.1


def test_text_that_is_not_the_job_s_metrics_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="glasspipe_last_committed_event_time_seconds"):
        fr.parse_job_metrics("# TYPE up gauge\nup 1\n")
    with pytest.raises(ValueError, match="not Prometheus text format"):
        fr.parse_job_metrics("<html>spark-ui</html>\n{")


def test_quantile_is_prometheus_histogram_quantile() -> None:
    h = fr.Histogram(((1.0, 10), (2.0, 60), (5.0, 100), (float("inf"), 100)))
    assert h.quantile(0.95) == pytest.approx(2 + 3 * (95 - 60) / 40)  # linear inside (2, 5]
    assert h.quantile(0.05) == pytest.approx(0.5)  # the first bucket starts at 0
    overflow = fr.Histogram(((1.0, 10), (2.0, 20), (5.0, 20), (float("inf"), 100)))
    assert overflow.quantile(0.95) == 5.0  # in +Inf: the largest finite bound, as Prometheus does
    assert fr.Histogram(((1.0, 0), (float("inf"), 0))).quantile(0.95) is None


def test_p95_covers_the_rows_committed_since_the_previous_read() -> None:
    slow = [(T0 + 100, [T0 + 100 - 30] * 50, [T0 + 50])]  # 50 rows 30 s late
    first = fr.parse_job_metrics(job_text(slow))
    second = fr.parse_job_metrics(job_text([*slow, (T0 + 200, [T0 + 200 - 0.2] * 50, [T0 + 199])]))
    assert (second.end_to_end.since(first.end_to_end).quantile(0.95) or 99) <= 0.25  # only the 50 fast rows
    assert (second.end_to_end.quantile(0.95) or 0) > 10  # all 100 rows
    # A restarted driver's counts start again: the new histogram is taken whole.
    assert first.end_to_end.since(second.end_to_end) == first.end_to_end


# ------------------------------------------------------------------------------ which pod and port


def pod(name: str, owner: str, phase: str = "Running", ip: str | None = "10.0.0.7",
        created: str = "2026-01-01T00:00:00Z", ports: list[dict[str, Any]] | None = None,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "creationTimestamp": created,
                            "ownerReferences": [{"kind": "SparkApplication", "uid": owner}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    status: dict[str, Any] = {"phase": phase, **({"podIP": ip} if ip else {})}
    container = {"name": "spark-kubernetes-driver", **({"ports": ports} if ports is not None else {})}
    return {"metadata": meta, "spec": {"containers": [container]}, "status": status}


def test_each_replica_s_live_driver_and_its_declared_metrics_port() -> None:
    declared = [{"name": "spark-ui", "containerPort": 4040}, {"name": "metrics", "containerPort": 19108}]
    targets = fr.driver_targets([
        pod("p-0-driver", "a0", ports=declared),
        pod("p-1-old", "a1", phase="Failed"),  # a stopped driver is never read
        pod("p-1-driver", "a1", ip="fd00::5", ports=[]),  # no declared port (an older render): 9108
        pod("p-2-driver", "a2", phase="Pending", ip=None),
        pod("p-3-driver", "a3", ip=None),
        pod("x-0-driver", "someone-else"),
        pod("p-4-gone", "a4", deleting=True),
    ], {"a0": 0, "a1": 1, "a2": 2, "a3": 3, "a4": 4})
    assert [(t.index, t.pod, t.url, t.problem) for t in targets] == [
        (0, "p-0-driver", "http://10.0.0.7:19108/metrics", ""),
        (1, "p-1-driver", "http://[fd00::5]:9108/metrics", ""),
        (2, "p-2-driver", None, "driver pod p-2-driver is Pending"),
        (3, "p-3-driver", None, "driver pod p-3-driver has no IP address yet"),
    ]
    # A restarted driver: the Running one wins over a Pending one, then the newest.
    [t] = fr.driver_targets([pod("old", "a0", created="2026-01-01T00:00:00Z"),
                             pod("new", "a0", created="2026-01-01T00:05:00Z"),
                             pod("next", "a0", phase="Pending", created="2026-01-01T00:09:00Z")], {"a0": 0})
    assert t.pod == "new"


# ------------------------------------------------------------------------------ status entries


TARGET = fr.Target(0, "p-0-driver", "uid-p", "http://10.0.0.7:9108/metrics")


def test_an_entry_says_when_how_far_behind_and_how_fast() -> None:
    sample = fr.parse_job_metrics(job_text([(T0 + 10, [T0 + 9.5] * 20, [T0 + 8.123456])]))
    entry = fr.replica_freshness(TARGET, T0 + 12.04, sample)
    assert entry == {
        "driverPod": "p-0-driver",
        "observedAt": "2026-01-01T00:00:12Z",
        "lastCommittedEventTime": "2026-01-01T00:00:08.123Z",
        "eventTimeLagSeconds": 3.9,
        "endToEndLatencyP95Seconds": entry["endToEndLatencyP95Seconds"],
    }
    assert 0.25 < entry["endToEndLatencyP95Seconds"] <= 0.5
    # Nothing committed since the previous read: no p95 (there is no latency to speak of), the rest stays.
    quiet = fr.replica_freshness(TARGET, T0 + 60, sample, previous=sample)
    assert "endToEndLatencyP95Seconds" not in quiet and quiet["eventTimeLagSeconds"] == 51.9
    # Before the first commit only the pod and the time.
    assert fr.replica_freshness(TARGET, T0, fr.parse_job_metrics(job_text())) == {
        "driverPod": "p-0-driver", "observedAt": "2026-01-01T00:00:00Z"}


def test_an_unreadable_driver_s_entry_says_why() -> None:
    entry = fr.replica_freshness(TARGET, T0, None, error="could not read http://10.0.0.7:9108/metrics: timed out")
    assert entry == {"driverPod": "p-0-driver", "observedAt": "2026-01-01T00:00:00Z",
                     "error": "could not read http://10.0.0.7:9108/metrics: timed out"}
    pending = fr.Target(0, "p-0-driver", "u", None, "driver pod p-0-driver is Pending")
    assert fr.replica_freshness(pending, T0, None)["error"] == "driver pod p-0-driver is Pending"


def test_read_sample_turns_every_failure_into_a_message() -> None:
    with mock.patch.object(job_metrics, "fetch", side_effect=TimeoutError("timed out")):
        assert job_metrics.read_sample(TARGET) == (None, "could not read http://10.0.0.7:9108/metrics: timed out")
    with mock.patch.object(job_metrics, "fetch", return_value="# TYPE up gauge\nup 1\n"):
        sample, error = job_metrics.read_sample(TARGET)
        assert sample is None and "is this the glasspipe job's metrics port?" in error


def statuses(*apps: str) -> list[dict[str, Any]]:
    return [{"index": i, "application": a, "state": "RUNNING"} for i, a in enumerate(apps)]


def test_between_observations_entries_are_carried_over_for_the_same_application() -> None:
    current = fr.with_freshness(statuses("p-0", "p-1"), {0: {"driverPod": "d0", "eventTimeLagSeconds": 4.0},
                                                         1: {"driverPod": "d1", "eventTimeLagSeconds": 9.5}})
    assert fr.pipeline_lag(current) == 9.5
    kept = fr.carried_over([{**s, "state": "FAILING"} for s in statuses("p-0", "p-1")], current)
    assert [s["freshness"]["driverPod"] for s in kept] == ["d0", "d1"]
    # A replica of another application (a rescale renamed it) does not inherit the old driver's entry.
    renamed = fr.carried_over(statuses("p-0", "q-1"), current)
    assert "freshness" in renamed[0] and "freshness" not in renamed[1]
    assert fr.pipeline_lag(statuses("p-0")) is None


def test_due_once_per_interval_and_never_when_off() -> None:
    assert fr.due(None, 100.0, 30) and fr.due(70.0, 100.0, 30)
    assert not fr.due(71.0, 100.0, 30)
    assert not fr.due(None, 100.0, 0)


# ------------------------------------------------------------------------------ the refresh rule


def test_the_operator_reads_the_drivers_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reconciliations every few seconds must not rewrite status: between observations the entries come
    from the current status, and the drivers are not even listed."""
    rec = Reconciler(mock.MagicMock(), freshness_interval=30)
    clock = [1000.0]
    monkeypatch.setattr("glasspipe.controller.reconcile.time.monotonic", lambda: clock[0])
    listed: list[int] = []

    def pods(namespace: str, name: str) -> list[dict[str, Any]]:
        listed.append(1)
        return [pod("p-0-driver", "a0")]

    monkeypatch.setattr(rec, "running_driver_pods", pods)
    texts = [job_text([(T0, [T0 - 1], [T0 - 2])]), job_text([(T0, [T0 - 1], [T0 - 2]), (T0 + 5, [T0 + 4], [T0 + 3])])]
    monkeypatch.setattr(job_metrics, "fetch", lambda url, timeout=0: texts.pop(0))
    apps = [{"metadata": {"name": "p-0", "uid": "a0", "labels": {"glasspipe.io/replica": "0"}}}]

    first = rec.observe_freshness("ns", "p", apps, statuses("p-0"), None)
    assert first[0]["freshness"]["lastCommittedEventTime"] == "2025-12-31T23:59:58.000Z" and len(listed) == 1
    clock[0] += 29
    again = rec.observe_freshness("ns", "p", apps, statuses("p-0"), first)
    assert again == first and len(listed) == 1  # carried over, no pod list, no HTTP
    clock[0] += 1
    later = rec.observe_freshness("ns", "p", apps, statuses("p-0"), first)
    assert later[0]["freshness"]["lastCommittedEventTime"] == "2026-01-01T00:00:03.000Z" and len(listed) == 2
    off = Reconciler(mock.MagicMock(), freshness_interval=0)
    assert off.observe_freshness("ns", "p", apps, statuses("p-0"), first) == statuses("p-0")


def test_a_failed_pod_list_keeps_the_entries_and_the_reconciliation(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client.exceptions import ApiException

    rec = Reconciler(mock.MagicMock(), freshness_interval=30)
    monkeypatch.setattr(rec, "running_driver_pods", mock.Mock(side_effect=ApiException(503, "Unavailable")))
    current = fr.with_freshness(statuses("p-0"), {0: {"driverPod": "d0", "observedAt": "2026-01-01T00:00:00Z"}})
    assert rec.observe_freshness("ns", "p", [], statuses("p-0"), current) == current
