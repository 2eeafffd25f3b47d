"""Report schemas: gates/schemas/<kind>.v<N>.schema.json (JSON Schema 2020-12), all sharing envelope.schema.json."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from gates.pointer import join
from gates.report import non_finite

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
ENVELOPE = "envelope.schema.json"
_FILE = re.compile(r"^([a-z][a-z0-9_-]*)\.v([1-9][0-9]*)\.schema\.json$")


@cache
def _load() -> tuple[Registry, dict[str, dict[str, Any]]]:
    """Every schema file, keyed by file name. They ship with kakeya and tests/gates/test_schemas.py checks each
    against the 2020-12 meta-schema: checking them again at each run cost every `kakeya gate pr` and every
    runner's gate about 0.3 s of CPU."""
    schemas: dict[str, dict[str, Any]] = {}
    for path in sorted(SCHEMA_DIR.glob("*.schema.json")):
        schemas[path.name] = json.loads(path.read_text())
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    return registry, schemas


def known() -> list[tuple[str, int]]:
    """(kind, schema_version) of every report schema there is."""
    return sorted((m[1], int(m[2])) for name in _load()[1] if (m := _FILE.match(name)))


def schema_name(kind: str, version: int) -> str:
    return f"{kind}.v{version}.schema.json"


def has_schema(kind: str, version: int) -> bool:
    return schema_name(kind, version) in _load()[1]


@cache
def _validator(name: str) -> Draft202012Validator:
    registry, schemas = _load()
    return Draft202012Validator(schemas[name], registry=registry)


def _short(message: str, limit: int = 240) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


def violations(report: Any, name: str) -> list[tuple[str, str]]:
    """(JSON pointer, message) for every way `report` breaks schema file `name`, plus every non-finite number."""
    found = [
        (join([str(p) for p in e.absolute_path]), _short(e.message))
        for e in _validator(name).iter_errors(report)
    ]
    found.extend(
        (ptr, f"{value!r} is not a finite number (JSON has no NaN or Infinity)")
        for ptr, value in non_finite(report)
    )
    return sorted(found)
