"""Freshness in a GlassPipeline's status: pure functions from the job's metrics to ``replicaStatuses``.

The operator reads each running driver's Prometheus endpoint (the port the render declares, see
``glasspipe.contract``) the way flink-kubernetes-operator reads a job's REST endpoint, and shows per
replica how far its committed rows are behind: the newest committed event time, the event-time lag at
the moment of observation, and the end-to-end latency p95 of the rows committed since the previous
observation. Nothing here does I/O (the HTTP GET is ``glasspipe.controller.job_metrics``), so the
parsing, the quantile and the status entries are unit-tested directly.

Status must not churn the resource: an observation is due only every ``interval`` seconds per pipeline;
in between, the entries are carried over unchanged from the current status, so the reconcile loop
(every few seconds) writes nothing new.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from glasspipe import contract

# Seconds between two observations of a pipeline's drivers (GLASSPIPE_FRESHNESS_INTERVAL; 0: never).
DEFAULT_INTERVAL = 30.0
LATENCY_QUANTILE = 0.95
FRESHNESS_KEY = "freshness"
PIPELINE_LAG_KEY = "eventTimeLagSeconds"
_MAX_ERROR = 512


# ------------------------------------------------------------------------------ the job's metrics


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative counts by upper bound (sorted, the last one +Inf)."""

    buckets: tuple[tuple[float, float], ...]
    total: float = 0.0

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def since(self, earlier: Histogram | None) -> Histogram:
        """The observations made after ``earlier`` (a previous read of the same driver); the whole
        histogram when there is none, or when the counts went down (a restarted process)."""
        if earlier is None or [b for b, _ in earlier.buckets] != [b for b, _ in self.buckets]:
            return self
        if any(now < before for (_, now), (_, before) in zip(self.buckets, earlier.buckets, strict=True)):
            return self
        return Histogram(tuple((b, now - before) for (b, now), (_, before)
                               in zip(self.buckets, earlier.buckets, strict=True)), self.total - earlier.total)

    def quantile(self, q: float) -> float | None:
        """Prometheus' ``histogram_quantile``: linear within the bucket that holds the rank; the largest
        finite bound when the rank falls into +Inf; None without observations."""
        if self.count <= 0:
            return None
        rank = q * self.count
        prev_bound, prev_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank and cumulative > prev_count:
                if math.isinf(bound):
                    return prev_bound
                return prev_bound + (bound - prev_bound) * (rank - prev_count) / (cumulative - prev_count)
            prev_bound, prev_count = bound, cumulative
        return prev_bound


@dataclass(frozen=True)
class JobSample:
    """What one read of a driver's metrics says about freshness."""

    last_committed_event_time: float | None  # Unix seconds; None before the replica's first commit
    end_to_end: Histogram
    event_time_lag: Histogram


def _histogram(samples: Iterable[Any], name: str) -> Histogram:
    counts: dict[float, float] = {}
    total = 0.0
    for s in samples:
        if s.name == f"{name}_bucket":
            bound = float(s.labels["le"])
            counts[bound] = counts.get(bound, 0.0) + float(s.value)
        elif s.name == f"{name}_sum":
            total += float(s.value)
    return Histogram(tuple(sorted(counts.items())), total)


def parse_job_metrics(text: str) -> JobSample:
    """The freshness series of the job's ``/metrics`` text (Prometheus text format). Raises ValueError
    when the text is not the glasspipe job's metrics."""
    try:
        families = {f.name: f for f in text_string_to_metric_families(text)}
    except Exception as e:  # the parser raises ValueError and others on malformed text
        raise ValueError(f"not Prometheus text format: {e}") from e
    wanted = (contract.METRIC_LAST_COMMITTED_EVENT_TIME, contract.METRIC_END_TO_END_LATENCY,
              contract.METRIC_EVENT_TIME_LAG)
    missing = [n for n in wanted if n not in families]
    if missing:
        raise ValueError(f"no {', '.join(missing)} among the metrics: is this the glasspipe job's metrics port?")
    newest = max((float(s.value) for s in families[contract.METRIC_LAST_COMMITTED_EVENT_TIME].samples),
                 default=0.0)
    return JobSample(
        last_committed_event_time=newest if newest > 0 else None,  # the gauge is 0 until the first commit
        end_to_end=_histogram(families[contract.METRIC_END_TO_END_LATENCY].samples,
                              contract.METRIC_END_TO_END_LATENCY),
        event_time_lag=_histogram(families[contract.METRIC_EVENT_TIME_LAG].samples, contract.METRIC_EVENT_TIME_LAG),
    )


# ------------------------------------------------------------------------------ which pod, which port


