"""Smoke test of the real single-node cluster: a Pod from an imported image runs on the kubelet to
Succeeded and its log is readable; the garbage collector deletes a child whose owner is deleted."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from fixtures_cluster import import_project_image
from glasspipe_dev.cluster import NODE_NAME, Cluster, PodNetwork
from glasspipe_dev.reaper import forget_bridge

# One worker owns the node cluster (dev/test.sh: pytest-xdist --dist loadgroup): it starts once.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("node")]


def _namespace(cluster: Cluster) -> str:
    ns = f"smoke-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    return ns


def _wait(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_pod_runs_to_succeeded_with_logs(cluster: Cluster) -> None:
    image = import_project_image(cluster, "glasspipe-operator")
    ns = _namespace(cluster)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "hello",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", "import socket; print('hello from', socket.gethostname())"],
                    "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                }
            ],
        },
    }
    t0 = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def phase() -> str | None:
        p = json.loads(cluster.kubectl("get", "pod", "hello", "-n", ns, "-o", "json").stdout)
        return p["status"].get("phase") if p["status"].get("phase") in ("Succeeded", "Failed") else None

    final = _wait("pod hello to finish", phase)
    print(f"\n[cluster] pod created -> {final} in {time.monotonic() - t0:.1f} s")
    got = json.loads(cluster.kubectl("get", "pod", "hello", "-n", ns, "-o", "json").stdout)
    assert final == "Succeeded", got["status"]
    assert got["spec"]["nodeName"] == NODE_NAME
    # A real pod IP from the CNI bridge, and the ServiceAccount token mounted by admission + kubelet.
    assert cluster.net is not None and got["status"]["podIP"].startswith(cluster.net.prefix), got["status"]
    assert any(v.get("projected") for v in got["spec"]["volumes"]), got["spec"]["volumes"]
    logs = cluster.kubectl("logs", "hello", "-n", ns).stdout
    assert logs.strip() == "hello from hello"


def test_garbage_collector_deletes_children(cluster: Cluster) -> None:
    ns = _namespace(cluster)
    owner = json.loads(
        cluster.kubectl("create", "configmap", "owner", "-n", ns, "--from-literal=a=b", "-o", "json").stdout
    )
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "namespace": ns,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
            ],
        },
        "data": {"c": "d"},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(child))
    cluster.kubectl("delete", "configmap", "owner", "-n", ns, "--wait=true")
    t0 = time.monotonic()

    def gone() -> bool:
        return cluster.kubectl("get", "configmap", "child", "-n", ns, check=False).returncode != 0

    _wait("the garbage collector to delete the child", gone, timeout=60)
    print(f"\n[cluster] owner deleted -> child gone in {time.monotonic() - t0:.1f} s")


def test_each_cluster_has_its_own_bridge_and_pod_subnet(cluster: Cluster) -> None:
    """Two clusters on one machine (two sessions, say) must not share the CNI bridge or the pod subnet."""
    other = PodNetwork()
    try:
        assert cluster.net is not None
        assert (other.bridge, other.subnet) != (cluster.net.bridge, cluster.net.subnet)
        assert other.subnet != cluster.net.subnet and other.bridge != cluster.net.bridge
        assert other.subnet.startswith("10.244.") and other.bridge.startswith("gpcni")
    finally:
        other.release()


def test_a_crashed_clusters_bridge_is_taken_back() -> None:
    """A cluster killed with its reaper leaves its bridge (made by the CNI plugin) and frees its index's lock: the
    next cluster deletes the bridge and takes the index, instead of skipping it for good."""
    crashed = PodNetwork()
    bridge, index = crashed.bridge, crashed.index
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", f"10.244.{index}.1/24", "dev", bridge], check=True)
    subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
    assert crashed._lock is not None
    crashed._lock.close()  # the process died: its lock is free, its bridge and the bridge's route stay
    forget_bridge(bridge)
    successor = PodNetwork()
    try:
        assert (successor.index, successor.bridge) == (index, bridge)
        assert not Path(f"/sys/class/net/{bridge}").exists(), "the crashed cluster's bridge is still there"
    finally:
        successor.release()
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)
