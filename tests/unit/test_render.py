"""Rendering SparkApplications is pure and byte-stable."""

from pathlib import Path

import pytest
import yaml

from glasspipe.api.models import GlassPipelineSpec
from glasspipe.api.validation import validate_resource
from glasspipe.cli import main
from glasspipe.render import render_selector, render_spark_applications

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


def spec_of(name: str, **changes: object) -> GlassPipelineSpec:
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    doc["spec"].update(changes)
    return validate_resource(doc)[0]


def test_one_application_per_replica_with_owner_and_selector_labels() -> None:
    apps = render_spark_applications("team-a", "pay", "uid-1", spec_of("filter-mapping.yaml"))
    assert [a["metadata"]["name"] for a in apps] == ["pay-0", "pay-1"]
    for i, app in enumerate(apps):
        meta = app["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"][0]["uid"] == "uid-1" and meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["glasspipe.io/pipeline"] == "pay"
        assert meta["labels"]["glasspipe.io/replica"] == str(i)
    assert render_selector("pay") == "glasspipe.io/pipeline=pay"


def test_render_is_byte_stable_and_changes_only_with_the_spec() -> None:
    first = yaml.safe_dump(render_spark_applications("ns", "p", "u", spec_of("sms-dedup.yaml")))
    again = yaml.safe_dump(render_spark_applications("ns", "p", "u", spec_of("sms-dedup.yaml")))
    assert first == again
    other = spec_of("sms-dedup.yaml", spark={"image": "x:2"})
    changed = yaml.safe_dump(render_spark_applications("ns", "p", "u", other))
    assert changed != first


def test_spark_image_is_the_spec_s_else_the_operator_s() -> None:
    """spec.spark.image has no CRD default: the operator's --spark-image (chart value spark.image) applies."""
    from glasspipe import contract

    assert spec_of("sms-dedup.yaml").spark.image is None
    [app] = render_spark_applications("ns", "p", "u", spec_of("sms-dedup.yaml", replicas=1))
    assert app["spec"]["image"] == contract.DEFAULT_SPARK_IMAGE == "glasspipe/spark:0.1.0"
    [app] = render_spark_applications("ns", "p", "u", spec_of("sms-dedup.yaml", replicas=1), "reg/spark:7")
    assert app["spec"]["image"] == "reg/spark:7"
    named = spec_of("sms-dedup.yaml", replicas=1, spark={"image": "mine/spark:1"})
    assert render_spark_applications("ns", "p", "u", named, "reg/spark:7")[0]["spec"]["image"] == "mine/spark:1"


def test_suspend_renders_nothing() -> None:
    assert render_spark_applications("ns", "p", "u", spec_of("sms-dedup.yaml", suspend=True)) == []


def test_secrets_are_referenced_never_copied() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "secure-sms-dedup.yaml").read_text())
    [app] = render_spark_applications("ns", "p", "u", validate_resource(doc)[0])
    driver = app["spec"]["driver"]["template"]["spec"]
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in driver["containers"][0]["env"]}
    assert env["GLASSPIPE_CLICKHOUSE_PASSWORD"] == {"name": "clickhouse-writer", "key": "password"}
    assert env["GLASSPIPE_KAFKA_SMS_PASSWORD"] == {"name": "sms-kafka-user", "key": "password"}
    assert {v["secret"]["secretName"] for v in driver["volumes"]} == {"kafka-ca", "clickhouse-ca"}
    executor_container = {k: v for k, v in driver["containers"][0].items() if k != "ports"}  # metrics: driver only
    assert app["spec"]["executor"]["template"]["spec"] == driver | {
        "containers": [{**executor_container, "name": "spark-kubernetes-executor"}]}
    # every env var that carries a Secret value is a reference, none has a literal value
    for container in (driver, app["spec"]["executor"]["template"]["spec"]):
        assert all("value" not in e for e in container["containers"][0]["env"])


def test_cli_render_prints_plain_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(ROOT / "examples" / "filter-mapping.yaml")]) == 0
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in docs] == ["payments-settled-0", "payments-settled-1"]
    assert "&id" not in out


