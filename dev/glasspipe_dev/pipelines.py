"""Run glasspipe pipelines as separate local Spark processes against the local servers.

A separate process per run is what production looks like (one driver per SparkApplication) and
lets tests SIGKILL a job at any moment and start it again from its checkpoint.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from glasspipe_dev.paths import REPO_ROOT
from glasspipe_dev.process import ServerProcess
from glasspipe_dev.reaper import remove_folder, temp_dir_at_exit


def load_example(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "examples" / name).read_text())


# Spark runs a stage whose generated code does not compile interpreted, with only a warning in its log: a JVM
# operator the generated code cannot reach (a class that is not public) would pass every test, at another speed.
# Every pipeline the tests, e2e and benchmarks write fails instead. Not in the job's own settings: a user's job
# keeps running.
STRICT_CODEGEN_CONF = {"spark.sql.codegen.fallback": "false"}


def write_pipeline(doc: dict[str, Any], directory: Path, name: str = "pipeline.yaml") -> Path:
    """``doc`` as YAML in ``directory``, with STRICT_CODEGEN_CONF unless its spec.spark.conf sets those keys."""
    doc = copy.deepcopy(doc)
    conf = doc["spec"].setdefault("spark", {}).setdefault("conf", {})
    for key, value in STRICT_CODEGEN_CONF.items():
        conf.setdefault(key, value)
    path = directory / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def sms_dedup_pipeline(directory: Path, name: str, topic: str, *, max_rows: int, max_delay: str = "1s",
                       max_offsets: int | None = None, seq_field: bool = False,
                       spark_conf: dict[str, str] | None = None, window: str | None = None,
                       extra_columns: list[dict[str, str]] | None = None,
                       order_by: list[str] | None = None, dedup: bool = True,
                       per_kafka_partition: bool = False, own_state: bool = False,
                       source_filter: str | None = None) -> Path:
    """examples/sms-dedup.yaml on ``topic`` into table ``name`` (dashes as underscores), dead letters to
    ``<topic>-dlq``: the pipeline the benchmarks and soak run; ``seq_field`` adds a ``seq`` long column.
    ``extra_columns``: sink columns after one per field, e.g. ``{"name": "sent_ms", "expression":
    "unix_millis(sent_at)", "type": "Int64"}`` (a ``timestamp`` field is a ``DateTime``: whole seconds).
    ``order_by``: the table's sorting key (default: the deduplication key). ``dedup=False``: the source without its
    ``deduplication`` (the CRD allows that; the plan is then stateless), for the benchmarks' baselines;
    ``per_kafka_partition``: its ``deduplication.perKafkaPartition`` (the topic must be partitioned by the key);
    ``own_state``: its ``deduplication.ownState``; ``source_filter``: the source's filter (a Spark SQL predicate)."""
    doc = load_example("sms-dedup.yaml")
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    source = spec["sources"][0]
    source["kafka"]["topic"] = topic
    if max_offsets is not None:
        source["kafka"]["maxOffsetsPerTrigger"] = max_offsets
    if seq_field:
        source["schema"]["fields"].append({"name": "seq", "type": "long", "nullable": False})
    spec["sink"]["clickhouse"]["table"] = name.replace("-", "_")
    spec["sink"]["clickhouse"]["batching"] = {"maxRows": max_rows, "maxDelay": max_delay}
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    if spark_conf:
        spec.setdefault("spark", {}).setdefault("conf", {}).update(spark_conf)
    if window is not None:
        source["deduplication"]["window"] = window
    if per_kafka_partition:
        source["deduplication"]["perKafkaPartition"] = True
    if own_state:
        source["deduplication"]["ownState"] = True
    if source_filter is not None:
        source["filter"] = source_filter
    if not dedup:
        del source["deduplication"]
    if order_by is not None:
        spec["sink"]["clickhouse"]["orderBy"] = order_by
    if extra_columns:
        spec["sink"]["clickhouse"]["columns"] = [{"name": f["name"]} for f in source["schema"]["fields"]]
        spec["sink"]["clickhouse"]["columns"] += extra_columns
    return write_pipeline(doc, directory, f"{name}.yaml")


CLI = (sys.executable, "-m", "glasspipe.cli")


def run_argv(pipeline: Path, bootstrap: str, clickhouse: str, checkpoint: Path, *extra: str,
             launcher: Sequence[str] = CLI) -> list[str]:
    """``glasspipe run`` of ``pipeline``; ``launcher``: the program that takes the CLI's arguments (e.g. a bench
    script that wraps the CLI)."""
    return [*launcher, "run", str(pipeline), "--bootstrap-servers", bootstrap,
            "--clickhouse", clickhouse, "--checkpoint", str(checkpoint), *extra]


