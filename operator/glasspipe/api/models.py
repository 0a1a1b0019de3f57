"""The GlassPipeline API (glasspipe.io/v1alpha1) as pydantic models.

These models are the single source of truth: ``glasspipe.api.crd`` generates the CRD's OpenAPI schema
(with its defaults and CEL rules) from them, and tests check that ``crds/`` and the Helm chart hold
exactly that render. Field names are camelCase on the wire, snake_case in Python.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from glasspipe.api.durations import DURATION_PATTERN, cel_duration_ms, parse_duration_ms

GROUP = "glasspipe.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "GlassPipeline"
PLURAL = "glasspipelines"
SINGULAR = "glasspipeline"
SHORT_NAMES = ["gp"]

MAX_DEDUP_WINDOW = "30d"
MAX_JOIN_WINDOW = "7d"

# Field types of a source's JSON schema. Nested values are reached by ``path``; decimals carry their
# precision and scale: decimal(18,4).
FIELD_TYPE_PATTERN = r"^(string|int|long|float|double|boolean|timestamp|date|decimal\([0-9]{1,2},[0-9]{1,2}\))$"
# A Kubernetes-style DNS label, used for source, field and column names that end up in Spark and SQL.
NAME_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
SOURCE_NAME_PATTERN = r"^[a-z]([a-z0-9_]*[a-z0-9])?$"


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """``x-kubernetes-validations`` entries: (CEL rule, message)."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def _map_list(*keys: str) -> dict[str, Any]:
    """A list whose items are identified by ``keys`` (unique, and correlatable for transition rules)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def _immutable(what: str) -> dict[str, Any]:
    return _rules(("self == oldSelf", f"{what} is immutable: it shapes the checkpointed state; "
                                      "create a new GlassPipeline (new name and checkpoint) to change it"))


def _bounded_duration(field: str, maximum: str, what: str) -> tuple[str, str]:
    return (
        f"{cel_duration_ms('self.' + field)} > 0 && "
        f"{cel_duration_ms('self.' + field)} <= {cel_duration_ms(repr(maximum))}",
        f"{what} must be greater than 0 and at most {maximum}",
    )


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=12)]
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields rejected (the API server prunes them; we say so)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


# ---------------------------------------------------------------- references to Secrets (never inline)

# What Kubernetes accepts as a Secret's name (a DNS subdomain) and as a key of its data.
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"


class SecretKeyRef(ApiModel):
    """One key of a Secret in the pipeline's namespace. The operator only references it: the value reaches
    the Spark pods as an env var or a mounted file and is never copied into what the operator writes."""

    name: str = Field(
        pattern=SECRET_NAME_PATTERN, max_length=253, description="Secret name (same namespace as the GlassPipeline)."
    )
    key: str = Field(pattern=SECRET_KEY_PATTERN, max_length=253, description="Key inside the Secret.")


# ---------------------------------------------------------------------------------------- sources

SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


class KafkaSasl(ApiModel):
    """SASL authentication: mechanism, and user name and password from Secrets."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        description="SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    )
    username_secret_ref: SecretKeyRef = Field(description="Secret key holding the SASL user name.")
    password_secret_ref: SecretKeyRef = Field(description="Secret key holding the SASL password.")


class KafkaTls(ApiModel):
    """TLS settings: which CA to trust and, for mutual TLS, the client certificate and its key."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("has(self.clientCertSecretRef) == has(self.clientKeySecretRef)",
             "tls.clientCertSecretRef and tls.clientKeySecretRef go together (mutual TLS): give both or neither"),
        )
    )

    ca_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key with the PEM CA bundle the brokers' certificates are verified with. "
        "Default: the image's system CAs."
    )
    client_cert_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key with the PEM client certificate (chain), for brokers that require mutual "
        "TLS (ssl.client.auth=required). With clientKeySecretRef."
    )
    client_key_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key with the client certificate's private key: unencrypted PKCS#8 PEM "
        "(-----BEGIN PRIVATE KEY-----), as Kafka's Java client wants it. With clientCertSecretRef."
    )


class KafkaSecurity(ApiModel):
    """How to reach a secured Kafka; credentials only by Secret reference."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!self.protocol.startsWith('SASL') || has(self.sasl)",
             "security.protocol SASL_PLAINTEXT and SASL_SSL need security.sasl (mechanism, usernameSecretRef, "
             "passwordSecretRef)"),
            ("self.protocol.startsWith('SASL') || !has(self.sasl)",
             "security.sasl is only used with protocol SASL_PLAINTEXT or SASL_SSL: set the protocol or remove sasl"),
            ("self.protocol.endsWith('SSL') || !has(self.tls)",
             "security.tls is only used with protocol SSL or SASL_SSL: set the protocol or remove tls"),
        )
    )

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security.protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl: KafkaSasl | None = Field(None, description="SASL settings, with protocol SASL_PLAINTEXT or SASL_SSL.")
    tls: KafkaTls | None = Field(
        None, description="TLS settings, with protocol SSL or SASL_SSL. Default: verify against the system CAs."
    )


