"""The contract between the operator and the job: what the render writes and the job reads.

Both sides import this module (``glasspipe.render`` writes, ``glasspipe_job`` reads), so every name is
spelled once: the environment variables that carry Secret values, the files Secret keys are mounted
as, the job-config JSON (writer and reader as a pair), the Spark settings the job relies on and the
default consumer group. Pure; it imports only the API models.

To hand the job another secret, add a ``SecretEnv`` to ``secret_env`` or a ``SecretFile`` to
``secret_files``: the render mounts it, and the job finds it through the same function. Secret values
never pass through here: only Secret names, keys, env var names and file paths (docs/security.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms

# The Spark image of a pipeline that does not name one (spec.spark.image): the operator's --spark-image,
# chart value spark.image. Not a CRD default, so that the operator's setting reaches new pipelines.
DEFAULT_SPARK_IMAGE = "glasspipe/spark:0.1.0"

# The job's entry point inside the Spark image, and the argument that carries its config.
JOB_MAIN = "local:///opt/glasspipe/sparkapp/glasspipe_job/main.py"
# The Python of the Spark image (sparkapp/Dockerfile: $VIRTUAL_ENV/bin/python), which runs the job.
IMAGE_PYTHON = "/opt/glasspipe/venv/bin/python"
CONFIG_ARGUMENT = "--config-json"

# ------------------------------------------------------------------------------ secrets as env vars

ENV_CLICKHOUSE_USER = "GLASSPIPE_CLICKHOUSE_USER"
ENV_CLICKHOUSE_PASSWORD = "GLASSPIPE_CLICKHOUSE_PASSWORD"


def kafka_env(source: str, what: str) -> str:
    """Env var holding a source's Kafka SASL user name (``what="username"``) or password."""
    return f"GLASSPIPE_KAFKA_{source.upper()}_{what.upper()}"


@dataclass(frozen=True)
class SecretEnv:
    """An env var of the Spark pods set from a Secret key (``valueFrom.secretKeyRef``); ``field`` is the
    spec field that references it (for error messages: they name the field, never the value)."""

    var: str
    secret: str
    key: str
    field: str = ""


def _source_path(spec: models.GlassPipelineSpec, source: models.Source) -> str:
    return f"spec.sources[{spec.sources.index(source)}].kafka.security"


def secret_env(spec: models.GlassPipelineSpec) -> list[SecretEnv]:
    """Every Secret value the job reads from its environment, in render order."""
    env: list[SecretEnv] = []
    ch = spec.sink.clickhouse
    if ch.user_secret_ref is not None:
        env.append(SecretEnv(ENV_CLICKHOUSE_USER, ch.user_secret_ref.name, ch.user_secret_ref.key,
                             "spec.sink.clickhouse.userSecretRef"))
    if ch.password_secret_ref is not None:
        env.append(SecretEnv(ENV_CLICKHOUSE_PASSWORD, ch.password_secret_ref.name, ch.password_secret_ref.key,
                             "spec.sink.clickhouse.passwordSecretRef"))
    for source in spec.sources:
        sasl = source.kafka.security.sasl
        if sasl is not None:
            path = f"{_source_path(spec, source)}.sasl"
            env.append(SecretEnv(kafka_env(source.name, "username"), sasl.username_secret_ref.name,
                                 sasl.username_secret_ref.key, f"{path}.usernameSecretRef"))
            env.append(SecretEnv(kafka_env(source.name, "password"), sasl.password_secret_ref.name,
                                 sasl.password_secret_ref.key, f"{path}.passwordSecretRef"))
    return env


# ------------------------------------------------------------------------------ secrets as files

SECRET_FILES_DIR = "/etc/glasspipe/secrets"
# Outside a pod (``glasspipe run``, the e2e stand-in) the Secret files live under another folder; the job
# reads them there when this env var names it. The render always uses SECRET_FILES_DIR.
ENV_SECRET_FILES_DIR = "GLASSPIPE_SECRET_FILES_DIR"


@dataclass(frozen=True)
class SecretFile:
    """A Secret key mounted into the Spark pods as the file ``path`` (volume ``volume`` at ``directory``);
    ``field`` is the spec field that references it."""

    volume: str
    secret: str
    key: str
    field: str = ""

    @property
    def directory(self) -> str:
        return f"{SECRET_FILES_DIR}/{self.volume}"

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.key}"

    def path_under(self, root: str) -> str:
        """The file's path when the Secret files are under ``root`` instead of SECRET_FILES_DIR."""
        return f"{root.rstrip('/')}/{self.volume}/{self.key}"


def _file(volume: str, ref: models.SecretKeyRef | None, field: str) -> SecretFile | None:
    return None if ref is None else SecretFile(volume, ref.name, ref.key, field)


def clickhouse_ca(spec: models.GlassPipelineSpec) -> SecretFile | None:
    """The CA bundle the sink verifies ClickHouse's certificate with (``sink.clickhouse.caSecretRef``)."""
    return _file("clickhouse-ca", spec.sink.clickhouse.ca_secret_ref, "spec.sink.clickhouse.caSecretRef")


