"""Gate checks as declared under `gate:` in a preset."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

# A JSON pointer (RFC 6901) whose segments may be `*` (every array item).
_POINTER = re.compile(r"^(/([^/~]|~[01])*)+$")


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Check(BaseModel):
    """One threshold over a JSON-pointer path; `*` fans out over array items."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    check: Literal["min", "max", "eq", "between", "all_true"]
    path: str
    value: Any = None

    @model_validator(mode="after")
    def _shape(self) -> Check:
        if not _POINTER.match(self.path):
            raise ValueError(
                f"path {self.path!r} is not a JSON pointer such as /summary/recall or /rungs/*/delta"
            )
        if self.check in ("min", "max"):
            if not _finite_number(self.value):
                raise ValueError(
                    f"check {self.check!r} at {self.path} needs a finite number, got {self.value!r}"
                )
        elif self.check == "between":
            ok = (
                isinstance(self.value, list)
                and len(self.value) == 2
                and all(_finite_number(v) for v in self.value)
                and self.value[0] <= self.value[1]
            )
            if not ok:
                raise ValueError(
                    f"check 'between' at {self.path} needs value [low, high], got {self.value!r}"
                )
        elif self.check == "eq":
            if self.value is None:
                raise ValueError(f"check 'eq' at {self.path} needs a value")
            if isinstance(self.value, float) and not math.isfinite(self.value):
                raise ValueError(f"check 'eq' at {self.path} needs a finite value, got {self.value!r}")
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
