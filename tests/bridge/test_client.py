"""The client against real repositories: validation, dirty trees, status, results, cancel, gc, doctor, `run`."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.bus.records import (
    CANCEL_PATH,
    MANIFEST_PATH,
    NS,
    PREFIX,
    Manifest,
    Update,
    cancel_ref,
    done_ref,
    new_id,
    req_ref,
    results_path,
    stage_ref,
    subject_ref,
    utcnow,
)
from bridge.cli.commands._common import parse_duration
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.client.remote import resolve_remote
from bridge.client.rows import age
from bridge.config import load_config
from bridge.core.errors import InvalidRequest, KakeyaError
from bridge.wire import git as G
from tests.bridge.bus_support import (
    Daemon,
    Env,
    free_port,
    git,
    make_runner,
    push_raw_request,
)


def client(remote: str | None = None) -> Client:
    return Client(load_config(), remote=remote)


def user_state(project: Path) -> tuple[str, str, str, bytes]:
    return (
        git(project, "rev-parse", "HEAD"),
        git(project, "symbolic-ref", "HEAD"),
        git(project, "status", "--porcelain", "--untracked-files=all"),
        (project / ".git" / "index").read_bytes(),
    )


def test_run_on_the_embedded_bus_passes_fails_and_refuses(world: Env, capsys):
    assert main(["run", "work", "-p", "tag=one"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    line, summary = lines[0], lines[-1]
    assert lines[1].startswith("**Gate: ✓ pass**")
    rid = line.split(":")[0]
    assert (
        line == f"{rid}: work succeeded, verdict pass"
        and summary == f"summary: {world.project}/out/{rid}/summary.md"
        and lines[-2] == f"report: {world.project}/out/{rid}/report.html"
    )
    out = world.project / "out" / rid
    assert {p.name for p in out.iterdir()} >= {
        "result.json",
        "report.json",
        "verdict.json",
        "summary.md",
        "logs",
    }
    result = json.loads((out / "result.json").read_text())
    assert (result["request_id"], result["subject"], result["runner_name"]) == (
        rid,
        git(world.project, "rev-parse", "HEAD"),
        "inproc",
    )
    assert (out / "logs" / "stdout.log").read_text() == "work count one done\n"
    assert world.count() == ["one"]
    # the embedded bus is a bare repository under .kakeya/, which git ignores
    bus = world.project / ".kakeya" / "bus.git"
    assert (bus / "HEAD").is_file() and git(world.project, "status", "--porcelain") == ""
    # the done push left only the done ref and its index ref (the request and claim refs went with it)
    refs = Bus(str(bus), world.project).ls_remote(PREFIX, NS).refs
    assert sorted(r.split("/")[2] for r in refs) == ["by-subject", "done"]

    assert main(["run", "strict", "-p", "tag=two", "--out", "strict-out"]) == 1
    printed = capsys.readouterr().out
    assert "strict failed" not in printed  # the program succeeded; its verdict failed
    strict = printed.split(":")[0]  # --out DIR writes DIR/<id>
    assert (
        json.loads((world.project / "strict-out" / strict / "result.json").read_text())["verdict"] == "fail"
    )
    assert main(["run", "nope"]) == 2
    assert main(["run", "work", "-p", "seconds=1000"]) == 2
    assert main(["run", "work", "--runner", "h200"]) == 2
    assert world.count() == ["one", "two"]


def test_run_sends_a_dirty_tree_as_a_snapshot_and_leaves_the_user_tree_alone(world: Env):
    (world.project / "work.py").write_text(
        (world.project / "work.py").read_text().replace("done", "dirty-done")
    )
    (world.project / "extra.txt").write_text("untracked\n")
    git(world.project, "add", "extra.txt")
    (world.project / "more.txt").write_text("untracked too\n")
    before = user_state(world.project)
    c = client()
    with pytest.raises(KakeyaError, match="uncommitted changes .*work.py.*--allow-dirty"):
        c.request("work", {}, "cpu")
    manifest = c.request("work", {"tag": "dirty"}, "cpu", allow_dirty=True)
    assert user_state(world.project) == before
    head = before[0]
    assert manifest.snapshot_of == head and manifest.subject != head
    assert git(world.project, "rev-parse", f"{manifest.subject}^") == head
    assert git(world.project, "show", f"{manifest.subject}:more.txt") == "untracked too"
    assert "dirty-done" in git(world.project, "show", f"{manifest.subject}:work.py")
    served = make_runner(c.url, world).once()
    assert served is not None and served.status == "succeeded"
    out = world.tmp / "res"
    c.results(manifest.id, out)
    assert (out / "logs" / "stdout.log").read_text() == "work count dirty dirty-done\n"
    assert user_state(world.project) == before
    with pytest.raises(InvalidRequest, match="cannot go with --subject"):
        c.request("work", {}, "cpu", subject="HEAD", allow_dirty=True)


def test_request_validates_before_anything_is_pushed(world: Env, capsys):
    bus = world.project / ".kakeya" / "bus.git"
    assert main(["request", "nope", "--runner", "cpu"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["request", "work", "--runner", "cpu", "-p", "mode=fly"]) == 2
    assert "parameter mode='fly' must be one of" in capsys.readouterr().err
    assert main(["request", "cpuonly", "--runner", "gpu"]) == 2
    assert "may not run on runner label 'gpu'" in capsys.readouterr().err
    assert main(["request", "work", "--runner", "GPU!"]) == 2
    assert main(["request", "work", "--runner", "cpu", "-p", "oops"]) == 2
    assert main(["request", "work", "--runner", "cpu", "--subject", "no-such-rev"]) == 2
    assert main(["request", "work", "--runner", "cpu", "--expires", "soon"]) == 2
    assert not bus.exists()  # nothing was pushed; a failed request leaves no .kakeya/ behind either
    first = git(world.project, "rev-parse", "HEAD")
    (world.project / "b.txt").write_text("b")
    git(world.project, "add", "b.txt")
    git(world.project, "commit", "-qm", "b")
    assert main(["request", "work", "--runner", "gpu", "--subject", first, "--expires", "2h"]) == 0
    rid = capsys.readouterr().out.strip()
    manifest = Manifest.model_validate_json(_manifest(bus, rid, "gpu"))
    assert manifest.subject == first and manifest.runner == "gpu" and manifest.requester == "t@example.com"
    assert 7190 < (manifest.expires_at - manifest.created_at).total_seconds() <= 7200


def _manifest(bus: Path, rid: str, label: str) -> bytes:
    return git(bus, "show", f"{req_ref(label, rid)}:.kakeya/request.json").encode()


def test_status_wait_results_and_cancel(world: Env, capsys):
    c = client()
    r = make_runner(c.url, world)
    done = c.request("work", {"tag": "a"}, "cpu")
    assert r.once() is not None
    pending = c.request("work", {"tag": "b"}, "cpu")
    expired = c.request("work", {"tag": "c"}, "cpu", expires_s=0.001)
    cancelled = c.request("work", {"tag": "d"}, "cpu")
    assert main(["cancel", cancelled.id, "--reason", "changed my mind"]) == 0
    assert "cancel requested (was requested)" in capsys.readouterr().out
    assert main(["cancel", cancelled.id]) == 0 and "already cancelled" in capsys.readouterr().out
    with pytest.raises(KakeyaError, match="already done"):
        c.cancel(done.id)
    gpu = c.request("work", {"tag": "e"}, "gpu")
    rows = {row.id: row for row in c.status()}
    assert [rows[i].state for i in (done.id, pending.id, expired.id, cancelled.id, gpu.id)] == [
        "succeeded",
        "requested",
        "expired",
        "cancelled",
        "requested",
    ]
    assert rows[done.id].verdict == "pass" and rows[done.id].holder == "r1"
    assert rows[gpu.id].runner == "gpu" and rows[gpu.id].subject == done.subject

    assert main(["status"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ID", "STATE", "PRESET", "RUNNER", "AGE", "VERDICT"]
    assert table[1].split()[:3] == [done.id, "succeeded", "work"] and table[1].split()[-1] == "pass"
    assert main(["status", "--json"]) == 0
    assert [d["id"] for d in json.loads(capsys.readouterr().out)] == sorted(rows)
    assert main(["status", pending.id]) == 0
    assert "state      requested" in capsys.readouterr().out
    assert main(["status", done.id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "pass"
    assert main(["status", "20260101T000000.000Z-work-abcdef"]) == 1
    assert "no request" in capsys.readouterr().err

    # the runner serves the rest: pending runs, expired and cancelled end without running
    served = [r.once() for _ in range(3)]
    assert sorted(s.status for s in served if s) == ["cancelled", "expired", "succeeded"]
    assert r.once() is None  # the gpu request is not for this runner
    assert world.count() == ["a", "b"]
    assert main(["wait", expired.id, "--out", "w"]) == 1
    assert "expired" in capsys.readouterr().out
    assert json.loads((world.project / "w" / expired.id / "result.json").read_text())["status"] == "expired"
    assert main(["results", cancelled.id]) == 0
    assert f"{cancelled.id}: work cancelled (cancelled before it started)" in capsys.readouterr().out
    assert main(["wait", gpu.id, "--timeout", "0.3"]) == 4
    assert "timed out after 0.3 s waiting for" in capsys.readouterr().err
    assert main(["results", gpu.id]) == 1
    assert "has no results yet (state: requested)" in capsys.readouterr().err


def test_request_wait_over_git_daemon_and_gc(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    r = make_runner(url, world)
    rid = client(url).request("work", {"tag": "x"}, "cpu").id
    r.once()
    # a fresh clone (no shared objects with the bus) waits and fetches the results
    other = world.tmp / "other"
    git(world.tmp, "clone", "-q", str(world.project), str(other))
    os.chdir(other)
    assert main(["wait", rid, "--remote", url, "--timeout", "30"]) == 0
    assert (other / "out" / rid / "summary.md").read_text().startswith("# work: succeeded — verdict pass")
    capsys.readouterr()
    assert (
        main(
            [
                "request",
                "work",
                "--runner",
                "cpu",
                "--remote",
                url,
                "-p",
                "tag=y",
                "--wait",
                "--timeout",
                "0.5",
            ]
        )
        == 4
    )
    assert "timed out" in capsys.readouterr().err
    snap = Bus(url, other).ls_remote()
    assert sum(1 for e in snap.entries.values() if not e.done) == 1
    assert snap.entries[rid].req is None and snap.entries[rid].claim is None  # gone with the done push
    # a cancel marker pushed after the done push is all gc has left to delete
    late = G.child_commit(other, snap.entries[rid].done or "", {CANCEL_PATH: b"{}"}, "late", "T <t@x>")
    assert Bus(url, other).swap([Update(cancel_ref(rid), late, None)], atomic=False)
    assert main(["bus", "gc", "--older-than", "0", "--remote", url, "--dry-run"]) == 0
    assert "would delete 1 refs" in capsys.readouterr().out
    assert main(["bus", "gc", "--older-than", "0", "--remote", url]) == 0
    assert "deleted 1 refs" in capsys.readouterr().out
    after = Bus(url, other).ls_remote()
    assert after.entries[rid].done == snap.entries[rid].done and after.entries[rid].cancel is None
    assert len(after.entries) == 2
    assert main(["bus", "gc", "--older-than", "1", "--remote", url]) == 0
    assert "deleted 0 refs" in capsys.readouterr().out
    # results of a request whose req ref is gone still come from its done ref
    assert main(["results", rid, "--remote", url, "--out", str(world.tmp / "again")]) == 0
    assert (world.tmp / "again" / rid / "result.json").is_file()


def test_bus_gc_deletes_result_side_refs_of_done_or_vanished_requests_only(
    world: Env, daemon: Daemon, capsys
):
    """A runner whose bus went away after the done push leaves its side ref (refs/kakeya-stage/<id>/<sha>)
    behind: gc deletes those of done or unknown requests, whatever their age, and keeps a running one's."""
    url = daemon.repo()
    r = make_runner(url, world)
    done_id = client(url).request("work", {"tag": "x"}, "cpu").id
    r.once()
    pending_id = client(url).request("work", {"tag": "y"}, "cpu").id
    snap = Bus(url, world.project).ls_remote()
    sha = snap.entries[done_id].done
    assert sha
    git(world.project, "fetch", "-q", url, done_ref(done_id))
    strays = [stage_ref(i, sha) for i in (done_id, pending_id, "r-20260101-000000-gone")]
    git(world.project, "push", "-q", url, *(f"{sha}:{ref}" for ref in strays))
    assert set(Bus(url, world.project).stage_refs()) == set(strays)
    assert main(["bus", "gc", "--older-than", "1", "--remote", url, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert strays[0] in out and strays[2] in out and strays[1] not in out
    assert "would delete 2 refs" in out
    assert main(["bus", "gc", "--older-than", "1", "--remote", url]) == 0
    assert "deleted 2 refs" in capsys.readouterr().out
    assert set(Bus(url, world.project).stage_refs()) == {strays[1]}  # the running request keeps its own
    assert Bus(url, world.project).ls_remote().entries[done_id].done == sha  # nothing else went


def test_unreachable_remote_is_a_clear_error_with_nothing_half_written(world: Env, tmp_path: Path, capsys):
    daemon = Daemon(tmp_path / "later")
    url = daemon.repo()
    before = user_state(world.project)
    assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kakeya: bus: {url}\nkakeya: error: cannot reach the bus at {url}")
    assert "Connection refused" in err
    assert main(["status", "--remote", url]) == 1
    assert "cannot reach the bus" in capsys.readouterr().err
    assert user_state(world.project) == before
    daemon.start()
    try:
        assert Bus(url, world.project).ls_remote().refs == {}  # nothing was written by the failed attempt
        assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 0
        rid = capsys.readouterr().out.strip()
        assert list(Bus(url, world.project).ls_remote().refs) == [req_ref("cpu", rid)]
        assert user_state(world.project) == before
    finally:
        daemon.stop()


def test_status_over_2000_finished_requests_is_one_round_trip(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    bus = daemon.base / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    git(world.project, "push", "-q", str(bus), "HEAD:refs/heads/main")
    # 2,000 finished requests in the shape a done push leaves (a done ref on the request commit, its index ref;
    # no request or claim ref), written with one `git fast-import`
    stream, t0 = [], utcnow().replace(microsecond=0)
    for i in range(2000):
        rid = new_id("work", t0 - dt.timedelta(seconds=i))
        result = json.dumps(
            {
                "schema_version": 1,
                "status": "succeeded" if i % 3 else "failed",
                "preset": "work",
                "verdict": "pass" if i % 3 else "fail",
                "request_id": rid,
            }
        ).encode()
        for ref, frm, path, data in (
            ("refs/tmp/req", head, MANIFEST_PATH, b"{}"),
            (done_ref(rid), f":{2 * i + 1}", f"{results_path(rid)}/result.json", result),
        ):
            mark = 2 * i + (1 if "req" in ref else 2)
            stream.append(
                f"commit {ref}\nmark :{mark}\ncommitter T <t@e> 1700000000 +0000\ndata 1\nx\n"
                f"from {frm}\nM 100644 inline {path}\ndata {len(data)}\n".encode()
                + data
                + b"\n"
            )
        stream.append(f"reset {subject_ref(head, rid)}\nfrom :{2 * i + 2}\n\n".encode())
    G.run(bus, "fast-import", "--quiet", input=b"".join(stream))
    G.update_ref(bus, "refs/tmp/req", None)
    before = daemon.connections()
    assert main(["status", "--remote", url, "--json"]) == 0
    assert daemon.connections() - before == 1
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2000 and {r["state"] for r in rows} == {"done"}  # verdicts are not here yet
    before = daemon.connections()
    assert main(["status", "--remote", url, "--fetch"]) == 0
    assert daemon.connections() - before == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2001 and sum(ln.split()[1] == "failed" for ln in lines[1:]) == 667
    before = daemon.connections()
    assert main(["status", "--remote", url]) == 0  # now the done commits are here: still one round trip
    assert daemon.connections() - before == 1
    without_age = [ln.split()[:4] + ln.split()[5:] for ln in lines[1:]]
    assert [ln.split()[:4] + ln.split()[5:] for ln in capsys.readouterr().out.splitlines()[1:]] == without_age


def test_doctor_says_what_is_wrong(world: Env, capsys, monkeypatch):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "ok    git" in out and "(embedded)" in out and "3 valid: cpuonly, strict, work" in out
    assert "all checks passed" in out
    # the engine line says what the torch backend quantizes K/V with on a cpu (torch is installed here)
    engine_line = next(ln for ln in out.splitlines() if ln.startswith("ok    engine"))
    assert "quantized K/V on a cpu: " in engine_line and (
        "C kernels" in engine_line or "torch ops (" in engine_line
    )
    monkeypatch.setenv("KAKEYA_REMOTE", f"git://127.0.0.1:{free_port()}/nope.git")
    monkeypatch.setenv("KAKEYA_PRESETS", str(world.tmp / "missing"))
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  bus      cannot reach the bus" in out and "KAKEYA_REMOTE" in out
    assert "FAIL  presets" in out and "2 check(s) failed" in out
    # what could not be checked without the bus says `skip`, never `ok`
    for line in (
        "skip  runners  not looked at: the bus could not be read",
        "skip  push     not tried: the bus could not be read",
        "skip  clock    not measured: the bus could not be read",
    ):
        assert line in out.splitlines(), out
    assert main(["doctor", "--json"]) == 1
    checks = {
        c["name"]: c for c in map(json.loads, capsys.readouterr().out.splitlines()) if c["event"] == "check"
    }
    assert checks["runners"]["skipped"] is True and checks["runners"]["ok"] is True
    assert checks["bus"]["skipped"] is False and checks["bus"]["ok"] is False


def test_helpers():
    assert [parse_duration(s) for s in ("90", "90s", "1.5m", "2h", "7d")] == [90, 90, 90, 7200, 604800]
    with pytest.raises(InvalidRequest):
        parse_duration("0")
    assert [age(s) for s in (5, 61, 3600 * 5, 86400 * 3)] == ["5s", "1m", "5h", "3d"]


def test_remotes_resolve_by_name_url_or_path(world: Env, tmp_path: Path):
    config = load_config()
    git(world.project, "remote", "add", "origin", "https://example.com/x.git")
    assert resolve_remote("origin", world.project, config) == "https://example.com/x.git"
    assert resolve_remote("ssh://h/x.git", world.project, config) == "ssh://h/x.git"
    assert resolve_remote("git@github.com:o/r.git", world.project, config) == "git@github.com:o/r.git"
    assert resolve_remote("bus.git", world.project, config) == str(world.project / "bus.git")
    assert resolve_remote("", world.project, config) == str(world.project / ".kakeya" / "bus.git")
    # outside a git repository there is no client: one line says to name the project; nothing is written there
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InvalidRequest, match=r"^not in a git project: pass --project DIR") as err:
        Client(config, root=plain, remote=str(world.project / ".kakeya" / "bus.git"))
    assert err.value.code == "not-in-project" and list(plain.iterdir()) == []


def test_bus_gc_deletes_the_branches_of_requests_no_runner_will_run(world: Env, daemon: Daemon, capsys):
    """A label no runner serves keeps its expired and cancelled requests under refs/heads (a runner of the label
    would close them with a done commit): gc deletes them once older than its cutoff, and nothing that may run."""
    url = daemon.repo()
    now = utcnow()
    old = new_id("work", now - dt.timedelta(days=10))  # unclaimed past MAX_TTL: expired whatever it says
    cancelled = new_id("work", now - dt.timedelta(days=2))
    waiting = new_id("work", now - dt.timedelta(days=2))  # may still run (within MAX_TTL): kept
    for rid in (old, cancelled, waiting):
        push_raw_request(url, world.project, "gpu-x", rid, b"{}")
    snap = Bus(url, world.project).ls_remote()
    sha = snap.entries[cancelled].req or ""
    marker = G.child_commit(world.project, sha, {CANCEL_PATH: b"{}"}, "cancel", "T <t@x>")
    assert Bus(url, world.project).swap([Update(cancel_ref(cancelled), marker, None)], atomic=False)
    assert main(["bus", "gc", "--older-than", "1", "--remote", url]) == 0
    assert "deleted 3 refs" in capsys.readouterr().out
    after = Bus(url, world.project).ls_remote().entries
    assert old not in after and cancelled not in after
    assert after[waiting].req == snap.entries[waiting].req
    assert main(["bus", "gc", "--older-than", "1", "--remote", url]) == 0
    assert "deleted 0 refs" in capsys.readouterr().out
