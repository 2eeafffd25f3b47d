"""Bus input from someone with push access, against a real bare bus, real runners and the real CLI: request ids
that are not real times (year 0000, 9999, a month later), manifests whose created_at is not their id's time,
a request.json far over the size cap, an expires_at a year out, a parameter with a trailing newline. Refs and
commits are written the way an attacker would: built with git and pushed straight to the bus."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.bus.records import (
    CLAIM_PATH,
    MANIFEST_PATH,
    Manifest,
    claim_ref,
    done_ref,
    id_time,
    new_id,
    read_manifests,
    req_ref,
    results_path,
    utcnow,
)
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from bridge.core.errors import InvalidRequest
from bridge.presets.registry import get_preset, load_registry
from bridge.wire import git as G
from tests.bridge.bus_support import Env, done_result, git, make_runner, manifest_dict, push_raw_request
from tests.bridge.test_gate_pr import gate

ROOT = Path(__file__).resolve().parents[2]


def plant(store: Path, url: str, ref: str, parent: str, files: dict[str, bytes]) -> str:
    """A commit on `parent` adding `files`, force-pushed to `ref` with plain git (no bridge code in the way)."""
    sha = G.child_commit(store, parent, files, "planted", "Mallory <m@example.com>")
    git(store, "push", "-q", "--force", url, f"{sha}:{ref}")
    return sha


def raw_manifest(rid: str, subject: str, created: str, expires: str, preset: str = "strict") -> bytes:
    return json.dumps(
        {
            "schema_version": 1,
            "id": rid,
            "preset": preset,
            "params": {},
            "subject": subject,
            "runner": "cpu",
            "requester": "mallory@example.com",
            "created_at": created,
            "expires_at": expires,
            "nonce": "n",
        }
    ).encode()


def iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds")


def test_ids_that_are_not_real_times_are_ignored_by_status_gc_runners_and_gate(world: Env, capsys):
    url = str(G.init_bare(world.tmp / "bus.git"))
    client = Client(load_config(), remote=url)
    runner = make_runner(url, world)
    head = git(world.project, "rev-parse", "HEAD")

    # The honest evidence: strict wants 4096 CPUs, so its run fails.
    honest = client.request("strict", {"tag": "h"}, "cpu").id
    served = runner.once(request_id=honest)
    assert served is not None and served.pushed and served.verdict == "fail"
    Bus(url, world.project).fetch([done_ref(honest)])
    done = Bus(url, world.project).ls_remote(done_ref(honest)).refs[done_ref(honest)]
    files = G.read_dir(world.project, done, results_path(honest))

    now = utcnow()
    month = now + dt.timedelta(days=30)
    hostile = {  # id -> (created_at, expires_at) its manifest says
        "00000000T000000.000Z-strict-abcdef": (iso(now), iso(now + dt.timedelta(hours=1))),
        "99991231T235959.999Z-strict-abcdef": (
            "9999-12-31T23:59:59.999+00:00",
            "9999-12-31T23:59:59.999999+00:00",
        ),
        new_id("strict", month): (iso(month), iso(month + dt.timedelta(hours=1))),
        "20261301T000000.000Z-strict-abcdef": (iso(now), iso(now + dt.timedelta(hours=1))),
        "20260101T236000.000Z-strict-abcdef": (iso(now), iso(now + dt.timedelta(hours=1))),
        "19991231T235959.999Z-strict-abcdef": (
            "1999-12-31T23:59:59.999+00:00",
            iso(now + dt.timedelta(hours=1)),
        ),
    }
    # Each is a forged passing result for this very commit, on a request commit naming it: were any of them
    # read as the newest evidence, strict@cpu would pass.
    planted: list[str] = []
    for rid, (created, expires) in hostile.items():
        req = plant(
            world.project,
            url,
            req_ref("cpu", rid),
            head,
            {MANIFEST_PATH: raw_manifest(rid, head, created, expires)},
        )
        result = {**json.loads(files["result.json"]), "request_id": rid, "verdict": "pass"}
        report = json.loads(files["report.json"])
        report["probe"]["cpu_count"] = 8192
        prefix = results_path(rid)
        forged = {
            f"{prefix}/result.json": json.dumps(result).encode(),
            f"{prefix}/report.json": json.dumps(report).encode(),
            f"{prefix}/verdict.json": json.dumps({"status": "pass", "checks": []}).encode(),
        }
        plant(world.project, url, done_ref(rid), req, forged)
        planted += [req_ref("cpu", rid), done_ref(rid)]
    # and requests waiting under those ids for a runner to take (one per hostile id, under the work preset)
    for rid in hostile:
        queued = rid.replace("-strict-", "-work-")
        plant(
            world.project,
            url,
            req_ref("cpu", queued),
            head,
            {MANIFEST_PATH: raw_manifest(queued, head, iso(now), iso(now + dt.timedelta(hours=1)), "work")},
        )
        planted.append(req_ref("cpu", queued))

    snap = Bus(url, world.project).ls_remote()
    assert set(snap.refs) >= set(planted)  # they are on the bus ...
    assert sorted(snap.ignored) == sorted(planted)  # ... and every reader ignores them
    assert list(snap.entries) == [honest]

    # kakeya status: no crash, none of them listed
    assert main(["status", "--remote", url, "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [honest]
    for rid in hostile:  # asked for by name, each is refused with the rule, not a traceback
        assert main(["status", rid, "--remote", url]) == 2  # invalid input (bad-id): exit 2
        assert "is not a request id (expected e.g." in capsys.readouterr().err

    # a runner serves the honest request waiting behind them, and nothing else
    waiting = client.request("work", {"tag": "w"}, "cpu").id
    served = runner.once()
    assert served is not None and served.id == waiting and served.pushed
    assert runner.once() is None
    assert world.count() == ["h", "w"]
    after = Bus(url, world.project).ls_remote()
    assert not any("/claim/" in r for r in after.refs)  # the done pushes took the claims
    assert {e.id for e in after.entries.values() if e.done} == {honest, waiting}

    # gate pr: the honest failing run is the evidence; no forged pass under a "newer" id masks it
    assert gate(url, head, "strict@cpu", as_json=True) == 1
    out = capsys.readouterr().out
    (outcome,) = json.loads(out)
    assert (outcome["status"], outcome["request_id"]) == ("fail", honest)
    assert not any(rid in out for rid in hostile)

    # bus gc: no crash; finished honest requests are collected, the refs it cannot read are left alone
    assert main(["bus", "gc", "--older-than", "0", "--remote", url]) == 0
    refs = Bus(url, world.project).ls_remote().refs
    assert req_ref("cpu", honest) not in refs and done_ref(honest) in refs
    assert set(planted) <= set(refs)


def test_a_result_whose_created_at_is_not_its_id_time_is_not_evidence(world: Env, capsys):
    url = str(G.init_bare(world.tmp / "bus.git"))
    client = Client(load_config(), remote=url)
    head = git(world.project, "rev-parse", "HEAD")
    honest = client.request("strict", {"tag": "h"}, "cpu").id  # fails: strict wants 4096 CPUs
    assert make_runner(url, world).once(request_id=honest).verdict == "fail"
    bus = Bus(url, world.project)
    bus.fetch([done_ref(honest)])
    files = G.read_dir(world.project, bus.ls_remote().refs[done_ref(honest)], results_path(honest))
    # a forged pass under a fresh id, whose manifest says it was made two days before that id's time
    rid = new_id("strict")
    made = id_time(rid) - dt.timedelta(days=2)
    manifest = raw_manifest(rid, head, iso(made), iso(made + dt.timedelta(days=3)))
    req = plant(world.project, url, req_ref("cpu", rid), head, {MANIFEST_PATH: manifest})
    report = json.loads(files["report.json"])
    report["probe"]["cpu_count"] = 8192
    result = {**json.loads(files["result.json"]), "request_id": rid, "verdict": "pass"}
    forged = {
        f"{results_path(rid)}/result.json": json.dumps(result).encode(),
        f"{results_path(rid)}/report.json": json.dumps(report).encode(),
    }
    plant(world.project, url, done_ref(rid), req, forged)
    assert gate(url, head, "strict@cpu", as_json=True) == 1
    (outcome,) = json.loads(capsys.readouterr().out)
    assert outcome["status"] != "pass", outcome
    if outcome["request_id"] == rid:  # named as the newest, it is refused for its request.json (fails closed)
        assert outcome["status"] == "mismatch"
        assert any(".kakeya/request.json is missing or invalid" in r for r in outcome["reasons"]), outcome
    else:  # or set aside, and the honest failing run is the evidence
        assert (outcome["status"], outcome["request_id"]) == ("fail", honest)
    assert main(["status", "--remote", url, "--json", "--fetch"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[rid]["subject"] is None and rows[honest]["subject"] == head  # its manifest is not read as one
    assert main(["bus", "gc", "--older-than", "0", "--remote", url]) == 0


def test_hostile_manifests_are_rejected_each_in_one_done_commit(world: Env):
    client = Client(load_config())
    url = client.url
    head = git(world.project, "rev-parse", "HEAD")
    cases: dict[str, str] = {}

    def raw(manifest) -> str:
        rid = new_id("work")
        push_raw_request(url, world.project, "cpu", rid, manifest(rid))
        return rid

    # a request.json of over 1 MiB: refused by its size alone
    big = raw(lambda r: {**manifest_dict(r, "work", head), "nonce": "x" * (1 << 20)})
    cases[big] = "invalid manifest: .kakeya/request.json is "

    # expires a year out (the most is 7 days)
    def year_out(rid: str) -> dict:
        return {
            **manifest_dict(rid, "work", head),
            "expires_at": iso(id_time(rid) + dt.timedelta(days=365)),
        }

    cases[raw(year_out)] = "at most 7 days after it"

    # created_at two days before the time of its id
    def backdated(rid: str) -> dict:
        made = id_time(rid) - dt.timedelta(days=2)
        return {
            **manifest_dict(rid, "work", head),
            "created_at": iso(made),
            "expires_at": iso(made + dt.timedelta(days=3)),
        }

    cases[raw(backdated)] = "is not the time of its id"
    # parameters with a trailing newline, which a `$` would let through
    cases[raw(lambda r: manifest_dict(r, "work", head, params={"tag": "abc\n"}))] = (
        "bad parameters: preset work: parameter tag='abc\\n' must not contain control characters (U+000A"
    )
    cases[raw(lambda r: manifest_dict(r, "work", head, params={"mode": "count\n"}))] = (
        "bad parameters: preset work: parameter mode='count\\n' must be one of"
    )
    runner = make_runner(url, world)
    served = [runner.once() for _ in range(len(cases))]
    assert runner.once() is None
    assert {s.id: s.status for s in served if s} == {rid: "rejected" for rid in cases}
    refs = Bus(url, world.project).ls_remote().refs
    for rid, why in cases.items():
        result = done_result(world.project, url, rid)
        assert result["status"] == "rejected" and why in result["reason"], (rid, result["reason"])
        assert result["argv"] == [] and result["started_at"] is None
        # one done commit, on the claim, on the request (whose refs went with the done push)
        done = refs[done_ref(rid)]
        assert claim_ref(rid) not in refs and req_ref("cpu", rid) not in refs
        (parent,) = G.parents(world.project, done)  # the result is in this one commit, not before it
        assert G.read_path(world.project, parent, CLAIM_PATH) is not None  # the claim commit
        assert G.read_path(world.project, parent, f"{results_path(rid)}/result.json") is None
    (req,) = G.parents(world.project, G.parents(world.project, refs[done_ref(big)])[0])  # the request
    (size,) = G.blob_sizes(world.project, [f"{req}:{MANIFEST_PATH}"]).values()
    assert size > 1 << 20
    assert done_result(world.project, url, big)["reason"] == (
        f"invalid manifest: .kakeya/request.json is {size} bytes, over the 65536-byte cap"
    )
    assert world.count() == []
    # kakeya status reads the same bus without trouble
    rows = {r.id: r for r in client.status(fetch=True)}
    assert {rows[rid].state for rid in cases} == {"rejected"}


def test_the_client_refuses_an_expiry_past_the_longest_wait(world: Env, capsys, monkeypatch):
    client = Client(load_config())
    assert main(["request", "work", "--runner", "cpu", "--expires", "8d"]) == 2
    err = capsys.readouterr().err
    assert "--expires 8d is too long: a request waits for a runner at most 7d" in err
    assert client.bus.ls_remote().entries == {}
    assert main(["request", "work", "--runner", "cpu", "--expires", "7d"]) == 0
    (entry,) = client.bus.ls_remote().entries.values()
    client.ensure([entry], ("req",))
    manifest = read_manifests(client.bus.repos(), [entry.req or ""])[entry.req or ""]
    assert isinstance(manifest, Manifest)
    assert manifest.expires_at - manifest.created_at == dt.timedelta(days=7)
    # nor can the configured default ask for more
    monkeypatch.setenv("KAKEYA_REQUEST_TTL", str(8 * 86400))
    with pytest.raises(InvalidRequest, match="request_ttl_s"):
        load_config()


def test_a_model_with_a_trailing_newline_is_refused_naming_the_parameter(world: Env, capsys, monkeypatch):
    monkeypatch.setenv("KAKEYA_PRESETS", str(ROOT / "presets"))
    client = Client(load_config())
    assert main(["request", "niah-smoke", "-p", "model=zoo:tiny-hybrid\n", "--runner", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "parameter model='zoo:tiny-hybrid\\n' must not contain control characters (U+000A" in err
    assert client.bus.ls_remote().entries == {}
    preset = get_preset(load_registry(), "niah-smoke")
    assert preset.validate_params({"model": "zoo:tiny-hybrid"})["model"] == "zoo:tiny-hybrid"
