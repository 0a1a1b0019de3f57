"""Generate the GlassPipeline CustomResourceDefinition from the pydantic models.

pydantic's JSON Schema is close to what Kubernetes wants; this module inlines ``$ref``s, turns
``Optional[X]`` into X (absence means unset), keeps defaults, constraints and ``x-kubernetes-*``
extensions, and drops what a structural schema does not allow (titles, ``anyOf`` with null).
The output is deterministic so that ``crds/`` can be compared byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from glasspipe.api import models

_KEEP = {
    "type", "description", "default", "enum", "pattern", "format", "minimum", "maximum",
    "minLength", "maxLength", "minItems", "maxItems", "maxProperties", "items", "properties",
    "required", "additionalProperties",
}


# Marks an optional field while the schema is built (see _apply_object_defaults); removed before output.
_OPTIONAL = "__optional__"


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-schema node as a Kubernetes structural schema node."""
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express anyOf {node['anyOf']} structurally")
        rest = {k: v for k, v in node.items() if k not in ("anyOf", "default") or (k == "default" and v is not None)}
        optional = _structural({**branches[0], **rest}, defs)
        if "default" not in rest:
            optional[_OPTIONAL] = True  # ``X | None = None``: absent means unset, never defaulted to {}
        return optional
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            out[key] = value
        elif key == "properties":
            out["properties"] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = _structural(value, defs)
        elif key == "additionalProperties" and isinstance(value, dict):
            out["additionalProperties"] = _structural(value, defs)
        elif key == "additionalProperties":
            continue  # extra="forbid": structural schemas prune unknown fields by default
        elif key in _KEEP:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "properties" in out:
        out["type"] = "object"
    if "required" in out:
        # A required field with a default is not required of the user.
        props = out.get("properties", {})
        required = [r for r in out["required"] if "default" not in props.get(r, {})]
        if required:
            out["required"] = required
        else:
            del out["required"]
    return out


def _schema_of(model: type[models.ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs)


def openapi_schema() -> dict[str, Any]:
    """The version's openAPIV3Schema."""
    spec = _schema_of(models.GlassPipelineSpec)
    status = _schema_of(models.GlassPipelineStatus)
    _apply_object_defaults(spec)
    _strip_markers(spec)
    _strip_markers(status)
    return {
        "type": "object",
        "description": "A Kafka -> ClickHouse pipeline with deduplication and temporal joins, run on Spark.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
    }


def _strip_markers(node: Any) -> None:
    if isinstance(node, dict):
        node.pop(_OPTIONAL, None)
        for v in node.values():
            _strip_markers(v)
    elif isinstance(node, list):
        for v in node:
            _strip_markers(v)


def _apply_object_defaults(node: dict[str, Any]) -> None:
    """Objects that pydantic fills with ``default_factory`` get ``default: {}`` in the CRD.

    pydantic leaves ``default_factory`` out of the JSON Schema; without ``default: {}`` the API server
    would not default the nested fields of an omitted object, and ``kubectl get -o yaml`` would not
    show the effective settings. Optional objects (``X | None``) stay absent unless given.
    """
    for sub in node.get("properties", {}).values():
        optional = sub.get(_OPTIONAL, False)
        _apply_object_defaults(sub)
        if sub.get("type") == "object" and "default" not in sub and not sub.get("required") and not optional:
            # The API server checks a default against the object's CEL rules without defaulting inside
            # it first: an object with rules gets its fields' defaults spelled out.
            rules = "x-kubernetes-validations" in sub
            sub["default"] = {k: v["default"] for k, v in sub.get("properties", {}).items()
                              if "default" in v} if rules else {}
    if "items" in node:
        _apply_object_defaults(node["items"])


def render_crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{models.PLURAL}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": models.SHORT_NAMES,
                "categories": ["all", "glasspipe"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        {"name": "Ready", "type": "string",
                         "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                        {"name": "Running", "type": "integer", "jsonPath": ".status.readyReplicas"},
                        {"name": "Lag", "type": "number", "jsonPath": ".status.eventTimeLagSeconds",
                         "description": "Seconds the slowest replica's committed rows are behind in event time"},
                        {"name": "Topics", "type": "string", "jsonPath": ".spec.sources[*].kafka.topic"},
                        {"name": "Table", "type": "string", "jsonPath": ".spec.sink.clickhouse.table",
                         "priority": 1},
                        {"name": "Reason", "type": "string",
                         "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    """The CRD as the YAML text kept in ``crds/`` and the chart (byte-stable)."""
    header = "# Generated by `glasspipe crd` from operator/glasspipe/api/models.py. Do not edit by hand.\n"
    return header + yaml.safe_dump(render_crd(), sort_keys=False, width=120)


def _reference_rows(node: dict[str, Any], path: str, required: bool, rows: list[str]) -> None:
    kind = node.get("type", "")
    if kind == "array":
        kind = f"array of {node['items'].get('type', '')}"
    elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
        kind = f"map of {node['additionalProperties'].get('type', '')}"
    default = json.dumps(node["default"]) if "default" in node else ("required" if required else "")
    limits = []
    for key, label in (("enum", "one of"), ("pattern", "pattern"), ("minimum", "min"), ("maximum", "max"),
                       ("minItems", "min items"), ("maxItems", "max items"), ("maxLength", "max length")):
        if key in node:
            value = ", ".join(map(str, node[key])) if key == "enum" else node[key]
            limits.append(f"{label} `{value}`" if key == "pattern" else f"{label} {value}")
    for rule in node.get("x-kubernetes-validations", []):
        limits.append(rule["message"])
    desc = node.get("description", "").replace("|", "\\|")
    lim = "; ".join(limits).replace("|", "\\|")
    rows.append(f"| `{path}` | {kind} | {default} | {desc} | {lim} |")
    req = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        _reference_rows(sub, f"{path}.{name}", name in req, rows)
    if isinstance(node.get("items"), dict) and node["items"].get("properties"):
        for name, sub in node["items"]["properties"].items():
            _reference_rows(sub, f"{path}[].{name}", name in set(node["items"].get("required", [])), rows)


def render_crd_reference() -> str:
    """docs/crd-reference.md: every field of spec and status with its type, default and rules."""
    schema = openapi_schema()
    out = [
        "# GlassPipeline reference (glasspipe.io/v1alpha1)",
        "",
        "Generated by `glasspipe crd --reference` from operator/glasspipe/api/models.py; do not edit by hand.",
        "Defaults are applied by the API server (they are part of the CRD schema). Durations are a whole",
        "number and a unit: `500ms`, `30s`, `5m`, `1h`, `7d`. Rules marked in the last column are checked",
        "by the API server (CEL); `glasspipe validate` and the operator check the rest (expressions parse as",
        "Spark SQL, referenced fields exist, types convert to the ClickHouse columns).",
        "",
    ]
    for part in ("spec", "status"):
        out += [f"## {part}", "", "| field | type | default | description | rules |", "|---|---|---|---|---|"]
        rows: list[str] = []
        node = schema["properties"][part]
        for rule in node.get("x-kubernetes-validations", []):
            out.append(f"| `{part}` | object | | | {rule['message']} |")
        for name, sub in node.get("properties", {}).items():
            _reference_rows(sub, f"{part}.{name}", name in set(node.get("required", [])), rows)
        out += [*rows, ""]
    return "\n".join(out)
