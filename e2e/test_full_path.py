"""The full path: kubectl -> API server -> glasspipe operator -> SparkApplications -> (spark-operator stand-in)
local Spark jobs -> Kafka in, ClickHouse out, exactly once; and back: job states -> GlassPipeline conditions.

Everything is real except spark-operator and the kubelet, which e2e/spark_operator_standin.py plays: it
runs each SparkApplication's real entry point with its real arguments as a local process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import dumps, group_lag, load_example, produce, write_pipeline
from operator_harness import Operator, wait_for
from spark_operator_standin import StandInProcess as StandIn

pytestmark = pytest.mark.e2e

T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
NAME = "sms-dedup"
APP_TIMEOUT = 600.0  # a local Spark driver starts in 20-60 s on a quiet 2-core box, minutes on a loaded one
GP = "glasspipelines.glasspipe.io"


class Clock:
    def __init__(self) -> None:
        self.start = self.last = time.monotonic()

    def mark(self, what: str) -> None:
        now = time.monotonic()
        print(f"[e2e {now - self.start:7.1f} s, +{now - self.last:6.1f} s] {what}", flush=True)
        self.last = now


def sms(sms_id: str, status: str, at: datetime) -> tuple[bytes, bytes]:
    doc = {"sms_id": sms_id, "status": status, "phone": "+100", "meta": {"provider": "p"}, "sent_at": at.isoformat()}
    return sms_id.encode(), dumps(doc)


def batch(prefix: str, n: int, start: timedelta, dups: int, old: list[tuple[str, timedelta]], old_at: timedelta,
          rng: random.Random) -> tuple[list[tuple[bytes, bytes]], list[tuple[str, timedelta]]]:
    """``n`` new keys ('first', 10 ms apart from T0+start), then ``dups`` repeats of them (1-20 s later) and
    repeats of already written keys (``old``) at T0+old_at: every repeat is inside its key's 5 m window and
    newer than the watermark (newest event - 1 m), so each must be dropped as a duplicate."""
    firsts = [(f"{prefix}-{i:05d}", start + timedelta(milliseconds=10 * i)) for i in range(n)]
    records = [sms(k, "first", T0 + t) for k, t in firsts]
    for _ in range(dups):
        k, t = rng.choice(firsts)
        records.append(sms(k, "repeat", T0 + t + timedelta(seconds=rng.randint(1, 20))))
    for k, t in rng.sample(old, min(len(old), dups)) if old else []:
        assert old_at - t < timedelta(minutes=5)
        records.append(sms(k, "repeat-old", T0 + old_at + timedelta(milliseconds=rng.randint(0, 5000))))
    return records, firsts


def app_states(op: Operator, ns: str) -> dict[str, tuple[str, int, str]]:
    """name -> (state, executionAttempts, errorMessage) of the live (not terminating) applications."""
    out = {}
    for name, a in op.apps(ns).items():
        if a["metadata"].get("deletionTimestamp"):
            continue
        st = a.get("status") or {}
        app_state = st.get("applicationState") or {}
        attempts = int(st.get("executionAttempts") or 0)
        out[name] = (app_state.get("state", ""), attempts, app_state.get("errorMessage", ""))
    return out


def wait_running(op: Operator, standin: StandIn, ns: str, names: list[str],
                 attempts: dict[str, int] | None = None) -> None:
    def check() -> bool:
        states = app_states(op, ns)
        assert sorted(states) == sorted(names), states
        assert all(states[n][0] == "RUNNING" for n in names), states
        assert all(states[n][1] == k for n, k in (attempts or {}).items()), states
        return True
    try:
        wait_for(check, f"{names} RUNNING", APP_TIMEOUT, op, interval=1.0)
    except BaseException:
        print(f"stand-in log:\n{standin.log_tail(60)}")
        for n in names:
            print(f"driver logs of {n}:\n{standin.driver_logs_tail(ns, n)}")
        raise


def wait_settled(kafka: KafkaServer, ch: ClickHouseServer, group: str, topic: str, table: str, rows: int,
                 standin: StandIn) -> None:
    """Every record processed (the group's commits reach the end of every partition) and ``rows`` rows in."""
    def check() -> bool:
        lag = group_lag(kafka.bootstrap, group, topic)
        assert lag and all(c == end for c, end in lag.values()), f"lag {lag}"
        count = ch.client().execute(f"SELECT count() FROM {table}")[0][0]
        assert count >= rows, f"{count} of {rows} rows"
        return True
    try:
        wait_for(check, f"{rows} rows in {table} and no lag", APP_TIMEOUT, interval=2.0)
    except BaseException:
        print(f"stand-in log:\n{standin.log_tail(60)}")
        raise


def assert_exact(ch: ClickHouseServer, table: str, keys: int) -> None:
    rows, distinct, not_first = ch.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0]
    if (rows, distinct, not_first) != (keys, keys, 0):
        dup = ch.client().execute(
            f"SELECT sms_id, groupArray(status) FROM {table} GROUP BY sms_id HAVING count() > 1 LIMIT 5")
        pytest.fail(f"{table}: {rows} rows, {distinct} distinct keys, {not_first} not-first (want {keys}, {keys}, 0);"
                    f" e.g. {dup}")


