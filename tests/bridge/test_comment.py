"""The pull request's comment, `kakeya gate pr --comment FILE` (bridge/evidence/comment.py), against a real bus with an
in-process runner: the evidence table, the change against the base branch's latest trusted run (never a newer
run of a commit off the base's history, never one with other parameters), links to summaries and committed
plots under the repository's web address (plain ids without one), hostile plot names left out, a refusal
still written as a comment."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from bridge.bus.records import results_path
from bridge.cli.main import main
from bridge.evidence import comment
from tests.bridge.bus_support import PRESETS, WRITE_REPORT_PY, Env, git
from tests.bridge.test_gate_pr import LocalBus

# The subject's program: its report's cpu_count is the number in value.txt of the commit under test, and it
# leaves plots in its run directory (one with a name that could break out of markdown).
BENCH_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import pathlib
    run = pathlib.Path(os.environ["KAKEYA_RUN_DIR"])
    (run / "plots").mkdir(exist_ok=True)
    (run / "plots" / "curve.png").write_bytes(b"\\x89PNG\\r\\n\\x1a\\n")
    (run / "x](javascript:alert(1)).png").write_bytes(b"\\x89PNG\\r\\n\\x1a\\n")
    write_report(cpu_count=int(pathlib.Path("value.txt").read_text()))
""")
BENCH = {
    "description": "a number from the subject",
    "timeout_s": 60,
    "runners": ["cpu"],
    "argv": ["{python}", "bench.py", "{tag}"],
    "params": {"tag": {"type": "str", "pattern": "[a-z0-9-]+", "max_length": 40, "default": "x"}},
    "verdict_free": ["tag"],  # a run's label here
    "report": {"kind": "probe", "schema_version": 1},
    "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
}


def set_value(env: Env, value: int) -> str:
    (env.project / "value.txt").write_text(str(value))
    git(env.project, "add", "-A")
    git(env.project, "commit", "-qm", f"value {value}")
    return git(env.project, "rev-parse", "HEAD")


@pytest.fixture(name="bus")
def bus_fixture(world: Env) -> LocalBus:
    (world.project / "bench.py").write_text(BENCH_PY)
    for name, extra in (
        ("bench", {}),
        ("flag", {"gate": [{"check": "eq", "path": "/probe/os", "value": "test"}]}),
        (
            "guarded",
            {"baseline": {"from": "previous-pass", "metric": "/probe/cpu_count", "max_regression_pct": 10}},
        ),
    ):
        (world.presets / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **BENCH, **extra}))
    return LocalBus(world)


def write_comment(bus: LocalBus, subject: str, *extra: str, require: str = "bench@cpu") -> tuple[int, str]:
    path = bus.env.tmp / "comment.md"
    rc = main(
        ["gate", "pr", "--subject", subject, "--require", require, "--remote", bus.url, "--allow-unsigned"]
        + ["--comment", str(path), *extra]
    )
    return rc, path.read_text()


def test_the_comment_compares_with_the_base_branchs_latest_trusted_run_and_links_summaries_and_plots(
    world: Env, bus: LocalBus, capsys
):
    base = set_value(world, 8)
    base_run = bus.run("bench", tag="base")
    bus.run("bench", tag="other")  # other parameters: no baseline for tag=base
    set_value(world, 1000)  # a later commit, not the base or its ancestor, run later: never the baseline
    side_run = bus.run("bench", tag="base")
    git(world.project, "checkout", "-q", base)
    git(world.project, "checkout", "-q", "-b", "pr")
    head = set_value(world, 4)
    # No evidence yet: the table says missing, nothing to compare.
    rc, text = write_comment(bus, head, "--base", base)
    assert rc == 1 and text.startswith(comment.MARKER + "\n")
    assert "| ✗ | `bench@cpu` | missing |" in text and "no evidence to compare yet" in text
    head_run = bus.run("bench", tag="base")
    rc, text = write_comment(bus, head, "--base", base, "--link-base", "https://github.com/org/kakeya/")
    assert rc == 0
    assert f"## Kakeya evidence for `{head}`" in text and "| ✓ | `bench@cpu` | pass |" in text
    assert f"### Change against the base branch (`{base[:12]}`)" in text
    row = f"| `bench@cpu` | `/probe/cpu_count` | 4 | 8 | -50.00 % | — (one sample) | `{base_run}` (subject `{base[:12]}`) |"
    assert row in text
    assert side_run not in text  # newer, same parameters, but not on the base's history
    done = bus.done(head_run)
    where = f"{done}/{results_path(head_run)}"
    assert f"[summary](https://github.com/org/kakeya/blob/{where}/summary.md)" in text
    assert f"![plots/curve.png](https://github.com/org/kakeya/raw/{where}/plots/curve.png)" in text
    assert "x](javascript:alert(1)).png" in bus.files(head_run)  # committed by the run, but
    assert "javascript" not in text  # a plot name that is not a plain path is left out
    # A base given as a short sha (a rev of this repository) is the same base.
    assert write_comment(bus, head, "--base", base[:10])[1].count(row) == 1
    # Without a web address for the bus (a local path): plain ids, no links.
    rc, text = write_comment(bus, head, "--base", base)
    assert rc == 0 and "https://" not in text and "plot `plots/curve.png`" in text
    assert f"`{head_run}` (done `{done[:12]}`)" in text
    # Without --base: the table and results, no change section.
    rc, text = write_comment(bus, head)
    assert rc == 0 and "Change against" not in text and head_run in text
    capsys.readouterr()


