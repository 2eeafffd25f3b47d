"""`kakeya evidence SHA` and `gate pr` reading .github/kakeya-required.yml, against a real bus (`git daemon`)
and a real runner process: missing evidence listed, every missing run requested at once (pins met), requested
ones seen as pending (never requested twice), all followed concurrently with each event carrying its id, then
passing; a requirements file that is not valid, and pins no value can meet, are refused."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from bridge.bus.records import new_id
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.client.follow import follow_all
from bridge.config import load_config
from bridge.core.errors import InvalidRequest, KakeyaError
from bridge.evidence import Requirement
from bridge.evidence.service import params_for
from bridge.presets.registry import load_registry
from tests.bridge.bus_support import (
    Daemon,
    Env,
    git,
    manifest_dict,
    push_raw_request,
    runner_process,
    stop,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = "required:\n  - work@cpu tag==ev\n  - cpuonly@cpu seconds>=0.5\n"


def events(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_evidence_requests_what_is_missing_and_waits_for_all(world: Env, daemon: Daemon, capsys):
    (world.project / ".github").mkdir()
    (world.project / ".github" / "kakeya-required.yml").write_text(REQUIRED)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "require evidence")
    head = git(world.project, "rev-parse", "HEAD")
    url = daemon.repo()
    base = ["evidence", head, "--remote", url, "--allow-unsigned", "--json"]
    gate = ["gate", "pr", "--subject", head, "--remote", url, "--allow-unsigned", "--json"]

    assert main(base) == 1
    (final,) = events(capsys)
    assert [(o["requirement"], o["status"]) for o in final["outcomes"]] == [
        ("work@cpu tag==ev", "missing"),
        ("cpuonly@cpu seconds>=0.5", "missing"),
    ]
    assert main(gate) == 1  # no --require: the file's entries
    assert {o["requirement"]: o["status"] for o in json.loads(capsys.readouterr().out)} == {
        "work@cpu tag==ev": "missing",
        "cpuonly@cpu seconds>=0.5": "missing",
    }

    # live requests for the subject that would not provide the evidence: never taken as pending
    c = Client(load_config(), remote=url)
    c.request("work", {"tag": "ev"}, "gpu", subject=head)  # another label
    c.request("work", {"tag": "zz"}, "cpu", subject=head)  # the pin not met
    late = c.request("cpuonly", {"seconds": 0.5}, "cpu", subject=head, expires_s=0.5)
    wait_for(lambda: c.status_one(late.id).state == "expired", 30, "a request to expire")
    forged = new_id("cpuonly")  # parameters the preset does not take
    push_raw_request(
        url, world.project, "cpu", forged, manifest_dict(forged, "cpuonly", head, params={"seconds": "lots"})
    )
    assert main([*base, "--request-missing"]) == 1
    requested = [e for e in events(capsys) if e["event"] == "requested"]
    assert [(e["requirement"], e["params"], e["runner"]) for e in requested] == [
        ("work@cpu tag==ev", {"tag": "ev"}, "cpu"),
        ("cpuonly@cpu seconds>=0.5", {"seconds": 0.5}, "cpu"),
    ]
    assert main([*base, "--request-missing"]) == 1  # asked again: pending, not requested twice
    again = events(capsys)
    assert {(e["event"], e["id"]) for e in again[:-1]} == {("pending", e["id"]) for e in requested}

    assert main([*base[:-1], "--wait", "--timeout", "1"]) != 0  # no runner: a timeout, said
    assert "timed out after 1 s waiting for" in capsys.readouterr().err
    runner = runner_process(world, url, "w1")
    try:
        assert main([*base, "--wait", "--timeout", "120"]) == 0
    finally:
        stop(runner)
    seen = events(capsys)
    ids = {e["id"] for e in requested}
    assert {e["id"] for e in seen if e["event"] == "finished"} == ids  # each followed to its end
    assert {e["id"] for e in seen if e["event"] == "claimed"} == ids
    assert [o["status"] for o in seen[-1]["outcomes"]] == ["pass", "pass"]
    assert {o["request_id"] for o in seen[-1]["outcomes"]} == ids
    assert main(gate) == 0
    capsys.readouterr()
    assert main(base[:-1] + ["--request-missing"]) == 0  # the text form; nothing left to request
    out = capsys.readouterr().out
    assert f"evidence for {head}:" in out and "requested" not in out and "✓ work@cpu tag==ev: pass" in out


def test_a_bad_requirements_file_and_unmeetable_pins_are_refused(world: Env, capsys):
    head = git(world.project, "rev-parse", "HEAD")
    assert main(["evidence", head]) == 2
    assert "no --require given and" in capsys.readouterr().err
    (world.project / ".github").mkdir()
    (world.project / ".github" / "kakeya-required.yml").write_text("required: [work@cpu]\nextra: 1\n")
    assert main(["gate", "pr", "--subject", head]) == 2
    assert "kakeya-required.yml" in capsys.readouterr().err
    (world.project / ".github" / "kakeya-required.yml").write_text("required: [ghost@cpu]\n")
    assert main(["evidence", head]) == 2
    assert "unknown preset 'ghost'" in capsys.readouterr().err
    registry = load_registry()
    with pytest.raises(InvalidRequest, match="no allowed parameters meet its pins"):
        params_for(Requirement.parse("work@cpu seconds>120", registry), registry["work"])
    with pytest.raises(InvalidRequest, match="no single value meets its pins"):
        params_for(Requirement.parse("work@cpu seconds>=5 seconds<=2", registry), registry["work"])
    shipped = load_registry(ROOT / "presets")
    ladder = Requirement.parse("niah-ladder@h200 contexts>=65536 samples>5", shipped)
    assert params_for(ladder, shipped["niah-ladder"]) == {"contexts": [65536], "samples": 6}
    assert params_for(Requirement.parse("work seconds<1.5", registry), registry["work"])["seconds"] < 1.5


def test_following_several_stops_them_all_when_one_fails(world: Env, daemon: Daemon):
    """One follower fails (no such request): the error is raised, and the follower of a request that no
    runner will ever claim stops polling instead of running on in its thread."""
    c = Client(load_config(), remote=daemon.repo())
    queued = c.request("work", {}, "cpu")
    before = threading.active_count()
    with pytest.raises(KakeyaError, match="no request"):
        list(follow_all(c, [queued.id, new_id("work")]))
    wait_for(lambda: threading.active_count() == before, 20, "the other follower to stop")