@dataclass(frozen=True)
class Target:
    """The driver pod of one replica and where its metrics are (``url``), or why they cannot be read."""

    index: int
    pod: str
    uid: str
    url: str | None
    problem: str = ""


def metrics_port_of(pod: Mapping[str, Any]) -> int:
    """The container port named ``contract.JOB_METRICS_PORT_NAME``; pods rendered before the port was
    declared still serve on ``contract.JOB_METRICS_PORT``."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == contract.JOB_METRICS_PORT_NAME and port.get("containerPort"):
                return int(port["containerPort"])
    return contract.JOB_METRICS_PORT


def _url(ip: str, port: int) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{contract.JOB_METRICS_PATH}"


def driver_targets(pods: Iterable[Mapping[str, Any]], app_index: Mapping[str, int]) -> list[Target]:
    """One target per replica: its application's (``app_index``: application uid -> replica index) live
    driver pod, the Running and newest one when there are several (a restarted driver)."""
    best: dict[int, Mapping[str, Any]] = {}

    def rank(pod: Mapping[str, Any]) -> tuple[bool, str]:
        return ((pod.get("status") or {}).get("phase") == "Running",
                str((pod.get("metadata") or {}).get("creationTimestamp") or ""))

    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        owners = [r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("uid") in app_index]
        if not owners:
            continue
        index = app_index[str(owners[0])]
        if index not in best or rank(pod) > rank(best[index]):
            best[index] = pod
    out = []
    for index, pod in sorted(best.items()):
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
        phase, ip = status.get("phase") or "Pending", status.get("podIP")
        if phase != "Running":
            out.append(Target(index, name, uid, None, f"driver pod {name} is {phase}"))
        elif not ip:
            out.append(Target(index, name, uid, None, f"driver pod {name} has no IP address yet"))
        else:
            out.append(Target(index, name, uid, _url(str(ip), metrics_port_of(pod))))
    return out


# ------------------------------------------------------------------------------ status entries


def rfc3339(t: float, millis: bool = False) -> str:
    moment = datetime.fromtimestamp(t, UTC)
    if millis:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def replica_freshness(target: Target, observed_at: float, sample: JobSample | None,
                      previous: JobSample | None = None, error: str = "") -> dict[str, Any]:
    """A replica's ``freshness`` entry. ``previous``: the same driver's sample at the last observation
    (the p95 covers the rows committed since); ``error``: why the metrics could not be read."""
    entry: dict[str, Any] = {"driverPod": target.pod, "observedAt": rfc3339(observed_at)}
    problem = error or target.problem
    if problem or sample is None:
        entry["error"] = (problem or "no metrics")[:_MAX_ERROR]
        return entry
    newest = sample.last_committed_event_time
    if newest is not None:
        entry["lastCommittedEventTime"] = rfc3339(newest, millis=True)
        entry["eventTimeLagSeconds"] = round(max(0.0, observed_at - newest), 1)
    p95 = sample.end_to_end.since(previous.end_to_end if previous else None).quantile(LATENCY_QUANTILE)
    if p95 is not None:
        entry["endToEndLatencyP95Seconds"] = round(p95, 3)
    return entry


def with_freshness(statuses: Sequence[dict[str, Any]], entries: Mapping[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """``replicaStatuses`` with each replica's freshness entry (replicas without one have none)."""
    out = []
    for s in statuses:
        entry = {k: v for k, v in s.items() if k != FRESHNESS_KEY}
        if s.get("index") in entries:
            entry[FRESHNESS_KEY] = entries[s["index"]]
        out.append(entry)
    return out


def carried_over(statuses: Sequence[dict[str, Any]], current: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Between observations: every replica keeps the freshness entry the status already shows for the
    same replica and application."""
    kept = {(s.get("index"), s.get("application")): s[FRESHNESS_KEY] for s in current or [] if FRESHNESS_KEY in s}
    entries = {s["index"]: kept[(s["index"], s.get("application"))] for s in statuses
               if (s.get("index"), s.get("application")) in kept}
    return with_freshness(statuses, entries)


def pipeline_lag(statuses: Sequence[dict[str, Any]]) -> float | None:
    """``status.eventTimeLagSeconds``: the largest lag among the replicas whose metrics were read."""
    lags = [s[FRESHNESS_KEY]["eventTimeLagSeconds"] for s in statuses
            if "eventTimeLagSeconds" in (s.get(FRESHNESS_KEY) or {})]
    return max(lags) if lags else None


def due(last_observed: float | None, now: float, interval: float) -> bool:
    """Whether the drivers of a pipeline should be read now (monotonic seconds)."""
    if interval <= 0:
        return False
    return last_observed is None or now - last_observed >= interval