@dataclass(frozen=True)
class KafkaTlsFiles:
    """A source's TLS material as files: the CA bundle and, for mutual TLS, the client certificate and key."""

    ca: SecretFile | None = None
    client_cert: SecretFile | None = None
    client_key: SecretFile | None = None

    def all(self) -> list[SecretFile]:
        return [f for f in (self.ca, self.client_cert, self.client_key) if f is not None]


def kafka_tls(spec: models.GlassPipelineSpec, source: models.Source) -> KafkaTlsFiles:
    """The files of ``kafka.security.tls`` of a source, for Spark's Kafka connector and librdkafka."""
    tls = source.kafka.security.tls
    if tls is None:
        return KafkaTlsFiles()
    volume = f"kafka-{source.name.replace('_', '-')}"
    path = f"{_source_path(spec, source)}.tls"
    return KafkaTlsFiles(
        ca=_file(f"{volume}-ca", tls.ca_secret_ref, f"{path}.caSecretRef"),
        client_cert=_file(f"{volume}-client-cert", tls.client_cert_secret_ref, f"{path}.clientCertSecretRef"),
        client_key=_file(f"{volume}-client-key", tls.client_key_secret_ref, f"{path}.clientKeySecretRef"),
    )


def secret_files(spec: models.GlassPipelineSpec) -> list[SecretFile]:
    """Every Secret file the job reads, in render order."""
    files = [clickhouse_ca(spec), *(f for s in spec.sources for f in kafka_tls(spec, s).all())]
    return [f for f in files if f is not None]


# ------------------------------------------------------------------------------ why a replica stopped

# The job writes one line (no secret) here when it fails; Kubernetes keeps it in the driver container's
# status (terminated.message) and the operator shows it in the pipeline's Degraded condition.
TERMINATION_LOG = "/dev/termination-log"
ENV_TERMINATION_LOG = "GLASSPIPE_TERMINATION_LOG"  # another file, outside a pod (the e2e stand-in)


# ------------------------------------------------------------------------------ the job's metrics

# The driver serves the job's Prometheus metrics on this port (``glasspipe_job.main --metrics-port``); the
# render declares it on the driver container under this name, where the chart's PodMonitor and the
# operator's freshness observation (glasspipe.freshness) find it.
JOB_METRICS_PORT = 9108
JOB_METRICS_PORT_NAME = "metrics"
JOB_METRICS_PATH = "/metrics"
# Series the operator reads back into the pipeline's status (the job defines them in glasspipe_job.metrics).
METRIC_END_TO_END_LATENCY = "glasspipe_end_to_end_latency_seconds"
METRIC_EVENT_TIME_LAG = "glasspipe_event_time_lag_seconds"
METRIC_LAST_COMMITTED_EVENT_TIME = "glasspipe_last_committed_event_time_seconds"


# ------------------------------------------------------------------------------ Spark and Kafka

SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|sasl[.]jaas|ssl[.]keystore[.]key"

STATE_ROW_COUNT_CONF = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"
CHECKPOINT_FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
KAFKA_FETCHED_DATA_TIMEOUT_CONF = "spark.kafka.consumer.fetchedData.cache.timeout"
KAFKA_FETCHED_DATA_EVICTOR_CONF = "spark.kafka.consumer.fetchedData.cache.evictorThreadRunInterval"
DRIVER_DEFAULT_JAVA_OPTIONS_CONF = "spark.driver.defaultJavaOptions"
EXECUTOR_DEFAULT_JAVA_OPTIONS_CONF = "spark.executor.defaultJavaOptions"
G1_REGION_OPTION = "-XX:G1HeapRegionSize=16m"

