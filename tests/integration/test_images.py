"""The container images, run for real with podman: the operator image answers and validates the
examples as a non-root user; the Spark image has everything the operator's render points at, and its
driver entrypoint runs the job against the local Kafka and ClickHouse with exactly the right rows."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from fixtures_images import REPO, Image, podman, removed_container
from glasspipe import contract
from glasspipe.api.validation import validate_resource
from glasspipe.contract import JOB_MAIN, default_consumer_group
from glasspipe.render import SPARK_VERSION, render_spark_applications
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.kube import KubeAPIServer
from glasspipe_dev.pipelines import dumps, group_lag, load_example, produce
from glasspipe_dev.process import free_port
from operator_harness import running_operator

pytestmark = pytest.mark.integration
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)


def docker_ref(name: str) -> str:
    """What a container runtime pulls for an image name (`glasspipe/x:1` is `docker.io/glasspipe/x:1`)."""
    first = name.split("/")[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    return name if "." in first or ":" in first or first == "localhost" else f"docker.io/{name}"


def chart_operator_image() -> tuple[str, int]:
    """The chart's default operator image and the uid its Deployment runs it as."""
    chart = REPO / "charts" / "glasspipe"
    values = yaml.safe_load((chart / "values.yaml").read_text())
    app_version = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    uid = re.search(r"runAsUser:\s*(\d+)", (chart / "templates" / "deployment.yaml").read_text())
    assert uid is not None, "the chart's Deployment sets no runAsUser"
    return f"{values['image']['repository']}:{values['image']['tag'] or app_version}", int(uid.group(1))


def test_operator_image_runs_the_operator_as_the_charts_non_root_user(operator_image: Image) -> None:
    image, chart_uid = chart_operator_image()
    assert docker_ref(image) == operator_image.ref
    help_text = operator_image.run("--help").stdout
    assert help_text.startswith("usage: glasspipe-operator") and "--metrics-port" in help_text, help_text
    uid, gid = operator_image.sh("id -u; id -g").split()
    assert uid != "0" and int(uid) == chart_uid, (uid, chart_uid)
    assert gid != "0"
    # no Spark, no JVM in the operator image
    probe = operator_image.sh("python -c 'import importlib.util as u; print(u.find_spec(\"pyspark\"))'; "
                              "command -v java || echo no-java")
    assert probe.split() == ["None", "no-java"], probe


def test_operator_image_validates_every_example_inside_it(operator_image: Image) -> None:
    inside = operator_image.sh("ls /opt/glasspipe/examples").split()
    assert inside == EXAMPLES
    done = operator_image.run("validate", *(f"/opt/glasspipe/examples/{n}" for n in EXAMPLES), entrypoint="glasspipe")
    lines = done.stdout.splitlines()
    assert len(lines) == len(EXAMPLES) and all(line.endswith(": valid") for line in lines), done.stdout
    # and it would say so if one were not
    broken = operator_image.run("-c", "sed 's/window: 5m/window: 5 minutes/' /opt/glasspipe/examples/sms-dedup.yaml"
                                " | glasspipe validate -", entrypoint="bash", check=False)
    assert broken.returncode == 1 and "window" in broken.stderr, broken


