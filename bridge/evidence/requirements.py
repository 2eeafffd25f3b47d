"""What evidence a commit needs: .github/kakeya-required.yml (`parse_required`) and its entries, `PRESET[@LABEL]
[PARAM OP VALUE ...]`, parsed once and typed against the preset's parameters (`Requirement`, `Pin`).

Which runs count: a parameter with a pin, the runs whose value meets its pins (`PARAM==*`: any value); one the
preset marks `verdict_free` (device, threads), any value; every other parameter, the preset's default only.
So `niah-ladder@h200` alone is met by a run at the preset's own defaults, never by a cheaper one with fewer
samples; `niah-ladder@h200 samples>=2` counts 2 samples and up, `samples==*` any."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from bridge.core.errors import InvalidRequest, problems
from bridge.core.names import PIN_RE, REQUIREMENT_RE
from bridge.presets.preset import Preset
from bridge.presets.registry import get_preset

REQUIRED_FILE = ".github/kakeya-required.yml"


class RequiredFile(BaseModel):
    """.github/kakeya-required.yml: `required:` a list of `PRESET[@LABEL] [PARAM OP VALUE ...]` entries, the
    evidence a pull request needs (`gate pr`, `kakeya evidence` and the history dashboard read it)."""

    model_config = ConfigDict(extra="forbid")
    required: list[str] = []


def parse_required(text: str, where: str) -> list[str]:
    """The entries of a required file's `text`; InvalidRequest naming `where` when it is not valid."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{where}: cannot read YAML: {exc}") from None
    try:
        return RequiredFile.model_validate(data).required
    except ValidationError as exc:
        raise InvalidRequest(f"{where}: {problems(exc, 'requirements file')}") from None


Op = Literal["==", ">=", "<=", ">", "<"]
_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_ORDERED_TYPES = ("int", "float", "int_list")  # parameter types that take >=, <=, >, <


ANY = "*"  # `PARAM==*`: any value the preset allows


def shown(value: Any) -> str:
    """A parameter's value as a pin writes it: 1024,4096 for a list, true/false, the number or string."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def same(seen: Any, want: Any) -> bool:
    """A run's value equals a typed one (a list as a tuple; a bool only as a bool)."""
    if isinstance(seen, bool) or isinstance(want, bool):
        return seen is want
    return (tuple(seen) if isinstance(seen, list) else seen) == want


@dataclass(frozen=True)
class Pin:
    """A requirement's parameter pin, `samples>=5`: the run's value of `param` must meet `op value`.

    ==            the value, whole (an int_list: the same items in the same order)
    >= <= > <     int and float parameters; for an int_list, EVERY item must meet it (`contexts>=65536`:
                  no rung below 65536), i.e. `>=`/`>` bound its smallest item and `<=`/`<` its largest
    """

    param: str
    op: Op
    value: Any  # typed by the preset's parameter: int, float, str, bool, or a tuple of ints (int_list ==)

    def met_by(self, seen: Any) -> bool:
        if self.value == ANY:
            return True
        if self.op == "==":
            return same(seen, self.value)
        items = seen if isinstance(seen, list) else [seen]
        numbers = all(isinstance(i, (int, float)) and not isinstance(i, bool) for i in items)
        return bool(items) and numbers and all(_ORDER[self.op](i, self.value) for i in items)

    def __str__(self) -> str:
        return f"{self.param}{self.op}{shown(self.value)}"