# Without kafka.maxOffsetsPerTrigger a micro-batch is bounded by the driver's memory (derived_max_offsets_per_trigger):
# at most one record per DRIVER_BYTES_PER_RECORD bytes of the driver JVM's max heap, split among the sources,
# and within [MIN_DERIVED_OFFSETS, MAX_DERIVED_OFFSETS]. The sink takes a batch to the driver one Spark partition
# at a time (a Kafka range is split into SPLITS_PER_BATCH partitions): a record may use up to ~8 KiB of the heap
# between Spark's copies of a partition before a batch of this size runs out of memory.
DRIVER_BYTES_PER_RECORD = 8 * 1024
MIN_DERIVED_OFFSETS = 1_000
MAX_DERIVED_OFFSETS = 1_000_000
SPLITS_PER_BATCH = 8


def derived_max_offsets_per_trigger(driver_heap_bytes: int, sources: int = 1) -> int:
    """Records per micro-batch, replica and source when kafka.maxOffsetsPerTrigger is not set: the driver's max
    heap / 8 KiB / number of sources, clamped to [1,000, 1,000,000] (1g -> 131,072; 512m -> ~58,000)."""
    per_source = driver_heap_bytes // DRIVER_BYTES_PER_RECORD // max(sources, 1)
    return max(MIN_DERIVED_OFFSETS, min(MAX_DERIVED_OFFSETS, per_source))