def test_micro_batch_bound_is_left_to_the_driver_unless_set() -> None:
    """Issue #14: without kafka.maxOffsetsPerTrigger the job derives the bound from its driver's heap
    (models.derived_max_offsets_per_trigger); a value the spec sets reaches the job as it is."""
    import json

    spec = spec_of("sms-dedup.yaml")
    app = render_spark_applications("ns", "p", "u", spec)[0]
    config = json.loads(app["spec"]["arguments"][1])
    assert "maxOffsetsPerTrigger" not in config["spec"]["sources"][0]["kafka"]
    spec.sources[0].kafka.max_offsets_per_trigger = 5000
    config = json.loads(render_spark_applications("ns", "p", "u", spec)[0]["spec"]["arguments"][1])
    assert config["spec"]["sources"][0]["kafka"]["maxOffsetsPerTrigger"] == 5000


def test_derived_micro_batch_bound_follows_the_driver_heap() -> None:
    from glasspipe.api.models import derived_max_offsets_per_trigger, records_per_partition

    assert derived_max_offsets_per_trigger(1 << 30) == 131_072
    assert derived_max_offsets_per_trigger(2 << 30) == 262_144
    assert derived_max_offsets_per_trigger(1 << 30, sources=2) == 65_536
    assert derived_max_offsets_per_trigger(1 << 20) == 1_000  # floor
    assert derived_max_offsets_per_trigger(1 << 40) == 1_000_000  # ceiling
    assert records_per_partition(131_072) == 16_384
    assert records_per_partition(7) == 1


def test_a_shuffled_sources_read_splits_only_ranges_over_a_share_of_a_batch_and_a_tenth() -> None:
    from glasspipe.api.models import records_per_shuffled_read_task

    assert records_per_shuffled_read_task(30_000, 2) == 16_500  # two even partitions of ~15 000 stay whole
    assert records_per_shuffled_read_task(2 * 30_000, 2) == 33_000  # a join's two sources: a range of 30 000 too
    assert records_per_shuffled_read_task(800, 2) == 440
    assert records_per_shuffled_read_task(131_072, 4) == 36_045  # a whole batch on one partition: 4 tasks
    assert records_per_shuffled_read_task(1, 8) == 1


def test_the_image_python_is_set_so_no_submitter_environment_reaches_the_driver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """spark-submit puts spark.pyspark.(driver.)python into the driver pod's PYSPARK_(DRIVER_)PYTHON, and
    only falls back to its own environment's when they are unset: a submitter's interpreter path (which
    once broke a run: 'Cannot run program .../venv/bin/python') must never be what a driver pod runs."""
    monkeypatch.setenv("PYSPARK_PYTHON", "/root/.cache/glasspipe/venv/bin/python")
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/root/.cache/glasspipe/venv/bin/python")
    [app] = render_spark_applications("ns", "p", "u", spec_of("sms-dedup.yaml"))
    conf = app["spec"]["sparkConf"]
    assert conf["spark.pyspark.python"] == conf["spark.pyspark.driver.python"] == "/opt/glasspipe/venv/bin/python"
    assert "/root/" not in yaml.safe_dump(app)
    # ... and it is the Python of the Spark image.
    dockerfile = (ROOT / "sparkapp" / "Dockerfile").read_text()
    assert "VIRTUAL_ENV=/opt/glasspipe/venv " in dockerfile
    assert "PYSPARK_PYTHON=/opt/glasspipe/venv/bin/python " in dockerfile
    # A custom image may keep its Python elsewhere: spec.spark.conf wins.
    custom = spec_of("sms-dedup.yaml", spark={"image": "x:2", "conf": {"spark.pyspark.python": "/usr/bin/python3"}})
    [app] = render_spark_applications("ns", "p", "u", custom)
    assert app["spec"]["sparkConf"]["spark.pyspark.python"] == "/usr/bin/python3"


def test_driver_declares_the_job_metrics_port_by_name() -> None:
    """The PodMonitor and the operator's freshness observation find the job's metrics by this port name."""
    from glasspipe import contract

    for app in render_spark_applications("ns", "p", "u", spec_of("filter-mapping.yaml")):
        [driver] = app["spec"]["driver"]["template"]["spec"]["containers"]
        assert driver["name"] == "spark-kubernetes-driver"
        assert driver["ports"] == [{"name": "metrics", "containerPort": 9108, "protocol": "TCP"}]
        assert (contract.JOB_METRICS_PORT_NAME, contract.JOB_METRICS_PORT) == ("metrics", 9108)
        # In the template, not driver.ports: that one needs spark-operator's mutating webhook.
        assert "ports" not in app["spec"]["driver"]
        [executor] = app["spec"]["executor"]["template"]["spec"]["containers"]
        assert "ports" not in executor
