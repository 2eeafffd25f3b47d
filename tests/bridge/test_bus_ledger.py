"""The ledger at scale (bridge/bus/ledger.py) against real buses: four refs whatever the history (the ledger and its
maps, no ref per shard), readers that fetch only the shard they need by object id (and a depth-1 fallback where
a server refuses that), runners that compact on their own under a lease (racing runners, a lease taken over from
a crashed compactor, a compaction that loses a race to a done ref that moved), baselines found in the ledger,
and an idle `runner once` that pushes no presence."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterator

import pytest

from benchmarks.bus_scale import Relay, template, write_history
from bridge.bus import ledger as L
from bridge.bus.bus import LEDGER_STORE
from bridge.bus.records import (
    DONE_PREFIX,
    LAYOUT_PREFIX,
    SUBJECT_PREFIX,
    Update,
    done_ref,
    id_time,
    layout_ref,
    new_id,
    runner_ref,
    utcnow,
)
from bridge.cli.main import main
from bridge.client.admin import Admin
from bridge.client.client import Client
from bridge.config import load_config
from bridge.core.errors import BusError, KakeyaError
from bridge.evidence import DoneResults
from bridge.run import compaction as compaction_module
from bridge.run.runner import Runner
from bridge.wire import git as G
from tests.bridge.bus_support import (
    Daemon,
    Env,
    HttpGit,
    client,
    git,
    make_runner,
    runner_process,
    stop,
    wait_for,
)
from tests.bridge.test_baseline import bench_fixture, run  # noqa: F401 — the `bench` fixture


def all_refs(bus_dir) -> dict[str, str]:
    return G.refs_under(bus_dir, "refs/")


def history(url: str, world: Env, bus_dir, count: int = 40) -> dict:
    """One real run, then `count` finished requests of its shape spread over 30 days (fast-import)."""
    rid = client(url).request("work", {"tag": "real"}, "cpu", subject="HEAD").id
    done = make_runner(url, world).once(request_id=rid)
    assert done is not None and done.pushed
    made = write_history(bus_dir, template(bus_dir, all_refs(bus_dir)[done_ref(rid)]), count, (1, 5))
    made["ids"].append(rid)
    return made


def ledgered(world: Env, daemon: Daemon, count: int) -> tuple[str, object, dict, str]:
    """A bus that filters (uploadpack.allowFilter) with a history of `count` results, those older than 3 days
    moved into the ledger: (its url, its directory, the history, the ledger commit)."""
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    G.run(bus_dir, "config", "uploadpack.allowFilter", "true")
    made = history(url, world, bus_dir, count)
    assert Admin(client(url)).compact(3)
    return url, bus_dir, made, all_refs(bus_dir)[L.LEDGER_REF]


def old_ids(made: dict, days: float) -> set[str]:
    cutoff = utcnow() - dt.timedelta(days=days)
    return {rid for rid in made["ids"] if id_time(rid) < cutoff}


def test_the_ledger_is_four_refs_and_a_reader_fetches_one_shard_by_id(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    made = history(url, world, bus_dir)
    # an earlier ledger kept a ref per shard: compaction deletes them (leased), whatever they point at
    G.update_ref(bus_dir, L.SHARD_PREFIX + "date/20260101", all_refs(bus_dir)[layout_ref()])
    G.update_ref(bus_dir, L.OLD_MAPS[0], all_refs(bus_dir)[layout_ref()])  # and one subject map of 256 shards
    old = old_ids(made, 3)
    assert main(["bus", "compact", "--older-than", "3", "--remote", url]) == 0
    assert f"moved {2 * len(old) + 2} refs into the ledger" in capsys.readouterr().out
    refs = all_refs(bus_dir)
    ledger_refs = sorted(r for r in refs if r.startswith("refs/kakeya/") and not r.startswith(DONE_PREFIX))
    ledger_refs = [r for r in ledger_refs if not r.startswith((SUBJECT_PREFIX, LAYOUT_PREFIX))]
    assert ledger_refs == [L.LEDGER_REF, *sorted(L.map_ref(kind) for kind in L.KINDS)]
    # the maps name the ledger commit and every shard tree of its index, each of its own kind
    maps = {
        kind: L.LedgerMap.model_validate_json(
            G.read_blobs(bus_dir, [refs[L.map_ref(kind)]])[refs[L.map_ref(kind)]]
        )
        for kind in L.KINDS
    }
    assert {m.ledger for m in maps.values()} == {refs[L.LEDGER_REF]}
    assert {n: t for m in maps.values() for n, t in m.shards.items()} == L.shard_trees(
        bus_dir, refs[L.LEDGER_REF]
    )
    assert all(L.map_kind(n) == kind for kind, m in maps.items() for n in m.shards)
    assert {f"date/{rid[:8]}" for rid in old} <= set(maps["date"].shards)
    ledger_map = maps["date"]

    # a fresh store reads one old result: the map blob and that day's shard tree, nothing else of the ledger
    moved = min(old)
    relay = Relay(daemon.port)
    try:
        fresh = Client(load_config(), remote=relay.url())
        entry = fresh.entry(moved)
        assert (
            entry.done is not None
            and json.loads(G.read_path(bus_dir, refs[L.LEDGER_REF], f"date/{moved[:8]}/{moved}") or b"{}")[
                "done"
            ]
            == entry.done
        )
        trees = {ledger_map.shards[f"date/{moved[:8]}"]}
        date_map = refs[L.map_ref("date")]
        assert G.present(fresh.bus.store, [*trees, date_map]) == {*trees, date_map}
        assert not G.present(fresh.bus.store, [refs[L.map_ref("subject-0")]])  # nor the other maps
        others = set(ledger_map.shards.values()) - trees
        assert not G.present(fresh.bus.store, sorted(others)) & others  # no other shard came
        assert not G.present(fresh.bus.store, [refs[L.LEDGER_REF]])  # nor the ledger commit
        assert relay.down < 64 * 1024
    finally:
        relay.close()
    # and a forged map is refused, not trusted
    tip = refs[L.LEDGER_REF]
    subject_shard = {"subject/ab": tip}
    for forged in (b'{"ledger": "nope"}', {"../etc": tip}, subject_shard):
        data = forged if isinstance(forged, bytes) else json.dumps({"ledger": tip, "shards": forged}).encode()
        G.update_ref(bus_dir, L.map_ref("date"), G.write_blobs(bus_dir, [data])[0])
        with pytest.raises(KakeyaError, match="no request"):  # ignored with a warning, never trusted
            client(url).entry(moved)
        assert "is not a ledger map: ignored" in capsys.readouterr().err


def test_one_subject_in_the_ledger_is_its_map_its_shard_tree_alone_and_its_own_directory(
    world: Env, daemon: Daemon
):
    """What `gate pr` reads of a subject whose results are in the ledger: its map (the shards of its first hex
    digit), its shard's tree without what it holds (a filtered fetch: the other subjects of the shard never
    come) and its own directory; the store's config is left as it was (no promisor remote written)."""
    url, bus_dir, made, tip = ledgered(world, daemon, 80)
    shards = G.ls_tree(bus_dir, f"{tip}:subject")
    crowded = {n: G.ls_tree(bus_dir, sha) for n, (_, _, sha) in shards.items()}
    subject, siblings = next((min(d), d) for d in crowded.values() if len(d) > 1)  # 80 subjects: some share
    other = world.tmp / "other"
    git(world.tmp, "clone", "-q", str(world.project), str(other))
    config = (other / ".git" / "config").read_text()
    fresh = Client(load_config(), root=other, remote=url)
    shelf = DoneResults(fresh.bus).load(["work"], subject=subject)
    ran = {
        rid
        for rid in made["ids"]
        if json.loads(G.read_path(bus_dir, tip, f"date/{rid[:8]}/{rid}") or b"{}").get("subject") == subject
    }
    assert ran and {d.id for d in shelf.dones["work"]} >= ran
    store = fresh.bus.store
    shard = shards[subject[:2]][2]
    assert G.present(store, [shard, siblings[subject][2]]) == {shard, siblings[subject][2]}
    others = {sha for name, (_, _, sha) in siblings.items() if name != subject}
    assert not G.present(store, sorted(others))  # the shard's other subjects did not come
    assert (other / ".git" / "config").read_text() == config


