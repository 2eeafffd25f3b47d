"""Issue 41 (8): `kakeya history ... --alert` on a real bus with real runs: exit 1 and an issue's markdown when
the newest commit with trusted runs changed for the worse (the noise test of bridge/evidence/history.py), nothing for
noise or an improvement; what a commit title says is never a link, a mention or HTML in that markdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.cli.main import main
from tests.bridge.bus_support import Env, git
from tests.bridge.test_history import LocalBus, commit, setup_bench

HOSTILE = "slow down @octocat [click](https://evil.example) <img src=x> `code` | #1 http://x.example"


@pytest.fixture(name="bus")
def bus_fixture(world: Env) -> LocalBus:
    setup_bench(world)
    return LocalBus(world)


def alert(bus: LocalBus, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["history", *args, "--remote", bus.url, "--allow-unsigned", "--branch", "main"])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_alert_on_a_regression_only_with_escaped_markdown(world: Env, bus: LocalBus, capsys, tmp_path: Path):
    c0 = commit(world, "bench at 100", speed=100)
    for seed in range(4):
        bus.run(c0, seed)
    c1 = commit(world, HOSTILE, speed=80)
    for seed in range(2):
        bus.run(c1, seed)
    # two runs against four cannot reach p < 0.05: no alert, whatever the percentage
    assert alert(bus, capsys, "bench@cpu", "--alert")[0] == 0
    for seed in range(2, 4):
        bus.run(c1, seed)
    code, out, err = alert(bus, capsys, "bench@cpu", "--alert")
    assert code == 1, err
    title = f"[kakeya regression] bench@cpu /probe/cpu_count at {c1[:12]}"
    assert out.startswith(f"<!-- kakeya-alert: {title} -->\n")
    assert (
        "went down" in out
        and "**down** (higher is better; its gate: ≥ 50)" in out
        and "p = 0.0286 (a change: p < 0.05)" in out
    )
    assert "median 80.5 against 100.5" in out
    assert (
        f"kakeya bisect --good {c0[:12]} --bad {c1[:12]} --require bench@cpu" in out
        and "--threshold 90.5" in out
    )
    # the hostile title sits in one code span of its table cell: no mention, link, HTML or broken table
    row = next(line for line in out.splitlines() if line.startswith("| now |"))
    assert (
        row.count(" | ") == 5
        and "``slow down @octocat [click](https://evil.example) <img src=x> `code` \\| #1" in row
    )
    outside = out.replace(row, "")
    assert "@octocat" not in outside and "evil.example" not in outside and "<img" not in outside
    # to a file, and as JSON for the workflow
    body = tmp_path / "alert.md"
    assert alert(bus, capsys, "bench@cpu", "--alert", "--alert-file", str(body))[0:2] == (1, "")
    assert body.read_text() == out
    (world.project / ".github").mkdir()
    (world.project / ".github" / "kakeya-required.yml").write_text("required:\n  - bench@cpu\n")
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "require bench")  # no run: the newest commit with runs is still c1
    code, out, _ = alert(bus, capsys, "--alert", "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and [e["event"] for e in events] == ["alert", "alerts"]
    assert events[0]["title"] == title and events[0]["subject"] == c1 and events[0]["against"] == c0
    assert events[0]["change"] == "down" and events[0]["body"] == body.read_text()
    assert events[1] == {"event": "alerts", "count": 1, "checked": ["bench@cpu /probe/cpu_count"]}

    # the same code again, four runs: within the noise of c1, so no alert now (the newest commit decides)
    c2 = commit(world, "docs only")
    for seed in range(4):
        bus.run(c2, seed)
    code, out, err = alert(bus, capsys, "bench@cpu", "--alert")
    assert (code, out) == (0, "") and "no regression" in err
    # faster is better: no alert for an improvement
    c3 = commit(world, "speed up", speed=120)
    for seed in range(4):
        bus.run(c3, seed)
    assert alert(bus, capsys, "bench@cpu", "--alert")[0:2] == (0, "")
    assert main(["history", "bench@cpu", "--alert-file", "x.md", "--remote", bus.url]) == 2
