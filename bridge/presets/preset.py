"""Presets: the allowlist of what a runner may execute (presets/*.yaml -> typed models).

A preset is an argv template, typed and bounded parameters, runner labels, a time limit, an
environment, the report kind it produces and its gate checks. A parameter fills exactly one argv
element: template elements are either literals or exactly `{name}`, never a mix, so no value can
add, split or prefix arguments. Nothing here runs anything.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import math
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bridge.core.errors import InvalidRequest, KakeyaError, problems
from bridge.core.names import NAME_RE
from bridge.wire import git
from gates import Check, parse_checks

BUILTINS = ("python", "report", "run_dir")
_PARAM = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_PLACEHOLDER = re.compile(r"^\{([a-z_][a-z0-9_]*)\}$")
_EMBEDDED = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_ENV_REF = re.compile(r"\$\{ENV:([A-Za-z_][A-Za-z0-9_]*)\}")
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


_NUMBER = re.compile(r"0|[1-9][0-9]{0,8}")
_PRECISION = re.compile(r"q[48]|k[48]v[48]")
_OPTION = re.compile(r"([a-z_]+)=(0|[1-9][0-9]{0,8})")
PolicyKind = Literal["full", "sink_window", "hybrid"]
DrafterKind = Literal["lookup", "model", "block", "diffusion", "gemma4-assistant"]


def _grammar_text(raw: Any, what: str) -> str:
    """`raw` when it is a string without control characters; ValueError saying it must be `what`."""
    if not isinstance(raw, str):
        raise ValueError(f"must be {what}")
    _no_controls(raw)
    return raw


def _model_ref(raw: str) -> bool:
    """`zoo:NAME` or NAME[/NAME] with no '..' part (what `ModelParam` takes)."""
    return bool(_ZOO.fullmatch(raw)) or (bool(_MODEL_NAME.fullmatch(raw)) and ".." not in raw.split("/"))


def _upto(top: int, low: int = 0) -> str:
    """A regex of the whole numbers low..top (low 0 or 1) written without leading zeros."""
    s, alts = str(top), ["0"] if low == 0 else []
    if len(s) > 1:
        alts.append(f"[1-9][0-9]{{0,{len(s) - 2}}}")
    for i in range(len(s)):
        lo, hi = (1 if i == 0 else 0), int(s[i]) - 1
        if hi >= lo:
            alts.append(s[:i] + f"[{lo}-{hi}]" + (f"[0-9]{{{len(s) - i - 1}}}" if i < len(s) - 1 else ""))
    if top >= max(low, 1):
        alts.append(s)
    return "(?:" + "|".join(alts) + ")"


class PolicyParam(_Base):
    """A cache policy, or a comma-separated list of them, one per kind (`hybrid:4:64,sink_window:4:64:q8`): the
    bridge's own grammar of engine.policy's (docs/presets.md), bounded by the preset."""

    type: Literal["policy"]
    kinds: list[PolicyKind] = Field(min_length=1)
    max_sink: int = Field(ge=0, le=10**9 - 1)
    max_window: int = Field(ge=1, le=10**9 - 1)
    precisions: list[str] = []  # q8, q4, kXvY (X, Y in 4, 8): K/V stored quantized; none: the model dtype
    max_items: int = Field(default=1, ge=1, le=3)  # policies in the list
    default: str | None = None

    @field_validator("precisions")
    @classmethod
    def _precisions(cls, values: list[str]) -> list[str]:
        for p in values:
            if not _PRECISION.fullmatch(p):
                raise ValueError(f"precision {p!r} must be q8, q4 or kXvY with X, Y in 4, 8")
        return values

    def parse(self, raw: Any) -> str:
        items = _grammar_text(raw, f"a cache policy ({self.bounds()})").split(",")
        if len(items) > self.max_items:
            raise ValueError(f"must be at most {self.max_items} polic{'y' if self.max_items == 1 else 'ies'}")
        kinds = [self._one(item) for item in items]
        if len(set(kinds)) != len(kinds):
            raise ValueError("must name each kind of policy once at most")
        return raw

    def _one(self, text: str) -> str:
        """The kind of one policy; ValueError naming what is wrong with it."""
        parts = text.split(":")
        kind = parts[0]
        if kind not in self.kinds:
            raise ValueError(f"{text!r}: the kind must be one of {', '.join(self.kinds)}")
        n = 1 if kind == "full" else 3
        if len(parts) == n + 1:
            if parts[-1] not in self.precisions:
                allowed = ", ".join(self.precisions) if self.precisions else "none (the model dtype only)"
                raise ValueError(f"{text!r}: the K/V precision must be one of {allowed}")
        elif len(parts) != n:
            raise ValueError(f"{text!r} must be {self._form(kind)}")
        if kind != "full":
            for what, value, low, top in (
                ("sink", parts[1], 0, self.max_sink),
                ("window", parts[2], 1, self.max_window),
            ):
                if not _NUMBER.fullmatch(value) or not low <= int(value) <= top:
                    raise ValueError(f"{text!r}: the {what} must be a whole number from {low} to {top}")
        return kind

    def _form(self, kind: str) -> str:
        prec = f"[:{'|'.join(self.precisions)}]" if self.precisions else ""
        return ("full" if kind == "full" else f"{kind}:SINK:WINDOW") + prec

    def bounds(self) -> str:
        many = f", up to {self.max_items} (one per kind), comma-separated" if self.max_items > 1 else ""
        return (
            " | ".join(self._form(k) for k in self.kinds)
            + f" (SINK 0..{self.max_sink}, WINDOW 1..{self.max_window}){many}"
        )

    def _schema(self) -> dict[str, Any]:
        prec = "(?::(?:" + "|".join(self.precisions) + "))?" if self.precisions else ""
        nums = f":{_upto(self.max_sink)}:{_upto(self.max_window, 1)}"
        one = "(?:" + "|".join(k + ("" if k == "full" else nums) + prec for k in self.kinds) + ")"
        pattern = f"^{one}(?:,{one}){{0,{self.max_items - 1}}}$"
        return {"type": "string", "pattern": pattern}


class DrafterParam(_Base):
    """A drafter spec as engine.drafters.DrafterSpec reads it (`lookup`, `model:REF`, `diffusion:REF:steps=4`):
    the bridge's own grammar (docs/presets.md), bounded by the preset: the kinds allowed, each kind's options
    with their ranges. REF is a model reference as `type: model` takes it. `none: true` also allows the value
    `none`, no drafter (a workload that counts what a drafter holds: engine.workloads.compression)."""

    type: Literal["drafter"]
    kinds: list[DrafterKind] = Field(min_length=1)
    options: dict[DrafterKind, dict[str, tuple[int, int]]] = {}  # kind -> option -> (min, max)
    none: bool = False
    default: str | None = None

    @field_validator("options")
    @classmethod
    def _ranges(cls, options: dict[str, dict[str, tuple[int, int]]]) -> dict[str, dict[str, tuple[int, int]]]:
        for kind, named in options.items():
            for name, (low, top) in named.items():
                if not re.fullmatch(r"[a-z_]+", name) or low not in (0, 1) or not low <= top < 10**9:
                    raise ValueError(f"{kind} option {name}: a name of a-z and _, a range [0 or 1, max]")
        return options

    def parse(self, raw: Any) -> str:
        text = _grammar_text(raw, f"a drafter spec ({self.bounds()})")
        if self.none and text == "none":
            return raw
        parts = text.split(":")
        kind, rest = parts[0], parts[1:]
        if kind not in self.kinds:
            raise ValueError(
                f"must start with a drafter kind, one of {', '.join(self.kinds)} ({self.bounds()})"
            )
        allowed = self.options.get(kind, {})  # type: ignore[call-overload]
        seen: set[str] = set()
        while rest and (m := _OPTION.fullmatch(rest[-1])):
            name, value = m.group(1), int(m.group(2))
            if name not in allowed or name in seen:
                raise ValueError(f"{kind} takes {', '.join(allowed) or 'no options'}, each once (got {name})")
            low, top = allowed[name]
            if not low <= value <= top:
                raise ValueError(f"{kind} option {name} must be from {low} to {top}")
            seen.add(name)
            rest.pop()
        ref = ":".join(rest)
        if kind == "lookup" and ref:
            raise ValueError("lookup takes no model reference")
        if kind != "lookup" and not _model_ref(ref):
            raise ValueError(f"{kind} needs a model: {kind}:zoo:NAME or {kind}:NAME (a model directory name)")
        return raw

    def _form(self, kind: str) -> str:
        opts = "".join(f"[:{o}={lo}..{hi}]" for o, (lo, hi) in self.options.get(kind, {}).items())  # type: ignore[call-overload]
        return kind if kind == "lookup" else f"{kind}:REF{opts}"

    def bounds(self) -> str:
        forms = (["none"] if self.none else []) + [self._form(k) for k in self.kinds]
        return " | ".join(forms) + " (REF: zoo:NAME or a model directory name)"

    def _schema(self) -> dict[str, Any]:
        ref = f"(?:{_ZOO.pattern[1:-1]}|{_MODEL_NAME.pattern[1:-1]})"
        alts = ["none"] if self.none else []
        for kind in self.kinds:
            opts = "".join(
                f"(?::{o}={_upto(hi, lo)})?"
                for o, (lo, hi) in self.options.get(kind, {}).items()  # type: ignore[call-overload]
            )
            alts.append(re.escape(kind) if kind == "lookup" else f"{re.escape(kind)}:{ref}{opts}")
        return {"type": "string", "pattern": "^(?:" + "|".join(alts) + ")$"}


Param = Annotated[
    IntParam
    | FloatParam
    | BoolParam
    | EnumParam
    | StrParam
    | IntListParam
    | PathParam
    | ModelParam
    | PolicyParam
    | DrafterParam,
    Field(discriminator="type"),
]


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


class ReportSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    schema_version: int = Field(ge=1)


class BaselineSpec(BaseModel):
    """`baseline: {from: previous-pass, metric: /summary/decode_tok_s, max_regression_pct: 10}`: the runner
    compares each report with the last passing report of the same preset and runner label on the bus."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    from_: Literal["previous-pass"] = Field(alias="from")
    metric: str
    max_regression_pct: float = Field(ge=0, allow_inf_nan=False)
    higher_is_better: bool = True
    # JSON pointer to the metric's per-repeat samples: a regression must then also be beyond the noise
    samples: str | None = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, metric: str) -> str:
        if not metric.startswith("/") or "*" in metric.split("/"):
            raise ValueError(
                f"baseline metric {metric!r} must be a JSON pointer to one number, e.g. "
                "/summary/decode_tok_s (no '*')"
            )
        return metric


