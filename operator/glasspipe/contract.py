"""The contract between the operator and the job: what the render writes and the job reads.

Both sides import this module (``glasspipe.render`` writes, ``glasspipe_job`` reads), so every name is
spelled once: the environment variables that carry Secret values, the files Secret keys are mounted
as, the job-config JSON (writer and reader as a pair), the Spark settings the job relies on and the
default consumer group. Pure; it imports only the API models.

To hand the job another secret (a Kafka client certificate, ClickHouse TLS material), add a
``SecretEnv`` to ``secret_env`` or a ``SecretFile`` to ``secret_files``: the render mounts it, and the
job finds it through the same function.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from glasspipe.api import models

# The job's entry point inside the Spark image, and the argument that carries its config.
JOB_MAIN = "local:///opt/glasspipe/sparkapp/glasspipe_job/main.py"
CONFIG_ARGUMENT = "--config-json"

# ------------------------------------------------------------------------------ secrets as env vars

ENV_CLICKHOUSE_USER = "GLASSPIPE_CLICKHOUSE_USER"
ENV_CLICKHOUSE_PASSWORD = "GLASSPIPE_CLICKHOUSE_PASSWORD"


def kafka_env(source: str, what: str) -> str:
    """Env var holding a source's Kafka SASL user name (``what="username"``) or password."""
    return f"GLASSPIPE_KAFKA_{source.upper()}_{what.upper()}"


@dataclass(frozen=True)
class SecretEnv:
    """An env var of the Spark pods set from a Secret key (``valueFrom.secretKeyRef``)."""

    var: str
    secret: str
    key: str


def secret_env(spec: models.GlassPipelineSpec) -> list[SecretEnv]:
    """Every Secret value the job reads from its environment, in render order."""
    env: list[SecretEnv] = []
    creds = spec.sink.clickhouse.credentials_secret_ref
    if creds is not None:
        env.append(SecretEnv(ENV_CLICKHOUSE_USER, creds.name, creds.username_key))
        env.append(SecretEnv(ENV_CLICKHOUSE_PASSWORD, creds.name, creds.password_key))
    for source in spec.sources:
        kc = source.kafka.security.credentials_secret_ref
        if kc is not None:
            env.append(SecretEnv(kafka_env(source.name, "username"), kc.name, kc.username_key))
            env.append(SecretEnv(kafka_env(source.name, "password"), kc.name, kc.password_key))
    return env


# ------------------------------------------------------------------------------ secrets as files

SECRET_FILES_DIR = "/etc/glasspipe/ca"


@dataclass(frozen=True)
class SecretFile:
    """A Secret key mounted into the Spark pods as the file ``path`` (volume ``volume`` at ``directory``)."""

    volume: str
    secret: str
    key: str

    @property
    def directory(self) -> str:
        return f"{SECRET_FILES_DIR}/{self.volume}"

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.key}"


def clickhouse_ca(spec: models.GlassPipelineSpec) -> SecretFile | None:
    """The CA bundle the sink verifies ClickHouse's certificate with (``sink.clickhouse.caSecretRef``)."""
    ref = spec.sink.clickhouse.ca_secret_ref
    return None if ref is None else SecretFile("clickhouse-ca", ref.name, ref.key)


def kafka_ca(source: models.Source) -> SecretFile | None:
    """The CA bundle of a source's Kafka (``kafka.security.caSecretRef``), for Spark and librdkafka."""
    ref = source.kafka.security.ca_secret_ref
    return None if ref is None else SecretFile(f"kafka-{source.name.replace('_', '-')}-ca", ref.name, ref.key)


def secret_files(spec: models.GlassPipelineSpec) -> list[SecretFile]:
    """Every Secret file the job reads, in render order."""
    files = [clickhouse_ca(spec), *(kafka_ca(s) for s in spec.sources)]
    return [f for f in files if f is not None]


# ------------------------------------------------------------------------------ Spark and Kafka

# Spark settings the job relies on (the dedup operator's transformWithState needs RocksDB).
REQUIRED_SPARK_CONF: dict[str, str] = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


def spark_conf(spec: models.GlassPipelineSpec, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's Spark settings, sorted: shuffle partitions, REQUIRED_SPARK_CONF and ``extra``; the user's
    ``spec.spark.conf`` wins over all of them."""
    conf = {"spark.sql.shuffle.partitions": str(spec.spark.shuffle_partitions), **REQUIRED_SPARK_CONF, **(extra or {})}
    conf.update(spec.spark.conf)
    return dict(sorted(conf.items()))


def default_consumer_group(namespace: str, pipeline: str) -> str:
    return f"glasspipe.{namespace}.{pipeline}"


def consumer_group(namespace: str, pipeline: str, source: models.Source) -> str:
    """The group a source's progress is committed to (``kafka.consumerGroup``, else the default)."""
    return source.kafka.consumer_group or default_consumer_group(namespace, pipeline)


# ------------------------------------------------------------------------------ the job config

# Spec fields the job does not get: suspending deletes the applications, and ``replicas`` travels next to
# ``replica`` in the job config (together they decide which partitions a replica owns).
OPERATOR_ONLY_FIELDS = frozenset({"replicas", "suspend"})


@dataclass(frozen=True)
class JobConfigDoc:
    """The job config as the job reads it: one replica's identity and the spec (API field names)."""

    namespace: str
    pipeline: str
    replica: int
    replicas: int
    spec: dict[str, Any]


def write_job_config(namespace: str, pipeline: str, spec: models.GlassPipelineSpec, replica: int,
                     replicas: int | None = None) -> dict[str, Any]:
    """What one replica's job needs: its identity, ``replicas`` (default: the spec's) and the spec
    minus OPERATOR_ONLY_FIELDS. A rescale changes every replica's config (see docs/scaling.md)."""
    body = spec.model_dump(by_alias=True, exclude_none=True, mode="json", exclude=set(OPERATOR_ONLY_FIELDS))
    return {"namespace": namespace, "pipeline": pipeline, "replica": replica,
            "replicas": spec.replicas if replicas is None else replicas, "spec": body}


def job_config_json(config: Mapping[str, Any]) -> str:
    """The config as the value of CONFIG_ARGUMENT: compact, keys sorted (byte-stable)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def read_job_config(raw: str | Mapping[str, Any]) -> JobConfigDoc:
    """The reader of ``write_job_config``'s output (or of its JSON)."""
    data = json.loads(raw) if isinstance(raw, str) else raw
    return JobConfigDoc(
        namespace=str(data["namespace"]),
        pipeline=str(data["pipeline"]),
        replica=int(data.get("replica", 0)),
        replicas=int(data.get("replicas", 1)),
        spec=dict(data["spec"]),
    )