def records_per_partition(max_offsets_per_trigger: int) -> int:
    """Spark's ``maxRecordsPerPartition`` for a batch bound: a batch reaches the driver one Spark partition at a
    time, so no partition holds more than an eighth of the batch (whatever the topic's partition count)."""
    return max(1, -(-max_offsets_per_trigger // SPLITS_PER_BATCH))


def records_per_shuffled_read_task(batch_records: int, shuffle_partitions: int) -> int:
    """Spark's ``maxRecordsPerPartition`` for a source whose rows are hashed by key after the read (a join,
    Spark's deduplication): a shuffle partition's share of a full batch (``batch_records``, all sources' bounds)
    and a tenth. An even topic's ranges stay whole (a split is a task more); a hot Kafka partition's range is
    split, so that the other cores read it too instead of waiting. The tenth is slack for an even topic's ranges,
    never quite equal; more would leave a whole batch on one partition in fewer tasks than shuffle partitions
    (Spark's minPartitions rounds 3 equal ranges to 3 tasks for 4 partitions, for example)."""
    return max(1, -(-11 * batch_records // (10 * max(shuffle_partitions, 1))))


class KafkaSource(ApiModel):
    """Where a source's records come from."""

    bootstrap_servers: str = Field(
        min_length=1, max_length=1024, description="Comma-separated host:port list of Kafka brokers."
    )
    topic: str = Field(pattern=r"^[a-zA-Z0-9._-]+$", max_length=249, description="Topic to read.")
    starting_offsets: Literal["earliest", "latest"] = Field(
        "earliest",
        description="Where a new pipeline starts reading a partition its consumer group has no committed offset "
        "for: earliest, at the partition's first record; latest, at the first record appended after the replica "
        "started. A partition added to the topic after the pipeline first started is read from its first record "
        "either way, as Spark reads the partitions it discovers.",
    )
    max_offsets_per_trigger: int | None = Field(
        None, ge=1, le=100_000_000,
        description="Upper bound on records read per micro-batch, per replica (back-pressure). Default: derived "
        "from the driver's memory, the driver JVM's max heap (spark.driver.memory) / 8 KiB / number of sources, "
        "between 1,000 and 1,000,000 (1g: 131,072 records). A pipeline that starts far behind catches up in "
        "batches of this size; the sink takes a batch to the driver one Spark partition (at most an eighth of "
        "the batch) at a time and writes it in chunks of batching.maxRows. Set it for records wider than ~2 KiB "
        "(lower) or for more throughput per batch with a larger driver (higher).",
    )
    consumer_group: str | None = Field(
        None,
        max_length=249,
        description="Consumer group that glasspipe commits processed offsets to. "
        "Default: glasspipe.<namespace>.<name>.",
    )
    security: KafkaSecurity = Field(default_factory=lambda: KafkaSecurity(), description="Security settings.")


class SchemaField(ApiModel):
    """One field of the JSON payload."""

    name: Name = Field(description="Field name used by filter, keys and column mappings.")
    path: str | None = Field(
        None,
        max_length=512,
        pattern=r"^[a-zA-Z0-9_$-]+(\.[a-zA-Z0-9_$-]+)*$",
        description="Dotted path of the value in the JSON document (e.g. meta.sms.id). Default: the name.",
    )
    type: str = Field(
        pattern=FIELD_TYPE_PATTERN,
        max_length=24,
        description="string, int, long, float, double, boolean, timestamp, date or decimal(P,S).",
    )
    nullable: bool = Field(
        True,
        description="If false, a record where the field is missing or null goes to the dead-letter topic.",
    )


class PayloadSchema(ApiModel):
    """The JSON schema of a source's record values."""

    fields: list[SchemaField] = Field(
        min_length=1, max_length=256, json_schema_extra=_map_list("name"),
        description="Declared fields; other JSON members are ignored.",
    )


class EventTime(ApiModel):
    """Which time windows are measured on."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.source != 'field' || has(self.field)", "eventTime.source 'field' needs eventTime.field"),
            ("self.source == 'field' || !has(self.field)",
             "eventTime.field is only used with eventTime.source 'field'"),
            _bounded_duration("allowedLateness", "7d", "eventTime.allowedLateness"),
            _bounded_duration("maxFutureSkew", "7d", "eventTime.maxFutureSkew"),
        )
    )

    source: Literal["kafkaTimestamp", "field"] = Field(
        "kafkaTimestamp", description="kafkaTimestamp (the record's timestamp) or field (a payload field)."
    )
    field: Name | None = Field(None, description="Declared field holding the event time, with source 'field'.")
    format: Literal["iso8601", "epochMillis", "epochSeconds"] = Field(
        "iso8601",
        description="How the field encodes time, with source 'field' and a string or long field.",
    )
    allowed_lateness: Duration = Field(
        "1m",
        description="Watermark delay: how far behind the newest event time a record may arrive and still "
        "be deduplicated or joined. Later records are dead-lettered with reason 'late'.",
    )
    max_future_skew: Duration = Field(
        "1h",
        description="With source 'field': a record whose event time is further ahead of its Kafka timestamp "
        "is dead-lettered with reason 'event_time_in_future' instead of moving the watermark for good.",
    )


class Deduplication(ApiModel):
    """Drop repeats of a key within a window of event time."""

    model_config = ConfigDict(
        json_schema_extra=_rules(_bounded_duration("window", MAX_DEDUP_WINDOW, "deduplication.window"))
    )

    keys: list[Name] = Field(
        min_length=1, max_length=8, json_schema_extra=_immutable("deduplication.keys"),
        description="Fields that together identify a record; the first occurrence wins.",
    )
    window: Duration = Field(description=f"How long a key is remembered, in event time (max {MAX_DEDUP_WINDOW}).")
    per_kafka_partition: bool = Field(
        False,
        description="Deduplicate within each Kafka partition, in the first stage (no shuffle, about half the CPU "
        "an event): exact only when every record of a key is in one partition, as when the producer keys records "
        "by the deduplication keys. Within a partition the first record to arrive wins. Not with a join.",
    )
    own_state: bool = Field(
        False,
        description="Deduplicate in glasspipe's own state after the shuffle by key, instead of Spark's "
        "transformWithState: exact on any topic, 8-26 % less CPU an event, and it keeps up where Spark's "
        "engine falls behind once keys expire. Within a micro-batch a key's "
        "records are taken in event-time order. A record written because it lies more than a window before its "
        "key's first one is remembered too. Changing it rebuilds the state from the topic. On a join's side "
        "too.",
    )


class Source(ApiModel):
    """One Kafka topic with its schema, filter and deduplication."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!has(self.deduplication) || self.deduplication.keys.all(k, self.schema.fields.exists(f, f.name == k))",
             "deduplication.keys must name fields declared in schema.fields"),
            ("!has(self.eventTime) || !has(self.eventTime.field) || "
             "self.schema.fields.exists(f, f.name == self.eventTime.field)",
             "eventTime.field must name a field declared in schema.fields"),
        )
    )

    name: str = Field(pattern=SOURCE_NAME_PATTERN, max_length=40, description="Source name, unique in the pipeline.")
    kafka: KafkaSource
    schema_: PayloadSchema = Field(alias="schema", description="Fields of the JSON value.")
    event_time: EventTime = Field(default_factory=lambda: EventTime(), description="Event time of each record.")
    filter: str | None = Field(
        None, max_length=4096,
        description="Spark SQL boolean expression over the declared fields; records are kept where it is true.",
    )
    deduplication: Deduplication | None = Field(None, description="Optional deduplication by key.")

    def field(self, name: str) -> SchemaField | None:
        return next((f for f in self.schema_.fields if f.name == name), None)


# ------------------------------------------------------------------------------------------- join


class JoinSide(ApiModel):
    source: str = Field(pattern=SOURCE_NAME_PATTERN, max_length=40, description="Name of a source.")
    keys: list[Name] = Field(min_length=1, max_length=8, description="Fields of that source to match on.")


class Join(ApiModel):
    """Temporal join of the two sources by key."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("size(self.left.keys) == size(self.right.keys)",
             "join.left.keys and join.right.keys must have the same length"),
            ("self.left.source != self.right.source", "join.left.source and join.right.source must differ"),
            _bounded_duration("window", MAX_JOIN_WINDOW, "join.window"),
        )
    )

    type: Literal["inner", "left"] = Field(
        "inner", description="inner, or left (unmatched left rows emitted with NULLs).")
    left: JoinSide
    right: JoinSide
    window: Duration = Field(description=f"Records match when |t_left - t_right| <= window (max {MAX_JOIN_WINDOW}).")


# ------------------------------------------------------------------------------------------- sink

CLICKHOUSE_TYPE_PATTERN = (
    r"^(LowCardinality\()?(Nullable\()?"
    r"(String|FixedString\([0-9]+\)|UUID|U?Int(8|16|32|64)|Float(32|64)|Bool|Date|DateTime|DateTime64\([0-9]\)"
    r"|Decimal\([0-9]{1,2}, ?[0-9]{1,2}\))\)?\)?$"
)


class Column(ApiModel):
    """One ClickHouse column and where its value comes from."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!(has(self.from) && has(self.expression))", "give either from or expression, not both"),
        )
    )

    name: Name = Field(description="ClickHouse column name.")
    from_: str | None = Field(
        None, alias="from", max_length=128, pattern=r"^([a-z][a-z0-9_]*\.)?[a-zA-Z_][a-zA-Z0-9_]*$",
        description="Field to copy (source.field with a join where the name is in both). Default: the column name.",
    )
    expression: str | None = Field(None, max_length=4096, description="Spark SQL expression over the fields.")
    type: str | None = Field(
        None, max_length=64, pattern=CLICKHOUSE_TYPE_PATTERN,
        description="ClickHouse type, e.g. String, Int64, Nullable(Float64), DateTime. Default: from the field's type.",
    )


