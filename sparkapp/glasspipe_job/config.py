"""The job's configuration: what the operator renders into ``--config-json`` (see glasspipe.render)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms
from glasspipe.api.validation import OutputColumn, validate_spec
from glasspipe.render import ENV_CLICKHOUSE_PASSWORD, ENV_CLICKHOUSE_USER, default_consumer_group, kafka_env


@dataclass(frozen=True)
class JobConfig:
    """One replica's view of a pipeline."""

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
        return source.kafka.consumer_group or default_consumer_group(self.namespace, self.pipeline)

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
            user = os.environ.get(kafka_env(source.name, "username"), "")
            password = os.environ.get(kafka_env(source.name, "password"), "")
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if sec.sasl_mechanism == "PLAIN"
                      else "org.apache.kafka.common.security.scram.ScramLoginModule")
            opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
            opts["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
        if sec.ca_secret_ref is not None:
            opts["kafka.ssl.truststore.type"] = "PEM"
            name = f"kafka-{source.name.replace('_', '-')}-ca"
            opts["kafka.ssl.truststore.location"] = f"/etc/glasspipe/ca/{name}/{sec.ca_secret_ref.key}"
        return opts

    def librdkafka_options(self, source: models.Source) -> dict[str, str]:
        """The same connection settings for confluent-kafka (offset commits, dead letters)."""
        opts = {}
        for k, v in self.kafka_options(source).items():
            key = k.removeprefix("kafka.")
            if key in ("bootstrap.servers", "security.protocol", "sasl.mechanism"):
                opts[key] = v
        if source.kafka.security.sasl_mechanism:
            opts["sasl.username"] = os.environ.get(kafka_env(source.name, "username"), "")
            opts["sasl.password"] = os.environ.get(kafka_env(source.name, "password"), "")
        return opts

    @property
    def clickhouse_credentials(self) -> tuple[str, str]:
        return os.environ.get(ENV_CLICKHOUSE_USER, "default"), os.environ.get(ENV_CLICKHOUSE_PASSWORD, "")


def load_job_config(raw: str | dict[str, Any]) -> JobConfig:
    """Parse and deeply validate the rendered config (the operator validated it too)."""
    data = json.loads(raw) if isinstance(raw, str) else raw
    spec, columns = validate_spec({**data["spec"], "replicas": data.get("replicas", 1)})
    return JobConfig(
        namespace=data["namespace"],
        pipeline=data["pipeline"],
        replica=int(data.get("replica", 0)),
        replicas=int(data.get("replicas", 1)),
        spec=spec,
        columns=columns,
    )


def config_from_resource(doc: dict[str, Any], replica: int = 0, replicas: int | None = None) -> dict[str, Any]:
    """The config a replica of a GlassPipeline document gets (used by ``glasspipe run``)."""
    from glasspipe.render import render_job_config

    spec, _ = validate_spec(doc["spec"])
    meta = doc.get("metadata") or {}
    config = render_job_config(meta.get("namespace", "default"), meta["name"], spec, replica)
    if replicas is not None:
        config["replicas"] = replicas
    return config