def log_index(standin: StandIn, needle: str, start: int = 0) -> int:
    """Index of the first stand-in log line from ``start`` on that contains ``needle`` (-1: none)."""
    for i, line in enumerate(standin.log_lines()):
        if i >= start and needle in line:
            return i
    return -1


def test_apply_scale_crash_delete(tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer,
                                  glasspipe_operator: Operator, spark_operator: StandIn, e2e_namespace: str) -> None:
    op, standin, clock, rng = glasspipe_operator, spark_operator, Clock(), random.Random(6)
    ns = e2e_namespace
    suffix = uuid.uuid4().hex[:8]
    topic, table = f"e2e-sms-{suffix}", f"e2e_sms_{suffix}"
    kafka.create_topic(topic, 4)
    kafka.create_topic(f"{topic}-dlq", 1)
    group = default_consumer_group(ns, NAME)

    # ---- (1) kubectl apply of the sms-dedup example, adapted to the local servers
    doc = load_example("sms-dedup.yaml")
    doc["metadata"] = {"name": NAME, "namespace": ns}
    spec: dict[str, Any] = doc["spec"]
    spec["sources"][0]["kafka"].update(bootstrapServers=kafka.bootstrap, topic=topic)
    spec["sink"]["clickhouse"].update(hosts=[f"127.0.0.1:{clickhouse.port}"], table=table)
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    spec["checkpoint"]["location"] = (tmp_path / "checkpoints").as_uri()
    op.k("apply", "-f", str(write_pipeline(doc, tmp_path)))
    records, firsts1 = batch("a", 2000, timedelta(0), 500, [], timedelta(0), rng)
    produce(kafka.bootstrap, topic, records)
    clock.mark(f"applied {NAME} in {ns}; produced {len(records)} events, 2000 keys")

    wait_running(op, standin, ns, [f"{NAME}-0"], {f"{NAME}-0": 1})
    clock.mark("SparkApplication sms-dedup-0 RUNNING")
    op.wait_condition(ns, NAME, "Ready", "True", "AllReplicasRunning", timeout=60)
    clock.mark("GlassPipeline Ready=True")
    wait_settled(kafka, clickhouse, group, topic, table, 2000, standin)
    assert_exact(clickhouse, table, 2000)
    clock.mark("(1) 2000 rows in ClickHouse, one per sms_id")
    old_pid = standin.driver_pid(ns, f"{NAME}-0")
    assert old_pid is not None

    # ---- (2) kubectl scale to 2 replicas: stop-first replacement, then more events (incl. repeats of old keys)
    mark = len(standin.log_lines())
    op.k("scale", f"{GP}/{NAME}", "-n", ns, "--replicas=2")
    wait_running(op, standin, ns, [f"{NAME}-0", f"{NAME}-1"], {f"{NAME}-0": 1, f"{NAME}-1": 1})
    clock.mark("scaled: sms-dedup-0 and sms-dedup-1 RUNNING")
    op.wait_condition(ns, NAME, "Ready", "True", "AllReplicasRunning", timeout=60)
    clock.mark("GlassPipeline Ready=True (2 replicas)")
    # Stop-first, seen from the drivers' side: the old driver had exited (its pod removed) before any
    # new one started, although its application was gone as soon as the pod's deletion was asked for.
    stopped = log_index(standin, f"{ns}/{NAME}-0: driver pid {old_pid} exited", mark)
    started = [log_index(standin, f"{ns}/{NAME}-{i}: submitted", mark) for i in (0, 1)]
    assert 0 <= stopped < min(started), standin.log_tail(30)
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)
    for i in (0, 1):
        config = json.loads(op.apps(ns)[f"{NAME}-{i}"]["spec"]["arguments"][1])
        assert (config["replica"], config["replicas"]) == (i, 2)

    records, firsts2 = batch("b", 1000, timedelta(seconds=60), 300, firsts1, timedelta(seconds=100), rng)
    produce(kafka.bootstrap, topic, records)
    clock.mark(f"produced {len(records)} more events: 1000 new keys, repeats of new and old keys")
    wait_settled(kafka, clickhouse, group, topic, table, 3000, standin)
    assert_exact(clickhouse, table, 3000)
    clock.mark("(2) 3000 rows, one per sms_id, across the rescale")

    # ---- (3) a driver crashes (SIGKILL of its process group): FAILING -> PENDING_RERUN at once (the retry
    # interval counts from the last submission) -> SUBMITTED -> RUNNING, as spark-operator v2.5.2 does:
    # Degraded while the replica is down and being resubmitted, then Ready.
    pid = standin.driver_pid(ns, f"{NAME}-1")
    assert pid is not None
    mark = len(standin.log_lines())
    os.killpg(pid, signal.SIGKILL)
    clock.mark(f"SIGKILLed the driver of {NAME}-1 (pid {pid})")
    records, _ = batch("c", 500, timedelta(seconds=150), 200, firsts1 + firsts2, timedelta(seconds=170), rng)
    produce(kafka.bootstrap, topic, records)

    def degraded_now() -> dict[str, Any] | None:
        c = op.condition(ns, NAME, "Degraded")
        return c if c.get("status") == "True" else None
    degraded = wait_for(degraded_now, "Degraded=True", 60, op, interval=0.3)
    assert degraded["reason"] in ("ReplicaFailed", "ReplicaRestarting"), degraded
    assert f"replica {NAME}-1 " in degraded["message"], degraded
    replicas = {r["application"]: r["state"] for r in op.pipeline(ns, NAME)["status"]["replicaStatuses"]}
    assert replicas[f"{NAME}-0"] == "RUNNING" and replicas[f"{NAME}-1"] in ("FAILING", "PENDING_RERUN", "SUBMITTED")
    assert log_index(standin, f"{NAME}-1: RUNNING -> FAILING (driver process killed by SIGKILL", mark) >= 0, \
        standin.log_tail(30)
    clock.mark(f"GlassPipeline Degraded=True {degraded['reason']}: {degraded['message']}")

    def warned() -> bool:  # kopf posts events from a queue: shortly after the status
        events = json.loads(op.k("get", "events", "-n", ns, "-o", "json"))["items"]
        return any(e["type"] == "Warning" and e["reason"] in ("ReplicaFailed", "ReplicaRestarting") for e in events)
    wait_for(warned, "a Warning event ReplicaFailed or ReplicaRestarting", 60, op, interval=1.0)

    wait_running(op, standin, ns, [f"{NAME}-0", f"{NAME}-1"], {f"{NAME}-0": 1, f"{NAME}-1": 2})
    clock.mark(f"{NAME}-1 rerun (restartPolicy Always), attempt 2 RUNNING")
    op.wait_condition(ns, NAME, "Ready", "True", "AllReplicasRunning", timeout=60)
    assert op.condition(ns, NAME, "Degraded")["status"] == "False"
    clock.mark("GlassPipeline Ready=True again")
    wait_settled(kafka, clickhouse, group, topic, table, 3500, standin)
    assert_exact(clickhouse, table, 3500)
    clock.mark("(3) 3500 rows, one per sms_id, across the crash")

    # ---- (4) kubectl delete: the applications go at once, the pipeline only when no driver pod runs
    pids = [standin.driver_pid(ns, f"{NAME}-{i}") for i in (0, 1)]
    op.k("delete", GP, NAME, "-n", ns, "--wait=false")
    wait_for(lambda: op.get(ns, GP, NAME) is None and not op.apps(ns), "the pipeline and its applications to go",
             90, op, interval=1.0)
    for p in pids:
        assert p is not None
        with pytest.raises(ProcessLookupError):
            os.kill(p, 0)
    clock.mark("(4) deleted: drivers stopped, applications and pipeline gone")
    assert_exact(clickhouse, table, 3500)
