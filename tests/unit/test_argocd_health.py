"""Argo CD's health check for GlassPipeline, run over every case of its health_test.yaml.

Argo CD evaluates health.lua with gopher-lua (Lua 5.1); lupa's lua51 module embeds the reference
Lua 5.1, so the script is run here with the same language level, with ``obj`` set as Argo CD sets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import lua51

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "charts" / "argocd" / "resource_customizations" / "glasspipe.io" / "GlassPipeline"
SCRIPT = (HERE / "health.lua").read_text()
pytestmark = pytest.mark.unit

CASES: list[dict[str, Any]] = yaml.safe_load((HERE / "health_test.yaml").read_text())["tests"]


def run_health(obj: dict[str, Any]) -> dict[str, Any]:
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT)
    return {k: result[k] for k in ("status", "message") if result[k] is not None}


def test_every_testdata_file_is_a_case() -> None:
    listed = {c["inputPath"] for c in CASES}
    on_disk = {f"testdata/{p.name}" for p in (HERE / "testdata").glob("*.yaml")}
    assert listed == on_disk
    assert {c["healthStatus"]["status"] for c in CASES} == {"Healthy", "Progressing", "Degraded", "Suspended"}


@pytest.mark.parametrize("case", CASES, ids=[c["inputPath"] for c in CASES])
def test_health_case(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((HERE / case["inputPath"]).read_text())
    assert run_health(obj) == case["healthStatus"]


def test_healthy_needs_the_current_generation() -> None:
    obj = yaml.safe_load((HERE / "testdata" / "healthy_allRunning.yaml").read_text())
    obj["metadata"]["generation"] += 1
    assert run_health(obj)["status"] == "Progressing"
