"""Build and run one replica's streaming query: the job's side effects live here."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from glasspipe_job.batch_writer import BatchWriter, DeadLetters, select_output
from glasspipe_job.clickhouse_sink import ClickHouseSink
from glasspipe_job.config import JobConfig
from glasspipe_job.kafka_offsets import ConsumerGroup, owned_partitions
from glasspipe_job.metrics import JobMetrics, ProgressListener
from glasspipe_job.transform import deduplicate, observe_counts, parse_and_check, read_kafka, with_dead_flag

log = logging.getLogger("glasspipe.job")

# Spark settings the job relies on; the SparkApplication render sets the same (glasspipe.render).
REQUIRED_SPARK_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}


class UnsupportedPipeline(Exception):
    """The spec asks for something this job version cannot run; the message says what."""


@dataclass
class RunningPipeline:
    query: StreamingQuery
    metrics: JobMetrics
    sink: ClickHouseSink
    groups: list[ConsumerGroup]

    def close(self) -> None:
        for g in self.groups:
            g.close()
        self.sink.close()


def _checkpoint_exists(spark: SparkSession, checkpoint: str) -> bool:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/offsets")
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    return bool(fs.exists(path))


def start_pipeline(spark: SparkSession, config: JobConfig, available_now: bool = False,
                   metrics_port: int = 0) -> RunningPipeline:
    """Start the query of one replica: Kafka -> checks/filter -> dedup -> ClickHouse."""
    spec = config.spec
    if spec.join is not None:
        raise UnsupportedPipeline("spec.join: temporal joins are not supported by this job version yet")
    [source] = spec.sources
    checkpoint = config.checkpoint_dir
    group = ConsumerGroup(config.librdkafka_options(source), config.consumer_group(source))
    all_partitions = group.partitions(source.kafka.topic)
    mine = owned_partitions(all_partitions, config.replica, config.replicas)
    if not mine:
        raise UnsupportedPipeline(f"replica {config.replica} of {config.replicas} owns no partition of "
                                  f"{source.kafka.topic} ({len(all_partitions)} partitions): lower spec.replicas")
    # A new checkpoint starts where the consumer group left off (hand-over from other replicas).
    starting = None if _checkpoint_exists(spark, checkpoint) else group.starting_offsets(
        source.kafka.topic, mine, source.kafka.starting_offsets)
    assign = None if config.replicas == 1 else {source.kafka.topic: mine}
    log.info("replica %d/%d reads %s partitions %s from %s", config.replica, config.replicas,
             source.kafka.topic, mine, starting or "its checkpoint")

    raw = read_kafka(spark, config, source, assign, starting)
    parsed = observe_counts(parse_and_check(raw, source), "input_" + source.name)
    deduped = deduplicate(with_dead_flag(parsed), source)
    out = select_output(deduped, config)

    ch = spec.sink.clickhouse
    user, password = config.clickhouse_credentials
    sink = ClickHouseSink(
        hosts=list(ch.hosts), database=ch.database, table=ch.table, columns=config.columns,
        writer_id=config.writer_id, max_rows=ch.batching.max_rows, user=user, password=password,
        secure=ch.secure, ca_file=None, create_table=ch.create_table,
        order_by=ch.order_by or (list(source.deduplication.keys) if source.deduplication else None),
    )
    dl = spec.dead_letter
    dl_conf = config.librdkafka_options(source)
    if dl.bootstrap_servers:
        dl_conf = {**dl_conf, "bootstrap.servers": dl.bootstrap_servers}
    metrics = JobMetrics(config.pipeline, config.replica)
    metrics.serve(metrics_port)
    spark.streams.addListener(ProgressListener(metrics))
    writer = BatchWriter(config, sink, DeadLetters(dl_conf, dl.topic, f"{config.namespace}/{config.pipeline}"),
                         [group], metrics, checkpoint)
    stream = (out.writeStream.queryName(f"glasspipe-{config.pipeline}-{config.replica}")
              .option("checkpointLocation", checkpoint).foreachBatch(writer))
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{config.trigger_interval_ms} milliseconds")
    return RunningPipeline(stream.start(), metrics, sink, [group])


def session_conf(config: JobConfig) -> dict[str, str]:
    conf = dict(REQUIRED_SPARK_CONF)
    conf["spark.sql.shuffle.partitions"] = str(config.spec.spark.shuffle_partitions)
    conf.update(config.spec.spark.conf)
    return conf
