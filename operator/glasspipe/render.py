"""Render the SparkApplications of a GlassPipeline: pure and byte-stable.

spark-operator kills and resubmits a driver on any change of a SparkApplication's spec, so nothing
here may depend on time, randomness, dict order or the operator's own state: the same GlassPipeline
always renders the same bytes. Secrets are referenced by the pods (env ``valueFrom``), never copied.
Pod-level settings go through ``driver.template`` / ``executor.template`` so that spark-operator's
mutating webhook is not needed. Whatever the job reads (env vars, mounted files, its config argument,
Spark settings) is defined in ``glasspipe.contract``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from glasspipe import contract
from glasspipe.api import models
from glasspipe.controller import spark_operator

SPARK_VERSION = "4.2.0"  # the Spark of the job image (spec.sparkVersion)
PIPELINE_LABEL = "glasspipe.io/pipeline"
REPLICA_LABEL = "glasspipe.io/replica"
SPEC_HASH_ANNOTATION = "glasspipe.io/spec-hash"
MANAGED_BY = "glasspipe-operator"
# Spark settings only the Kubernetes deployment needs (the job's own come from glasspipe.contract).
# The image's Python, spelled out: spark-submit otherwise copies its own environment's PYSPARK_PYTHON
# (whatever the submitter, e.g. spark-operator's pod or a test session, has set) into the driver pod.
_KUBERNETES_SPARK_CONF = {
    "spark.pyspark.python": contract.IMAGE_PYTHON,
    "spark.pyspark.driver.python": contract.IMAGE_PYTHON,
    "spark.sql.streaming.metricsEnabled": "true",
    "spark.kubernetes.driver.podTemplateContainerName": "spark-kubernetes-driver",
    "spark.kubernetes.executor.podTemplateContainerName": "spark-kubernetes-executor",
}


def application_name(pipeline: str, replica: int) -> str:
    return f"{pipeline}-{replica}"


def selector_labels(pipeline: str) -> dict[str, str]:
    """Labels every SparkApplication (and Spark pod) of a pipeline carries; the scale selector."""
    return {PIPELINE_LABEL: pipeline}


def render_selector(pipeline: str) -> str:
    """``status.selector`` as the scale subresource wants it: a label-selector string."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(pipeline).items()))


def _env_from_secrets(spec: models.GlassPipelineSpec) -> list[dict[str, Any]]:
    return [{"name": e.var, "valueFrom": {"secretKeyRef": {"name": e.secret, "key": e.key}}}
            for e in contract.secret_env(spec)]


def _secret_volumes(spec: models.GlassPipelineSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A Secret volume per contract.SecretFile, holding just its key, mounted read-only at its directory."""
    files = contract.secret_files(spec)
    volumes = [{"name": f.volume, "secret": {"secretName": f.secret, "items": [{"key": f.key, "path": f.key}]}}
               for f in files]
    mounts = [{"name": f.volume, "mountPath": f.directory, "readOnly": True} for f in files]
    return volumes, mounts


def metrics_port() -> dict[str, Any]:
    """The job's metrics port, declared on the driver container (by name, for the PodMonitor and the
    operator's freshness observation). Declared in the pod template, not in ``driver.ports``: spark-operator
    applies ``driver.ports`` only through its mutating webhook, which glasspipe does not need; Spark keeps
    the template's ports and adds its own (driver-rpc-port, blockmanager, spark-ui)."""
    return {"name": contract.JOB_METRICS_PORT_NAME, "containerPort": contract.JOB_METRICS_PORT, "protocol": "TCP"}


def _pod_template(labels: dict[str, str], container: str, env: list[dict[str, Any]],
                  volumes: list[dict[str, Any]], mounts: list[dict[str, Any]],
                  ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": container}
    if ports:
        c["ports"] = ports
    if env:
        c["env"] = env
    if mounts:
        c["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {"containers": [c]}
    if volumes:
        pod_spec["volumes"] = volumes
    return {"metadata": {"labels": labels}, "spec": pod_spec}


def spec_hash(obj: Any) -> str:
    """A short, stable digest of a rendered spec (shown as an annotation, used to detect drift)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def render_spark_application(
    namespace: str, pipeline: str, uid: str, spec: models.GlassPipelineSpec, replica: int,
    default_image: str = contract.DEFAULT_SPARK_IMAGE,
) -> dict[str, Any]:
    """The SparkApplication of one replica, owned by the GlassPipeline; ``default_image`` is the Spark
    image when the spec names none (the operator's --spark-image)."""
    name = application_name(pipeline, replica)
    labels = {
        "app.kubernetes.io/name": "glasspipe",
        "app.kubernetes.io/instance": pipeline,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector_labels(pipeline),
        REPLICA_LABEL: str(replica),
    }
    env = _env_from_secrets(spec)
    volumes, mounts = _secret_volumes(spec)
    config = contract.write_job_config(namespace, pipeline, spec, replica)
    app_spec: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": spec.spark.image or default_image,
        "imagePullPolicy": spec.spark.image_pull_policy,
        "mainApplicationFile": contract.JOB_MAIN,
        "arguments": [contract.CONFIG_ARGUMENT, contract.job_config_json(config)],
        "sparkVersion": SPARK_VERSION,
        "sparkConf": contract.spark_conf(spec, _KUBERNETES_SPARK_CONF),
        # A stream never ends on its own: restart it whatever way the driver stopped.
        "restartPolicy": {
            "type": "Always",
            "onFailureRetryInterval": 10,
            "onSubmissionFailureRetryInterval": 20,
        },
        "driver": {
            "cores": spec.spark.driver.cores,
            "memory": spec.spark.driver.memory,
            "serviceAccount": spec.spark.service_account,
            "labels": dict(labels),
            "template": _pod_template(dict(labels), "spark-kubernetes-driver", env, volumes, mounts,
                                      [metrics_port()]),
        },
        "executor": {
            "instances": spec.spark.executor.instances,
            "cores": spec.spark.executor.cores,
            "memory": spec.spark.executor.memory,
            "labels": dict(labels),
            "template": _pod_template(dict(labels), "spark-kubernetes-executor", env, volumes, mounts),
        },
    }
    return {
        "apiVersion": spark_operator.API_VERSION,
        "kind": spark_operator.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {SPEC_HASH_ANNOTATION: spec_hash(app_spec)},
            "ownerReferences": [{
                "apiVersion": models.API_VERSION,
                "kind": models.KIND,
                "name": pipeline,
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }],
        },
        "spec": app_spec,
    }


def render_spark_applications(
    namespace: str, pipeline: str, uid: str, spec: models.GlassPipelineSpec,
    default_image: str = contract.DEFAULT_SPARK_IMAGE,
) -> list[dict[str, Any]]:
    """Every SparkApplication the pipeline should have now (none while suspended)."""
    if spec.suspend:
        return []
    return [render_spark_application(namespace, pipeline, uid, spec, i, default_image) for i in range(spec.replicas)]
