"""Reports show what was judged: real runs of the real presets on the zoo's tiny models (`kakeya exec`) put
each report kind's results table (gates/tables.py) in summary.md, report.html and the job summary, with the
judged values marked against the gate's thresholds, and draw judged plots (threshold line, verdict, preset,
label, subject and device in the title, human units). Every table's paths exist in its kind's schema."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

import gates
import gates.tables as T
from bridge.cli.main import main
from bridge.evidence import Outcome, Requirement, summary_table
from bridge.presets.registry import load_registry
from bridge.results import plots

ROOT = Path(__file__).resolve().parents[2]


def exec_run(preset: str, tmp: Path, capsys, *params: str) -> tuple[Path, dict[str, Any]]:
    out = tmp / preset
    args = ["exec", preset, "--out", str(out)]
    for p in params:
        args += ["-p", p]
    main(args)
    capsys.readouterr()
    return out, json.loads((out / "report.json").read_text())


@pytest.fixture(name="niah", scope="module")
def niah_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """niah-smoke on the tiny model: the gate judges hybrid's recall delta (it passes); sink_window, reported
    beside it, loses the needles outside its window (gated by niah-sink-window, it fails)."""
    out = tmp_path_factory.mktemp("niah") / "niah-smoke"
    assert main(["exec", "niah-smoke", "--out", str(out), "-p", "contexts=128,256", "-p", "samples=1"]) == 0
    return out


def test_niah_shows_recall_per_context_and_policy_judged_in_every_rendering(niah: Path, capsys):
    capsys.readouterr()
    summary = (niah / "summary.md").read_text()
    assert summary.startswith("# niah-smoke: succeeded — verdict pass")
    results = summary.split("## Results\n\n", 1)[1].split("\n## ", 1)[0]
    head = next(line for line in results.splitlines() if line.startswith("| context |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    for col in ("hybrid recall", "sink_window recall", "hybrid K/V vs full", "sink_window K/V vs full"):
        assert col in cols, cols  # every policy's recall and K/V vs full, one level deeper than before
    judged = cols.index("hybrid recall Δ (gate ≤ 0.05)")
    assert "sink_window recall Δ" in cols  # reported, not judged
    rows = [line for line in results.splitlines() if re.match(r"\| (128|256) \|", line)]
    assert len(rows) == 2
    report = json.loads((niah / "report.json").read_text())
    for row, rung in zip(rows, report["rungs"], strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        delta = rung["policies"]["hybrid"]["recall_delta"]
        assert (
            cells[judged]
            == f"{delta:.3g}{'.0' if delta == int(delta) else ''} {'✓' if delta <= 0.05 else '✗'}"
        )
        assert cells[cols.index("hybrid recall")] == T.human(rung["policies"]["hybrid"]["recall"])
        assert cells[cols.index("full K/V")].endswith("KiB")  # bytes in human units
    assert "![results-1.png](results-1.png)" in summary
    assert "## Plots (drawn by the program)" in summary  # the workload's own plot, apart

    page = (niah / "report.html").read_text()
    section = page.split("<h2>Results</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<th>hybrid recall Δ (gate ≤ 0.05)</th>" in section
    assert section.count('<span class="pass">0.0 ✓</span>') == 2
    png = (niah / "results-1.png").read_bytes()
    assert png[:4] == b"\x89PNG" and base64.b64encode(png).decode() in section  # inline, under Results

    # the job summary of `gate pr` shows the evidence's table, judged by the re-gated verdict: here by
    # niah-sink-window's gate, which judges (and fails) sink_window's recall delta
    registry = load_registry()
    preset = registry["niah-sink-window"]
    verdict = gates.evaluate(report, preset.gate, kind="niah", schema_version=1)
    req = Requirement.parse("niah-sink-window@cpu", registry)
    job = summary_table("a" * 40, [Outcome(req, "fail", ["x"], verdict=verdict, report=report)])
    assert "<details open><summary>niah-sink-window@cpu: results</summary>" in job
    assert "| sink_window recall Δ (gate ≤ 0.05) |" in job and "| hybrid recall Δ |" in job
    assert job.count("1.0 ✗") == 2


def test_the_judged_plot_has_the_threshold_line_the_verdict_and_human_units(niah: Path):
    assert (niah / "results-1.png").read_bytes()[:4] == b"\x89PNG"  # drawn by the run; its panels, again:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads((niah / "report.json").read_text())
    verdict = gates.evaluate(report, load_registry()["niah-sink-window"].gate)
    (table,) = T.results_tables(report, verdict.checks)
    fig, axes = plt.subplots(1, 3)
    for ax, plot in zip(axes, table.plots, strict=True):
        plots._panel(ax, table, plot)
    fig.canvas.draw()
    recall, delta, kv = axes
    lines = {line.get_label(): line.get_ydata() for line in delta.get_lines()}
    assert list(lines["gate: sink_window recall Δ ≤ 0.05"]) == [0.05, 0.05]  # the threshold, dashed
    assert list(lines["sink_window recall Δ"]) == [
        r["policies"]["sink_window"]["recall_delta"] for r in report["rungs"]
    ]
    assert "gate: full recall ≥ 0.8" in {line.get_label() for line in recall.get_lines()}
    # the first series (the oracle's) is drawn widest, hollow, under the next: hybrid equal to it hides nothing
    full, hybrid = (
        next(ln for ln in recall.get_lines() if ln.get_label() == n) for n in ("full recall", "hybrid recall")
    )
    assert full.get_markersize() > hybrid.get_markersize() and full.get_markerfacecolor() == "none"
    assert full.get_linewidth() > hybrid.get_linewidth() and full.get_zorder() < hybrid.get_zorder()
    ticks = [t.get_text() for t in kv.get_yticklabels() if t.get_text()]
    assert ticks and all(t.endswith(("KiB", "MiB")) for t in ticks), ticks
    assert [t.get_text() for t in kv.get_xticklabels()] == ["128", "256"]
    plt.close(fig)
    title = plots.title_line("niah-sink-window", "fail", "cpu", "b" * 40, "cpu (x86_64)")
    assert title == "niah-sink-window · verdict fail · label cpu · subject bbbbbbbbbbbb · device cpu (x86_64)"


def test_throughput_and_compression_show_methods_and_batch_by_length(tmp_path: Path, capsys):
    out, report = exec_run(
        "throughput-code",
        tmp_path,
        capsys,
        "prompts=2",
        "prompt_tokens=16",
        "new_tokens=16",
        "repeats=1",
        "batches=1,2",
    )
    summary = (out / "summary.md").read_text()
    assert (
        "| prompt tokens | greedy decode tok/s | speculative decode tok/s | greedy e2e tok/s | "
        "speculative e2e tok/s | speedup | acceptance length | exact (gate all true) |"
    ) in summary
    first = report["prompts"][0]
    assert (
        f"| {first['greedy']['decode_tok_s']:,.1f} | {first['speculative']['decode_tok_s']:,.1f} |" in summary
    )
    assert f"| {T.human(first['speculative']['acceptance_length'])} | yes ✓ |" in summary
    assert re.search(r"\| yes ✓ \|", summary)  # exactness, judged per prompt
    assert "### Batched greedy decoding" in summary and (out / "results-2.png").is_file()
    decoding = T.results_tables(report)[0]  # its speedup panel draws the min_speedup the gate compares with
    assert decoding.thresholds == [None, report["summary"]["min_speedup"]]

    out, report = exec_run("compression-table", tmp_path, capsys)
    summary = (out / "summary.md").read_text()
    assert "| policy | batch | length | full | net | net bytes/token | ratio |" in summary
    assert re.search(r"\| sink_window:4:64 \| 64 \| 1M \| [0-9.]+ GiB \| [0-9.]+ MiB \|", summary)
    assert "| match (gate = true) |" in summary


def _schema_node(schema: dict[str, Any], node: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    """The schema node that `path` names below `node` (`*`: an array's items, or any of an object's
    properties), or None."""
    while "$ref" in node and node["$ref"].startswith("#/$defs/"):
        rest = {k: v for k, v in node.items() if k != "$ref"}
        node = {**schema["$defs"][node["$ref"].removeprefix("#/$defs/")], **rest}
    if not path:
        return node
    seg, rest = path[0], path[1:]
    nexts = [b for b in node.get("anyOf", []) + node.get("oneOf", []) if b.get("type") != "null"]
    if nexts:
        return next((n for b in nexts if (n := _schema_node(schema, b, path)) is not None), None)
    if seg == "*" and "items" in node:
        nexts = [node["items"]]
    elif seg == "*":
        nexts = list(node.get("properties", {}).values())
    elif seg in node.get("properties", {}):
        nexts = [node["properties"][seg]]
    if isinstance(node.get("additionalProperties"), dict):
        nexts.append(node["additionalProperties"])
    return next((n for b in nexts if (n := _schema_node(schema, b, rest)) is not None), None)


@pytest.mark.parametrize("kind", sorted(T.TABLES))
def test_every_declared_column_exists_in_its_kinds_schema(kind: str):
    schema = json.loads((ROOT / "gates" / "schemas" / f"{kind}.v1.schema.json").read_text())
    for table in T.TABLES[kind]:
        rows = gates.pointer.split(table.rows)
        assert _schema_node(schema, schema, rows) is not None, table.rows
        for col in table.columns:
            where = [*rows, "*", *gates.pointer.split(col.path)]
            assert _schema_node(schema, schema, where) is not None, col.path
        names = {c.name for c in table.columns} | {"#"}
        for plot in table.plots:
            assert {plot.x, *plot.y, *plot.series} <= names, plot


def test_a_hostile_report_cannot_open_html_in_the_job_summary():
    report = {
        "kind": "restoration",
        "arms": [{"name": "</details><img src=x>", "policy": "a|b\nc", "recall": 0.5, "kv_bytes": 3 * 2**30}],
    }
    (table,) = T.results_tables(report)
    from bridge.results.render import tables_markdown

    md = "\n".join(tables_markdown([table]))
    assert "| `</details><img src=x>` | `a\\|b c` |" in md and "| 3 GiB |" in md  # code spans (issue 40)
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<img" not in html and "</details>" not in html and "<code>a|b c</code>" in html


def test_a_secret_in_the_report_reaches_no_table_and_no_plot(niah: Path, monkeypatch: pytest.MonkeyPatch):
    from bridge.core.logs import Redactor
    from bridge.core.result import RunResult
    from bridge.results.outcome import RunOutcome

    report = json.loads((niah / "report.json").read_text())
    report["environment"]["device"] = "cpu hunter2-token"
    verdict = gates.evaluate(report, load_registry()["niah-smoke"].gate)
    result = RunResult.model_validate_json((niah / "result.json").read_text())
    drawn: list[tuple[list[T.Built], str]] = []
    monkeypatch.setattr(plots, "judged_plots", lambda tables, title: drawn.append((tables, title)) or {})
    files = RunOutcome(niah, result, report, verdict, Redactor(["hunter2-token"])).files()
    ((tables, title),) = drawn
    assert title.endswith("device cpu [REDACTED]") and tables[0].rows
    assert b"hunter2" not in b"".join(files.values())
    # a secret that redaction cannot take out of the JSON without breaking it (a number): no plot at all
    drawn.clear()
    files = RunOutcome(niah, result, report, verdict, Redactor(["0.0, "])).files()
    assert drawn == [] and "## Results" in files["summary.md"].decode()
