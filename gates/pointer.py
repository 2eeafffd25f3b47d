"""JSON pointers (RFC 6901) where a `*` segment fans out over every item of an array."""

from __future__ import annotations

import re
from typing import Any

_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")


class PathError(LookupError):
    """The path does not resolve: a key is missing, an index is out of range, or `*` matched nothing."""


def split(path: str) -> list[str]:
    """`/a/b~1c` -> ["a", "b/c"]; the empty pointer is the whole document."""
    if path == "":
        return []
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer {path!r} must start with '/'")
    return [s.replace("~1", "/").replace("~0", "~") for s in path[1:].split("/")]


def join(parts: list[str] | tuple[str, ...]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def json_type(value: Any) -> str:
    """The JSON name of a Python value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def resolve(doc: Any, path: str) -> list[tuple[str, Any]]:
    """Every (concrete pointer, value) that `path` names in `doc`, in document order.

    Raises PathError naming the first place where the path breaks; never returns an empty list.
    """
    matches: list[tuple[tuple[str, ...], Any]] = [((), doc)]
    for seg in split(path):
        found: list[tuple[tuple[str, ...], Any]] = []
        for parts, node in matches:
            here = join(parts) or "the document root"
            if seg == "*":
                if not isinstance(node, list):
                    raise PathError(
                        f"{here} is {json_type(node)}, not an array, so '*' cannot fan out over it"
                    )
                if not node:
                    raise PathError(f"{here} is an empty array, so '*' matched nothing")
                found.extend(((*parts, str(i)), item) for i, item in enumerate(node))
            elif isinstance(node, dict):
                if seg not in node:
                    raise PathError(f"{join((*parts, seg))} is missing (no key {seg!r} in {here})")
                found.append(((*parts, seg), node[seg]))
            elif isinstance(node, list):
                if not _INDEX.match(seg) or int(seg) >= len(node):
                    raise PathError(
                        f"{join((*parts, seg))} is missing ({here} is an array of {len(node)} items)"
                    )
                found.append(((*parts, seg), node[int(seg)]))
            else:
                raise PathError(f"{join((*parts, seg))} is missing ({here} is {json_type(node)})")
        matches = found
    return [(join(parts), value) for parts, value in matches]