# Spark settings the job relies on (the dedup operator's transformWithState needs RocksDB). The JVM operators
# jar (sparkapp/jvm) is on the job's classpath wherever it runs.
REQUIRED_SPARK_CONF: dict[str, str] = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # With the default (true) every state write first reads its key to keep a row count: the join runs
    # 10-12 % slower (docs/benchmarks-journal.md). glasspipe_state_rows then reads 0; glasspipe_state_*_bytes
    # report the state's size. spec.spark.conf may turn it back on.
    STATE_ROW_COUNT_CONF: "false",
    # Spark's checkpoint file manager, but on a local disk it writes and renames without starting a
    # process per file (Hadoop without its native library does: chmod, readlink); in the job's JVM jar.
    CHECKPOINT_FILE_MANAGER_CONF: "io.glasspipe.spark.LocalCheckpointFileManager",
    # Spark's default plus the Kafka options that carry credentials (the SASL JAAS config holds the password,
    # ssl.keystore.key the mTLS private key): redacted wherever Spark prints options or its configuration.
    "spark.redaction.regex": SPARK_REDACTION_REGEX,
    # Spark 4.2 asks this for every field of every row it encodes (its types framework), and unset, its default
    # reads an environment variable each time (SPARK_TESTING): ~1 % of the dedup stage's task samples. False is
    # what that default gives outside Spark's own tests; set, it is a map lookup.
    "spark.sql.types.framework.enabled": "false",
    # Spark's Kafka reader keeps each poll's records (kafka.max.poll.records, glasspipe's 10 000: a whole fetch) in
    # a pool, for a task that starts where that poll's task stopped. An entry no task takes again waits out the idle
    # timeout, Spark's default 5 minutes, and the pool has no bound. A batch split into ranges
    # (maxRecordsPerPartition: a pipeline without a shuffle, or a hot partition's range in one with a shuffle)
    # leaves one such entry per range: catching up at 20 000 pairs/s, a join's driver held
    # 6.4 M records in it after 3.5 minutes and ran out of heap (docs/benchmarks-journal.md). A few seconds keep
    # the entry a next batch takes; one evicted early costs that batch one poll.
    KAFKA_FETCHED_DATA_TIMEOUT_CONF: "5s",
    KAFKA_FETCHED_DATA_EVICTOR_CONF: "2s",
    # A task's result (a batch's Arrow bytes for the sink: over 1 MB at 80 000 events/s, where JFR saw them fetched as
    # blocks) above Spark's default 1 MB goes into the executor's block manager, and the driver fetches it from there as
    # a block; and any array of half a G1 region or more (1 MB of a 2 GB heap's 2 MB regions) is "humongous": each
    # allocation of one may start a concurrent mark of the whole heap. At 100 000/s per Kafka partition that was 226
    # concurrent starts in 4 minutes and a median batch of 880-1 002 ms; with results sent directly and 16 MB regions,
    # 3-4 and 701-748 ms (docs/benchmarks-journal.md, 2026-12-03). spark.rpc.message.maxSize (128 MB) still bounds
    # a direct result. The Java options are Spark's "default" ones, which spec.spark.conf's extraJavaOptions add to
    # rather than replace.
    "spark.task.maxDirectResultSize": "64m",
    DRIVER_DEFAULT_JAVA_OPTIONS_CONF: G1_REGION_OPTION,
    EXECUTOR_DEFAULT_JAVA_OPTIONS_CONF: G1_REGION_OPTION,
}


# Spark's RocksDB store flushes its memtable and makes a local checkpoint every minDeltasForSnapshot batches
# (Spark's default 10), inside the batch's commit; its maintenance thread uploads only the newest of them once a
# maintenanceInterval (Spark's default 60 s) and drops the rest. So the job snapshots about once an interval: at
# a 250 ms trigger Spark's 10 meant a flush every 2.5 s, and compacting the small files took 0.13 of the 2 cores
# at 10 000/s, 0.02 with a minute's (docs/benchmarks-journal.md). A restart replays the changelogs after the newest
# uploaded snapshot: up to one interval more of them.
SNAPSHOT_BATCHES_CONF = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
MAINTENANCE_INTERVAL_CONF = "spark.sql.streaming.stateStore.maintenanceInterval"
SPARK_DEFAULT_SNAPSHOT_BATCHES = 10
SPARK_DEFAULT_MAINTENANCE_INTERVAL_MS = 60_000


def maintenance_interval_ms(conf: Mapping[str, str]) -> int:
    """The state stores' maintenance interval in ``conf`` (a user's spec.spark.conf): milliseconds, or a
    duration as glasspipe writes them (``30s``, ``2m``); Spark's default for anything else."""
    text = conf.get(MAINTENANCE_INTERVAL_CONF, "").strip()
    if text.isdigit():  # Spark reads a bare number as milliseconds
        return int(text)
    try:
        return parse_duration_ms(text)
    except ValueError:
        return SPARK_DEFAULT_MAINTENANCE_INTERVAL_MS


def batches_per_snapshot(max_delay: str, maintenance_ms: int = SPARK_DEFAULT_MAINTENANCE_INTERVAL_MS) -> int:
    """State-store batches between two snapshots: a maintenance interval of ``max_delay`` triggers, at least
    Spark's default."""
    interval_ms = max(parse_duration_ms(max_delay), 1)
    return max(SPARK_DEFAULT_SNAPSHOT_BATCHES, -(-maintenance_ms // interval_ms))


def spark_conf(spec: models.GlassPipelineSpec, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's Spark settings, sorted: shuffle partitions, the snapshot interval, REQUIRED_SPARK_CONF and
    ``extra``; the user's ``spec.spark.conf`` wins over all of them."""
    conf = {
        "spark.sql.shuffle.partitions": str(spec.spark.shuffle_partitions),
        SNAPSHOT_BATCHES_CONF: str(batches_per_snapshot(spec.sink.clickhouse.batching.max_delay,
                                                         maintenance_interval_ms(spec.spark.conf))),
        **REQUIRED_SPARK_CONF,
        **(extra or {}),
    }
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