def run_to_end(pipeline: Path, bootstrap: str, clickhouse: str, checkpoint: Path, *extra: str,
               timeout: float = 600, launcher: Sequence[str] = CLI) -> subprocess.CompletedProcess[str]:
    """Process what is in the topics now (availableNow) and stop; raise with the logs on failure."""
    argv = run_argv(pipeline, bootstrap, clickhouse, checkpoint, "--available-now", *extra, launcher=launcher)
    done = run_job(argv, timeout)
    if done.returncode != 0:
        raise RuntimeError(f"glasspipe run failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    return done


def run_job(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a job to its end with a TMPDIR of its own, removed after it: the Spark scratch a run killed on the
    timeout leaves behind goes too."""
    temp_dir = temp_dir_at_exit("gp-tmp-")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, "TMPDIR": str(temp_dir)})
    finally:
        remove_folder(temp_dir)


def start_continuous(pipeline: Path, bootstrap: str, clickhouse: str, checkpoint: Path, log: Path,
                     *extra: str, env: dict[str, str] | None = None, launcher: Sequence[str] = CLI) -> ServerProcess:
    """A long-running job (processing-time trigger) in its own process group, killable at any time; ``env`` is
    added to this process's environment."""
    return ServerProcess("glasspipe-run", run_argv(pipeline, bootstrap, clickhouse, checkpoint, *extra,
                                                   launcher=launcher), log, env=env, own_temp_dir=True).start()


def totals(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("glasspipe run:")]
    return lines[-1] if lines else ""


def total_of(summary: str, what: str) -> int:
    """The N of ``what N`` in a ``totals`` line (``rows written``, ``warm-up rows``, ...)."""
    return int(summary.split(f"{what} ")[1].split(",")[0])


def duplicates_dropped(summary: str) -> int:
    """The ``duplicates dropped N`` of a ``totals`` line."""
    return total_of(summary, "duplicates dropped")


def reporting_producer(conf: dict[str, Any]) -> tuple[Producer, list[str]]:
    """A producer that notes each record it could not deliver (and only those: a report a record would cost a
    Python call each) in the list returned beside it, for ``require_delivered``. ``flush()`` alone counts only the
    records still queued, and a failed one has left the queue: e.g. a record for a partition the broker does not
    serve yet, just after the topic grew."""
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        failed.append(f"{msg.topic()} partition {msg.partition()}: {err.str()}")

    return Producer({**conf, "delivery.report.only.error": True, "on_delivery": delivered}), failed


def require_delivered(producer: Producer, failed: list[str], n: int, timeout_s: float = 60) -> None:
    """Raise unless every one of the ``n`` records produced reached the broker within ``timeout_s``."""
    left = producer.flush(timeout_s)
    if left or failed:
        raise RuntimeError(f"{left + len(failed)} of {n} records were not delivered ({left} still queued after "
                           f"{timeout_s:.0f} s; the first failure: {failed[0] if failed else 'none'})")


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
            partition_of: Any = None, timestamp_of: Any = None) -> int:
    """Produce (key, value) records; keys go to partitions by Kafka's default hashing unless told, with the
    producer's clock as their timestamp unless ``timestamp_of(key, value)`` gives one (epoch ms). Raises unless
    the broker took every one."""
    producer, failed = reporting_producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                                           "enable.idempotence": True})
    n = 0
    for key, value in records:
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition_of is not None:
            kwargs["partition"] = partition_of(key)
        if timestamp_of is not None:
            kwargs["timestamp"] = timestamp_of(key, value)
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
    require_delivered(producer, failed, n)
    return n


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[Any]:
    """Every message of a topic from the beginning (stops at ``expected`` or after the timeout)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
        # a short grace period shows records beyond the expected count
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out


T = TypeVar("T")


def again_until(seconds: float, ask: Callable[[], T]) -> T:
    """``ask`` the broker, again after each KafkaException until ``seconds`` have passed: a group coordinator still
    loading after a broker start, or a test broker on a machine too busy to take a connection, answers a moment
    later. The last error is raised if none does."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return ask()
        except KafkaException as e:
            if time.monotonic() > deadline:
                raise
            print(f"{e}: asking the broker again", file=sys.stderr)
            time.sleep(0.2)


def group_lag(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (committed offset, end offset) for a consumer group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def read() -> dict[int, tuple[int, int]]:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        committed = consumer.committed([TopicPartition(topic, p) for p in sorted(meta.partitions)], timeout=10)
        return {tp.partition: (tp.offset, consumer.get_watermark_offsets(tp, timeout=10)[1]) for tp in committed}

    try:
        return again_until(30, read)
    finally:
        consumer.close()


def dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()
