"""The chart's static parts agree with the code: dashboard metrics exist, values match their schema.

No I/O beyond reading the chart's files; the metric names come from the real metric definitions
(operator and job), expanded the way prometheus_client exposes them (_total, _bucket, _sum, _count).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from glasspipe.controller import metrics as operator_metrics
from glasspipe_job.metrics import JobMetrics

pytestmark = pytest.mark.unit

CHART = Path(__file__).resolve().parents[2] / "charts" / "glasspipe"
DASHBOARD = json.loads((CHART / "dashboards" / "glasspipe.json").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SERIES = re.compile(r"\bglasspipe_[a-z0-9_]+\b")


def exposed(family_name: str, kind: str) -> set[str]:
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}[kind]
    return {family_name + s for s in suffixes}


def real_series() -> set[str]:
    names: set[str] = set()
    job = JobMetrics("p", 0, registry=CollectorRegistry())
    for family in job.registry.collect():
        names |= exposed(family.name, family.type)
    for obj in vars(operator_metrics).values():
        if isinstance(obj, MetricWrapperBase):
            for family in obj.describe():
                names |= exposed(family.name, family.type)
    return names


def queries(node: Any) -> list[str]:
    """Every PromQL text in the dashboard: panel targets and template variable queries."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                out.append(v)
            elif k == "query" and isinstance(v, dict) and isinstance(v.get("query"), str):
                out.append(v["query"])
            else:
                out.extend(queries(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(queries(v))
    return out


def test_dashboard_references_only_real_metrics() -> None:
    real = real_series()
    used = {name for q in queries(DASHBOARD) for name in SERIES.findall(q)}
    assert used, "the dashboard has no glasspipe queries"
    assert used <= real, f"not exposed by any glasspipe metric: {sorted(used - real)}"


def test_dashboard_shows_what_an_operator_needs() -> None:
    used = {name for q in queries(DASHBOARD) for name in SERIES.findall(q)}
    for name in ("glasspipe_rows_written_total", "glasspipe_duplicates_dropped_total",
                 "glasspipe_dead_letters_by_reason_total", "glasspipe_consumer_lag", "glasspipe_state_disk_bytes",
                 "glasspipe_state_memory_bytes",
                 "glasspipe_batch_duration_seconds_bucket", "glasspipe_pipeline_ready_replicas",
                 "glasspipe_operator_reconciles_total", "glasspipe_end_to_end_latency_seconds_bucket",
                 "glasspipe_event_time_lag_seconds_bucket", "glasspipe_last_committed_event_time_seconds"):
        assert name in used, name
    reasons = [q for q in queries(DASHBOARD) if "glasspipe_dead_letters_by_reason_total" in q]
    assert all("reason" in q.split("(")[1] for q in reasons), "dead letters must be split by reason"


def test_dashboard_ids_unique_and_panels_have_targets() -> None:
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert all(p["targets"] for p in panels if p["type"] != "row")


def check_against_schema(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """A structural check (types, closed objects, enums) enough to catch drift between the two files."""
    errors: list[str] = []
    kind = schema.get("type")
    types: dict[str, type | tuple[type, ...]] = {
        "object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}
    if (kind and not isinstance(value, types[kind])) or (kind in ("integer", "number") and isinstance(value, bool)):
        return [f"{path}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                errors += check_against_schema(v, props[k], f"{path}.{k}")
            elif extra is False:
                errors.append(f"{path}.{k}: not in values.schema.json")
            elif isinstance(extra, dict):
                errors += check_against_schema(v, extra, f"{path}.{k}")
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
    return errors


def test_values_match_schema_both_ways() -> None:
    assert check_against_schema(VALUES, SCHEMA, "values") == []
    # Every schema property has a default in values.yaml, so `helm show values` documents it.
    missing = [k for k in SCHEMA["properties"] if k not in VALUES]
    assert missing == []


def test_schema_check_catches_drift() -> None:
    bad = {**VALUES, "metrics": {"port": "8080", "service": True}, "unknown": 1}
    errors = check_against_schema(bad, SCHEMA, "values")
    assert any("metrics.port" in e for e in errors) and any("unknown" in e for e in errors)


def test_dashboard_template_ships_the_file() -> None:
    template = (CHART / "templates" / "grafana-dashboard.yaml").read_text()
    assert '.Files.Get "dashboards/glasspipe.json"' in template


def test_dead_letter_series_carry_the_reason_the_dashboard_groups_by() -> None:
    job = JobMetrics("sms-dedup", 1, registry=CollectorRegistry())
    for reason in ("malformed_json", "missing_key", "malformed_json"):
        job.count_dead_letter(reason)
    samples = {(s.labels["reason"], s.value) for f in job.registry.collect() for s in f.samples
               if s.name == "glasspipe_dead_letters_by_reason_total"}
    assert samples == {("malformed_json", 2.0), ("missing_key", 1.0)}
    assert job.totals.per_reason == {"malformed_json": 2, "missing_key": 1}


def test_chart_s_default_spark_image_is_the_one_the_code_defaults_to() -> None:
    """The chart passes spark.image to the operator (--spark-image); by default the same image as without it."""
    from glasspipe.contract import DEFAULT_SPARK_IMAGE

    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = VALUES["spark"]["image"]
    assert f"{image['repository']}:{image['tag'] or app_version}" == DEFAULT_SPARK_IMAGE
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert "- --spark-image={{ .Values.spark.image.repository }}:" in deployment
