"""The newcomer's friction (issue 33 item 5), on real buses and runners: untracked files warn and never block a
request; `results --out DIR` keeps runs apart in DIR/<id>/; ids by unique prefix or six-hex suffix, from a
prefix-scoped listing; `wait` ends at once for a request cancelled or expired before any runner claimed it;
`gate check` infers the preset from the report's kind; `run` prints the verdict table (`--summary`: all)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.records import (
    CANCEL_PREFIX,
    CLAIM_PREFIX,
    DONE_PREFIX,
    MANIFEST_PATH,
    Manifest,
    Update,
    done_ref,
    req_ref,
)
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from tests.bridge.bus_support import PRESETS, Env, git, make_runner, push_raw_request


def manifest(bus: Path, rid: str, label: str = "cpu") -> Manifest:
    return Manifest.model_validate_json(git(bus, "show", f"{req_ref(label, rid)}:{MANIFEST_PATH}"))


def test_untracked_files_warn_and_only_tracked_changes_block(world: Env, capsys):
    bus = world.project / ".kakeya" / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    (world.project / "results").mkdir()
    (world.project / "results" / "old.json").write_text("{}")  # what `results --out results/` leaves
    (world.project / "-n notes.txt").write_text("an odd name\n")
    assert main(["request", "work", "--runner", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "warning: 2 untracked file(s) (-n notes.txt, results/) are not sent: a runner sees HEAD" in err
    sent = manifest(bus, out.strip())
    assert (sent.subject, sent.snapshot_of) == (head, None)  # the untracked files went nowhere

    # a staged new file is a tracked change: it blocks, as an edit does, and the message names only those
    git(world.project, "add", "-N", "--", "-n notes.txt")
    (world.project / "work.py").write_text("edited\n")
    assert main(["request", "work", "--runner", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "uncommitted changes (-n notes.txt, work.py)" in err and "results" not in err
    # --allow-dirty sends it all, as before
    assert main(["request", "work", "--runner", "cpu", "--allow-dirty"]) == 0
    snap = manifest(bus, capsys.readouterr().out.strip())
    assert snap.snapshot_of == head
    assert git(world.project, "show", f"{snap.subject}:work.py") == "edited"
    assert git(world.project, "show", f"{snap.subject}:results/old.json") == "{}"


def test_results_out_keeps_two_runs_apart_and_run_prints_the_verdict_table(world: Env, capsys):
    assert main(["run", "work", "-p", "tag=one", "--out", "res"]) == 0
    first = capsys.readouterr().out
    one = first.split(":")[0]
    assert "**Gate: ✓ pass**" in first and "# work:" not in first  # the table, not the whole summary
    assert main(["run", "work", "-p", "tag=two", "--summary"]) == 0
    two = capsys.readouterr().out
    assert "**Gate: ✓ pass**" in two and "\n# work: succeeded" in two
    two = two.split(":")[0]
    for rid, tag in ((one, "one"), (two, "two"), (one, "one")):  # one again: written over, still apart
        assert main(["results", rid, "--out", "res"]) == 0
        assert capsys.readouterr().out.endswith(f"summary: {world.project}/res/{rid}/summary.md\n")
        assert (world.project / "res" / rid / "logs" / "stdout.log").read_text() == f"work count {tag} done\n"
    assert sorted(p.name for p in (world.project / "res").iterdir()) == sorted([one, two])


def test_ids_by_unique_prefix_or_suffix_from_a_scoped_listing(
    world: Env, capsys, monkeypatch: pytest.MonkeyPatch
):
    c = Client(load_config())
    ids = [
        "20260601T101500.000Z-work-aaa111",
        "20260601T101500.500Z-work-aaa222",
        "20260601T111500.000Z-work-bbb333",
    ]
    for rid in ids:
        push_raw_request(c.url, world.project, "cpu", rid, b"{}")  # refs are all that is read
    # a hostile ref whose name only looks like an id is no candidate
    sha = git(world.project, "rev-parse", "HEAD")
    assert c.bus.swap([Update(req_ref("cpu", "20260601T10-evil"), sha, None)], atomic=False)
    listed: list[tuple[str, ...]] = []
    real = Bus.list
    monkeypatch.setattr(
        Bus, "list", lambda self, prefixes: listed.append(tuple(prefixes)) or real(self, prefixes)
    )

    assert main(["status", "20260601T11", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == ids[2]
    # never a full listing of the done, claim or cancel refs: each is asked by the prefix given
    first = listed[0]
    assert DONE_PREFIX + "20260601T11" in first and not {
        DONE_PREFIX,
        CLAIM_PREFIX,
        CANCEL_PREFIX,
    } & set(first)
    assert main(["status", "20260601T10", "--json"]) == 1
    err = json.loads(capsys.readouterr().out)
    assert (err["code"], err["candidates"]) == ("ambiguous-id", ids[:2])
    assert main(["cancel", "aaa2"]) == 0  # the six-hex suffix (its start) of a live request
    assert capsys.readouterr().out == f"{ids[1]}: cancel requested (was requested)\n"
    for bad in ("aaa", "2026T", "20260601T1*", "20260601/../x", "refs/heads/kakeya"):
        assert main(["wait", bad, "--json"]) == 2  # invalid input, nothing looked up: exit 2
        assert json.loads(capsys.readouterr().out)["code"] == "bad-id", bad
    assert main(["results", "20270101", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["code"] == "not-found"

    # a request finished long ago, compacted into the ledger, is found by prefix too
    rid = c.request("work", {"tag": "old"}, "cpu").id
    assert make_runner(c.url, world).once(request_id=rid) is not None
    assert main(["bus", "compact", "--older-than", "0"]) == 0
    assert done_ref(rid) not in c.bus.ls_remote(DONE_PREFIX).refs
    capsys.readouterr()
    assert main(["results", rid[:-2], "--out", "res"]) == 0
    assert (world.project / "res" / rid / "result.json").is_file()


def test_wait_ends_at_once_for_a_cancelled_or_expired_request(world: Env, capsys):
    c = Client(load_config())
    expired = c.request("work", {}, "gpu", expires_s=0.001).id  # no runner serves gpu here
    # a timeout would exit 4 with a `timeout` event: the wait ends on its own, with the state
    assert main(["wait", expired, "--timeout", "60", "--json"]) == 1
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (last["event"], last["state"], last["exit_code"]) == ("expired", "expired", 1)
    cancelled = c.request("work", {}, "gpu").id
    assert main(["cancel", cancelled]) == 0
    assert main(["wait", cancelled[-6:], "--timeout", "60"]) == 1
    assert capsys.readouterr().out.endswith("cancelled before any runner claimed it: nothing ran\n")
    # a request whose manifest cannot be read (pushed by hand) is not taken for expired: it waits it out
    head = git(world.project, "rev-parse", "HEAD")
    junk = "20260601T101500.000Z-work-ccc444"
    push_raw_request(c.url, world.project, "gpu", junk, b"not json")
    assert main(["wait", junk, "--timeout", "0.3"]) == 4
    assert head and "timed out after 0.3 s" in capsys.readouterr().err


def test_gate_check_infers_the_preset_from_the_reports_kind(world: Env, tmp_path: Path, capsys, monkeypatch):
    assert main(["exec", "work", "--out", str(tmp_path / "e")]) == 0
    report = str(tmp_path / "e" / "report.json")
    capsys.readouterr()
    # every test preset makes a `probe` report: which one is meant cannot be told
    assert main(["gate", "check", report, "--json"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert (err["code"], err["candidates"]) == ("preset-needed", sorted(PRESETS))
    for name, code in (("work", 0), ("strict", 1)):  # the only preset of that kind: its checks
        only = tmp_path / f"only-{name}"
        only.mkdir()
        (only / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **PRESETS[name]}))
        monkeypatch.setenv("KAKEYA_PRESETS", str(only))
        assert main(["gate", "check", report]) == code
        assert "(probe v1, 1 check)" in capsys.readouterr().out
    # a hostile report: a kind that is not a string, or not JSON at all
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"kind": ["probe"], "schema_version": 1}))
    assert main(["gate", "check", str(odd)]) == 2
    assert "no preset has report kind ['probe']" in capsys.readouterr().err
    odd.write_text("{not json")
    assert main(["gate", "check", str(odd), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["code"] == "bad-report"
