"""Issue 40 (3): text a run controls, in the markdown and HTML people read. Runs on a real bus (served by the
runner) whose reports quote an attacker's text in their gate reasons (a failing value, a duplicate key) and
whose stderr tries to close its code block; `kakeya gate pr --comment --base --summary` (the real CLI) and the
runner's own summary.md and report.html: parsed by a CommonMark parser (markdown-it-py, tables on), they hold
no link, image, raw HTML, mention, autolink or emoji from it; the page holds no tag from it. And an invalid
report the runner kept (duplicate keys, a 10,000-digit integer, nesting past the limit) is one line from every
reader, never a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from html.parser import HTMLParser

import pytest
import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token

from gates.markdown import cell, code, fence
from tests.bridge.bus_support import Env, git
from tests.bridge.test_gate_pr import LocalBus

ATTACK = (
    "@octocat ![pass](https://x/badge.svg) [click](https://evil) <img src=x> www.evil.example "
    "https://evil.example/a **bold** :+1: #1 &amp; `tick` ``two`` | pipe </details> <!-- c -->"
)
QUOTE_PY = textwrap.dedent("""
    import json, os, pathlib, sys

    attack, mode = json.loads(sys.argv[1]), sys.argv[2]
    run = pathlib.Path(os.environ["KAKEYA_RUN_DIR"])
    (run / "[c](javascript:alert(1)).png").write_bytes(b"\\x89PNG\\r\\n\\x1a\\n")
    print("```\\n" + attack + "\\n```", file=sys.stderr)
    env = {"python": "3", "os": "test", "machine": "x", "hostname": "h", "cpu_count": 1, "memory_bytes": None,
           "versions": {"python": "3"}}
    probe = {"python": "3", "os": attack, "cpu_count": 1, "memory_bytes": None,
             "packages": {"torch": None, "transformers": None, "mlx": None, "mlx_lm": None},
             "accelerators": {"cuda": {"available": False, "devices": []}, "mps": {"available": False},
                              "metal": {"available": False}},
             "mlx_default_device": None}
    report = {"kind": "probe", "schema_version": 1, "created_at": "2026-01-01T00:00:00+00:00",
              "environment": env, "subject": os.environ.get("KAKEYA_SUBJECT"), "probe": probe}
    text = json.dumps(report, ensure_ascii=False)
    if mode == "dup":  # the same key twice: the key's text is quoted in the reason
        text = text[:-1] + ", " + json.dumps(attack) + ": 1, " + json.dumps(attack) + ": 2}"
    elif mode == "bigint":
        text = text.replace('"cpu_count": 1', '"cpu_count": ' + "9" * 10000)
    elif mode == "deep":
        text = text[:-1] + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}"
    with open(os.environ["KAKEYA_REPORT"], "w") as fh:
        fh.write(text)
