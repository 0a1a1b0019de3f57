"""A throw-away single-node Kafka (KRaft, broker and controller in one JVM) on free loopback ports.

The jars come from Maven Central via dev/install/kafka.sh. Settings aim at a fast start and a small
footprint on a 2-core machine shared with Spark, ClickHouse and the API server: 512 MiB heap, every
internal topic with replication factor 1 and few partitions, no initial rebalance delay.

stop() and start() can be called again and again: the ports, the cluster id and the data folder stay
the same, so tests can take Kafka away mid-run and bring it back with its topics and offsets intact.
"""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from glasspipe_dev.paths import NotInstalledError, cache_dir, java_binary
from glasspipe_dev.process import RestartableServer, ServerProcess, free_ports, log_tail, port_open

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

# Must agree with dev/install/kafka.sh (GP_KAFKA_VERSION there overrides both).
KAFKA_VERSION = "4.3.1"
INSTALL_HINT = "run `bash dev/install/kafka.sh` (fetches the Kafka broker jars from Maven Central with mvn)"

# Broker settings for tests. Internal topics: replication factor 1 (one node) and few partitions
# (each partition is a log segment + index files and a leader to elect at start).
_BASE_CONFIG: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "share.coordinator.state.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    # After a kill the controller must time out the dead broker's session before the new one registers: a start
    # after a SIGKILL took 4.7-4.9 s with 3 s here, 11.9 s with Kafka's 9 s. A broker starved to 0.02 cores
    # (a cgroup quota) was fenced by its own controller ("event queue overloaded") with either; at 0.03 with neither.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "1000",
    # Threads and buffers sized for 2 cores and a 512 MiB heap (the cleaner's default buffer is 128 MiB).
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    # Tests create their topics explicitly (with a partition count); a typo should fail, not auto-create.
    "auto.create.topics.enable": "false",
    "delete.topic.enable": "true",
}

_JVM_OPTS = [
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseSerialGC",  # one GC thread: the machine has 2 cores for everything
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
]
# C1 only: ~2x faster start, and test traffic is small. A benchmark's broker (``long_running``) keeps C2, as a
# production broker does: under C1 it spent ~0.26 cores at 25 000 events/s.
_TEST_JIT = ["-XX:TieredStopAtLevel=1"]


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """The cache folder with libs/ and log4j2.properties; NotInstalledError if the install is missing."""
    home = cache_dir() / "kafka" / version
    if not (home / ".installed").is_file() or not (home / "libs" / f"kafka_2.13-{version}.jar").is_file():
        raise NotInstalledError(f"Kafka {version} jars not found in {home}: {INSTALL_HINT}")
    return home