def test_a_compaction_onto_a_ledger_reads_only_the_directories_it_writes_into(world: Env, daemon: Daemon):
    """A compactor with an empty store moving a day of results onto a ledger fetches the ledger commit, its
    maps and the trees of the directories those results go into, trees alone: never the index (every entry
    ever moved, 33 MB at 100,000 results). It leaves the ledger and the maps that reading the whole index
    writes."""
    url, bus_dir, made, tip = ledgered(world, daemon, 60)
    before = G.ls_tree(bus_dir, tip, recursive=True)
    other = world.tmp / "other"
    git(world.tmp, "clone", "-q", str(world.project), str(other))
    fresh = Client(load_config(), root=other, remote=url)
    moved = old_ids(made, 1) - old_ids(made, 3)
    assert moved and len(Admin(fresh).compact(1)) == 2 * len(moved)  # their done and index refs
    refs = all_refs(bus_dir)
    new_tip = refs[L.LEDGER_REF]
    after = G.ls_tree(bus_dir, new_tip, recursive=True)
    assert {p: e for p, e in after.items() if p in before} == before  # every earlier entry, as it was
    assert {p.rsplit("/", 1)[1] for p in set(after) - set(before) if p.startswith("date/")} == moved
    assert {kind: refs[L.map_ref(kind)] for kind in L.KINDS} == L.write_maps(bus_dir, new_tip)
    side = other / ".git" / LEDGER_STORE
    entries = sorted({sha for _, _, sha in before.values()})
    assert not G.present(side, entries)  # no earlier entry came
    untouched = {
        sha for name, (_, _, sha) in G.ls_tree(bus_dir, f"{tip}:date").items() if name < min(moved)[:8]
    }
    assert untouched and not G.present(side, sorted(untouched))  # nor the day shards it did not write into
    # a map gone (deleted by hand): the next compaction in that store, where the tip came with some of its
    # trees only, reads the whole index afresh and writes every map again
    G.run(bus_dir, "update-ref", "-d", L.map_ref("preset"))
    assert Admin(fresh).compact(0)
    refs = all_refs(bus_dir)
    assert {kind: refs[L.map_ref(kind)] for kind in L.KINDS} == L.write_maps(bus_dir, refs[L.LEDGER_REF])


