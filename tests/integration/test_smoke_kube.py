"""Smoke test of the local Kubernetes API server: CRDs, subresources, watches, RBAC via ServiceAccount."""

from __future__ import annotations

import json
import queue
import threading
import uuid
from typing import Any

import pytest
from kubernetes import client, config, watch

from glasspipe_dev.kube import KubeAPIServer

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "smoke.glasspipe.test", "v1", "widgets"

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "replicas": {"type": "integer", "minimum": 0},
                                    "color": {"type": "string"},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "replicas": {"type": "integer"},
                                    "selector": {"type": "string"},
                                },
                            },
                        },
                    }
                },
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    },
                },
            }
        ],
    },
}


def widget(name: str, namespace: str, color: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"color": color, "replicas": replicas},
    }


@pytest.fixture(scope="module")
def crd(kube: KubeAPIServer) -> str:
    kube.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}", "--timeout=60s")
    return f"{PLURAL}.{GROUP}"


def new_namespace(kube: KubeAPIServer) -> str:
    ns = f"smoke-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    return ns


def test_watch_and_scale_subresource(kube: KubeAPIServer, crd: str) -> None:
    ns = new_namespace(kube)
    kube.kubectl("apply", "-f", "-", input=json.dumps(widget("w1", ns, "red", 1)))
    created = json.loads(kube.kubectl("get", crd, "w1", "-n", ns, "-o", "json").stdout)

    api = client.CustomObjectsApi(config.new_client_from_config(str(kube.kubeconfig)))
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
    w = watch.Watch()

    def pump() -> None:
        try:
            for ev in w.stream(
                api.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
                resource_version=created["metadata"]["resourceVersion"], timeout_seconds=60,
            ):  # fmt: skip
                events.put((ev["type"], ev["object"]))
        except Exception as e:  # reported by wait_for; after w.stop() the server may just go away
            events.put(("ERROR", {"error": repr(e)}))

    t = threading.Thread(target=pump, daemon=True)
    t.start()

    def wait_for(pred: Any, what: str) -> dict[str, Any]:
        while True:
            try:
                typ, obj = events.get(timeout=30)
            except queue.Empty:
                pytest.fail(f"watch did not see {what}")
            if typ == "ERROR":
                pytest.fail(f"watch failed before it saw {what}: {obj['error']}")
            if typ == "MODIFIED" and pred(obj):
                return obj

    kube.kubectl("patch", crd, "w1", "-n", ns, "--type=merge", "-p", '{"spec":{"color":"blue"}}')
    wait_for(lambda o: o["spec"]["color"] == "blue", "spec.color=blue")

    # The scale subresource maps onto spec.replicas.
    kube.kubectl("scale", f"{crd}/w1", "-n", ns, "--replicas=3")
    wait_for(lambda o: o["spec"]["replicas"] == 3, "spec.replicas=3 after kubectl scale")
    scale = json.loads(
        kube.kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}/w1/scale").stdout
    )
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3

    # The status subresource: a patch there changes status only; its spec part is ignored.
    kube.kubectl(
        "patch", crd, "w1", "-n", ns, "--subresource=status", "--type=merge",
        "-p", '{"status":{"replicas":3,"selector":"app=w1"},"spec":{"color":"green"}}',
    )  # fmt: skip
    obj = wait_for(lambda o: o.get("status", {}).get("replicas") == 3, "status.replicas=3")
    assert obj["spec"]["color"] == "blue"
    w.stop()


def test_service_account_under_rbac(kube: KubeAPIServer, crd: str) -> None:
    ns = new_namespace(kube)
    kube.kubectl("apply", "-f", "-", input=json.dumps(widget("w2", ns, "red", 1)))
    sa_kubeconfig = kube.service_account_kubeconfig(ns, "robot")

    who = json.loads(kube.kubectl("auth", "whoami", "-o", "json", kubeconfig=sa_kubeconfig).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:robot"

    denied = kube.kubectl("get", crd, "-n", ns, kubeconfig=sa_kubeconfig, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()

    kube.kubectl("create", "role", "widget-reader", "-n", ns, "--verb=get,list,watch", f"--resource={crd}")
    kube.kubectl("create", "rolebinding", "robot-reads", "-n", ns, "--role=widget-reader",
                 f"--serviceaccount={ns}:robot")  # fmt: skip
    names = kube.kubectl("get", crd, "-n", ns, "-o", "name", kubeconfig=sa_kubeconfig).stdout.split()
    assert names == [f"widget.{GROUP}/w2"]
    # Still no write access, and nothing outside its namespace.
    assert kube.kubectl("delete", crd, "w2", "-n", ns, kubeconfig=sa_kubeconfig, check=False).returncode != 0
    assert kube.kubectl("get", crd, "-n", "default", kubeconfig=sa_kubeconfig, check=False).returncode != 0