class Limits(BaseModel):
    """`limits: {memory_mb: 4096, processes: 256, file_mb: 1024}`: what one local run may use of the host
    (bridge/run/isolation.py's `run_limits`; unset: its default). A run that reaches one ends in `error` naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    memory_mb: int | None = Field(default=None, ge=16, le=1 << 24)  # per process (RLIMIT_DATA)
    processes: int | None = Field(default=None, ge=4, le=1 << 20)  # tasks of the run's user (RLIMIT_NPROC)
    file_mb: int | None = Field(default=None, ge=1, le=1 << 24)  # the largest file, /tmp's too (RLIMIT_FSIZE)


class Resources(BaseModel):
    """`resources: {gpus: 1, cpus: 8, memory: 64G}`: what a run needs of a node. A scheduler executor
    (bridge/run/slurm.py) asks for it (`--gres`, `--cpus-per-task`, `--mem`); the local executor ignores it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpus: int = Field(default=0, ge=0, le=64)
    cpus: int = Field(default=1, ge=1, le=1024)
    memory: str | None = Field(default=None, pattern=r"^[1-9][0-9]{0,6}[KMGT]?$")  # Slurm's --mem: 64G


# The presets as shipped when `content_hash` became one rule (fields at their defaults left out) and their
# policy and drafter parameters typed (`type: policy`, `type: drafter`, a regex string before): the rule's
# hash of each -> the hash its runs were signed with then, so that their evidence still matches. Frozen: a
# definition changed since hashes by the rule and its alias goes (compression-table: one drafter parameter,
# issue 30; tests/bridge/test_preset_hash.py).
SIGNED_AS: dict[str, str] = {
    "sha256:49431350318e59166f28a96074ff70f6756316596488c973331c065f3330b081": "sha256:284b28b8c4f27ee12badf7156fd128b7fd1b81a4c80fd2c87e9b6c66b4fe9068",  # niah-ladder
    "sha256:179ef6651feeeed9133519f73c1c6e581d55dca43f6c26c61b518ba2139b5f17": "sha256:21e1ffcfd177b91f8a2ea96d072f523038015f6d1ff0ed91ab6cb9238120e9bb",  # niah-sink-window
    "sha256:bb118e34707771af9424edd5ba9850b6271a96eafcc11c97b1e68c0df1e519a2": "sha256:2bb708bc7fbf52925671a1a80cb5d97a9b2977a0eab91e72a99a6d894fa2c663",  # niah-smoke
    "sha256:1754c6dcb4cf665e2123814285d8f64d042f8f10b28985f9064c45d6dcf99add": "sha256:d2ccdeae8685841480b1cf28a33f877ff16399d0561476e5d09b92cd2510cb2a",  # parity
    "sha256:f85dd1ac848fc67d705f0ee6037f7167b0d6aec6041361e849e1630628529521": "sha256:46bfce41857ccf4d5d181bab2893c7d71b2d6ebfe32a586e828c7cfcc7bb2094",  # probe
    "sha256:e9e3698ee66f3675172c0572f62846882116d9c164b9dc98be202cf399a06adc": "sha256:70ad00fd2fc03f621149c9b9e352a7217a83309c856c43d2bdaa6c69ad2eb72b",  # restoration-study
    "sha256:18a3d58705bb5901c59f0b002ebd17edf19bacca5a938fce63b330de8746e525": "sha256:3e5ea04260f9e3ee3f0583ff968e0e982e8f5e52323c4e8485f314f8cfe4fd45",  # throughput-code
}  # fmt: skip


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    runners: list[str] = Field(min_length=1)
    timeout_s: int = Field(ge=1, le=7 * 24 * 3600)
    argv: list[str] = Field(min_length=1)
    params: dict[str, Param] = {}
    env: dict[str, str] = {}
    secrets: list[str] = []
    report: ReportSpec
    gate: list[Check] = []
    # more checks on a runner label, e.g. on h200 the report's device must be CUDA (`checks_for`)
    gate_on: dict[str, list[Check]] = {}
    baseline: BaselineSpec | None = None
    # none (the default): the run's own network namespace, loopback only; host: the host's network, by name
    network: Literal["host", "none"] = "none"
    limits: Limits = Limits()
    resources: Resources | None = None
    # parameters whose value does not change what the verdict means (device, threads): a requirement without
    # pins on them counts runs at any of their values; every other parameter counts at its default only
    # (bridge/evidence/requirements.py). Not part of `content_hash`: it is how evidence is judged, not what ran.
    verdict_free: list[str] = []

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.match(name):
            raise ValueError(f"name {name!r} must be lowercase letters, digits and dashes")
        return name

    @field_validator("gate", mode="before")
    @classmethod
    def _gate(cls, raw: Any) -> list[Check]:
        return parse_checks(raw)

    @field_validator("gate_on", mode="before")
    @classmethod
    def _gate_on(cls, raw: Any) -> dict[str, list[Check]]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ValueError("gate_on must map a runner label to a list of checks")
        return {str(label): parse_checks(checks) for label, checks in raw.items()}

    @model_validator(mode="after")
    def _template(self) -> Preset:
        for label in self.gate_on:
            if label not in self.runners:
                raise ValueError(f"gate_on names label {label!r}, which is not in runners")
        for pname, spec in self.params.items():
            if not _PARAM.fullmatch(pname):
                raise ValueError(
                    f"parameter name {pname!r} must be lowercase letters, digits and underscores"
                )
            if pname in BUILTINS:
                raise ValueError(f"parameter {pname!r} shadows the builtin {{{pname}}}")
            if spec.default is not None:
                try:
                    spec.parse(spec.default)
                except ValueError as exc:
                    raise ValueError(f"default of parameter {pname!r} ({spec.default!r}) {exc}") from None
            elif not spec.required:
                raise ValueError(f"parameter {pname!r} needs a default or `required: true`")
        for pname in self.verdict_free:
            if pname not in self.params:
                raise ValueError(f"verdict_free names {pname!r}, which is not a parameter")
        used = set()
        for element in self.argv:
            m = _PLACEHOLDER.fullmatch(element)
            if m:
                if m.group(1) not in self.params and m.group(1) not in BUILTINS:
                    raise ValueError(f"argv element {element!r} names no parameter or builtin")
                used.add(m.group(1))
            elif any(n in self.params or n in BUILTINS for n in _EMBEDDED.findall(element)):
                raise ValueError(
                    f"argv element {element!r}: a placeholder must be a whole element, e.g. '{{model}}'"
                )
        unused = set(self.params) - used
        if unused:
            raise ValueError(f"parameters {sorted(unused)} are never used in argv")
        for key in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"env name {key!r} is not a valid variable name")
        return self

    def checks_for(self, label: str | None) -> list[Check]:
        """The gate of a run on runner label `label`: `gate`, then `gate_on[label]`."""
        return [*self.gate, *self.gate_on.get(label or "", [])]

    def allows(self, label: str) -> bool:
        """Whether this preset may run on runner label `label`."""
        return label in self.runners

    def check_runs_on(self, label: str) -> None:
        """InvalidRequest unless this preset may run on runner label `label` (the one rule, for requests,
        runners and evidence requirements)."""
        if not self.allows(label):
            raise InvalidRequest(
                f"preset {self.name} may not run on runner label {label!r}: "
                f"preset {self.name} runs on {', '.join(self.runners)}, not {label}",
                code="wrong-label",
            )

    @property
    def content_hash(self) -> str:
        """sha256 of the canonical definition, what the runner ran: its JSON (independent of YAML formatting)
        with every field at its default left out, so that a field added later, at its default, changes no
        hash. A definition shipped before this rule keeps the hash its runs were signed with (`SIGNED_AS`)."""
        data = self.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude={"verdict_free"})
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
        return SIGNED_AS.get(digest, digest)

    def validate_params(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Typed values for every parameter (defaults filled); InvalidRequest names what is wrong."""
        unknown = sorted(set(raw) - set(self.params))
        if unknown:
            known = ", ".join(sorted(self.params)) or "none"
            raise InvalidRequest(
                f"preset {self.name}: unknown parameter {unknown[0]!r}{did_you_mean(unknown[0], self.params)} "
                f"(known: {known})",
                code="bad-param",
            )
        values: dict[str, Any] = {}
        for pname, spec in self.params.items():
            if pname in raw:
                try:
                    values[pname] = spec.parse(raw[pname])
                except ValueError as exc:
                    raise InvalidRequest(
                        f"preset {self.name}: parameter {pname}={raw[pname]!r} {exc}", code="bad-param"
                    ) from None
            elif spec.required:
                raise InvalidRequest(
                    f"preset {self.name}: parameter {pname!r} is required ({spec.type}, {spec.bounds()})",
                    code="bad-param",
                )
            else:
                values[pname] = spec.parse(spec.default)
        return values

    def render_argv(
        self, values: Mapping[str, Any], builtins: Mapping[str, str], environ: Mapping[str, str]
    ) -> list[str]:
        """One argv element per template element; model names are resolved on this (runner) host."""
        argv = []
        for element in self.argv:
            m = _PLACEHOLDER.fullmatch(element)
            if not m:
                argv.append(element)
                continue
            key = m.group(1)
            if key in builtins:
                argv.append(str(builtins[key]))
                continue
            spec = self.params[key]
            rendered = spec.render(values[key])
            if isinstance(spec, ModelParam):
                rendered = resolve_model(rendered, environ)
            argv.append(rendered)
        return argv

    def render_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The preset's env with `${ENV:NAME}` resolved from the runner's environment (never the request)."""
        out = {}
        for key, template in self.env.items():
            missing = [n for n in _ENV_REF.findall(template) if n not in environ]
            if missing:
                raise KakeyaError(
                    f"preset {self.name}: env {key} needs ${{ENV:{missing[0]}}} but {missing[0]} "
                    f"is not set on this runner"
                )
            out[key] = _ENV_REF.sub(lambda m: environ[m.group(1)], template)
        return out

    def params_schema(self) -> dict[str, Any]:
        """The parameters as one JSON Schema object (what `presets --json`, `kakeya mcp`'s tools and agents
        check values against): each parameter's type with its real minimum/maximum/enum/pattern, the
        required ones listed, nothing else allowed. `validate_params` stays the rule that decides."""
        return {
            "type": "object",
            "properties": {n: s.json_schema() for n, s in self.params.items()},
            "required": [n for n, s in self.params.items() if s.required],
            "additionalProperties": False,
        }

    def summary(self) -> dict[str, Any]:
        """What `kakeya presets` shows."""
        return {
            "name": self.name,
            "description": self.description,
            "runners": self.runners,
            "timeout_s": self.timeout_s,
            "report": self.report.model_dump(),
            "params": self.params_schema(),
            **({"verdict_free": self.verdict_free} if self.verdict_free else {}),
            "gate": [c.model_dump(exclude_none=True) for c in self.gate],
            **(
                {
                    "gate_on": {
                        lb: [c.model_dump(exclude_none=True) for c in checks]
                        for lb, checks in self.gate_on.items()
                    }
                }
                if self.gate_on
                else {}
            ),
            **(
                {"baseline": self.baseline.model_dump(by_alias=True, exclude_none=True)}
                if self.baseline
                else {}
            ),
            "hash": self.content_hash,
        }


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


def default_presets_dir(cwd: Path | None = None) -> Path:
    """Where the presets are: $KAKEYA_PRESETS; else presets/ at the repository root of the working directory
    (the checkout it runs in); else presets/ of the checkout the bridge package runs from (an editable
    install, a runner's trusted harness); else the copy installed with the package (`kakeya_presets`)."""
    env = os.environ.get("KAKEYA_PRESETS")
    if env:
        return Path(env)
    candidates = [Path(__file__).resolve().parents[2] / "presets"]
    top = git.toplevel(cwd or Path.cwd())
    if top is not None:
        candidates.insert(0, top / "presets")
    spec = importlib.util.find_spec("kakeya_presets")
    if spec is not None:
        candidates += [Path(p) for p in spec.submodule_search_locations or []]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def load_preset_file(path: Path) -> Preset:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidRequest(f"preset file {path}: cannot read YAML: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"preset file {path}: expected a mapping at the top level")
    try:
        preset = Preset.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(f"preset file {path}: {problems(exc, 'preset')}") from None
    if preset.name != path.stem:
        raise InvalidRequest(
            f"preset file {path}: name {preset.name!r} must match the file name {path.stem!r}"
        )
    return preset


def load_registry(directory: Path | None = None) -> dict[str, Preset]:
    """Every presets/*.yaml, validated; one bad file fails the whole registry (an allowlist is all or nothing)."""
    directory = directory or default_presets_dir()
    if not directory.is_dir():
        raise KakeyaError(
            f"presets directory {directory} does not exist (set KAKEYA_PRESETS to a presets/ directory)"
        )
    return {p.stem: load_preset_file(p) for p in sorted(directory.glob("*.yaml"))}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """'; did you mean 'x'?' for the closest known name, or ''."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def get_preset(registry: Mapping[str, Preset], name: str) -> Preset:
    if name not in registry:
        raise InvalidRequest(
            f"unknown preset {name!r}{did_you_mean(name, registry)} "
            f"(known: {', '.join(sorted(registry)) or 'none'})",
            code="unknown-preset",
        )
    return registry[name]