class Batching(ApiModel):
    max_rows: int = Field(100_000, ge=1, le=10_000_000, description="Most rows in one INSERT.")
    max_delay: Duration = Field(
        "5s", description="Micro-batch interval: the longest a record waits before it is written."
    )


# How long a DELETE the sink issued may wait for ClickHouse (sink.clickhouse.mutationTimeout): at least a
# second (a poll and a backoff step; less would stop on every healthy delete), at most a day (a stuck
# mutation has to reach someone; a day covers rewriting the largest parts).
DEFAULT_MUTATION_TIMEOUT = "15m"
MIN_MUTATION_TIMEOUT = "1s"
MAX_MUTATION_TIMEOUT = "24h"


class ClickHouseSink(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("self.secure || !has(self.caSecretRef)",
             "sink.clickhouse.caSecretRef is only used with secure: true: set secure or remove caSecretRef"),
            (f"{cel_duration_ms('self.mutationTimeout')} >= {cel_duration_ms(repr(MIN_MUTATION_TIMEOUT))} && "
             f"{cel_duration_ms('self.mutationTimeout')} <= {cel_duration_ms(repr(MAX_MUTATION_TIMEOUT))}",
             f"sink.clickhouse.mutationTimeout must be at least {MIN_MUTATION_TIMEOUT} and at most "
             f"{MAX_MUTATION_TIMEOUT} (default {DEFAULT_MUTATION_TIMEOUT})"),
        )
    )

    hosts: list[Annotated[str, Field(pattern=r"^[a-zA-Z0-9.-]+(:[0-9]{1,5})?$", max_length=260)]] = Field(
        min_length=1, max_length=16,
        description="host or host:port of the native protocol (default port 9000, 9440 with secure).",
    )
    secure: bool = Field(False, description="TLS on the secure native port; the server's certificate is verified.")
    ca_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key with the PEM CA bundle the server's certificate is verified with, with "
        "secure. Default: the image's system CAs."
    )
    database: str = Field("default", max_length=128, pattern=NAME_PATTERN)
    table: str = Field(max_length=128, pattern=NAME_PATTERN)
    user_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key holding the ClickHouse user name. Default: user 'default'."
    )
    password_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret key holding the user's password. Default: no password."
    )
    create_table: bool = Field(False, description="Create the table (MergeTree) if it does not exist.")
    order_by: list[Name] | None = Field(
        None, max_length=8, description="ORDER BY of a created table (no Nullable column). Default: the deduplication "
        "keys when none of their columns is Nullable, else the first column that is not Nullable."
    )
    columns: list[Column] | None = Field(
        None, max_length=512, json_schema_extra=_map_list("name"),
        description="Output columns. Default: every declared field, with its default ClickHouse type.",
    )
    batching: Batching = Field(default_factory=lambda: Batching())
    mutation_timeout: Duration = Field(
        DEFAULT_MUTATION_TIMEOUT,
        description="How long the sink waits for a DELETE it issued on the table (removing a crashed write's "
        "partial chunks, rolling back an abandoned batch) before the replica stops with MutationStuck, naming "
        "the table's unfinished mutations. ClickHouse runs a table's mutations in order, so one that cannot "
        f"finish blocks ours. Between {MIN_MUTATION_TIMEOUT} and {MAX_MUTATION_TIMEOUT}; raise it when deletes "
        "on big parts are only slow.",
    )