""")
MODES = ("value", "dup", "bigint", "deep")
# the HTML kakeya writes itself: the comment's marker, the job summary's <details> around a requirement's name
OUR_HTML = re.compile(
    r"\s*(<!-- kakeya-evidence -->|<details( open)?><summary>[\w@ :()-]+</summary>|</details>)\s*"
)
OUR_HTML_ANYWHERE = re.compile(r"<!-- kakeya-evidence -->|</?details( open)?>|</?summary>")


def preset(mode: str) -> dict:
    return {
        "name": f"quote-{mode}",
        "description": "a report that quotes an attacker",
        "runners": ["cpu"],
        "timeout_s": 60,
        "argv": ["{python}", "quote.py", json.dumps(ATTACK), mode],
        "report": {"kind": "probe", "schema_version": 1},
        "gate": [
            {"check": "min", "path": "/probe/cpu_count", "value": 1},
            {"check": "eq", "path": "/probe/os", "value": "test"},
        ],
    }


@pytest.fixture(name="bus")
def bus_fixture(world: Env) -> LocalBus:
    (world.project / "quote.py").write_text(QUOTE_PY)
    for mode in MODES:
        (world.presets / f"quote-{mode}.yaml").write_text(yaml.safe_dump(preset(mode)))
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "quote")
    return LocalBus(world)


def inline(tokens: list[Token]) -> list[Token]:
    return [t for tok in tokens for t in ([tok] + inline(tok.children or []))]


def assert_inert(markdown: str, what: str, links: tuple[str, ...] = ()) -> None:
    """Rendered as GitHub renders (CommonMark, tables): no link but `links`, no image, no raw HTML; and no
    text outside code that GitHub would make a mention, an autolink, an emoji or an issue link."""
    md = MarkdownIt("commonmark").enable("table")
    tokens = inline(md.parse(markdown))
    assert not [t for t in tokens if t.type == "image"], what
    html = [t.content for t in tokens if t.type in ("html_inline", "html_block")]
    assert all(OUR_HTML.fullmatch(h) for h in html), f"{what} has HTML: {html}"
    hrefs = [t.attrs.get("href") for t in tokens if t.type == "link_open"]
    assert all(h in links for h in hrefs), f"{what} links to {hrefs}"
    for t in tokens:
        if t.type == "text":
            assert not re.search(r"(^|[^\w`])@\w|https?:|www\.|:\+1:|#1\b|<img", t.content), (
                f"{what}: {t.content!r}"
            )
    html = OUR_HTML_ANYWHERE.sub("", md.render(markdown))
    assert (
        "<img" not in html
        and "<!--" not in html
        and "evil" not in re.sub(r"<code>.*?</code>|<pre><code>.*?</code></pre>", "", html, flags=re.S)
    )


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, attrs))


def test_run_text_in_the_comment_job_summary_summary_md_and_page_is_quoted(world: Env, bus: LocalBus):
    base = git(world.project, "rev-parse", "HEAD")
    (world.project / "head.txt").write_text("head")
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "head")
    head = git(world.project, "rev-parse", "HEAD")
    bus.run("quote-value")  # on the base too: something to compare with
    runs = {mode: bus.run(f"quote-{mode}") for mode in MODES}
    comment, summary = world.tmp / "comment.md", world.tmp / "step-summary.md"
    requires = [a for mode in MODES for a in ("--require", f"quote-{mode}@cpu")]
    gate = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "gate", "pr", "--subject", head, *requires, "--remote", bus.url]
        + ["--allow-unsigned", "--comment", str(comment), "--base", base, "--summary", str(summary)],
        cwd=world.project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gate.returncode == 1 and "Traceback" not in gate.stderr, gate.stderr
    for name, text in (("the comment", comment.read_text()), ("the job summary", summary.read_text())):
        assert "octocat" in text and "duplicate key" in text and "4300 digits" in text  # said, quoted
        assert_inert(text, name)
    for mode, rid in runs.items():
        files = bus.files(rid)
        md = files["summary.md"].decode()
        assert "octocat" in md and "[c](javascript" in md
        assert_inert(md, f"summary.md of {mode}", links=("logs/stdout.log", "logs/stderr.log"))
        page = Tags()
        page.feed(files["report.html"].decode())
        ours = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "b", "table", "tr"}
        ours |= {"th", "td", "code", "pre", "ul", "li", "span", "figure", "img", "figcaption"}
        assert {t for t, _ in page.tags} <= ours, page.tags
        # the one image: the program's plot, inlined (its name only as text)
        assert [dict(a)["src"][:22] for t, a in page.tags if t == "img"] == ["data:image/png;base64,"]
        assert "octocat" in files["report.html"].decode()


def test_an_invalid_report_is_one_line_from_every_reader(world: Env, bus: LocalBus):
    """The runner keeps a report that does not parse (its result says why); `gate pr --comment --base`, `gate
    check` and `gate compare` on it, real CLI processes, each say so in one line."""
    base = git(world.project, "rev-parse", "HEAD")
    for mode in ("dup", "bigint", "deep"):
        rid = bus.run(f"quote-{mode}")
        result = json.loads(bus.files(rid)["result.json"])
        assert result["status"] == "error" and "report.json is not valid" in result["reason"]
        report = world.tmp / "report.json"
        report.write_bytes(bus.files(rid)["report.json"])
        comment = world.tmp / f"{mode}.md"
        for args in (
            ["gate", "pr", "--subject", base, "--require", f"quote-{mode}@cpu", "--remote", bus.url]
            + ["--allow-unsigned", "--comment", str(comment), "--base", base],
            ["gate", "check", str(report), "--preset", f"quote-{mode}"],
            [
                "gate",
                "compare",
                str(report),
                str(report),
                "--metric",
                "/probe/cpu_count",
                "--max-regression",
                "1",
            ],
        ):
            proc = subprocess.run(
                [sys.executable, "-m", "bridge.cli", *args], cwd=world.project, capture_output=True, text=True
            )
            assert "Traceback" not in proc.stderr and proc.returncode in (1, 2), (mode, args, proc.stderr)
            assert "not valid" in proc.stdout + proc.stderr, (mode, args)
            errors = [ln for ln in proc.stderr.splitlines() if not ln.startswith("kakeya: bus:")]
            assert len(errors) <= 1, errors
        assert "not valid" in comment.read_text()


def test_code_spans_and_fences_hold_any_text():
    md = MarkdownIt("commonmark").enable("table")
    for text in (ATTACK, "`", "``a``", " lead", "trail ", "a|b", "x\\|y"):
        html = md.render(f"| a |\n|---|\n| {code(text)} |\n")
        assert html.count("<code>") == 1 and "<a " not in html and "<img" not in html
        span = md.parseInline(code(text, table=False))[0].children
        assert [t.type for t in span] == ["code_inline"] and span[0].content == text
    assert cell("3 checks passed, 0.05 ≥ 0.01") == "3 checks passed, 0.05 ≥ 0.01"
    assert cell("see www.evil.example").startswith("`")
    block = "\n".join(fence(["```", ATTACK, "````"]))
    tokens = md.parse(block)
    assert [t.type for t in tokens] == ["fence"] and tokens[0].content == f"```\n{ATTACK}\n````\n"
