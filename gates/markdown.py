"""The one markdown helper of gates and the bridge (bridge/render.py uses it): a table cell that keeps to one
line and cannot break its table or open HTML, and a table of such cells.

    lines = table(["check", "value"], [["min", cell(reason)]])   # ['| check | value |', '|---|---|', ...]
"""

from __future__ import annotations

from collections.abc import Sequence


def cell(text: str, limit: int | None = None, *, html: bool = True) -> str:
    """`text` for one markdown table cell (or list item): no newline, no `|`; with `html`, no `<` either (what a
    report or result says cannot open HTML, a `</details>`, where the markdown is shown: inside a code span
    pass html=False, there `&lt;` would show as it is). At most `limit` characters, cut with "…"."""
    text = text.replace("|", "\\|").replace("\n", " ")
    if html:
        text = text.replace("<", "&lt;")
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table; `head` and `rows` are cells already (see `cell`)."""
    return [row_line(head), "|" + "---|" * len(head), *(row_line(row) for row in rows)]


def row_line(cells: Sequence[str]) -> str:
    """One table row: `| a | b |`, an empty cell as `| |`."""
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