def random_cluster_id() -> str:
    """What `StorageTool random-uuid` prints (a Kafka Uuid: url-safe base64 of 16 random bytes).

    Done in Python to save one JVM start (~1 s here); Kafka rejects ids that start with '-'.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


class KafkaServer(RestartableServer):
    """One Kafka KRaft node (broker + controller) as a child JVM with its own data and log folder."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        version: str = KAFKA_VERSION,
        config: Mapping[str, str] | None = None,
        start_timeout: float = 90.0,
        host: str = "127.0.0.1",
        long_running: bool = False,
    ) -> None:
        """``host``: the address to listen on and advertise (the node's, for pods of glasspipe_dev.cluster).
        ``long_running``: the JIT of a broker that runs for long (benchmarks), not the quick start of a test's."""
        self.host = host
        self.jvm_opts = _JVM_OPTS if long_running else [*_JVM_OPTS, *_TEST_JIT]
        self.home = kafka_home(version)
        self.java = java_binary()
        self.version = version
        self._set_workdir(workdir, "gp-kafka-")
        self.data_dir = self.workdir / "data"
        self.log_dir = self.workdir / "log"
        self.config_path = self.workdir / "server.properties"
        self.gc_log = self.log_dir / "gc.log"
        self.port, self.controller_port = free_ports(2)
        self.cluster_id = random_cluster_id()
        self.extra_config = dict(config or {})
        self.start_timeout = start_timeout
        self.last_start_seconds: float | None = None
        self.format_seconds: float | None = None
        self._formatted = False
        self._process: ServerProcess | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The `bootstrap.servers` value for clients (also Spark's `kafka.bootstrap.servers`)."""
        return f"{self.host}:{self.port}"

    def _classpath(self) -> str:
        return str(self.home / "libs" / "*")

    def _java(self, main: str, *args: str, opts: Sequence[str] = ()) -> list[str]:
        return [
            str(self.java),
            *self.jvm_opts,
            *opts,
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.log_dir}",
            "-cp",
            self._classpath(),
            main,
            *args,
        ]

    def _write_config(self) -> None:
        props = {
            **_BASE_CONFIG,
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "log.dirs": str(self.data_dir),
            **self.extra_config,
        }
        self.config_path.write_text(
            "# Written by glasspipe_dev.kafka for one test broker; not for production.\n"
            + "".join(f"{k}={v}\n" for k, v in props.items())
        )

    def _format(self) -> None:
        """`StorageTool format` writes meta.properties with the cluster id: once per data folder."""
        argv = self._java("kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(self.config_path),
                          *self._format_args())
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.workdir)
        if result.returncode != 0:
            raise RuntimeError(
                f"kafka StorageTool format failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        self._formatted = True

    def _format_args(self) -> list[str]:
        """Extra StorageTool format arguments (SecureKafkaServer adds its SCRAM users)."""
        return []

    def start(self) -> KafkaServer:
        """Start (or start again after stop()/kill()) on the same ports and data; wait for metadata."""
        if self.running():
            return self
        began = time.monotonic()
        for d in (self.data_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._write_config()
        meta = self.data_dir / "meta.properties"
        if not self._formatted and meta.is_file():  # a workdir formatted by an earlier KafkaServer
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    self.cluster_id = line.split("=", 1)[1].strip()
                    self._formatted = True
        if not self._formatted:
            t0 = time.monotonic()
            self._format()
            self.format_seconds = time.monotonic() - t0
        for port in (self.port, self.controller_port):
            self._wait_port_free(port)
        self._process = ServerProcess(
            "kafka",
            # A line per collection, as Kafka's own start script logs them: a failed test can show a broker's pauses.
            self._java("kafka.Kafka", str(self.config_path),
                       opts=[f"-Xlog:gc:file={self.gc_log}:uptime,time:filecount=2,filesize=4m"]),
            self.log_dir / "stdout.log",
            cwd=self.workdir,
        ).start()
        self._process.wait_ready(self._ready, self.start_timeout, f"(bootstrap {self.bootstrap})")
        self.last_start_seconds = time.monotonic() - began
        return self

    def _ready(self) -> bool:
        if not port_open(self.port, self.host):  # librdkafka logs every refused connection
            return False
        metadata = self.admin().list_topics(timeout=2)
        return bool(metadata.brokers) and 1 in metadata.brokers

    # -- clients -----------------------------------------------------------------------------

    def client_config(self, **extra: str | int | float | bool) -> dict[str, str | int | float | bool]:
        """A confluent-kafka config dict pointing at this broker."""
        return {"bootstrap.servers": self.bootstrap, **extra}

    def admin(self) -> AdminClient:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_config())

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create a topic and wait until every partition has a leader (so producers never see
        UNKNOWN_TOPIC_OR_PART right after)."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=dict(config or {}))],
            operation_timeout=timeout,
        )
        futures[name].result(timeout=timeout)
        self._wait_for_leaders(admin, name, partitions, timeout)

    def add_partitions(self, name: str, total: int, timeout: float = 30.0) -> None:
        """Grow a topic to ``total`` partitions and wait until the broker serves every one: a producer that
        asks for the topic's metadata just after the controller took the change can still be told the old
        count, and its records for a new partition then fail as an unknown partition."""
        from confluent_kafka.admin import NewPartitions

        admin = self.admin()
        admin.create_partitions([NewPartitions(name, total)], operation_timeout=timeout)[name].result(timeout=timeout)
        self._wait_for_leaders(admin, name, total, timeout)

    @staticmethod
    def _wait_for_leaders(admin: AdminClient, name: str, partitions: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            topic = admin.list_topics(topic=name, timeout=5).topics.get(name)
            if (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            ):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {name} has no leader for every one of {partitions} partitions after "
                                   f"{timeout:.0f} s")
            time.sleep(0.1)

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        self.admin().delete_topics([name], operation_timeout=timeout)[name].result(timeout=timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the broker's log, then of its GC log (a long pause shows there, not in the log)."""
        gc = log_tail(self.gc_log, 8) if self.gc_log.is_file() else ""
        return log_tail(self.log_dir / "stdout.log", lines) + (f"\n-- {self.gc_log.name}:\n{gc}" if gc else "")