@pytest.fixture(name="v0")
def v0_fixture(world: Env) -> Iterator[HttpGit]:
    old = HttpGit(world.tmp / "v0", v2=False)
    yield old
    old.stop()


def test_a_server_that_sends_no_unnamed_object_gets_the_ledger_at_depth_one(world: Env, v0: HttpGit, capsys):
    """Protocol v0 (a server that speaks only v0: a git daemon is asked in v2 by bridge/wire/upload_pack.py) serves
    only objects a ref names: the shard tree is refused, and the reader falls back to the ledger commit at
    depth 1, in the ledger's own store (the user's repository never becomes shallow)."""
    url = v0.repo()
    bus_dir = v0.base / "bus.git"
    made = history(url, world, bus_dir, 12)
    assert main(["bus", "compact", "--older-than", "3", "--remote", url]) == 0
    moved = min(old_ids(made, 3))
    other = world.tmp / "other"
    git(world.tmp, "clone", "-q", str(world.project), str(other))
    os.chdir(other)
    capsys.readouterr()
    assert main(["status", "--all", "--json", "--remote", url]) == 0  # the index: from the ledger at depth 1
    assert moved in {row["id"] for row in json.loads(capsys.readouterr().out)}
    assert (other / ".git" / LEDGER_STORE / "shallow").is_file()
    assert not (other / ".git" / "shallow").exists()
    # an old result's own files are its done commit, which no ref names any more: the error says what to do
    assert main(["results", moved, "--remote", url, "--out", str(world.tmp / "moved")]) == 1
    assert "uploadpack.allowReachableSHA1InWant=true" in capsys.readouterr().err
    G.run(bus_dir, "config", "uploadpack.allowReachableSHA1InWant", "true")
    assert main(["results", moved, "--remote", url, "--out", str(world.tmp / "moved")]) == 0
    assert json.loads((world.tmp / "moved" / moved / "result.json").read_text())["request_id"] == moved


