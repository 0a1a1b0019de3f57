"""Render the SparkApplications of a GlassPipeline: pure and byte-stable.

spark-operator kills and resubmits a driver on any change of a SparkApplication's spec, so nothing
here may depend on time, randomness, dict order or the operator's own state: the same GlassPipeline
always renders the same bytes. Secrets are referenced by the pods (env ``valueFrom``), never copied.
Pod-level settings go through ``driver.template`` / ``executor.template`` so that spark-operator's
mutating webhook is not needed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from glasspipe.api import models

SPARK_API_VERSION = "sparkoperator.k8s.io/v1beta2"
SPARK_KIND = "SparkApplication"
SPARK_PLURAL = "sparkapplications"
SPARK_VERSION = "4.2.0"
JOB_MAIN = "local:///opt/glasspipe/sparkapp/glasspipe_job/main.py"
PIPELINE_LABEL = "glasspipe.io/pipeline"
REPLICA_LABEL = "glasspipe.io/replica"
SPEC_HASH_ANNOTATION = "glasspipe.io/spec-hash"
MANAGED_BY = "glasspipe-operator"

# Environment variables through which the job receives secret values (set from secretKeyRef).
ENV_CLICKHOUSE_USER = "GLASSPIPE_CLICKHOUSE_USER"
ENV_CLICKHOUSE_PASSWORD = "GLASSPIPE_CLICKHOUSE_PASSWORD"


def kafka_env(source: str, what: str) -> str:
    """Env var holding a source's Kafka SASL user or password."""
    return f"GLASSPIPE_KAFKA_{source.upper()}_{what.upper()}"


def application_name(pipeline: str, replica: int) -> str:
    return f"{pipeline}-{replica}"


def selector_labels(pipeline: str) -> dict[str, str]:
    """Labels every SparkApplication (and Spark pod) of a pipeline carries; the scale selector."""
    return {PIPELINE_LABEL: pipeline}


def render_selector(pipeline: str) -> str:
    """``status.selector`` as the scale subresource wants it: a label-selector string."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(pipeline).items()))


def default_consumer_group(namespace: str, pipeline: str) -> str:
    return f"glasspipe.{namespace}.{pipeline}"


def render_job_config(namespace: str, pipeline: str, spec: models.GlassPipelineSpec, replica: int) -> dict[str, Any]:
    """What one replica's job needs: the spec minus operator-only fields, plus its identity.

    ``suspend`` is left out (suspending deletes the applications). ``replicas`` is in: it decides which
    partitions this replica owns, so a rescale re-renders every replica (see docs/scaling.md).
    """
    body = spec.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"replicas", "suspend"})
    return {"namespace": namespace, "pipeline": pipeline, "replica": replica, "replicas": spec.replicas,
            "spec": body}


def render_job_argument(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _env_from_secrets(spec: models.GlassPipelineSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []

    def ref(var: str, secret: str, key: str) -> None:
        env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})

    creds = spec.sink.clickhouse.credentials_secret_ref
    if creds is not None:
        ref(ENV_CLICKHOUSE_USER, creds.name, creds.username_key)
        ref(ENV_CLICKHOUSE_PASSWORD, creds.name, creds.password_key)
    for source in spec.sources:
        kc = source.kafka.security.credentials_secret_ref
        if kc is not None:
            ref(kafka_env(source.name, "username"), kc.name, kc.username_key)
            ref(kafka_env(source.name, "password"), kc.name, kc.password_key)
    return env


def _ca_volumes(spec: models.GlassPipelineSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Secret volumes for CA bundles, mounted at /etc/glasspipe/ca/<volume>/<key>."""
    refs: list[tuple[str, models.SecretKeyRef]] = []
    if spec.sink.clickhouse.ca_secret_ref is not None:
        refs.append(("clickhouse-ca", spec.sink.clickhouse.ca_secret_ref))
    for source in spec.sources:
        if source.kafka.security.ca_secret_ref is not None:
            refs.append((f"kafka-{source.name.replace('_', '-')}-ca", source.kafka.security.ca_secret_ref))
    volumes = [{"name": n, "secret": {"secretName": r.name, "items": [{"key": r.key, "path": r.key}]}} for n, r in refs]
    mounts = [{"name": n, "mountPath": f"/etc/glasspipe/ca/{n}", "readOnly": True} for n, _ in refs]
    return volumes, mounts


def _pod_template(labels: dict[str, str], container: str, env: list[dict[str, Any]],
                  volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = {"name": container}
    if env:
        c["env"] = env
    if mounts:
        c["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {"containers": [c]}
    if volumes:
        pod_spec["volumes"] = volumes
    return {"metadata": {"labels": labels}, "spec": pod_spec}


def _spark_conf(spec: models.GlassPipelineSpec) -> dict[str, str]:
    conf = {
        "spark.sql.shuffle.partitions": str(spec.spark.shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.kubernetes.driver.podTemplateContainerName": "spark-kubernetes-driver",
        "spark.kubernetes.executor.podTemplateContainerName": "spark-kubernetes-executor",
    }
    conf.update(spec.spark.conf)  # the user's word wins
    return dict(sorted(conf.items()))


def spec_hash(obj: Any) -> str:
    """A short, stable digest of a rendered spec (shown as an annotation, used to detect drift)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def render_spark_application(
    namespace: str, pipeline: str, uid: str, spec: models.GlassPipelineSpec, replica: int
) -> dict[str, Any]:
    """The SparkApplication of one replica, owned by the GlassPipeline."""
    name = application_name(pipeline, replica)
    labels = {
        "app.kubernetes.io/name": "glasspipe",
        "app.kubernetes.io/instance": pipeline,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector_labels(pipeline),
        REPLICA_LABEL: str(replica),
    }
    env = _env_from_secrets(spec)
    volumes, mounts = _ca_volumes(spec)
    config = render_job_config(namespace, pipeline, spec, replica)
    app_spec: dict[str, Any] = {
        "type": "Python",
        "pythonVersion": "3",
        "mode": "cluster",
        "image": spec.spark.image,
        "imagePullPolicy": spec.spark.image_pull_policy,
        "mainApplicationFile": JOB_MAIN,
        "arguments": ["--config-json", render_job_argument(config)],
        "sparkVersion": SPARK_VERSION,
        "sparkConf": _spark_conf(spec),
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
            "template": _pod_template(dict(labels), "spark-kubernetes-driver", env, volumes, mounts),
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
        "apiVersion": SPARK_API_VERSION,
        "kind": SPARK_KIND,
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
    namespace: str, pipeline: str, uid: str, spec: models.GlassPipelineSpec
) -> list[dict[str, Any]]:
    """Every SparkApplication the pipeline should have now (none while suspended)."""
    if spec.suspend:
        return []
    return [render_spark_application(namespace, pipeline, uid, spec, i) for i in range(spec.replicas)]
