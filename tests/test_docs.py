"""The README's and docs' relative links point at files in the repository (the design doc ships in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_relative_links_resolve_inside_the_repository():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{page.name}: {target}"
    readme = (ROOT / "README.md").read_text()
    assert "[docs/architecture.md](docs/architecture.md)" in readme and "../shared" not in readme
    assert "GitPython" not in (ROOT / "docs" / "architecture.md").read_text()


def test_every_path_the_architecture_page_names_exists():
    """docs/architecture.md names modules and files by their repository path (the module map, the walk of a
    drafter choice): each must exist, so the page stays true when code moves. A path with a placeholder
    (`<name>`, `*`) names a family, not a file."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    top = r"(?:engine|bridge|gates|presets|tests|benchmarks|scripts|docs|\.github)"
    named = set(re.findall(rf"(?<![\w/.-]){top}/[\w./-]*\w", text))
    assert len(named) > 100, sorted(named)  # the module map is there
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"


def test_no_page_says_a_sentence_twice():
    """A sentence repeated on one page (an edit that left its old copy behind, docs/runners.md's
    `untrusted_labels` line) reads as a mistake; code blocks, tables and lists may repeat."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        seen: set[str] = set()
        for sentence in re.split(r"(?<=[.!?])\s+", prose):
            words = " ".join(sentence.split())
            if len(words) > 40 and not words.startswith(("|", "-", "#")):
                assert words not in seen, f"{page.name} says twice: {words}"
                seen.add(words)


def test_the_module_map_lists_exactly_the_modules_on_disk():
    """docs/architecture.md's "Layout: one line per module" lists every module of bridge/, engine/ and gates/,
    one line each (a package's __init__.py may be listed, and need not be), and nothing that is not on disk: a
    module added, renamed or removed fails here with the exact lines to add or remove."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Layout: one line per module")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    packages = ("bridge", "engine", "gates")
    # a map line: indented, its first word a .py path (placeholders such as <name> included, so they count extra)
    listed = re.findall(rf"^ {{4}}((?:{'|'.join(packages)})/\S*\.py)(?:\s|$)", section, flags=re.M)
    twice = sorted({p for p in listed if listed.count(p) > 1})
    on_disk = {
        path.relative_to(ROOT).as_posix()
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    modules = {p for p in on_disk if not p.endswith("/__init__.py")}
    missing = sorted(modules - set(listed))
    extra = sorted(set(listed) - on_disk)
    assert (missing, extra, twice) == ([], [], []), (
        "docs/architecture.md's module map (## Layout: one line per module) is out of date:\n"
        + "".join(f"  missing from the map (add a line under its layer): {p}\n" for p in missing)
        + "".join(f"  in the map but not on disk (remove or rename its line): {p}\n" for p in extra)
        + "".join(f"  listed more than once: {p}\n" for p in twice)
    )
