"""Reports as strict JSON: reading one (an object, no duplicate keys, no NaN / Infinity), and the JSON
value rules every gate module shares: the one finite-number test, JSON equality, a value as written."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from gates.pointer import join, json_type


class ReportError(ValueError):
    """A report file that cannot be read as a strict JSON object."""


def is_number(value: Any) -> bool:
    """A finite JSON number: an int or float, not a boolean, not NaN or +-Infinity."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def non_finite(value: Any, parts: tuple[str, ...] = ()) -> list[tuple[str, float]]:
    """Pointers of every NaN / +-Infinity in a parsed document."""
    if isinstance(value, float) and not is_number(value):
        return [(join(parts), value)]
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in non_finite(v, (*parts, str(k)))]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in non_finite(v, (*parts, str(i)))]
    return []


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def fmt(value: Any, limit: int = 80) -> str:
    """A value as JSON text for messages, cut at `limit` characters."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fmt_number(x: float | None) -> str:
    """A number as written: 95 not 95.0, 25276510208 not 2.52765e+10."""
    if x is None:
        return "null"
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ReportError(f"duplicate key {key!r}")
        out[key] = value
    return out


MAX_DEPTH = (
    64  # arrays and objects in one another; a report is a few levels deep, its gate walks it recursively
)


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in a parsed document (a scalar is 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:
            todo += [(c, depth + 1) for c in children]
    return deepest


def parse_report(data: str | bytes, name: str = "report") -> dict[str, Any]:
    """Parse a report as strict JSON: an object, no duplicate keys, no NaN / Infinity (nor overflow to them).
    `name` says which report in the error messages."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ReportError(f"cannot read {name}: {exc}") from None
    try:
        parsed = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{name} is not valid JSON: {exc}") from None
    except ReportError as exc:
        raise ReportError(f"{name} is not valid: {exc}") from None
    except ValueError as exc:  # an integer past Python's int-from-string limit (4300 digits)
        raise ReportError(f"{name} is not valid: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise ReportError(f"{name} is not valid: nested too deep to read") from None
    if _depth(parsed) > MAX_DEPTH:
        raise ReportError(f"{name} is not valid: arrays and objects nested more than {MAX_DEPTH} deep")
    bad = non_finite(parsed)
    if bad:
        where = ", ".join(f"{p or '/'} = {v!r}" for p, v in bad[:5])
        raise ReportError(f"{name} has non-finite numbers ({where}); JSON numbers must be finite")
    if not isinstance(parsed, dict):
        raise ReportError(f"{name} is {json_type(parsed)}, not a JSON object")
    return parsed


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`parse_report` on a file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ReportError(f"cannot read report {path}: {exc}") from None
    return parse_report(data, f"report {path}")