def test_a_compaction_lease_lets_one_runner_compact_and_a_lost_one_pushes_nothing(world: Env, daemon: Daemon):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    made = history(url, world, bus_dir, 20)
    a, b = make_runner(url, world, "ra"), make_runner(url, world, "rb")
    now = utcnow()
    held = L.take_lease(a.bus, "ra", 60, a.who, now)
    assert held is not None and all_refs(bus_dir)[L.LEASE_REF] == held
    assert L.take_lease(b.bus, "rb", 60, b.who, now) is None  # ra's lease runs: rb does not start
    # ra crashed: its lease runs out and rb takes it over
    later = now + dt.timedelta(seconds=61)
    taken = L.take_lease(b.bus, "rb", 60, b.who, later)
    assert taken is not None
    before = all_refs(bus_dir)
    cutoff = now - dt.timedelta(days=3)
    with pytest.raises(BusError, match="nothing of this push landed"):  # ra came back: it compacts nothing
        L.compact(a.bus, cutoff, a.who, lease=("ra", held, 60))
    assert all_refs(bus_dir) == before
    moved = L.compact(b.bus, cutoff, b.who, lease=("rb", taken, 60))
    old = old_ids(made, 3)
    assert {r.rsplit("/", 1)[1] for r in moved} == old
    lease = L.CompactLease.model_validate_json(
        G.read_path(bus_dir, all_refs(bus_dir)[L.LEASE_REF], L.LEASE_PATH)
    )
    assert lease.holder == "rb" and lease.until > utcnow()


def test_a_compaction_that_loses_a_race_to_a_moved_done_ref_lands_nothing(
    world: Env, daemon: Daemon, monkeypatch
):
    """Between its listing and its push, a runner finishes a request (its done push lands) and someone deletes
    an old done ref: the compaction's atomic push is refused whole, and the next one moves what is there."""
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    made = history(url, world, bus_dir, 20)
    old = sorted(old_ids(made, 3))
    monkeypatch.setenv("KAKEYA_COMPACT_AFTER_DAYS", "0")  # the racing runner compacts nothing itself
    c = client(url)
    racing = c.request("work", {"tag": "race"}, "cpu", subject="HEAD").id
    real_import = G.import_commits
    raced: list[str] = []

    def import_commits(*args, **kwargs):
        if not raced:  # once: a racing done push, and a done ref gone
            raced.append(racing)
            served = make_runner(url, world, "racer").once(request_id=racing)
            assert served is not None and served.pushed
            G.update_ref(bus_dir, done_ref(old[0]), None)
        return real_import(*args, **kwargs)

    monkeypatch.setattr(G, "import_commits", import_commits)
    before_ledger = all_refs(bus_dir).get(L.LEDGER_REF)
    with pytest.raises(BusError, match="nothing of this push landed"):
        Admin(c).compact(3)
    refs = all_refs(bus_dir)
    assert refs.get(L.LEDGER_REF) == before_ledger is None
    assert all(done_ref(rid) in refs for rid in old[1:]) and done_ref(racing) in refs
    moved = Admin(c).compact(3)
    assert {r.rsplit("/", 1)[1] for r in moved if r.startswith(DONE_PREFIX)} == set(old[1:])
    assert done_ref(racing) in all_refs(bus_dir)


def test_racing_runners_compact_on_their_own_and_serve_each_request_once(
    world: Env, daemon: Daemon, monkeypatch
):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    made = history(url, world, bus_dir, 30)
    old = old_ids(made, 3)
    monkeypatch.setenv("KAKEYA_COMPACT_AFTER_DAYS", "3")
    monkeypatch.setenv("KAKEYA_COMPACT_EVERY", "1")
    c = client(url)
    ids = [c.request("work", {"tag": f"t{i}"}, "cpu", subject="HEAD").id for i in range(4)]
    procs = [runner_process(world, url, name) for name in ("w1", "w2", "w3")]
    try:
        wait_for(lambda: all(done_ref(rid) in all_refs(bus_dir) for rid in ids), 90, "every request done")
        wait_for(
            lambda: not any(done_ref(rid) in all_refs(bus_dir) for rid in old), 60, "the old results moved"
        )
    finally:
        for proc in procs:
            assert stop(proc) == 0
    assert sorted(t for t in world.count() if t != "real") == sorted(f"t{i}" for i in range(4))  # once each
    logs = "".join((world.tmp / f"{name}.log").read_text() for name in ("w1", "w2", "w3"))
    assert "compacted the bus" in logs
    refs = all_refs(bus_dir)
    ledger = refs[L.LEDGER_REF]
    for rid in old:  # every old result is in the ledger (its done commit reachable), none lost
        entry = L.LedgerEntry.model_validate_json(
            G.read_path(bus_dir, ledger, f"date/{rid[:8]}/{rid}") or b""
        )
        assert G.is_ancestor(bus_dir, entry.done, ledger)
    lease = L.CompactLease.model_validate_json(G.read_path(bus_dir, refs[L.LEASE_REF], L.LEASE_PATH))
    assert lease.holder in ("w1", "w2", "w3")


