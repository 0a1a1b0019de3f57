"""The CRD in crds/ and in the Helm chart is exactly what the models generate."""

from pathlib import Path

import pytest
import yaml

from glasspipe.api.crd import render_crd, render_crd_yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path", ["crds/glasspipe.io_glasspipelines.yaml",
                                  "charts/glasspipe/crds/glasspipe.io_glasspipelines.yaml"])
def test_checked_in_crd_matches_models(path: str) -> None:
    assert (ROOT / path).read_text() == render_crd_yaml(), f"{path} is stale: run `glasspipe crd > {path}`"


def test_crd_is_structural_and_has_subresources() -> None:
    crd = render_crd()
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    text = yaml.safe_dump(crd)
    for forbidden in ("$ref", "anyOf", "title:", "$defs"):
        assert forbidden not in text
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["replicas"]["default"] == 1
    assert spec["properties"]["sources"]["x-kubernetes-list-type"] == "map"
    # nested defaults are filled by the API server
    assert spec["properties"]["spark"]["default"] == {}


def test_every_object_declares_its_type() -> None:
    def walk(node: dict, path: str) -> None:
        if "x-kubernetes-preserve-unknown-fields" not in node:
            assert "type" in node, f"{path} has no type"
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")

    walk(render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")


def test_crd_reference_doc_is_current() -> None:
    from glasspipe.api.crd import render_crd_reference

    doc = (ROOT / "docs" / "crd-reference.md").read_text()
    assert doc == render_crd_reference(), "docs/crd-reference.md is stale: run `glasspipe crd --reference`"
    for field in ("spec.sources[].deduplication.window", "spec.sink.clickhouse.batching.maxRows", "spec.replicas"):
        assert f"| `{field}` |" in doc
