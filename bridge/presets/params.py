"""Preset parameter types: what one parameter of a preset takes, typed and bounded (`type: int`, `float`,
`bool`, `enum`, `str`, `int_list`, `path`, `model`; the policy and drafter grammars are in grammar.py), where a
runner finds the model a `model` parameter names (`models_dirs`, `resolve_model`: the one search order) and
`-p name=value` pairs (`parse_assignments`). Each type parses a CLI string or a JSON value into its typed value
(ValueError: the rule broken), renders it as one argv element and states its bounds as JSON Schema.
"""

from __future__ import annotations

import difflib
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bridge.core.errors import InvalidRequest, KakeyaError

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127})?$")
_ZOO = re.compile(r"^zoo:[a-z0-9][a-z0-9-]{0,63}$")
_PATH_PATTERN = r"^(?!(?:.*/)?\.\.(?:/|$))[^\x00-\x1f]+$"  # JSON Schema of a path: no '..' part, no controls
# Patterns are matched whole (re.fullmatch): `$` alone would let a trailing newline through.
_CONTROL = ("Cc", "Cf", "Cs", "Zl", "Zp")  # control and format characters, lone surrogates, line breaks


def _no_controls(raw: str) -> None:
    """ValueError naming the first control character of `raw` (a newline, an escape, a bidi override)."""
    for i, char in enumerate(raw):
        if unicodedata.category(char) in _CONTROL:
            raise ValueError(f"must not contain control characters (U+{ord(char):04X} at position {i})")


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    required: bool = False

    def parse(self, raw: Any) -> Any:
        """Turn a CLI string or a JSON value into the typed value, or raise ValueError (the rule broken)."""
        raise NotImplementedError

    def render(self, value: Any) -> str:
        return str(value)

    def bounds(self) -> str:
        return ""

    def json_schema(self) -> dict[str, Any]:
        """This parameter as JSON Schema: its type and real bounds (`Preset.params_schema`)."""
        schema = {**self._schema(), "description": self.description or self.bounds()}
        default = getattr(self, "default", None)
        return schema if default is None else {**schema, "default": default}

    def _schema(self) -> dict[str, Any]:
        raise NotImplementedError


def _as_int(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError("must be an integer, not a boolean")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and re.fullmatch(r"[+-]?\d{1,18}", raw.strip()):
        return int(raw.strip())
    raise ValueError("must be an integer")


class _Number(_Base):
    """A number from `min` to `max`, both included (IntParam, FloatParam)."""

    json_type: ClassVar[str]
    min: float
    max: float

    def _in_range(self, value: Any) -> Any:
        if not self.min <= value <= self.max:
            raise ValueError(f"must be between {self.min} and {self.max}")
        return value

    def bounds(self) -> str:
        return f"{self.min}..{self.max}"

    def _schema(self) -> dict[str, Any]:
        return {"type": self.json_type, "minimum": self.min, "maximum": self.max}


class IntParam(_Number):
    json_type: ClassVar[str] = "integer"
    type: Literal["int"]
    min: int
    max: int
    default: int | None = None

    def parse(self, raw: Any) -> int:
        return self._in_range(_as_int(raw))


class FloatParam(_Number):
    json_type: ClassVar[str] = "number"
    type: Literal["float"]
    default: float | None = None

    def parse(self, raw: Any) -> float:
        if isinstance(raw, bool):
            raise ValueError("must be a number, not a boolean")
        try:
            value = float(raw.strip() if isinstance(raw, str) else raw)
        except (TypeError, ValueError):
            raise ValueError("must be a number") from None
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return self._in_range(value)

    def render(self, value: Any) -> str:
        return repr(float(value))


class BoolParam(_Base):
    type: Literal["bool"]
    default: bool | None = None

    def parse(self, raw: Any) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(raw, str) and raw.strip().lower() in ("false", "0", "no", "off"):
            return False
        raise ValueError("must be true or false")

    def render(self, value: Any) -> str:
        return "true" if value else "false"

    def bounds(self) -> str:
        return "true|false"

    def _schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


class EnumParam(_Base):
    type: Literal["enum"]
    choices: list[str] = Field(min_length=1)
    default: str | None = None

    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str) or raw not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}")
        return raw

    def bounds(self) -> str:
        return "|".join(self.choices)

    def _schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.choices)}


class StrParam(_Base):
    type: Literal["str"]
    pattern: str
    max_length: int = Field(ge=1, le=4096)
    default: str | None = None

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        re.compile(pattern)
        return pattern

    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str):
            raise ValueError("must be a string")
        if len(raw) > self.max_length:
            raise ValueError(f"must be at most {self.max_length} characters")
        _no_controls(raw)
        if not re.fullmatch(self.pattern, raw):
            raise ValueError(f"must match the pattern {self.pattern}")
        return raw

    def bounds(self) -> str:
        return f"/{self.pattern}/ max {self.max_length} chars"

    def _schema(self) -> dict[str, Any]:  # matched whole, as `parse` does (re.fullmatch)
        return {"type": "string", "pattern": f"^(?:{self.pattern})$", "maxLength": self.max_length}