def test_a_runner_with_compaction_off_or_nothing_old_takes_no_lease(world: Env, daemon: Daemon, monkeypatch):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    made = history(url, world, bus_dir, 12)
    monkeypatch.setenv("KAKEYA_COMPACT_AFTER_DAYS", "0")
    assert make_runner(url, world, "off").once() is None
    assert L.LEASE_REF not in all_refs(bus_dir) and L.LEDGER_REF not in all_refs(bus_dir)
    monkeypatch.setenv("KAKEYA_COMPACT_AFTER_DAYS", "60")  # nothing that old
    assert make_runner(url, world, "young").once() is None
    assert L.LEASE_REF not in all_refs(bus_dir)
    monkeypatch.setenv("KAKEYA_COMPACT_AFTER_DAYS", "3")
    monkeypatch.setattr(compaction_module, "COMPACT_BATCH", 4)  # a few at a time, then on at the next poll
    r = make_runner(url, world, "old")
    old = old_ids(made, 3)

    def left() -> set[str]:
        return {rid for rid in old if done_ref(rid) in all_refs(bus_dir)}

    assert r.once() is None and len(left()) == len(old) - 4 and L.LEDGER_REF in all_refs(bus_dir)
    assert r.once() is None and len(left()) == len(old) - 8  # straight on: compact_every_s is not waited
    while left():
        assert r.once() is None
    ledger = all_refs(bus_dir)[L.LEDGER_REF]
    assert r.once() is None and all_refs(bus_dir)[L.LEDGER_REF] == ledger  # not again before compact_every_s


def test_an_idle_runner_once_pushes_no_presence(world: Env, daemon: Daemon):
    url = daemon.repo()
    proc = runner_process(world, url, "idle1", mode="once")
    assert proc.wait(60) == 0
    assert runner_ref("idle1") not in all_refs(daemon.base / "bus.git")
    assert "nothing to do" in (world.tmp / "idle1.log").read_text()


def test_a_previous_pass_compacted_into_the_ledger_is_still_the_baseline(bench: Env, capsys):
    code, first, verdict, _ = run(bench, capsys, 100)
    assert code == 0 and verdict["baseline"]["run"] is None
    assert main(["bus", "compact", "--older-than", "0"]) == 0
    assert "moved 2 refs into the ledger" in capsys.readouterr().out
    code, second, verdict, _ = run(bench, capsys, 95)
    assert code == 0 and verdict["baseline"]["run"] == first  # read from the ledger's preset shard
    assert main(["bus", "compact", "--older-than", "0"]) == 0
    capsys.readouterr()
    code, _, verdict, _ = run(bench, capsys, 80)  # a regression against the newest pass, in the ledger too
    assert code == 1 and verdict["baseline"]["run"] == second and verdict["comparison"]["status"] == "fail"


def test_a_compaction_that_fails_is_logged_and_the_runner_goes_on(world: Env, daemon: Daemon, monkeypatch):
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    history(url, world, bus_dir, 10)
    said: list[str] = []
    r = Runner(
        url, config=load_config(), name="rf", labels=["cpu"], workdir=world.tmp / "rf", log=said.append
    )
    monkeypatch.setattr(L, "take_lease", lambda *a: (_ for _ in ()).throw(BusError("the bus went away")))
    assert r.once() is None
    assert any("no compaction this time: the bus went away" in line for line in said)
    assert L.LEDGER_REF not in all_refs(bus_dir)
    # not only a bus error: anything a forged ledger makes the compaction trip on is logged, and it goes on
    r.compaction.next = 0.0
    monkeypatch.setattr(L, "take_lease", lambda *a: (_ for _ in ()).throw(ValueError("odd ledger entry")))
    assert r.once() is None
    assert any("no compaction this time: odd ledger entry" in line for line in said)


