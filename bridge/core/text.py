"""Text a run (or anyone who can push to the bus) wrote, made safe to show on a terminal, in a page or to an
agent: `clean` drops terminal control sequences (CSI such as cursor moves and clear-screen, OSC such as OSC 52
that writes the clipboard, DCS/APC/PM/SOS strings, other ESC sequences), every C0 and C1 control character
(tab and newline kept in multi-line text), DEL, and the format characters that reorder or hide text (bidi
overrides and isolates such as U+202E, zero-width characters, the line and paragraph separators).

    clean("\\x1b]52;c;aGk=\\x07\\x1b[2J\\x1b[32m✓ pass\\x1b[0m")        # '✓ pass'
    clean(log_text, multiline=True)                                     # newlines and tabs kept
    clean_json({"what": "\\u202egnp.exe"})                              # every string in it cleaned

It is used where a run's text is stored for showing (a heartbeat's progress, gate reasons, summary.md) and
again where the client prints (bridge/cli/main.py filters stdout and stderr through it; the live bar's and the MCP
server's text are cleaned before they are handed on): a client never trusts that a runner cleaned.
Markdown and HTML quoting is another matter (gates/markdown.py, bridge/results/render.py).
"""

from __future__ import annotations

import re
from typing import Any, TextIO

# Characters never shown: C0 (tab and newline are handled apart), DEL and C1, and the Unicode format characters
# (category Cf), line and paragraph separators (Zl, Zp) and lone surrogates (Cs) of Unicode 15.
# tests/bridge/test_text.py checks this against the running Python's unicodedata.
_DROPPED = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
# Whole control sequences first, so that their parameters do not remain as text: CSI (7-bit and 8-bit), the
# string sequences OSC, DCS, SOS, PM, APC up to their terminator (BEL or ST; else to the end of the line),
# then any other ESC sequence (intermediate bytes and a final byte).
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
_BAD = re.compile(f"[{_DROPPED}\t\n]")
_BAD_MULTILINE = re.compile(f"[{_DROPPED}]")
_SPACE = re.compile(r"[\t\n]")


def clean(text: str, multiline: bool = False) -> str:
    """`text` without control sequences, control characters and format characters. A single line (the
    default) has its tabs and newlines made spaces; `multiline` keeps them (a log shown as lines)."""
    if not (_BAD if not multiline else _BAD_MULTILINE).search(text):
        return text  # the common case: nothing to drop
    text = _BAD_MULTILINE.sub("", _SEQUENCE.sub("", text))
    return text if multiline else _SPACE.sub(" ", text)


def clean_json(value: Any, multiline: bool = True) -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with every string in it, keys too, `clean`ed."""
    if isinstance(value, str):
        return clean(value, multiline)
    if isinstance(value, dict):
        return {clean_json(k, False): clean_json(v, multiline) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v, multiline) for v in value]
    return value


class CleanStream:
    """A text stream that writes to `unfiltered` what `clean(..., multiline=True)` leaves of each write
    (bridge/cli/main.py puts one over stdout and stderr). `unfiltered` stays reachable for a writer that draws escape
    sequences of its own (the live progress bar) and cleans its text itself."""

    def __init__(self, unfiltered: TextIO):
        self.unfiltered = unfiltered

    def write(self, text: str) -> int:
        self.unfiltered.write(clean(text, multiline=True))
        return len(text)

    def flush(self) -> None:
        self.unfiltered.flush()

    def isatty(self) -> bool:
        return self.unfiltered.isatty()

    def fileno(self) -> int:
        return self.unfiltered.fileno()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer, ...
        return getattr(self.unfiltered, name)