def test_a_regression_beyond_the_presets_tolerance_is_significant(world: Env, bus: LocalBus, capsys):
    base = set_value(world, 100)
    base_run = bus.run("guarded")
    head = set_value(world, 80)
    bus.run("guarded")  # the runner fails it: 20 % worse than the previous pass, 10 % allowed
    rc, text = write_comment(bus, head, "--base", base, require="guarded@cpu")
    assert rc == 1 and "| ✗ | `guarded@cpu` | fail |" in text
    assert f"| 80 | 100 | -20.00 % | yes (tolerance 10 %) | `{base_run}`" in text
    same = set_value(world, 95)
    bus.run("guarded")
    rc, text = write_comment(bus, same, "--base", base, require="guarded@cpu")
    assert rc == 0 and f"| 95 | 100 | -5.00 % | no (tolerance 10 %) | `{base_run}`" in text
    capsys.readouterr()


def test_a_base_the_bus_does_not_have_is_said_not_guessed(world: Env, bus: LocalBus, capsys):
    head = set_value(world, 3)
    bus.run("bench")
    rc, text = write_comment(bus, head, "--base", "f" * 40)
    assert rc == 0 and f"the base commit {'f' * 12} is not on the bus" in text
    capsys.readouterr()


def test_a_refused_gate_still_writes_its_comment(world: Env, bus: LocalBus, capsys):
    head = git(world.project, "rev-parse", "HEAD")
    path = world.tmp / "comment.md"
    rc = main(
        [
            "gate",
            "pr",
            "--subject",
            head,
            "--require",
            "bench@cpu",
            "--remote",
            bus.url,
            "--comment",
            str(path),
        ]
    )
    assert rc == 2
    text = path.read_text()
    assert text.startswith(comment.MARKER) and "✗ refused" in text and "allowed-signers" in text
    capsys.readouterr()


@pytest.mark.parametrize(
    "url, web",
    [
        ("https://github.com/org/kakeya.git", "https://github.com/org/kakeya"),
        ("https://x-access-token:t@github.com/org/kakeya", "https://github.com/org/kakeya"),
        ("https://github.com/org/kakeya.git/extra", None),
        ("https://gitlab.com/org/kakeya.git", None),
        ("/tmp/bus.git", None),
    ],
)
def test_github_web_address_of_a_bus(url, web):
    assert comment.github_web(url) == web


def test_metrics_are_the_baseline_metric_else_the_gates_single_numbers():
    from bridge.presets.preset import Preset

    data = {**BENCH, "name": "m"}
    data["gate"] = [
        {"check": "min", "path": "/probe/cpu_count", "value": 1},
        {"check": "max", "path": "/probe/memory_bytes", "value": 9},
        {"check": "min", "path": "/probe/cpu_count", "value": 2},
        {"check": "all_true", "path": "/probe/x/*"},
    ]
    assert comment.metrics(Preset.model_validate(data), "cpu") == [
        ("/probe/cpu_count", True, None, None),
        ("/probe/memory_bytes", False, None, None),
    ]
    data["baseline"] = {"from": "previous-pass", "metric": "/probe/cpu_count", "max_regression_pct": 5}
    assert comment.metrics(Preset.model_validate(data), "cpu") == [("/probe/cpu_count", True, 5.0, None)]
    assert PRESETS  # the shared test presets are untouched


def test_significance_is_the_noise_test_else_the_tolerance_else_unknown():
    import gates

    def change(tolerance=None, **kw):
        c = gates.Comparison(
            status="pass", metric="/m", max_regression_pct=0, higher_is_better=True, reason="", **kw
        )
        return comment.Change("p@cpu", "/m", None, c, tolerance)

    assert change(new=1, base=2, change_pct=-50, regression_pct=50, p_value=0.01).significant() == (
        "yes (p = 0.01)"
    )
    assert (
        change(new=1, base=2, change_pct=-50, regression_pct=50, p_value=0.2).significant() == "no (p = 0.2)"
    )
    assert change(5.0, new=1, base=2, change_pct=-50, regression_pct=50).significant() == (
        "yes (tolerance 5 %)"
    )
    assert change(new=1, base=2, change_pct=-50, regression_pct=50).significant() == "— (one sample)"
    assert change(base=2).significant() == "—"  # no new value: nothing to say


def test_a_preset_whose_gate_checks_no_number_says_so(world: Env, bus: LocalBus, capsys):
    base = set_value(world, 2)
    rc, text = write_comment(bus, base, "--base", base, require="flag@cpu")
    assert rc == 1 and "no evidence to compare yet" in text
    bus.run("flag")
    rc, text = write_comment(bus, base, "--base", base, require="flag@cpu")
    assert rc == 0, text
    assert "| `flag@cpu` | — | — | — | — | — | its gate checks no single number |" in text
    capsys.readouterr()