class Sink(ApiModel):
    clickhouse: ClickHouseSink


class DeadLetter(ApiModel):
    """Where records that cannot be processed go, with the reason and their original bytes."""

    topic: str = Field(pattern=r"^[a-zA-Z0-9._-]+$", max_length=249)
    bootstrap_servers: str | None = Field(
        None, max_length=1024, description="Brokers of the dead-letter topic. Default: the first source's. "
        "Either way the dead-letter producer uses the first source's security settings."
    )


class Checkpoint(ApiModel):
    location: str = Field(
        min_length=1, max_length=1024, json_schema_extra=_immutable("checkpoint.location"),
        description="Durable folder URI (s3a://, hdfs://, or file:// on a shared volume) for offsets and state.",
    )


class Resources(ApiModel):
    cores: int = Field(1, ge=1, le=64)
    memory: str = Field("1g", pattern=r"^[0-9]+[kmgt]$", max_length=12, description="JVM heap, e.g. 1g, 512m.")


class ExecutorResources(Resources):
    instances: int = Field(1, ge=1, le=1000)
    memory: str = Field("2g", pattern=r"^[0-9]+[kmgt]$", max_length=12, description="JVM heap, e.g. 2g.")


class SparkSettings(ApiModel):
    image: str | None = Field(
        None, min_length=1, max_length=512,
        description="Image with Spark and the glasspipe job; default: the operator's --spark-image (chart value "
                    "spark.image, glasspipe/spark:<chart appVersion>).")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent")
    service_account: str = Field(
        "spark-operator-spark", max_length=253, description="ServiceAccount of the driver (spark-operator's chart)."
    )
    driver: Resources = Field(default_factory=lambda: Resources())
    executor: ExecutorResources = Field(default_factory=lambda: ExecutorResources())
    shuffle_partitions: int = Field(
        2, ge=1, le=10_000,
        json_schema_extra=_immutable("spark.shufflePartitions"),
        description="State-store partitions (Spark's spark.sql.shuffle.partitions); fixed when the checkpoint is "
        "created. A micro-batch's stateful stage runs one task per partition, each with a fixed cost: set it to "
        "the cores of one replica's executors (2 fits a 2-core machine); scale beyond with replicas.",
    )
    conf: dict[str, str] = Field(
        default_factory=dict, json_schema_extra={"maxProperties": 128}, description="Extra Spark configuration."
    )


