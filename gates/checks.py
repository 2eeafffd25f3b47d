"""Gate checks: as declared under `gate:` in a preset (`Check`, `parse_checks`), and run over a report
(`run_check` -> `CheckResult`: the decisive value seen, where, and one reason).

    min / max / between   numbers (the worst of a `*` fan-out decides)
    eq                    a JSON value
    all_true              every value is true
    match                 every value is a string that the regular expression (value) matches whole, e.g.
                          {check: match, path: /environment/device, value: "cuda:[^,]*(, cuda:[^,]*)*"}
    same                  every value is an object whose members named in value (2 or more) are equal, e.g.
                          {check: same, path: /prompts/*/digest, value: [greedy, speculative]}
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from gates.pointer import PathError, json_type, resolve
from gates.report import fmt, is_number, json_equal

# A JSON pointer (RFC 6901) whose segments may be `*` (every array item).
_POINTER = re.compile(r"^(/([^/~]|~[01])*)+$")


class Check(BaseModel):
    """One threshold over a JSON-pointer path; `*` fans out over array items."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    check: Literal["min", "max", "eq", "between", "all_true", "match", "same"]
    path: str
    value: Any = None

    @model_validator(mode="after")
    def _shape(self) -> Check:
        if not _POINTER.match(self.path):
            raise ValueError(
                f"path {self.path!r} is not a JSON pointer such as /summary/recall or /rungs/*/delta"
            )
        if self.check in ("min", "max"):
            if not is_number(self.value):
                raise ValueError(
                    f"check {self.check!r} at {self.path} needs a finite number, got {self.value!r}"
                )
        elif self.check == "between":
            ok = (
                isinstance(self.value, list)
                and len(self.value) == 2
                and all(is_number(v) for v in self.value)
                and self.value[0] <= self.value[1]
            )
            if not ok:
                raise ValueError(
                    f"check 'between' at {self.path} needs value [low, high], got {self.value!r}"
                )
        elif self.check == "eq":
            if self.value is None:
                raise ValueError(f"check 'eq' at {self.path} needs a value")
            if isinstance(self.value, float) and not is_number(self.value):
                raise ValueError(f"check 'eq' at {self.path} needs a finite value, got {self.value!r}")
        elif self.check == "match":
            try:
                ok = isinstance(self.value, str) and re.compile(self.value) is not None
            except re.error:
                ok = False
            if not ok:
                raise ValueError(
                    f"check 'match' at {self.path} needs a regular expression (a string), got {self.value!r}"
                )
        elif self.check == "same":
            ok = (
                isinstance(self.value, list)
                and len(self.value) >= 2
                and all(isinstance(v, str) and v for v in self.value)
            )
            if not ok:
                raise ValueError(
                    f"check 'same' at {self.path} needs value [member, member, ...] (2 or more names), "
                    f"got {self.value!r}"
                )
        elif self.value is not None:
            raise ValueError(f"check 'all_true' at {self.path} takes no value")
        return self


def parse_checks(raw: Any) -> list[Check]:
    """Validate a list of check mappings; raises ValueError naming the bad item."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"gate checks must be a list, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        try:
            out.append(Check.model_validate(item))
        except ValidationError as exc:
            msg = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
            raise ValueError(f"gate check #{i + 1} ({item!r}): {msg}") from None
    return out


class CheckResult(BaseModel):
    """One check's outcome: the decisive value seen (the worst one over a `*` fan-out), its pointer, the threshold."""

    check: str
    path: str
    threshold: Any = None
    status: Literal["pass", "fail"]
    value: Any = None
    at: str | None = None  # None: no value was found (the reason says why)
    count: int = 0  # how many values the path matched
    reason: str


def threshold_text(check: str, threshold: Any) -> str:
    if check == "min":
        return f"≥ {fmt(threshold)}"
    if check == "max":
        return f"≤ {fmt(threshold)}"
    if check == "between":
        return f"in [{fmt(threshold[0])}, {fmt(threshold[1])}]"
    if check == "eq":
        return f"= {fmt(threshold)}"
    if check == "match":
        return f"matches /{threshold}/"
    if check == "same":
        return f"equal {' = '.join(threshold)}"
    return "all true"


def _margin(check: str, threshold: Any, value: float) -> float:
    """How far inside the threshold a value is: >= 0 passes; the smallest margin is the worst value."""
    if check == "min":
        return value - threshold
    if check == "max":
        return threshold - value
    return min(value - threshold[0], threshold[1] - value)


def run_check(report: Any, check: Check) -> CheckResult:
    """One check over every value its path names. A missing path or an empty `*` fails."""
    base = {"check": check.check, "path": check.path, "threshold": check.value}
    want = threshold_text(check.check, check.value)
    try:
        matches = resolve(report, check.path)
    except PathError as exc:
        return CheckResult(**base, status="fail", reason=str(exc))
    count = len(matches)
    if check.check in ("min", "max", "between"):
        for at, value in matches:
            if not is_number(value):
                what = "not finite" if isinstance(value, float) else f"{json_type(value)}, not a number"
                return CheckResult(
                    **base,
                    status="fail",
                    value=value,
                    at=at,
                    count=count,
                    reason=f"{at} = {fmt(value)} is {what}",
                )
        i = min(range(count), key=lambda k: _margin(check.check, check.value, matches[k][1]))
        ok = _margin(check.check, check.value, matches[i][1]) >= 0
    elif check.check == "eq":
        i = next((k for k, (_, v) in enumerate(matches) if not json_equal(v, check.value)), 0)
        ok = json_equal(matches[i][1], check.value)
    elif check.check == "match":  # every value a string that the whole expression matches

        def matched(v: Any) -> bool:
            return isinstance(v, str) and re.fullmatch(check.value, v) is not None

        i = next((k for k, (_, v) in enumerate(matches) if not matched(v)), 0)
        ok = matched(matches[i][1])
    elif check.check == "same":  # every value an object whose named members are present and equal

        def same(v: Any) -> bool:
            if not isinstance(v, dict) or any(name not in v for name in check.value):
                return False
            return all(json_equal(v[name], v[check.value[0]]) for name in check.value[1:])

        i = next((k for k, (_, v) in enumerate(matches) if not same(v)), 0)
        ok = same(matches[i][1])
    else:
        i = next((k for k, (_, v) in enumerate(matches) if v is not True), 0)
        ok = matches[i][1] is True
    at, value = matches[i]
    verb = "meets" if ok else "needs"
    reason = f"{at} = {fmt(value)}, {verb} {want}" + (f" (worst of {count} values)" if count > 1 else "")
    return CheckResult(
        **base, status="pass" if ok else "fail", value=value, at=at, count=count, reason=reason
    )
