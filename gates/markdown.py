"""The one markdown helper of gates and the bridge (bridge/render.py, bridge/comment.py, the job summary use it).
Text a report, a run or the bus wrote is hostile: shown where markdown renders (a pull request's comment, a job
summary, summary.md on GitHub) it must not mention anyone, link, embed an image or a badge, open HTML or break
its table. So it goes into an inline code span (`code`), where nothing is markdown and GitHub neither mentions
nor autolinks; `cell` leaves plain the text that is inert anyway (words, numbers) and spans the rest; `fence`
opens a code block that the text inside cannot close.

    lines = table(["check", "value"], [["min", cell(reason)]])   # ['| check | value |', '|---|---|', ...]
    f"**Reason:** {code(reason, table=False)}"
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Text that renders as itself everywhere: letters, digits, spaces and punctuation that starts no markdown, HTML,
# entity, mention, issue reference, math or autolink (never `@`, `#`, `&`, `<`, `>`, `!`, `*`, `~`, `$`, `\`,
# a backtick or `|`); `_` only inside a word, `[` `]` never followed by `(`, `:` neither in `://` nor between
# letters as an emoji's `:name:` is (`sink_window:4:64` stays plain).
_INERT_TEXT = re.compile(r"[A-Za-z0-9 .,;:=+%/'\"()?\[\]_\-\u0080-\U0010ffff]*")  # no markdown is non-ASCII
_ACTIVE = re.compile(
    r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\]\(|://|:[A-Za-z0-9_+-]*[A-Za-z_+-][A-Za-z0-9_+-]*:|www\.", re.I
)
_TICKS = re.compile(r"`+")


def _one_line(text: str, limit: int | None) -> str:
    text = " ".join(text.splitlines()) if "\n" in text or "\r" in text else text
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def code(text: str, limit: int | None = None, *, table: bool = True) -> str:
    """`text` as one inline code span, shown as written: one line, at most `limit` characters (cut with "…"),
    fenced with more backticks than any run of them in it; `table`: its `|` escaped for a table cell (GFM reads
    `\\|` in a cell, a code span's too, as `|`). An empty text is an empty string."""
    text = _one_line(text, limit)
    if not text:
        return ""
    fence = "`" * (max((len(m) for m in _TICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    if table:
        text = text.replace("|", "\\|")
    return f"{fence}{pad}{text}{pad}{fence}"


def cell(text: str, limit: int | None = None, *, table: bool = True) -> str:
    """`text` for a table cell (or, `table=False`, a line or a list item): as it is when it is inert (words,
    numbers), else a code span (`code`). One line, at most `limit` characters, cut with "…"."""
    text = _one_line(text, limit)
    if _INERT_TEXT.fullmatch(text) and not _ACTIVE.search(text):
        return text
    return code(text, table=table)


def fence(lines: Sequence[str], info: str = "") -> list[str]:
    """`lines` as a fenced code block whose fence no line can close (longer than any run of backticks)."""
    longest = max((len(m) for line in lines for m in _TICKS.findall(line)), default=0)
    mark = "`" * max(3, longest + 1)
    return [mark + info, *lines, mark]


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table; `head` and `rows` are cells already (see `cell`)."""
    return [row_line(head), "|" + "---|" * len(head), *(row_line(row) for row in rows)]


def row_line(cells: Sequence[str]) -> str:
    """One table row: `| a | b |`, an empty cell as `| |`."""
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
