"""The grammars of the `policy` and `drafter` parameter types: a cache policy (`hybrid:4:64,sink_window:4:64:q8`)
and a drafter (`model:zoo:NAME:k=4`), each checked against the forms and ranges a preset allows, rendered as
one argv element and stated as a JSON Schema pattern.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from bridge.presets.params import _MODEL_NAME, _ZOO, _Base, _no_controls

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
