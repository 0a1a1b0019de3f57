"""The job's configuration: the config the operator renders (read through glasspipe.contract), validated,
and the client settings derived from it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from glasspipe import contract
from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms
from glasspipe.api.validation import OutputColumn, validate_spec
from glasspipe_job.failure import JobFailure

# How long a broker may park a fetch that finds no new records (Kafka's default 500 ms). Spark keeps a task's
# Kafka consumer between micro-batches, and a consumer cannot send a fetch while an earlier one to the same
# broker is parked. At 10 000 events/s with a 250 ms trigger the default let 7-8 Kafka tasks in five minutes
# sit 500-550 ms with ~15 ms of CPU (which fetch waited is not pinned down); with 50 ms none did in three
# alternating pairs, and p95 / p99 were 0.75-0.92 / 1.05-1.30 s against 0.89-1.16 / 1.24-2.78 s (median
# batches unchanged; docs/benchmarks-journal.md). The price: a consumer reading at the end of its partition sends
# up to 20 fetches a second instead of 2.
KAFKA_FETCH_MAX_WAIT_MS = 50

# Records a poll of Spark's Kafka reader may return (Kafka's default 500). Spark seeks before every poll and asks
# the broker for the partition's earliest and latest offsets after it (two ListOffsets round trips), so each poll
# costs the reader and the broker alike, whatever it returns. 10 000 lets one poll take a whole fetch (1 MiB a
# partition, ~4 500 records of 200 bytes). Reading 4 M such records, local[2], medians of 7 rounds: Spark 1.91 ->
# 1.56 CPU-us a record, the broker 0.87 -> 0.31 (bench/kafka_reader.py; docs/benchmarks-journal.md). A task's records
# past its offset range stay cached for the next batch, at most one poll's: 10 000 records, a few MB.
KAFKA_MAX_POLL_RECORDS = 10_000


class SecretMissing(JobFailure):
    """A Secret file the render mounts is not there (a run outside Kubernetes without it)."""


def secret_file_path(f: contract.SecretFile) -> str:
    """Where the job finds a Secret file: the render's mount path, or under GLASSPIPE_SECRET_FILES_DIR."""
    root = os.environ.get(contract.ENV_SECRET_FILES_DIR)
    return f.path_under(root) if root else f.path


def read_secret_file(f: contract.SecretFile) -> str:
    path = secret_file_path(f)
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as e:
        raise SecretMissing(f"{f.field}: cannot read key {f.key!r} of Secret {f.secret!r} at {path}: "
                            f"{e.strerror or e}") from None


def read_pkcs8_key(f: contract.SecretFile) -> str:
    """A private key in the PKCS#8 PEM form Kafka's Java client reads (librdkafka reads more forms)."""
    text = read_secret_file(f)
    if "-----BEGIN PRIVATE KEY-----" not in text:
        kind = "encrypted PKCS#8" if "ENCRYPTED PRIVATE KEY" in text else "PKCS#1 or SEC1" if (
            "RSA PRIVATE KEY" in text or "EC PRIVATE KEY" in text) else "not a PEM private key"
        raise SecretMissing(f"{f.field}: key {f.key!r} of Secret {f.secret!r} is {kind}; Kafka's Java client "
                            "needs an unencrypted PKCS#8 key (-----BEGIN PRIVATE KEY-----): convert it with "
                            "`openssl pkcs8 -topk8 -nocrypt -in tls.key -out tls.pkcs8.key` and store that")
    return text