def test_operator_image_says_in_one_line_that_glasspipe_run_needs_the_spark_extra(operator_image: Image) -> None:
    """``run`` is the job's command, plugged into the CLI by an entry point: the operator image has the job's code
    but not pyspark, so the command is listed and says what is missing instead of a traceback."""
    listed = operator_image.run("--help", entrypoint="glasspipe").stdout
    assert "{validate,render,crd,run}" in listed, listed
    done = operator_image.run("run", "/opt/glasspipe/examples/sms-dedup.yaml", entrypoint="glasspipe", check=False)
    assert done.returncode == 2, done
    assert done.stderr.startswith("glasspipe run needs the Spark extra: pip install 'glasspipe[spark]'"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def test_operator_image_reconciles_an_example_as_the_chart_runs_it(
    operator_image: Image, kube: KubeAPIServer, tmp_path: Path
) -> None:
    """The image as the chart's Deployment runs it (its uid, a read-only root file system) with the
    chart's ServiceAccount and RBAC, on the host network against the real API server: an example gets
    the SparkApplication the render gives and a status."""
    _, uid = chart_operator_image()
    container = f"gp-operator-{uuid.uuid4().hex[:8]}"

    def command(kubeconfig: Path) -> list[str]:
        return operator_image.run_argv(
            network="host", name=container, user=f"{uid}:{uid}", read_only=True,
            volumes=[f"{kubeconfig}:/etc/glasspipe/kubeconfig:ro"], env={"KUBECONFIG": "/etc/glasspipe/kubeconfig"})

    with removed_container(container), running_operator(kube, tmp_path / "operator.log", command) as op:
        ns = op.new_namespace()
        doc = load_example("sms-dedup.yaml")
        doc["metadata"] = {"name": "sms", "namespace": ns}
        op.k("apply", "-f", "-", input=json.dumps(doc))
        app = op.wait_apps(ns, ["sms-0"], timeout=90)["sms-0"]
        created = op.pipeline(ns, "sms")
        spec, _ = validate_resource(created)
        want = render_spark_applications(ns, "sms", created["metadata"]["uid"], spec)[0]
        assert app["spec"] == want["spec"]
        op.wait_condition(ns, "sms", "Progressing", "True", "ReplicasStarting", timeout=60)
        op.set_state(ns, "sms-0", "RUNNING")  # what spark-operator would write
        op.wait_condition(ns, "sms", "Ready", "True", "AllReplicasRunning", timeout=60)
        assert "glasspipe_operator_reconciles_total" in op.metrics()


def render_example(name: str, **spec_changes: Any) -> dict[str, Any]:
    doc = load_example(name)
    doc["spec"].update(spec_changes)
    spec, _ = validate_resource(doc)
    apps = render_spark_applications("default", doc["metadata"]["name"], "uid-1", spec)
    assert len(apps) == spec.replicas
    return apps[0]


def local_paths(obj: Any) -> set[str]:
    """Every local:// URI anywhere in a rendered object, as a path in the image."""
    if isinstance(obj, dict):
        return set().union(*(local_paths(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(local_paths(v) for v in obj)) if obj else set()
    if isinstance(obj, str):
        return {m for m in re.findall(r"local://(/[^,\s\"]+)", obj)}
    return set()


@pytest.mark.parametrize("example", EXAMPLES)
def test_spark_image_has_what_the_render_points_at(spark_image: Image, example: str) -> None:
    app = render_example(example)
    spec = app["spec"]
    assert docker_ref(spec["image"]) == spark_image.ref  # the CRD's default image is this image
    assert docker_ref(contract.DEFAULT_SPARK_IMAGE) == spark_image.ref
    paths = local_paths(app)  # the main file today; jars or py files if the render ever lists some
    assert spec["mainApplicationFile"] == JOB_MAIN and JOB_MAIN.removeprefix("local://") in paths, paths
    listing = spark_image.sh(
        "set -e; for p in " + " ".join(sorted(paths)) + "; do test -f $p && echo found $p; done; "
        "java -version 2>&1 | head -1; "
        "spark-submit --version 2>&1 | grep -o 'version [0-9.]*' | head -1; "
        "ls /opt/spark/jars | grep -E '^(spark-sql-kafka|kafka-clients|glasspipe-spark-ops)'; "
        "python -c 'import zipfile; print(\"WindowDedup\", \"io/glasspipe/spark/WindowDedup.class\" in "
        "zipfile.ZipFile(\"/opt/spark/jars/glasspipe-spark-ops.jar\").namelist())'; "
        "python -c 'import pyspark, glasspipe_job; print(\"pyspark\", pyspark.__version__)'; id -u")
    lines = listing.splitlines()
    assert [f"found {p}" for p in sorted(paths)] == lines[:len(paths)], listing
    assert re.match(r'(openjdk|java) version "17\.', lines[len(paths)]), listing
    assert f"version {spec['sparkVersion']}" in lines and spec["sparkVersion"] == SPARK_VERSION, listing
    assert f"spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar" in lines and "glasspipe-spark-ops.jar" in lines, listing
    assert any(line.startswith("kafka-clients-") for line in lines), listing
    assert "WindowDedup True" in lines and f"pyspark {SPARK_VERSION}" in lines, listing
    assert lines[-1] != "0", "the Spark image runs as root"


def test_spark_image_executor_entrypoint_starts_the_kubernetes_executor_backend(spark_image: Image) -> None:
    """`executor` with the variables Spark sets on an executor pod: the backend starts and dials the
    driver URL it is given (no driver here, so it fails there, after classpath and arguments)."""
    env = {"SPARK_EXECUTOR_MEMORY": "512m", "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:9",
           "SPARK_EXECUTOR_ID": "1", "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": "spark-test",
           "SPARK_EXECUTOR_POD_IP": "127.0.0.1", "SPARK_EXECUTOR_POD_NAME": "test-exec-1",
           "SPARK_RESOURCE_PROFILE_ID": "0", "SPARK_JAVA_OPT_0": "-Dspark.driver.port=9", "SPARK_LOCAL_IP": "127.0.0.1"}
    done = spark_image.run("executor", env=env, check=False, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "KubernetesExecutorBackend: Started daemon" in out and "Failed to connect to /127.0.0.1:9" in out, out


@pytest.mark.parametrize("extra_conf", [None, "log4j2.properties"])
def test_spark_image_driver_maps_the_cds_archive_unless_its_conf_folder_holds_more_than_spark_properties(
    spark_image: Image, tmp_path: Path, extra_conf: str | None
) -> None:
    """A driver pod's conf folder holds only the spark.properties Spark mounts: the driver JVM takes the image's
    empty conf folder and the class-data-sharing archive dumped for that classpath (``-Xshare:on`` fails the JVM
    if it cannot map it). Another file there (a log4j2.properties) keeps Spark's own classpath, without it."""
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark.properties").write_text("spark.master=local[1]\n")
    if extra_conf:
        (conf_dir / extra_conf).write_text("# a user's file\n")
    opts = "-Xshare:on" if extra_conf is None else "-Xshare:auto"
    done = spark_image.run(
        "driver", "--properties-file", "/opt/spark/conf/spark.properties", "--version",
        volumes=[f"{conf_dir}:/opt/spark/conf:ro"],
        env={"SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1", "SPARK_CONF_DIR": "/opt/spark/conf",
             "SPARK_PRINT_LAUNCH_COMMAND": "1", "SPARK_SUBMIT_OPTS": opts}, timeout=120)
    out = done.stdout + done.stderr
    command = next(line for line in out.splitlines() if line.startswith("Spark Command:"))
    assert f"version {SPARK_VERSION}" in out, out
    if extra_conf is None:
        assert "glasspipe: the driver JVM maps the class-data-sharing archive" in out, out
        assert " -cp /opt/glasspipe/cds/conf/:" in command, command
        assert "-XX:SharedArchiveFile=/opt/glasspipe/cds/driver.jsa -Xshare:on" in command, command
    else:
        assert (f"glasspipe: the driver JVM starts without the class-data-sharing archive: "
                f"/opt/spark/conf/{extra_conf} is on the classpath") in out, out
        assert " -cp /opt/spark/conf/:" in command and "SharedArchiveFile" not in command, command


def sms(sms_id: str, status: str, at: datetime) -> tuple[bytes, bytes]:
    doc = {"sms_id": sms_id, "status": status, "phone": "+100", "meta": {"provider": "p"}, "sent_at": at.isoformat()}
    return sms_id.encode(), dumps(doc)


def wait_for(what: str, check: Any, timeout: float, container_log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}; driver log tail:\n{container_log.read_text()[-8000:]}")


def test_spark_image_driver_runs_the_job_exactly_once(
    spark_image: Image, kafka: KafkaServer, clickhouse: ClickHouseServer, tmp_path: Path
) -> None:
    """The driver pod's command (entrypoint `driver`, spark.properties in /opt/spark/conf, the render's
    main file and arguments) in local[2] mode, host network: 400 events, 100 duplicates, 300 rows."""
    suffix = uuid.uuid4().hex[:8]
    name, topic, table = f"img-{suffix}", f"img-{suffix}", f"img_{suffix}"
    kafka.create_topic(topic, 2)
    kafka.create_topic(f"{topic}-dlq", 1)
    doc = load_example("sms-dedup.yaml")
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["sources"][0]["kafka"].update(bootstrapServers=kafka.bootstrap, topic=topic)
    spec["sink"]["clickhouse"].update(hosts=[f"127.0.0.1:{clickhouse.port}"], table=table)
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    spec["checkpoint"]["location"] = f"file:///checkpoints/{name}"
    parsed, _ = validate_resource(doc)
    app = render_spark_applications("default", name, "uid-1", parsed)[0]["spec"]

    rng = random.Random(11)
    records = [sms(f"id-{i:04d}", "first", T0 + timedelta(seconds=i)) for i in range(300)]
    for _ in range(100):  # repeats 1-120 s later: inside the 5 m window
        i = rng.randrange(300)
        records.append(sms(f"id-{i:04d}", "repeat", T0 + timedelta(seconds=i + rng.randint(1, 120))))
    assert produce(kafka.bootstrap, topic, records) == 400

    conf_dir, checkpoints = tmp_path / "conf", tmp_path / "checkpoints"
    conf_dir.mkdir()
    checkpoints.mkdir()
    checkpoints.chmod(0o777)  # the image's user (185) writes the checkpoint
    properties = {**app["sparkConf"], "spark.master": "local[2]", "spark.app.name": name,
                  "spark.submit.deployMode": "client", "spark.driver.memory": "1g", "spark.ui.enabled": "false"}
    (conf_dir / "spark.properties").write_text("".join(f"{k}={v}\n" for k, v in sorted(properties.items())))
    container = f"gp-test-{suffix}"
    argv = spark_image.run_argv(
        "driver", "--properties-file", "/opt/spark/conf/spark.properties",
        "--class", "org.apache.spark.deploy.PythonRunner", app["mainApplicationFile"],
        *app["arguments"], "--metrics-port", str(free_port()),
        network="host", name=container,
        volumes=[f"{conf_dir}:/opt/spark/conf:ro", f"{checkpoints}:/checkpoints"],
        env={"SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1", "SPARK_LOCAL_IP": "127.0.0.1",
             "SPARK_CONF_DIR": "/opt/spark/conf",
             "SPARK_SUBMIT_OPTS": "-Xlog:class+load=info:file=/checkpoints/class-load.log"})
    log = tmp_path / "driver.log"
    ch = clickhouse.client()
    group = default_consumer_group("default", name)

    def landed() -> bool:
        try:
            rows = ch.execute(f"SELECT count() FROM {table}")[0][0]
        except Exception:  # the job creates the table when it starts
            return False
        lag = group_lag(kafka.bootstrap, group, topic)
        return rows >= 300 and len(lag) == 2 and all(c == end for c, end in lag.values())

    started = time.monotonic()
    with removed_container(container), log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for("300 rows and the group's offsets at the end", lambda: proc.poll() is not None or landed(),
                     420, log)
            assert proc.poll() is None, f"the driver exited ({proc.returncode}):\n{log.read_text()[-8000:]}"
            elapsed = time.monotonic() - started
            time.sleep(6)  # a few more micro-batch triggers (maxDelay 2s): nothing more may land
            rows, distinct, repeats = ch.execute(
                f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0]
            lag = group_lag(kafka.bootstrap, group, topic)
        finally:
            podman("stop", "--time", "20", container, check=False, timeout=60)
            proc.wait(timeout=60)
    print(f"image job: {rows} rows ({distinct} distinct, {repeats} repeats) in {elapsed:.0f} s; offsets {lag}")
    assert (rows, distinct, repeats) == (300, 300, 0)
    assert sum(end for _, end in lag.values()) == 400 and all(c == end for c, end in lag.values()), lag
    text = log.read_text()
    assert "Traceback" not in text, text[-8000:]
    # podman stop's SIGTERM reached the job's Python (the entrypoint), which stopped between batches
    assert "stopping the query between micro-batches" in text, text[-8000:]
    assert json.loads(app["arguments"][1])["pipeline"] == name
    # the driver JVM mapped Spark's classes from the image's class-data-sharing archive
    loaded = (checkpoints / "class-load.log").read_text()
    assert "org.apache.spark.SparkContext source: shared objects file" in loaded, loaded[-3000:]
    print(f"image job: {loaded.count('source: shared objects file')} classes mapped from the CDS archive, "
          f"{loaded.count('source: jar:') + loaded.count('source: file:')} loaded from jars")


_CONTAINER_OWNER = """
import subprocess, sys, time
from fixtures_images import SPARK_REF, Image, podman, removed_container

with removed_container(sys.argv[1]) as name:
    run = subprocess.Popen(Image(SPARK_REF).run_argv("-c", "sleep 600", entrypoint="bash", name=name))
    while podman("container", "inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip() != "true":
        assert run.poll() is None, f"podman run exited {run.returncode}"
        time.sleep(0.2)
    print(run.pid, flush=True)
    time.sleep(600)
"""


def test_a_killed_test_runs_container_is_removed(spark_image: Image) -> None:
    """A container that runs on (the operator's, the driver's) is removed when the process that started it is
    SIGKILLed: podman's conmon keeps it running without its ``podman run``, so glasspipe_dev.reaper runs
    ``podman rm`` (tests/fixtures_images.removed_container)."""
    name = f"gp-reaped-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "dev"),
                                                        os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", _CONTAINER_OWNER, name], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert owner.stdout is not None
        run_pid = int(owner.stdout.readline() or 0)
        assert run_pid, f"the owner exited {owner.wait(timeout=10)} before its container ran"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 90
        while podman("container", "exists", name, check=False).returncode == 0:
            assert time.monotonic() < deadline, f"container {name} still there 90 s after its owner was killed"
            time.sleep(0.5)
    finally:
        if owner.poll() is None:
            owner.kill()
        podman("rm", "--force", "--ignore", "--time", "0", name, check=False)


def test_a_container_run_that_times_out_is_removed(spark_image: Image) -> None:
    """``Image.run`` past its timeout kills ``podman run``, and conmon keeps the container running on its own: the
    run names it and removes it at the end."""
    marker = f"600.{uuid.uuid4().int % 10**6}"  # a sleep of its own, to find the container by its command

    def ours() -> list[str]:
        listed = podman("ps", "--all", "--no-trunc", "--format", "{{.Names}} {{.Command}}").stdout.splitlines()
        return [line for line in listed if marker in line]

    with pytest.raises(subprocess.TimeoutExpired):
        spark_image.run("-c", f"sleep {marker}", entrypoint="bash", timeout=8)
    assert not ours(), "the timed-out run's container is still there"