class IntListParam(_Base):
    type: Literal["int_list"]
    min: int
    max: int
    max_items: int = Field(ge=1, le=1024)
    default: list[int] | None = None

    def parse(self, raw: Any) -> list[int]:
        if isinstance(raw, str):
            items: list[Any] = raw.split(",") if raw.strip() else []
        elif isinstance(raw, list):
            items = raw
        else:
            raise ValueError("must be a comma-separated list of integers")
        if not items:
            raise ValueError("must hold at least one integer")
        if len(items) > self.max_items:
            raise ValueError(f"must hold at most {self.max_items} items")
        values = []
        for item in items:
            try:
                value = _as_int(item)
            except ValueError:
                raise ValueError(f"item {item!r} must be an integer") from None
            if not self.min <= value <= self.max:
                raise ValueError(f"item {value} must be between {self.min} and {self.max}")
            values.append(value)
        return values

    def render(self, value: Any) -> str:
        return ",".join(str(v) for v in value)

    def bounds(self) -> str:
        return f"items {self.min}..{self.max}, at most {self.max_items}"

    def _schema(self) -> dict[str, Any]:
        item = {"type": "integer", "minimum": self.min, "maximum": self.max}
        return {"type": "array", "items": item, "minItems": 1, "maxItems": self.max_items}


class PathParam(_Base):
    """A relative path under `root` (relative roots are relative to the checkout the run uses)."""

    type: Literal["path"]
    root: str = "."
    default: str | None = None

    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError("must be a non-empty path")
        _no_controls(raw)
        path = PurePosixPath(raw)
        root = PurePosixPath(self.root)
        if path.is_absolute():
            if not root.is_absolute() or not _is_under(path, root):
                raise ValueError(f"must be a relative path under {self.root} (absolute paths are refused)")
            path = path.relative_to(root)
        if ".." in path.parts:
            raise ValueError("must not contain '..'")
        return str(path)

    def render(self, value: Any) -> str:
        return str(PurePosixPath(self.root) / value)

    def bounds(self) -> str:
        return f"under {self.root}"

    def _schema(self) -> dict[str, Any]:  # relative, no '..' part (an absolute one only under `root`)
        return {"type": "string", "minLength": 1, "pattern": _PATH_PATTERN}


def _is_under(path: PurePosixPath, root: PurePosixPath) -> bool:
    return ".." not in path.parts and (path == root or root in path.parents)


class ModelParam(_Base):
    """`zoo:NAME` (a model shipped in engine/zoo) or NAME, a directory under the runner's models dir."""

    type: Literal["model"]
    default: str | None = None

    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str):
            raise ValueError("must be a model reference (zoo:NAME or a model directory name)")
        _no_controls(raw)
        if _ZOO.fullmatch(raw):
            return raw
        if not _MODEL_NAME.fullmatch(raw) or ".." in raw.split("/"):
            raise ValueError(
                "must be zoo:NAME or a model directory name such as gemma-3-1b (no '..', not absolute)"
            )
        return raw

    def bounds(self) -> str:
        return "zoo:NAME | NAME under $KAKEYA_MODELS or ~/kakeya-models"

    def _schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": f"^(?:{_ZOO.pattern[1:-1]}|{_MODEL_NAME.pattern[1:-1]})$"}


def models_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Where a runner looks for model NAME: $KAKEYA_MODELS, then ~/kakeya-models."""
    dirs = []
    if environ.get("KAKEYA_MODELS"):
        dirs.append(Path(environ["KAKEYA_MODELS"]).expanduser())
    home = environ.get("HOME")
    dirs.append(Path(home).expanduser() / "kakeya-models" if home else Path.home() / "kakeya-models")
    return dirs


def resolve_model(ref: str, environ: Mapping[str, str]) -> str:
    """On the runner: `zoo:NAME` passes through; NAME becomes the first existing models-dir/NAME."""
    if ref.startswith("zoo:"):
        return ref
    tried = [d / ref for d in models_dirs(environ)]
    for candidate in tried:
        if candidate.is_dir():
            return str(candidate)
    raise KakeyaError(
        f"model {ref!r} not found: looked in {' and '.join(str(t) for t in tried)}; "
        f"set KAKEYA_MODELS or put the model directory at ~/kakeya-models/{ref}"
    )


def parse_assignments(pairs: list[str] | None) -> dict[str, str]:
    """`-p name=value` pairs into a dict; a repeated or malformed pair is an InvalidRequest."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"parameter {pair!r} must look like name=value", code="bad-param")
        if name in out:
            raise InvalidRequest(f"parameter {name!r} is given twice", code="bad-param")
        out[name] = value
    return out


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest known name, or ''."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
