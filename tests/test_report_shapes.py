"""Report shapes defined once: the workloads' pydantic report models agree with gates/schemas/*.v1.

Every field a model emits (model_dump emits them all) is allowed by the schema with a compatible type,
and every property the schema requires is a field of the model, walking nested objects, arrays and maps.
Real reports of each workload on the zoo's tiny models are validated against these schemas by
tests/engine/test_workloads.py, test_workloads_zoo.py, test_parity.py and tests/gates/test_schemas.py.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "gates" / "schemas"

# kind -> the report's top-level property -> (class in engine.workloads.<kind>, a list of them?)
PARTS: dict[str, dict[str, tuple[str, bool]]] = {
    "niah": {"config": ("Config", False), "rungs": ("Rung", True), "summary": ("Summary", False)},
    "throughput": {
        "config": ("Config", False),
        "prompts": ("Prompt", True),
        "batched": ("Batched", True),
        "summary": ("Summary", False),
    },
    "parity": {"config": ("Config", False), "runs": ("Run", True), "summary": ("Summary", False)},
    "compression": {
        "config": ("Config", False),
        "table": ("Row", True),
        "checks": ("Check", True),
        "summary": ("Summary", False),
    },
    "restoration": {
        "config": ("Config", False),
        "training": ("Training", False),
        "arms": ("Arm", True),
        "summary": ("Summary", False),
    },
    "serving": {"config": ("Config", False), "levels": ("Level", True), "summary": ("Summary", False)},
}
JSON_TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}


def _deref(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A node with its local `$ref` merged in (the keywords beside a `$ref` apply too: properties and
    required add up, the rest beside it wins)."""
    while "$ref" in node and node["$ref"].startswith("#/$defs/"):
        target, here = (
            defs[node["$ref"].removeprefix("#/$defs/")],
            {k: v for k, v in node.items() if k != "$ref"},
        )
        merged = {**target, **here}
        merged["properties"] = {**target.get("properties", {}), **here.get("properties", {})}
        merged["required"] = [*target.get("required", []), *here.get("required", [])]
        node = merged
    return node