# ------------------------------------------------------------------------------------------- spec


class GlassPipelineSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("size(self.sources) == 1 || has(self.join)", "two sources need a join; one source needs none"),
            ("!has(self.join) || size(self.sources) == 2", "a join needs exactly two sources"),
            ("!has(self.join) || (self.sources.exists(s, s.name == self.join.left.source) && "
             "self.sources.exists(s, s.name == self.join.right.source))",
             "join.left.source and join.right.source must name the two sources"),
            ("!has(self.join) || self.sources.all(s, s.name != self.join.left.source || "
             "self.join.left.keys.all(k, s.schema.fields.exists(f, f.name == k)))",
             "join.left.keys must name fields declared in the left source's schema"),
            ("!has(self.join) || self.sources.all(s, s.name != self.join.right.source || "
             "self.join.right.keys.all(k, s.schema.fields.exists(f, f.name == k)))",
             "join.right.keys must name fields declared in the right source's schema"),
            ("!has(self.join) || self.sources.all(s, !has(s.deduplication) || "
             "!has(s.deduplication.perKafkaPartition) || !s.deduplication.perKafkaPartition)",
             "deduplication.perKafkaPartition is not for a joined source: remove it or the join"),
            ("has(self.join) == has(oldSelf.join)",
             "join cannot be added or removed: it changes the checkpointed state"),
        )
    )

    replicas: int = Field(1, ge=0, le=256, description="Parallel pipelines sharing one consumer group.")
    suspend: bool = Field(False, description="Stop the Spark applications, keeping checkpoints and offsets.")
    sources: list[Source] = Field(min_length=1, max_length=2, json_schema_extra=_map_list("name"))
    join: Join | None = None
    sink: Sink
    dead_letter: DeadLetter
    checkpoint: Checkpoint
    spark: SparkSettings = Field(default_factory=lambda: SparkSettings())

    @field_validator("sources")
    @classmethod
    def _unique_source_names(cls, v: list[Source]) -> list[Source]:
        names = [s.name for s in v]
        if len(set(names)) != len(names):
            raise ValueError("source names must be unique")
        return v

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)


# ----------------------------------------------------------------------------------------- status


class Condition(ApiModel):
    """metav1.Condition."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field("", max_length=32768)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, ge=0)


class ReplicaFreshness(ApiModel):
    """What the operator last read from the replica's driver metrics (every --freshness-interval seconds)."""

    driver_pod: str = Field(description="The driver pod whose metrics were read.")
    observed_at: str = Field(json_schema_extra={"format": "date-time"}, description="When they were read.")
    last_committed_event_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"},
        description="Newest event time among the rows this replica has committed to ClickHouse.")
    event_time_lag_seconds: float | None = Field(
        None, description="observedAt minus lastCommittedEventTime: how far behind in event time the replica's "
                          "committed rows were.")
    end_to_end_latency_p95_seconds: float | None = Field(
        None, description="p95 of Kafka append time to ClickHouse commit of the rows committed since the "
                          "previous observation (since the driver started at the first one); absent when none was.")
    error: str | None = Field(None, description="Why the driver's metrics could not be read.")


class ReplicaStatus(ApiModel):
    index: int = Field(ge=0)
    application: str
    state: str = Field("", description="spark-operator's applicationState.state.")
    partitions: str = Field("", description="Which partitions of which topics this replica reads.")
    message: str = ""
    freshness: ReplicaFreshness | None = None


class GlassPipelineStatus(ApiModel):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_map_list("type"))
    replicas: int = 0
    ready_replicas: int = 0
    selector: str = ""
    replica_statuses: list[ReplicaStatus] = Field(default_factory=list, json_schema_extra=_map_list("index"))
    event_time_lag_seconds: float | None = Field(
        None, description="The largest replicaStatuses[].freshness.eventTimeLagSeconds (kubectl get's LAG).")


def parse_spec(spec: dict[str, Any]) -> GlassPipelineSpec:
    """Validate a spec dict as the API server would have defaulted it (pydantic errors on failure)."""
    return GlassPipelineSpec.model_validate(spec)


def window_ms(duration: str) -> int:
    return parse_duration_ms(duration)
