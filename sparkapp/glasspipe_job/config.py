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

    def kafka_options(self, source: models.Source) -> dict[str, str]:
        """``kafka.*`` client options for a source, with SASL credentials from the environment."""
        sec = source.kafka.security
        opts = {"kafka.bootstrap.servers": source.kafka.bootstrap_servers, "kafka.security.protocol": sec.protocol}
        if sec.sasl_mechanism:
            user, password = self._sasl_credentials(source)
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if sec.sasl_mechanism == "PLAIN"
                      else "org.apache.kafka.common.security.scram.ScramLoginModule")
            opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
            opts["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
        ca = contract.kafka_ca(source)
        if ca is not None:
            opts["kafka.ssl.truststore.type"] = "PEM"
            opts["kafka.ssl.truststore.location"] = ca.path
        return opts

    def librdkafka_options(self, source: models.Source) -> dict[str, str]:
        """The same connection settings for confluent-kafka (offset commits, dead letters, warm-up reads)."""
        sec = source.kafka.security
        opts = {"bootstrap.servers": source.kafka.bootstrap_servers, "security.protocol": sec.protocol}
        if sec.sasl_mechanism:
            opts["sasl.mechanism"] = sec.sasl_mechanism
            opts["sasl.username"], opts["sasl.password"] = self._sasl_credentials(source)
        ca = contract.kafka_ca(source)
        if ca is not None:
            opts["ssl.ca.location"] = ca.path
        return opts

    @staticmethod
    def _sasl_credentials(source: models.Source) -> tuple[str, str]:
        return (os.environ.get(contract.kafka_env(source.name, "username"), ""),
                os.environ.get(contract.kafka_env(source.name, "password"), ""))

    @property
    def clickhouse_credentials(self) -> tuple[str, str]:
        return (os.environ.get(contract.ENV_CLICKHOUSE_USER, "default"),
                os.environ.get(contract.ENV_CLICKHOUSE_PASSWORD, ""))

    @property
    def clickhouse_ca_file(self) -> str | None:
        """The CA bundle the render mounted for the sink, if any."""
        ca = contract.clickhouse_ca(self.spec)
        return None if ca is None else ca.path

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