@dataclass(frozen=True)
class Requirement:
    """What must pass: a preset, on a runner label (None: any), with its parameters pinned. Written
    `niah-ladder@h200 contexts>=65536 samples>=5`; parsed once, typed against the preset's parameters
    (`parse`), which also fills `defaults`: the parameters neither pinned nor verdict-free, each with the
    preset's default, that a run must have had to count (built by hand without it: any values count)."""

    preset: str
    label: str | None = None
    pins: tuple[Pin, ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str, registry: Mapping[str, Preset]) -> Requirement:
        """`PRESET[@LABEL] [PARAM OP VALUE ...]`, checked against `registry`: the preset exists, may run on
        the label, and each pin names one of its parameters with an operator its type takes and a value it
        allows. InvalidRequest says what is wrong."""
        m = REQUIREMENT_RE.fullmatch(text.strip())
        if not m:
            raise InvalidRequest(
                f"requirement {text!r} must look like PRESET, PRESET@LABEL or PRESET@LABEL PARAM>=VALUE ... "
                "(operators == >= <= > <, no spaces inside a pin), e.g. probe@cpu or "
                "'niah-ladder@h200 samples>=5'"
            )
        name, label = m.group(1), m.group(2)
        preset = get_preset(registry, name)
        where = f"{name}@{label}" if label else name
        if label is not None:
            try:
                preset.check_runs_on(label)
            except InvalidRequest as exc:
                raise InvalidRequest(f"requirement {where}: {exc}") from None
        pins: list[Pin] = []
        for token in m.group(3).split():
            pm = PIN_RE.fullmatch(token)
            assert pm is not None  # REQUIREMENT_RE matched it
            param, op, raw = pm.group(1), pm.group(2), pm.group(3)
            spec = preset.params.get(param)
            if spec is None:
                raise InvalidRequest(
                    f"requirement {where}: preset {name} has no parameter {param!r} "
                    f"(its parameters: {', '.join(sorted(preset.params)) or 'none'})"
                )
            if any(p.param == param and p.op == op for p in pins):
                raise InvalidRequest(f"requirement {where}: {param}{op} is pinned twice")
            if raw == ANY:
                if op != "==":
                    raise InvalidRequest(f"requirement {where}: {token}: * (any value) takes == only")
                pins.append(Pin(param, "==", ANY))
                continue
            if op != "==" and spec.type not in _ORDERED_TYPES:
                raise InvalidRequest(
                    f"requirement {where}: {token}: parameter {param} is {spec.type}; it takes == only"
                )
            try:
                value = spec.parse(raw)
            except ValueError as exc:
                raise InvalidRequest(f"requirement {where}: {token}: {param} {exc}") from None
            if isinstance(value, list):
                if op != "==" and len(value) != 1:
                    raise InvalidRequest(
                        f"requirement {where}: {token}: {op} takes one number (it bounds every item)"
                    )
                value = tuple(value) if op == "==" else value[0]
            pins.append(Pin(param, op, value))  # type: ignore[arg-type]  # op is one of Op
        pinned = {p.param for p in pins}
        defaults = tuple(
            (pname, tuple(v) if isinstance(v := spec.parse(spec.default), list) else v)
            for pname, spec in preset.params.items()
            if pname not in pinned and pname not in preset.verdict_free and spec.default is not None
        )
        return cls(name, label, tuple(pins), defaults)

    def unmet(self, params: Mapping[str, Any]) -> list[str]:
        """The pins a run's parameters do not meet, and the parameters it did not have at the preset's default
        (neither pinned nor verdict-free), each saying what the run had."""
        out = []
        for pin in self.pins:
            if pin.param not in params:
                out.append(f"{pin}: it has no {pin.param}")
            elif not pin.met_by(params[pin.param]):
                seen = params[pin.param]
                text = shown(seen) if isinstance(seen, list) else json.dumps(seen)
                out.append(f"{pin}: it ran {pin.param}={text}")
        for pname, want in self.defaults:
            if pname not in params:
                out.append(f"{pname}: it has no {pname} (the preset's default: {shown(want)})")
            elif not same(params[pname], want):
                out.append(
                    f"{pname}: it ran {pname}={shown(params[pname])}, not the preset's default {shown(want)} "
                    f"(a pin counts other values: {pname}=={shown(params[pname])}, {pname}==*)"
                )
        return out

    def __str__(self) -> str:
        head = f"{self.preset}@{self.label}" if self.label else self.preset
        return " ".join([head, *(str(p) for p in self.pins)])


def check_requirements(texts: Sequence[str], registry: Mapping[str, Preset]) -> list[Requirement]:
    """Parsed (`Requirement.parse`), each naming a preset of `registry`, a label it may run on and pins its
    parameters take; duplicates dropped."""
    out: list[Requirement] = []
    for text in texts:
        req = Requirement.parse(text, registry)
        if req not in out:
            out.append(req)
    return out
