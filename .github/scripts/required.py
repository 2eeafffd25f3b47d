"""Print the PR gate's requirements, one PRESET@LABEL a line, from .github/kakeya-required.yml.

    python .github/scripts/required.py [FILE] [--presets DIR]

With --presets, every entry must name a preset in DIR that may run on LABEL. Exit 2 with one line
saying what is wrong when the file is not a valid list.
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


ENTRY = re.compile(r"^[a-z][a-z0-9-]{0,62}@[a-z0-9][a-z0-9_-]{0,62}$")
DEFAULT = Path(__file__).resolve().parent.parent / "kakeya-required.yml"


class Required(BaseModel):
    model_config = ConfigDict(extra="forbid")
    required: list[str] = Field(default_factory=list)

    @field_validator("required")
    @classmethod
    def _entries(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            if not ENTRY.match(entry):
                raise ValueError(f"{entry!r} must look like PRESET@LABEL, e.g. probe@cpu")
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


def check_presets(entries: list[str], presets: Path) -> None:
    for entry in entries:
        name, label = entry.split("@")
        path = presets / f"{name}.yaml"
        if not path.is_file():
            raise Invalid(f"{entry}: there is no preset {name} ({path})")
        runners = (yaml.safe_load(path.read_text()) or {}).get("runners") or []
        if label not in runners:
            raise Invalid(f"{entry}: preset {name} runs on {', '.join(runners)}, not {label}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument(
        "--presets", type=Path, help="check every entry against the presets in this directory"
    )
    args = parser.parse_args(argv)
    try:
        entries = load(args.file)
        if args.presets:
            check_presets(entries, args.presets)
    except Invalid as exc:
        print(f"required.py: {exc}", file=sys.stderr)
        return 2
    for entry in entries:
        print(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