def _types(node: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema node admits, or None when it does not say (anything goes)."""
    if "const" in node:
        values = [node["const"]]
    elif "enum" in node:
        values = node["enum"]
    elif "type" in node:
        return {node["type"]} if isinstance(node["type"], str) else set(node["type"])
    else:
        return None
    names = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}
    return {names.get(type(v), "object") for v in values}


def mismatches(model: dict, gate: dict, mdefs: dict, gdefs: dict, where: str) -> list[str]:
    """Why what `model` (a pydantic JSON schema node) can emit is not what `gate` accepts, if it is not."""
    model, gate = _deref(model, mdefs), _deref(gate, gdefs)
    if "anyOf" in model:  # an Optional or a union: every branch must be accepted
        return [m for branch in model["anyOf"] for m in mismatches(branch, gate, mdefs, gdefs, where)]
    for key in ("anyOf", "oneOf"):
        if key in gate:  # then some branch of the schema's must accept the model's node
            rest = {k: v for k, v in gate.items() if k != key}
            tries = [mismatches(model, {**rest, **b}, mdefs, gdefs, where) for b in gate[key]]
            return [] if [] in tries else min(tries, key=len)
    want, have = _types(gate), _types(model)
    if have is None:
        return (
            [] if want is None else [f"{where}: the model may emit anything, the schema wants {sorted(want)}"]
        )
    if want is not None:
        widened = want | ({"integer"} if "number" in want else set())
        if not have <= widened:
            return [f"{where}: the model emits {sorted(have)}, the schema wants {sorted(want)}"]
    out = []
    if "object" in have:
        props, extra = gate.get("properties", {}), gate.get("additionalProperties", True)
        for name, sub in model.get("properties", {}).items():
            if name in props:
                out += mismatches(sub, props[name], mdefs, gdefs, f"{where}/{name}")
            elif isinstance(extra, dict):
                out += mismatches(sub, extra, mdefs, gdefs, f"{where}/{name}")
            elif extra is False or gate.get("unevaluatedProperties") is False:
                out.append(f"{where}/{name}: the model emits it, the schema does not allow it")
        for name in gate.get("required", []):
            if name not in model.get("properties", {}) and not isinstance(
                model.get("additionalProperties"), dict
            ):
                out.append(f"{where}/{name}: the schema requires it, the model has no such field")
        values = model.get("additionalProperties")
        if isinstance(values, dict):  # a map: its values against what the schema allows for unnamed keys
            patterns = list(gate.get("patternProperties", {}).values())
            targets = [extra] if isinstance(extra, dict) else patterns
            if not targets and extra is False:
                out.append(f"{where}/*: the model emits a map, the schema allows only named keys")
            for target in targets:
                out += mismatches(values, target, mdefs, gdefs, f"{where}/*")
    if "array" in have and "items" in model and isinstance(gate.get("items"), dict):
        out += mismatches(model["items"], gate["items"], mdefs, gdefs, f"{where}/*")
    return out


def report_model(kind: str, name: str) -> type[BaseModel]:
    module = importlib.import_module(f"engine.workloads.{kind}")
    cls = getattr(module, name, None)
    assert isinstance(cls, type) and issubclass(cls, BaseModel), (
        f"engine.workloads.{kind} has no model {name}"
    )
    return cls


@pytest.mark.parametrize("kind", sorted(PARTS))
def test_workload_models_match_their_schema(kind: str) -> None:
    schema = json.loads((SCHEMAS / f"{kind}.v1.schema.json").read_text())
    gdefs = schema.get("$defs", {})
    assert set(PARTS[kind]) <= set(schema["required"])  # the parts the models build are required parts
    for prop, (name, many) in PARTS[kind].items():
        model = report_model(kind, name).model_json_schema(mode="serialization")
        gate = _deref(schema["properties"][prop], gdefs)
        if many:
            assert _types(gate) == {"array"}, f"/{prop} is a list of {name} but the schema says {gate}"
            gate = gate["items"]
        found = mismatches(model, gate, model.get("$defs", {}), gdefs, f"/{prop}" + ("/*" if many else ""))
        assert found == [], f"engine.workloads.{kind}.{name} vs {kind}.v1.schema.json:\n" + "\n".join(found)


class _Inner(BaseModel):
    ratio: float
    tag: str | None


class _Sample(BaseModel):
    count: int
    inner: list[_Inner]
    by_name: dict[str, _Inner]


_SAMPLE_SCHEMA = {
    "type": "object",
    "required": ["count", "inner", "by_name"],
    "additionalProperties": False,
    "properties": {
        "count": {"type": "integer", "minimum": 0},
        "inner": {"type": "array", "items": {"$ref": "#/$defs/inner"}},
        "by_name": {"type": "object", "additionalProperties": {"$ref": "#/$defs/inner"}},
    },
    "$defs": {
        "inner": {
            "type": "object",
            "required": ["ratio"],
            "additionalProperties": False,
            "properties": {"ratio": {"type": "number"}, "tag": {"type": ["string", "null"]}},
        }
    },
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: None, None),
        (lambda s: s["properties"].pop("count"), "/count: the model emits it, the schema does not allow it"),
        (
            lambda s: s["required"].append("wall_s"),
            "/wall_s: the schema requires it, the model has no such field",
        ),
        (lambda s: s["$defs"]["inner"]["properties"]["tag"].update(type="string"), "/inner/*/tag: the model"),
        (lambda s: s["$defs"]["inner"]["properties"].update(ratio={"type": "integer"}), "/by_name/*/ratio"),
        (lambda s: s["$defs"]["inner"]["required"].append("seen"), "/inner/*/seen: the schema requires it"),
        (lambda s: s["properties"]["by_name"].update(additionalProperties=False), "/by_name/*: the model"),
    ],
)
def test_the_shape_check_catches_a_drifted_schema(change, message) -> None:
    schema = json.loads(json.dumps(_SAMPLE_SCHEMA))
    change(schema)
    model = _Sample.model_json_schema(mode="serialization")
    found = mismatches(model, schema, model["$defs"], schema["$defs"], "")
    if message is None:
        assert found == []
    else:
        assert any(f.startswith(message) for f in found), found
