"""Print the PR gate's requirements, one `PRESET@LABEL [PARAM OP VALUE ...]` a line, from
.github/kakeya-required.yml.

    python .github/scripts/required.py [FILE] [--presets DIR] [--request-args]

With --presets, every entry must name a preset in DIR that may run on LABEL, and every pin one of its
parameters (`kakeya gate pr` checks the rest: operators, types, values). With --request-args, print instead
the `kakeya request` arguments that would provide each entry (`PRESET --runner LABEL -p NAME=VALUE ...`, a
value that meets each pin). Exit 2 with one line saying what is wrong when the file is not a valid list.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class Invalid(Exception):
    """The requirements file is not a valid list of PRESET@LABEL entries."""


PIN = r"[a-z][a-z0-9_]{0,62}(?:==|>=|<=|>|<)\S+"  # as bridge/core/names.py
ENTRY = re.compile(rf"^[a-z][a-z0-9-]{{0,62}}@[a-z0-9][a-z0-9_-]{{0,62}}(?: +{PIN})*$")
PIN_PARTS = re.compile(r"^([a-z][a-z0-9_]{0,62})(==|>=|<=|>|<)(\S+)$")
DEFAULT = Path(__file__).resolve().parent.parent / "kakeya-required.yml"


class Required(BaseModel):
    model_config = ConfigDict(extra="forbid")
    required: list[str] = Field(default_factory=list)

    @field_validator("required")
    @classmethod
    def _entries(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not ENTRY.match(entry):
                raise ValueError(
                    f"{entry!r} must look like PRESET@LABEL [PARAM OP VALUE ...], e.g. probe@cpu or "
                    "'niah-ladder@h200 samples>=5'"
                )
        if len(set(entries)) != len(entries):
            raise ValueError("an entry is listed twice")
        return entries


def load(path: Path) -> list[str]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return Required.model_validate(data).required
    except (OSError, yaml.YAMLError) as exc:
        raise Invalid(f"{path}: cannot read YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise Invalid(f"{path}: {problems}") from None


def split(entry: str) -> tuple[str, str, list[tuple[str, str, str]]]:
    """(preset, label, [(param, op, value), ...]) of a valid entry."""
    head, *pins = entry.split()
    name, label = head.split("@")
    return name, label, [PIN_PARTS.match(p).groups() for p in pins]  # type: ignore[union-attr]


def check_presets(entries: list[str], presets: Path) -> None:
    for entry in entries:
        name, label, pins = split(entry)
        path = presets / f"{name}.yaml"
        if not path.is_file():
            raise Invalid(f"{entry}: there is no preset {name} ({path})")
        data = yaml.safe_load(path.read_text()) or {}
        runners = data.get("runners") or []
        if label not in runners:
            raise Invalid(f"{entry}: preset {name} runs on {', '.join(runners)}, not {label}")
        for param, _, _ in pins:
            if param not in (data.get("params") or {}):
                raise Invalid(f"{entry}: preset {name} has no parameter {param}")


def request_args(entry: str, presets: Path) -> str:
    """`PRESET --runner LABEL -p NAME=VALUE ...` for `kakeya request`: one value per pinned parameter that
    meets its first pin (> and < on an integer step by one; on a float the bound itself is shown)."""
    name, label, pins = split(entry)
    path = presets / f"{name}.yaml"
    params = (yaml.safe_load(path.read_text()) or {}).get("params") or {} if path.is_file() else {}
    out = [name, "--runner", label]
    seen = set()
    for param, op, value in pins:
        if param in seen:
            continue
        seen.add(param)
        if op in (">", "<") and (params.get(param) or {}).get("type") in ("int", "int_list"):
            value = str(int(value) + (1 if op == ">" else -1))
        out += ["-p", f"{param}={value}"]
    return " ".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument(
        "--presets", type=Path, help="check every entry against the presets in this directory"
    )
    parser.add_argument(
        "--request-args",
        action="store_true",
        help="print the `kakeya request` arguments that would provide each entry",
    )
    args = parser.parse_args(argv)
    try:
        entries = load(args.file)
        if args.presets:
            check_presets(entries, args.presets)
    except Invalid as exc:
        print(f"required.py: {exc}", file=sys.stderr)
        return 2
    presets = args.presets or args.file.resolve().parent.parent / "presets"
    for entry in entries:
        print(request_args(entry, presets) if args.request_args else entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
