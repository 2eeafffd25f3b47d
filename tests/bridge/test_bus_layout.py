"""Bus layout 2 against real buses (`git daemon`, bare repositories): what a done push leaves and takes away,
prefix-scoped reads that cost the same whatever the history (bytes counted by a relay), the by-subject index
`gate pr` reads, the layout marker, `kakeya bus migrate`, and the history `benchmarks/bus_scale.py` writes
checked against a real run."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest

from benchmarks.bus_scale import Relay, template, write_history
from bridge import evidence as E
from bridge.bus.bus import Bus, BusError, BusUnreachable
from bridge.bus.records import (
    CLAIM_PATH,
    CLAIM_PREFIX,
    DONE_PREFIX,
    MANIFEST_PATH,
    NS,
    PREFIX,
    RUNNERS_PREFIX,
    Claim,
    Manifest,
    Update,
    claim_ref,
    done_ref,
    id_time,
    layout_ref,
    new_id,
    req_ref,
    results_path,
    runner_ref,
    subject_ref,
    utcnow,
)
from bridge.cli.main import main
from bridge.core.result import RunResult
from bridge.presets.registry import load_registry
from bridge.wire import git as G
from tests.bridge.bus_support import Daemon, Env, HttpGit, client, git, make_runner
from tests.bridge.test_gate_pr import gate


def served(url: str, world: Env, **params: str) -> str:
    rid = client(url).request("work", params, "cpu", subject="HEAD").id
    done = make_runner(url, world).once(request_id=rid)
    assert done is not None and done.pushed
    return rid


def all_refs(bus_dir) -> dict[str, str]:
    return {ref: sha for ref, sha in G.refs_under(bus_dir, "refs/").items()}


@pytest.fixture(name="relayed", params=["http", "git"])
def relayed_fixture(request: pytest.FixtureRequest, daemon: Daemon):
    """A bus served by `git daemon` or by smart HTTP (`git http-backend`): (its URL, the URL through a relay
    that counts the bytes, its directory, the relay)."""
    if request.param == "git":
        relay = Relay(daemon.port)
        yield daemon.repo(), relay.url(), daemon.base / "bus.git", relay
    else:
        http: HttpGit = request.getfixturevalue("httpgit")
        relay = Relay(http.port)
        yield http.repo(), http.repo(port=relay.port), http.base / "bus.git", relay
    relay.close()


def test_history_written_by_fast_import_has_the_shape_of_a_real_run(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    real = served(url, world, tag="real")
    real_done = all_refs(bus_dir)[done_ref(real)]
    tpl = template(bus_dir, real_done)
    made = write_history(bus_dir, tpl, 60, (1, 50))
    assert len(made["ids"]) == 60 and len(set(made["ids"])) == 60
    refs = all_refs(bus_dir)
    for rid in made["ids"] + [real]:  # each finished request: a done ref and one index ref, nothing else
        mine = sorted(ref.split("/")[2] for ref in refs if ref.endswith("/" + rid))
        assert mine == ["by-subject", "done"], (rid, mine)
    fake = made["ids"][-1]
    fake_done = refs[done_ref(fake)]

    def shape(done: str, rid: str) -> list[tuple[list[str], int]]:
        """Per commit from the done commit down to the subject: its .kakeya paths (id written as ID; not
        live.json, which a heartbeat adds only when the run printed while it lasted past a beat) and parent
        count."""
        manifest = json.loads(G.read_path(bus_dir, done, MANIFEST_PATH) or b"{}")
        chain = G.out(bus_dir, "rev-list", "--first-parent", done).split()
        chain = chain[: chain.index(manifest["subject"])]
        return [
            (
                sorted(
                    p.replace(rid, "ID")
                    for p in G.ls_tree(bus_dir, f"{c}:.kakeya", recursive=True)
                    if p != "live.json"
                ),
                len(G.parents(bus_dir, c)),
            )
            for c in chain
        ]

    def collapsed(chain: list[tuple[list[str], int]]) -> list[tuple[list[str], int]]:
        """Heartbeats (claim commits on the claim) as one claim: a real run has as many as its time took."""
        return [c for i, c in enumerate(chain) if i == 0 or c != chain[i - 1]]

    assert collapsed(shape(fake_done, fake)) == collapsed(shape(real_done, real))
    assert len(shape(fake_done, fake)) == 3  # done, claim, request
    # and the files are as valid as a real run's: the same models read them
    result = RunResult.model_validate_json(
        G.read_path(bus_dir, fake_done, f"{results_path(fake)}/result.json") or b""
    )
    subject50 = made["subjects"][50]
    assert (result.request_id, result.status) == (fake, "succeeded")
    Manifest.model_validate_json(G.read_path(bus_dir, fake_done, MANIFEST_PATH) or b"")
    Claim.model_validate_json(G.read_path(bus_dir, fake_done, CLAIM_PATH) or b"")
    # `gate pr`, `results` and `status` treat them as real: the subject with 50 runs passes on its newest
    newest = max(rid for rid in made["ids"] if refs.get(subject_ref(subject50, rid)))
    assert gate(url, subject50, "work@cpu") == 0
    assert capsys.readouterr().out.startswith(f"✓ work@cpu: pass — {newest} · unsigned (allowed)")
    assert main(["results", fake, "--remote", url, "--out", str(world.tmp / "fake")]) == 0
    assert json.loads((world.tmp / "fake" / fake / "result.json").read_text())["request_id"] == fake
    capsys.readouterr()
    assert main(["status", "--remote", url, "--all", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in rows} == set(made["ids"]) | {real}


def test_reads_cost_the_same_bytes_whatever_the_history(world: Env, relayed, capsys):
    """A runner's idle poll, a look at one request, the runners list and the gate of a subject with one run
    are prefix-scoped, over git:// and over http alike: after 400 more finished requests they move the same
    bytes; a full listing grows."""
    direct, url, bus_dir, relay = relayed
    real = served(direct, world, tag="real")
    tpl = template(bus_dir, all_refs(bus_dir)[done_ref(real)])
    subject = write_history(bus_dir, tpl, 20, (1,))["subjects"][1]
    runner = make_runner(url, world, name="poller")
    registry = load_registry()

    def costs() -> dict[str, int]:
        out = {}
        for name, op in (
            ("poll", lambda: runner.once()),
            ("entry", lambda: client(url).entry(real)),
            ("runners", lambda: main(["runners", "--remote", url])),
            (
                "gate",
                lambda: E.gate_subject(
                    E.DoneResults(client(url).bus), subject, [E.Requirement("work", "cpu")], registry
                ),
            ),
            ("full", lambda: git(world.project, "ls-remote", url)),
        ):
            op()  # once to fetch what it needs; then what a repeat costs
            relay.reset()
            op()
            out[name] = relay.down + relay.up
        capsys.readouterr()
        return out

    before = costs()
    write_history(bus_dir, tpl, 400, (1,))
    after = costs()
    assert after["full"] > before["full"] + 400 * 100  # an unscoped listing pays for every finished request
    for name in ("poll", "entry", "runners", "gate"):
        assert after[name] == before[name], (name, before, after)
        assert after[name] < 3000, (name, after)


def test_the_done_push_is_atomic_and_a_lost_lease_pushes_nothing(world: Env, daemon: Daemon):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    c = client(url)
    rid = c.request("work", {}, "cpu", subject="HEAD").id
    r1 = make_runner(url, world, name="r1")
    entry = r1.bus.ls_remote().entries[rid]
    claimed = r1.claims.claim(entry, None)
    assert claimed is not None
    claim_sha = claimed[0]
    # someone takes the claim over before r1's done push: the push must change nothing at all
    thief = G.child_commit(r1.mirror, claim_sha, {CLAIM_PATH: b"{}"}, "takeover", "T <t@x>")
    assert r1.bus.swap([Update(claim_ref(rid), thief, claim_sha)])
    done = G.child_commit(r1.mirror, claim_sha, {f"{results_path(rid)}/result.json": b"{}"}, "d", "T <t@x>")
    before = all_refs(bus_dir)
    assert r1.outbox.push(rid, claim_sha, done, entry) is False
    assert all_refs(bus_dir) == before  # no done ref, no index ref, the request and the thief's claim kept
    assert before[req_ref("cpu", rid)] == entry.req and before[claim_ref(rid)] == thief

    # a squatted index ref (someone pushed it first) is replaced by the done push, never a reason to fail
    other = c.request("work", {"tag": "b"}, "cpu", subject="HEAD").id
    other_req = all_refs(bus_dir)[req_ref("cpu", other)]
    assert r1.bus.swap([Update(subject_ref(head, other), head, None)], atomic=False)
    result = make_runner(url, world, name="r2").once(request_id=other)
    assert result is not None and result.pushed
    refs = all_refs(bus_dir)
    assert refs[subject_ref(head, other)] == refs[done_ref(other)] == result.done
    assert req_ref("cpu", other) not in refs and claim_ref(other) not in refs
    # the request and the claim commit whose refs went stay reachable from the done commit
    assert G.is_ancestor(bus_dir, other_req, result.done or "")
    claims = G.first_parents(bus_dir, result.done or "", other_req)[1:]
    assert claims and all(G.read_path(bus_dir, c, CLAIM_PATH) for c in claims)


def test_a_bus_of_another_layout_is_refused_with_the_version_to_use(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    served(url, world)
    assert layout_ref() in all_refs(bus_dir)  # a new bus says its layout from its first request
    # a newer kakeya moved the bus on to layout 3
    G.update_ref(bus_dir, layout_ref(), None)
    G.run(bus_dir, "update-ref", layout_ref(3), head)
    assert main(["status", "--remote", url]) == 1
    err = capsys.readouterr().err
    assert "has bus layout 3; this kakeya speaks layout 2: upgrade kakeya" in err, err
    with pytest.raises(BusError, match="bus layout 3"):
        make_runner(url, world).once()
    # a bus of layout 1 (everything under refs/heads/kakeya/) that nobody migrated
    G.update_ref(bus_dir, layout_ref(3), None)
    G.run(bus_dir, "update-ref", f"{PREFIX}done/{new_id('work')}", head)
    assert main(["status", "--remote", url]) == 1
    assert "old bus layout 1" in (err := capsys.readouterr().err) and "kakeya bus migrate" in err, err


def test_migrate_upgrades_an_old_bus_once_and_a_live_claim_is_honoured(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    # A bus of layout 1: a finished request (request, claim = done, done refs under refs/heads/kakeya/), a
    # request a runner of layout 1 holds (its claim there too), a cancel marker and a presence.
    finished = served(url, world, tag="old")
    refs = all_refs(bus_dir)
    done = refs[done_ref(finished)]
    req = G.first_parents(bus_dir, done, head)[-1]  # the request commit: the first on the subject
    assert G.parents(bus_dir, req) == [head]
    live = client(url).request("work", {"tag": "live"}, "cpu", subject="HEAD").id
    live_req = all_refs(bus_dir)[req_ref("cpu", live)]
    now = utcnow()
    claim = Claim(
        id=live,
        runner="old-runner",
        labels=["cpu"],
        host="h",
        pid=1,
        claimed_at=now,
        lease_until=now,
        lease_s=3,
    )
    claim_sha = G.child_commit(bus_dir, live_req, {CLAIM_PATH: claim.dump()}, "old claim", "T <t@x>")
    old = {
        req_ref("cpu", finished): req,
        f"{PREFIX}claim/{finished}": done,
        f"{PREFIX}done/{finished}": done,
        f"{PREFIX}claim/{live}": claim_sha,
        f"{PREFIX}runners/old-runner": head,
    }
    G.run(
        bus_dir,
        "update-ref",
        "--stdin",
        input="".join(
            [f"delete {ref}\n" for ref in all_refs(bus_dir) if ref.startswith(NS)]
            + [f"update {ref} {sha}\n" for ref, sha in old.items()]
        ).encode(),
    )
    assert main(["status", "--remote", url]) == 1 and "kakeya bus migrate" in capsys.readouterr().err
    assert main(["bus", "migrate", "--remote", url, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "would update 10 refs" in dry and subject_ref(head, finished) in dry
    assert all_refs(bus_dir) == {**old, req_ref("cpu", live): live_req}  # a dry run changes nothing
    capsys.readouterr()
    assert main(["bus", "migrate", "--remote", url]) == 0
    assert "updated 10 refs" in capsys.readouterr().out
    after = all_refs(bus_dir)
    marker = after.pop(layout_ref())
    assert after == {
        done_ref(finished): done,
        subject_ref(head, finished): done,
        claim_ref(live): claim_sha,
        req_ref("cpu", live): live_req,
        runner_ref("old-runner"): head,
    }
    assert marker
    assert main(["bus", "migrate", "--remote", url]) == 0  # idempotent
    assert "updated 0 refs" in capsys.readouterr().out
    assert (
        main(["gate", "pr", "--subject", head, "--require", "work@cpu", "--remote", url, "--allow-unsigned"])
        == 0
    )
    assert capsys.readouterr().out.startswith(f"✓ work@cpu: pass — {finished} · unsigned (allowed)")
    # the old runner's claim is a claim: a runner of layout 2 waits out its lease, then takes it over, once
    runner = make_runner(url, world, name="new")
    assert runner.once() is None  # first sight of the claim: its lease runs on this runner's clock
    time.sleep(3.5)
    took = runner.once()
    assert took is not None and took.id == live and took.pushed
    assert world.count() == ["old", "live"]
    final = all_refs(bus_dir)
    assert claim_ref(live) not in final and req_ref("cpu", live) not in final


def test_compact_moves_old_results_into_the_ledger_and_every_reader_still_finds_them(
    world: Env, daemon: Daemon, capsys
):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    real = served(url, world, tag="real")
    made = write_history(bus_dir, template(bus_dir, all_refs(bus_dir)[done_ref(real)]), 40, (1, 5))
    ids = made["ids"] + [real]
    cutoff = utcnow().timestamp() - 3 * 86400
    old = {rid for rid in ids if id_time(rid).timestamp() < cutoff}
    assert 20 < len(old) < len(ids)
    assert main(["bus", "compact", "--older-than", "3", "--remote", url, "--dry-run"]) == 0
    assert f"would move {2 * len(old)} refs into the ledger" in capsys.readouterr().out
    assert main(["bus", "compact", "--older-than", "3", "--remote", url]) == 0
    assert f"moved {2 * len(old)} refs into the ledger" in capsys.readouterr().out
    refs = all_refs(bus_dir)
    # only the recent results keep refs; the ledger and its shard refs hold the rest
    assert {r.rsplit("/", 1)[1] for r in refs if r.startswith(DONE_PREFIX)} == set(ids) - old
    assert not any(r.endswith(tuple(old)) for r in refs)
    ledger = refs["refs/kakeya/ledger"]
    kept = set(G.out(bus_dir, "rev-list", ledger).split())
    # the done commits stay reachable (a gc of the bus keeps them) and are indexed by date, subject and preset
    G.run(bus_dir, "gc", "--prune=now", "--quiet")
    for rid in old:
        done = json.loads(G.read_path(bus_dir, ledger, f"date/{rid[:8]}/{rid}") or b"{}")["done"]
        assert done in kept and G.read_path(bus_dir, done, f"{results_path(rid)}/result.json")
    tree = G.ls_tree(bus_dir, ledger, recursive=True)
    assert {p.split("/")[0] for p in tree} == {"date", "subject", "preset"}
    assert (
        max(len(G.ls_tree(bus_dir, f"{ledger}:date/{d}")) for d in G.ls_tree(bus_dir, f"{ledger}:date"))
        < 3000
    )
    assert main(["bus", "compact", "--older-than", "3", "--remote", url]) == 0  # nothing left to move
    assert "moved 0 refs" in capsys.readouterr().out
    # a fresh clone (none of these objects): gate pr, results and status --all find the moved results
    other = world.tmp / "other"
    git(world.tmp, "clone", "-q", str(world.project), str(other))
    os.chdir(other)
    subject5 = made["subjects"][5]
    five = sorted(
        rid for rid in made["ids"] if G.read_path(bus_dir, ledger, f"subject/{subject5[:2]}/{subject5}/{rid}")
    )
    assert five and set(five) <= old
    assert gate(url, subject5, "work@cpu") == 0
    assert capsys.readouterr().out.startswith(f"✓ work@cpu: pass — {max(five)} · unsigned (allowed)")
    moved = min(old)
    assert main(["results", moved, "--remote", url, "--out", str(world.tmp / "moved")]) == 0
    assert json.loads((world.tmp / "moved" / moved / "result.json").read_text())["request_id"] == moved
    capsys.readouterr()
    assert main(["status", "--remote", url, "--all", "--json"]) == 0
    assert {r["id"] for r in json.loads(capsys.readouterr().out)} == set(ids)
    assert main(["status", "--remote", url, "--json"]) == 0  # recent only: nothing from the ledger
    assert not {r["id"] for r in json.loads(capsys.readouterr().out)} & old


def test_listing_errors_and_time_limits_say_what_was_asked(world: Env, daemon: Daemon, tmp_path):
    missing = f"git://127.0.0.1:{daemon.port}/nope.git"
    with pytest.raises(BusUnreachable, match=r"listing refs/kakeya/claim/.*nope.git"):
        Bus(missing, world.project).ls_remote(CLAIM_PREFIX)
    # a server that accepts and never answers: the time limit names what was being listed
    import socket

    silent = socket.create_server(("127.0.0.1", 0))
    try:
        url = f"git://127.0.0.1:{silent.getsockname()[1]}/bus.git"
        with pytest.raises(BusUnreachable, match=r"listing refs/kakeya/runners/.*timed out after 1 s"):
            Bus(url, world.project, timeout_s=1).ls_remote(RUNNERS_PREFIX)
    finally:
        silent.close()
    # a local bus is asked through `git upload-pack`: the same scoped answer as over git://
    url = daemon.repo()
    served(url, world)
    local = Bus(str(daemon.base / "bus.git"), world.project).list([DONE_PREFIX])
    assert local == Bus(url, world.project).list([DONE_PREFIX]) and local.count("\n") == 1


def test_an_idle_watch_backs_off_and_a_served_request_resets_it():
    from bridge.run.runner import IDLE_CAP, idle_wait

    waits = [idle_wait(0.5, n) for n in range(40)]
    assert waits[:11] == [0.5] * 11  # the first ten idle polls at the poll interval
    assert all(a <= b for a, b in zip(waits, waits[1:], strict=False))  # then slower and slower
    assert waits[-1] == 0.5 * IDLE_CAP  # up to IDLE_CAP times the interval
    assert idle_wait(10.0, 40) == 30.0 and idle_wait(60.0, 40) == 60.0  # never past 30 s unless poll_s is


def test_a_baseline_is_looked_for_newest_first_a_batch_at_a_time(world: Env, daemon: Daemon):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    real = served(url, world, tag="real")
    made = write_history(bus_dir, template(bus_dir, all_refs(bus_dir)[done_ref(real)]), 40, (1,))
    ids = sorted(made["ids"] + [real])
    shelf = E.DoneResults(client(url).bus).load(["work"])
    assert [d.id for d in shelf.of("work", None)] == ids[::-1][: E.BATCH]  # only the newest batch was read
    preset = load_registry()["work"]
    newest = shelf.previous_pass(preset, "cpu")
    assert newest is not None and newest[0].id == ids[-1] and len(shelf.of("work", None)) == E.BATCH
    found = shelf.previous_pass(preset, "cpu", before=ids[2])  # a pass older than two more batches
    assert found is not None and found[0].id == ids[1]
    assert len(shelf.of("work", None)) == len(ids)  # 16 + 16 + the last 9: read only as far as needed
    assert shelf.previous_pass(preset, "cpu", before=ids[0]) is None  # nothing older: none found


def test_compact_takes_in_a_forged_done_result_without_trusting_what_it_names(
    world: Env, daemon: Daemon, capsys
):
    """A done ref anyone pushed, whose result.json names a 'subject' that is no commit (and could be no ref name)
    and that has no request.json: compaction takes it in (dated, by preset), indexes it under no subject, and
    never fails on it."""
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    served(url, world)  # a real, recent one (stays in refs)
    rid = new_id("work", utcnow() - dt.timedelta(days=5))
    junk = json.dumps({"request_id": rid, "subject": "</details><img src=x>", "status": "succeeded"}).encode()
    forged = G.child_commit(bus_dir, head, {f"{results_path(rid)}/result.json": junk}, "forged", "M <m@x>")
    G.update_ref(bus_dir, done_ref(rid), forged)
    assert main(["bus", "compact", "--older-than", "3", "--remote", url]) == 0
    assert "moved 1 refs into the ledger" in capsys.readouterr().out
    ledger = all_refs(bus_dir)["refs/kakeya/ledger"]
    paths = sorted(G.ls_tree(bus_dir, ledger, recursive=True))
    assert paths == [f"date/{rid[:8]}/{rid}", f"preset/work/-/{rid[:6]}/{rid}"]
    entry = json.loads(G.read_path(bus_dir, ledger, paths[0]) or b"{}")
    assert (entry["done"], entry["subject"], entry["label"]) == (forged, None, None)