def test_while_compactions_run_a_runner_looks_only_at_the_days_before_its_window(world: Env, daemon: Daemon):
    """A runner's check (`ledger.due`) lists the done refs of the days just before its cutoff while a lease
    shows compactions run; with no lease, or one run out more than MAX_TTL ago, it lists every done ref."""
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    history(url, world, bus_dir, 30)
    assert Admin(client(url)).compact(3)  # by hand: no lease
    now = utcnow()
    stray = new_id("work", now - dt.timedelta(days=25))  # a done ref older than any compaction left
    G.update_ref(bus_dir, done_ref(stray), all_refs(bus_dir)[L.LEDGER_REF])
    r = make_runner(url, world, "dd")
    cutoff = now - dt.timedelta(days=3)
    assert L.due(r.bus, cutoff, now)  # no lease: every done ref is looked at, the stray one too
    assert L.take_lease(r.bus, "dd", 60, r.who, now) is not None
    assert not L.due(r.bus, cutoff, now)  # compactions run: only the days before the cutoff, none there
    assert L.due(r.bus, now - dt.timedelta(days=1), now)  # a later cutoff has results just before it
    lapsed = L.lease_commit(r.bus.store, "dd", now - dt.timedelta(days=9), r.who)
    assert r.bus.swap([Update(L.LEASE_REF, lapsed, all_refs(bus_dir)[L.LEASE_REF])], atomic=False)
    assert L.due(r.bus, cutoff, now)  # no compaction for longer than a request lives: everything again


def test_import_commits_writes_the_tree_tree_with_would_and_refuses_unsafe_paths(tmp_path):
    """The compactor's commits (one `git fast-import`): on a base, each commit's tree is the one before it with
    its files added, its parents the one before it and its own; `..` or a newline in a path is refused."""
    repo = G.init_bare(tmp_path / "r.git")
    who = "K <k@x>"
    base = G.commit(repo, G.tree_with(repo, None, {"a/x": b"1\n", "b/y": b"2\n"}), [], "base", who)
    other = G.commit(repo, G.tree_with(repo, None, {"o": b"o\n"}), [], "other", who)
    files = [{"a/z": b"3\n", "c/w": b"3\n"}, {"b/y": b"4\n"}]
    tip = G.import_commits(repo, base, [(files[0], [other], "one"), (files[1], [], "two")], who)
    want = G.tree_with(repo, G.tree_with(repo, base, files[0]), files[1])
    assert G.out(repo, "rev-parse", f"{tip}^{{tree}}") == want
    first = G.parents(repo, tip)
    assert len(first) == 1 and G.parents(repo, first[0]) == [base, other]
    assert not G.refs_under(repo, "refs/")  # no ref moved (the temporary one is gone)
    root = G.import_commits(repo, None, [({"d/e": b"5\n"}, [], "root")], who)
    assert G.parents(repo, root) == [] and G.read_path(repo, root, "d/e") == b"5\n"
    for bad in ("a/../x", "a\nb", "a//b"):
        with pytest.raises(KakeyaError, match="refusing to write"):
            G.import_commits(repo, base, [({bad: b"x"}, [], "bad")], who)


@pytest.mark.parametrize("garbage", ["blob", "commit"])
def test_a_garbage_ledger_map_a_pusher_wrote_stops_no_reader(
    world: Env, daemon: Daemon, capsys, garbage: str
):
    """Issue 40 (8): any pusher can write refs/kakeya/ledger-map/*; one that is not a ledger map (a garbage
    blob, a commit) is ignored with a warning by `gate pr`, `status --all` and `history`, whose evidence is in
    done refs: never an error for the subjects it does not hold."""
    url = daemon.repo()
    bus_dir = daemon.base / "bus.git"
    head = git(world.project, "rev-parse", "HEAD")
    rid = client(url).request("work", {"tag": "x"}, "cpu", subject="HEAD").id
    done = make_runner(url, world).once(request_id=rid)
    assert done is not None and done.pushed
    junk = (
        G.write_blobs(bus_dir, [b"\0garbage{"])[0] if garbage == "blob" else all_refs(bus_dir)[done_ref(rid)]
    )
    for kind in L.KINDS:  # the subject's own map (subject-<its first hex digit>) among them
        G.update_ref(bus_dir, L.map_ref(kind), junk)
    capsys.readouterr()
    gate = ["gate", "pr", "--subject", head, "--require", "work@cpu", "--remote", url, "--allow-unsigned"]
    assert main(gate) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"✓ work@cpu: pass — {rid}"), out
    assert f"{L.map_ref('subject-' + head[0])} ({junk[:12]})" in out.err and "is not a ledger map" in out.err
    assert main(["status", "--all", "--json", "--remote", url]) == 0
    assert rid in {row["id"] for row in json.loads(capsys.readouterr().out)}
    assert main(["history", "work@cpu", "--remote", url, "--allow-unsigned"]) == 0
