"""bridge/core/text.py: what a terminal, a page or an agent is shown of a run's text."""

from __future__ import annotations

import io
import sys
import unicodedata

import pytest

from bridge.core.text import _BAD_MULTILINE, CleanStream, clean, clean_json

HOSTILE = (
    "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # OSC 52: write the clipboard
    "\x1b[2J\x1b[H"  # clear the screen, cursor home
    "\x1b[5A\x1b[10;20H"  # cursor moves
    "\x1b[32m\u2713 pass\x1b[0m"  # a fake green pass
    "\x1bP+q\x1b\\"  # DCS
    "\x1b]8;;https://evil\x1b\\link\x1b]8;;\x1b\\"  # OSC 8 hyperlink
    "\x9b2J\x9d0;title\x9c"  # 8-bit CSI and OSC
    "\u202egnp.exe\u202c\u2066x\u2069\u200b\u200d\ufeff\u2028\r\x07\x08\x00\x7f"
)


def test_control_sequences_and_characters_are_dropped_and_their_text_kept():
    out = clean(HOSTILE)
    assert out == "\u2713 passlinkgnp.exex"
    assert clean("plain text, 3/5 \u2713 é 中") == "plain text, 3/5 \u2713 é 中"


def test_a_single_line_has_its_tabs_and_newlines_made_spaces_multiline_keeps_them():
    assert clean("a\tb\nc\r\n") == "a b c "
    assert clean("a\tb\r\nc\x1b[1A\n", multiline=True) == "a\tb\nc\n"


def test_an_unterminated_string_sequence_ends_at_the_line():
    assert clean("x\x1b]52;c;AAAA\nnext", multiline=True) == "x\nnext"


def test_every_control_format_and_separator_character_of_this_python_is_dropped():
    bad = [
        chr(c)
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp", "Cs")
    ]
    missed = [f"U+{ord(c):04X}" for c in bad if c not in "\t\n" and not _BAD_MULTILINE.fullmatch(c)]
    assert not missed
    assert clean("".join(bad), multiline=True) == "\t\n"


def test_json_values_are_cleaned_through_and_through():
    assert clean_json({"a\x1b[2J": ["\u202ex", {"b": "\x1b]0;t\x07y"}], "n": 3}) == {
        "a": ["x", {"b": "y"}],
        "n": 3,
    }


@pytest.mark.parametrize("chunks", [["\x1b[2Jok\n"], ["o", "k\x1b]52;c;AA\x07", "\n"]])
def test_a_clean_stream_writes_what_clean_leaves(chunks):
    raw = io.StringIO()
    stream = CleanStream(raw)
    for chunk in chunks:
        print(chunk, end="", file=stream)
    assert raw.getvalue() == "ok\n"