def jaas_quote(value: str) -> str:
    """A value inside a double-quoted JAAS option (Kafka parses it with StreamTokenizer: backslash escapes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


class UnsupportedPipeline(JobFailure):
    """The spec asks for something this job version cannot run; the message says what."""


@dataclass(frozen=True)
class JobConfig:
    """One replica's view of a pipeline. ``replicas`` is this field, not ``spec.replicas`` (an operator-only
    field the job config leaves out, see contract.OPERATOR_ONLY_FIELDS)."""

    namespace: str
    pipeline: str
    replica: int
    replicas: int
    spec: models.GlassPipelineSpec
    columns: list[OutputColumn]

    @property
    def writer_prefix(self) -> str:
        """Every writer id of this pipeline starts with it (ledger rows, chunk markers, insert tokens).

        A writer is one checkpoint of one replica layout: ``<prefix><i>of<N>-<random>``, chosen when
        the checkpoint is created and kept next to it (see handover.py)."""
        return f"{self.namespace}.{self.pipeline}."

    def consumer_group(self, source: models.Source) -> str:
        return contract.consumer_group(self.namespace, self.pipeline, source)

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.spec.checkpoint.location.rstrip('/')}/replica-{self.replica}-of-{self.replicas}"

    @property
    def trigger_interval_ms(self) -> int:
        return parse_duration_ms(self.spec.sink.clickhouse.batching.max_delay)

    @property
    def mutation_deadline(self) -> float:
        """Seconds the sink waits for a DELETE it issued before the replica stops with MutationStuck
        (``sink.clickhouse.mutationTimeout``; clickhouse/mutations.py)."""
        return parse_duration_ms(self.spec.sink.clickhouse.mutation_timeout) / 1000

    def kafka_options(self, source: models.Source) -> dict[str, str]:
        """``kafka.*`` options of Spark's Kafka connector for a source: SASL credentials from the environment,
        TLS files from the Secret mounts. The client certificate and key go inline (Kafka's PEM key store
        wants them in one file; the mounts hold them apart): spark.redaction.regex hides them, and the
        SASL JAAS config, from Spark's logs and plans (contract.REQUIRED_SPARK_CONF)."""
        sec = source.kafka.security
        opts = {"kafka.bootstrap.servers": source.kafka.bootstrap_servers, "kafka.security.protocol": sec.protocol,
                "kafka.fetch.max.wait.ms": str(KAFKA_FETCH_MAX_WAIT_MS),
                "kafka.max.poll.records": str(KAFKA_MAX_POLL_RECORDS)}
        if sec.sasl is not None:
            user, password = self.sasl_credentials(source)
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if sec.sasl.mechanism == "PLAIN"
                      else "org.apache.kafka.common.security.scram.ScramLoginModule")
            opts["kafka.sasl.mechanism"] = sec.sasl.mechanism
            opts["kafka.sasl.jaas.config"] = (
                f'{module} required username="{jaas_quote(user)}" password="{jaas_quote(password)}";')
        tls = contract.kafka_tls(self.spec, source)
        if tls.ca is not None:
            opts["kafka.ssl.truststore.type"] = "PEM"
            opts["kafka.ssl.truststore.location"] = secret_file_path(tls.ca)
        if tls.client_cert is not None and tls.client_key is not None:
            opts["kafka.ssl.keystore.type"] = "PEM"
            opts["kafka.ssl.keystore.certificate.chain"] = read_secret_file(tls.client_cert)
            opts["kafka.ssl.keystore.key"] = read_pkcs8_key(tls.client_key)
        return opts

    def librdkafka_options(self, source: models.Source) -> dict[str, str]:
        """The same connection settings for confluent-kafka (offset commits, dead letters, warm-up reads)."""
        sec = source.kafka.security
        opts = {"bootstrap.servers": source.kafka.bootstrap_servers, "security.protocol": sec.protocol}
        if sec.sasl is not None:
            opts["sasl.mechanism"] = sec.sasl.mechanism
            opts["sasl.username"], opts["sasl.password"] = self.sasl_credentials(source)
        tls = contract.kafka_tls(self.spec, source)
        if tls.ca is not None:
            opts["ssl.ca.location"] = secret_file_path(tls.ca)
        elif sec.protocol in models.TLS_PROTOCOLS:
            opts["ssl.ca.location"] = "probe"  # the system CAs, wherever this image keeps them
        if tls.client_cert is not None and tls.client_key is not None:
            opts["ssl.certificate.location"] = secret_file_path(tls.client_cert)
            opts["ssl.key.location"] = secret_file_path(tls.client_key)
        return opts

    @staticmethod
    def sasl_credentials(source: models.Source) -> tuple[str, str]:
        """(user name, password) of a source's SASL login, from the env vars the render sets."""
        return (os.environ.get(contract.kafka_env(source.name, "username"), ""),
                os.environ.get(contract.kafka_env(source.name, "password"), ""))

    def secret_values(self) -> list[str]:
        """The passwords this job holds: what ``redact`` takes out of any message before it is printed."""
        names = [contract.ENV_CLICKHOUSE_PASSWORD, *(contract.kafka_env(s.name, "password") for s in self.spec.sources)]
        return [v for v in (os.environ.get(n, "") for n in names) if v]

    @property
    def clickhouse_credentials(self) -> tuple[str, str]:
        return (os.environ.get(contract.ENV_CLICKHOUSE_USER, "default"),
                os.environ.get(contract.ENV_CLICKHOUSE_PASSWORD, ""))

    @property
    def clickhouse_ca_file(self) -> str | None:
        """The CA bundle the render mounted for the sink, if any."""
        ca = contract.clickhouse_ca(self.spec)
        return None if ca is None else secret_file_path(ca)

    @property
    def spark_conf(self) -> dict[str, str]:
        """Settings of the job's SparkSession (the render passes the same through sparkConf)."""
        return contract.spark_conf(self.spec)


def load_job_config(raw: str | dict[str, Any]) -> JobConfig:
    """Read the rendered config (contract.read_job_config) and validate its spec deeply (the operator did too)."""
    doc = contract.read_job_config(raw)
    spec, columns = validate_spec(doc.spec)
    return JobConfig(namespace=doc.namespace, pipeline=doc.pipeline, replica=doc.replica, replicas=doc.replicas,
                     spec=spec, columns=columns)


def config_from_resource(doc: dict[str, Any], replica: int = 0, replicas: int | None = None) -> dict[str, Any]:
    """The config a replica of a GlassPipeline document gets, as the operator would render it (``glasspipe
    run``); ``replicas`` overrides the spec's."""
    spec, _ = validate_spec(doc["spec"])
    meta = doc.get("metadata") or {}
    return contract.write_job_config(meta.get("namespace", "default"), meta["name"], spec, replica, replicas)
