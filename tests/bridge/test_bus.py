"""The bus primitives against real repositories: ids, ref parsing, commits built in-process, leased pushes."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from bridge.bus.bus import Bus, BusError, BusUnreachable
from bridge.bus.records import (
    MANIFEST_MAX_BYTES,
    MANIFEST_PATH,
    Entry,
    Manifest,
    RequestId,
    Snapshot,
    Update,
    cancel_ref,
    claim_ref,
    done_ref,
    id_preset,
    id_time,
    new_id,
    parse_id,
    read_manifests,
    req_ref,
    utcnow,
)
from bridge.core import names as N
from bridge.core.errors import KakeyaError
from bridge.wire import git as G
from tests.bridge.bus_support import Daemon, free_port, git


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "w"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "a.txt").write_text("a\n")
    (path / "dir").mkdir()
    (path / "dir" / "b.txt").write_text("b\n")
    (path / "caf\u00e9 \u2603.txt").write_text("unicode name\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-q", "-m", "base")
    return path


def head(path: Path) -> str:
    return git(path, "rev-parse", "HEAD")


def test_ids_sort_by_time_and_carry_the_preset():
    t0 = dt.datetime(2026, 6, 14, 10, 15, 2, 123456, tzinfo=dt.UTC)
    ids = [new_id("niah-ladder", t0 + dt.timedelta(milliseconds=ms)) for ms in (0, 1, 999, 1000, 86_400_000)]
    assert ids == sorted(ids)
    assert ids[0].startswith("20260614T101502.123Z-niah-ladder-")
    assert id_time(ids[0]) == t0.replace(microsecond=123000)
    assert id_preset(ids[0]) == "niah-ladder"
    assert id_preset("garbage") == ""
    with pytest.raises(KakeyaError, match="not a request id"):
        id_time("20260614-probe")
    assert len({new_id("p", t0) for _ in range(200)}) == 200  # the random suffix separates same-ms ids
    assert N.check_label("mac-m4") == "mac-m4"
    for bad in ("", "H200", "a/b", "a..b", "-x", "cpu\n"):
        with pytest.raises(KakeyaError, match="runner label"):
            N.check_label(bad)
    for regex, good in ((N.NAME_RE, "probe"), (N.LABEL_RE, "h200"), (N.RUNNER_NAME_RE, "gpu-1.lab")):
        assert regex.match(good) and not regex.match(good + "\n")  # matched whole: `$` would take a newline


def test_ids_are_parsed_not_pattern_matched():
    now = dt.datetime(2026, 6, 14, 12, 0, tzinfo=dt.UTC)
    good = "20260614T101502.123Z-niah-ladder-a1b2c3"
    made = dt.datetime(2026, 6, 14, 10, 15, 2, 123000, tzinfo=dt.UTC)
    assert parse_id(good, now) == RequestId(made, "niah-ladder", "a1b2c3")
    assert parse_id("20260615T115959.999Z-p-000001", now) is not None  # a clock up to a day ahead of ours
    assert parse_id("20200101T000000.000Z-p-000001", now) is not None
    assert parse_id("20260615T120000.001Z-p-000001", now) is None  # more than a day ahead
    for bad in (
        "00000000T000000.000Z-probe-abcdef",  # no such date: strptime used to raise for every reader
        "99991231T235959.999Z-probe-abcdef",  # the far future: it would always be the newest evidence
        "20261301T000000.000Z-probe-abcdef",  # a 13th month
        "20260230T000000.000Z-probe-abcdef",  # 30 February
        "20260614T236000.000Z-probe-abcdef",  # minute 60
        "20260614T235960.000Z-probe-abcdef",  # second 60
        "20191231T235959.999Z-probe-abcdef",  # before there were requests
        good + "\n",
        "\n" + good,
        good + "0",
        good.replace("a1b2c3", "A1B2C3"),
        good.replace("niah-ladder", "Niah"),
        good.replace(".123Z", ".1234Z"),
        "",
    ):
        assert parse_id(bad, now) is None, bad
        assert id_preset(bad) == ""
        with pytest.raises(KakeyaError, match="not a request id"):
            id_time(bad)
    # every reader gets its ids through Snapshot.parse: the ones that do not parse are ignored
    later = new_id("probe", utcnow() + dt.timedelta(days=2))
    refs = [req_ref("cpu", "00000000T000000.000Z-probe-abcdef"), done_ref(later), claim_ref(good)]
    snap = Snapshot.parse("".join(f"{'a' * 40}\t{ref}\n" for ref in refs))
    assert list(snap.entries) == [good] and snap.ignored == refs[:2]
    assert snap.entries[good].created_at == made


def manifest_fields(now: dt.datetime) -> dict:
    return {
        "id": new_id("probe", now),
        "preset": "probe",
        "subject": "a" * 40,
        "runner": "cpu",
        "requester": "t@example.com",
        "created_at": now,
        "expires_at": now + dt.timedelta(hours=1),
        "nonce": "n",
    }


def test_a_manifest_is_bound_to_its_id_time_and_expires_within_seven_days():
    now = utcnow()
    base = manifest_fields(now)
    Manifest(**base)
    Manifest(**{**base, "created_at": now + dt.timedelta(seconds=59)})  # clocks and rounding: a minute
    Manifest(**{**base, "expires_at": now + dt.timedelta(days=7)})  # the longest wait
    for change, rule in (
        ({"created_at": now - dt.timedelta(minutes=2)}, "is not the time of its id"),
        ({"created_at": now + dt.timedelta(days=365)}, "is not the time of its id"),
        ({"expires_at": now}, "must be after created_at"),
        ({"expires_at": now - dt.timedelta(hours=1)}, "must be after created_at"),
        ({"expires_at": now + dt.timedelta(days=7, milliseconds=1)}, "at most 7 days after it"),
        ({"expires_at": now + dt.timedelta(days=365)}, "at most 7 days after it"),
        ({"id": "00000000T000000.000Z-probe-abcdef"}, "is not a request id"),
        ({"id": new_id("probe", now + dt.timedelta(days=3))}, "is not a request id"),
        ({"runner": "cpu\n"}, "runner"),
    ):
        with pytest.raises(ValidationError, match=rule):
            Manifest(**{**base, **change})


def test_a_request_json_over_the_cap_is_refused_by_its_size_unread(repo: Path, tmp_path: Path, monkeypatch):
    manifest = Manifest(**manifest_fields(utcnow()))
    text = manifest.dump()
    at_cap = text + b" " * (MANIFEST_MAX_BYTES - len(text))  # valid JSON, exactly the cap
    commits = {
        name: G.child_commit(repo, head(repo), {MANIFEST_PATH: data}, name, "K <k@x>")
        for name, data in (("good", text), ("at_cap", at_cap), ("over", at_cap + b" "), ("junk", b"{no"))
    }
    read: list[str] = []
    real = G.read_blobs
    monkeypatch.setattr(G, "read_blobs", lambda r, specs: read.extend(specs) or real(r, specs))
    empty = G.init_bare(tmp_path / "empty.git")  # a repository without the objects comes first: skipped
    found = read_manifests([empty, repo], [*commits.values(), head(repo)])
    assert found[commits["good"]] == manifest and found[commits["at_cap"]] == manifest
    over = f"{commits['over']}:{MANIFEST_PATH}"
    assert found[commits["over"]] == ".kakeya/request.json is 65537 bytes, over the 65536-byte cap"
    assert over not in read and f"{commits['at_cap']}:{MANIFEST_PATH}" in read  # sized, never read
    assert str(found[commits["junk"]]).startswith("manifest: Invalid JSON")
    assert found[head(repo)] == f"commit {head(repo)[:12]} has no .kakeya/request.json"
    assert G.blob_sizes(repo, [over, f"{head(repo)}:a.txt", f"{head(repo)}:dir", "1" * 40]) == {
        over: 65537,
        f"{head(repo)}:a.txt": 2,
    }


def test_snapshot_parses_every_kind_and_ignores_malformed_refs():
    a, b, c, d = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)
    i1, i2 = "20260101T000000.000Z-probe-000001", "20260101T000001.000Z-niah-000002"
    text = "\n".join(
        [
            f"{a}\t{req_ref('cpu', i1)}",
            f"{b}\t{claim_ref(i1)}",
            f"{c}\t{done_ref(i1)}",
            f"{d}\t{req_ref('h200', i2)}",
            f"{a}\t{cancel_ref(i2)}",
            f"{a}\t{req_ref('gpu', i2)}",  # the same id under a second label
            f"{a}\trefs/heads/kakeya/req/cpu/not-an-id",
            f"{a}\trefs/heads/kakeya/what/{i1}",
            f"{a}\trefs/heads/kakeya/req/{i1}",
            f"{a}\trefs/heads/main",
            "zzz\trefs/heads/kakeya/done/x",
            "",
        ]
    )
    snap = Snapshot.parse(text)
    assert list(snap.entries) == [i1, i2]
    e1, e2 = snap.entries[i1], snap.entries[i2]
    assert (e1.label, e1.req, e1.claim, e1.done, e1.cancel, e1.state) == ("cpu", a, b, c, None, "done")
    assert (e2.label, e2.req, e2.state, e2.preset) == ("h200", d, "cancelled", "niah")
    assert Entry("x", req=a, claim=b, cancel=c).state == "cancelling"
    assert Entry("x", req=a, claim=b).state == "claimed"
    assert Entry("x", req=a).state == "requested"
    assert len(snap.ignored) == 4
    assert "refs/heads/main" not in snap.refs


def test_commits_add_files_without_touching_anything_else(repo: Path):
    before = (git(repo, "status", "--porcelain"), head(repo), (repo / ".git" / "index").read_bytes())
    r = repo
    c1 = G.child_commit(
        r, head(repo), {".kakeya/request.json": b"{}\n", "dir/new.txt": b"n"}, "one", "K <k@x>"
    )
    c2 = G.child_commit(
        r, c1, {".kakeya/results/x/logs/out.log": b"log", ".kakeya/request.json": b"[]"}, "two", "K <k@x>"
    )
    assert G.read_path(r, c2, ".kakeya/request.json") == b"[]"
    assert G.read_path(r, c2, "dir/b.txt") == b"b\n"
    assert G.read_path(r, c2, "dir/new.txt") == b"n"
    assert G.read_path(r, c2, "caf\u00e9 \u2603.txt") == b"unicode name\n"
    assert G.read_path(r, c2, "missing") is None and G.read_path(r, c2, "dir") is None
    assert G.read_path(r, "0" * 40, "a.txt") is None
    assert G.read_dir(r, c2, ".kakeya") == {"request.json": b"[]", "results/x/logs/out.log": b"log"}
    assert G.read_dir(r, c2, "nope") == {} and G.read_dir(r, c2, "a.txt") == {}
    assert G.has_object(r, c2) and not G.has_object(r, "1" * 40) and not G.has_object(r, "zz")
    assert G.parents(r, c2) == [c1]
    with pytest.raises(KakeyaError, match="refusing"):
        G.tree_with(r, None, {"../x": b""})
    assert git(repo, "fsck", "--strict", "--no-dangling") == ""
    assert (git(repo, "status", "--porcelain"), head(repo), (repo / ".git" / "index").read_bytes()) == before
    # the commit's tree is the parent's tree plus exactly the added files
    changed = git(repo, "diff-tree", "-r", "--name-only", "--no-commit-id", head(repo), c1).splitlines()
    assert sorted(changed) == [".kakeya/request.json", "dir/new.txt"]
    found = G.read_blobs(repo, [f"{c2}:.kakeya/request.json", f"{'1' * 40}:x", f"{c2}:dir", f"{c2}:a.txt"])
    assert found == {f"{c2}:.kakeya/request.json": b"[]", f"{c2}:a.txt": b"a\n"}
    assert G.read_blobs(repo, []) == {}
    assert G.present(repo, [c1, "1" * 40]) == {c1} and G.present(repo, []) == set()
    assert G.is_ancestor(repo, head(repo), c2) and not G.is_ancestor(repo, c2, head(repo))


def test_leased_pushes_create_once_update_on_the_seen_sha_and_delete(repo: Path, tmp_path: Path):
    bus = Bus(str(G.init_bare(tmp_path / "bus.git")), repo)
    r = repo
    one = G.child_commit(r, head(repo), {"x": b"1"}, "1", "K <k@x>")
    two = G.child_commit(r, head(repo), {"x": b"2"}, "2", "K <k@x>")
    three = G.child_commit(r, one, {"x": b"3"}, "3", "K <k@x>")
    ref = claim_ref("20260101T000000.000Z-p-000001")
    assert bus.swap([Update(ref, one, None)])
    assert not bus.swap([Update(ref, two, None)])  # must not exist: lost
    assert not bus.swap([Update(ref, three, two)])  # leased on a sha that is not there: lost
    assert bus.swap([Update(ref, three, one)])  # leased on what is there
    assert bus.swap([Update(ref, three, one)])  # already there (a retry after a lost answer)
    done = done_ref("20260101T000000.000Z-p-000001")
    assert not bus.swap([Update(ref, two, one), Update(done, two, None)])  # atomic: neither moves
    assert bus.ls_remote().refs == {ref: three}
    assert bus.swap([Update(ref, None, three)]) and bus.ls_remote().refs == {}
    status = bus.push([Update(ref, one, None), Update(done, one, "f" * 40)])
    assert status[ref][0] and not status[done][0]


def test_racing_writers_create_a_ref_exactly_once(repo: Path, daemon: Daemon):
    bus = Bus(daemon.repo(), repo)
    shas = []
    r = repo
    for i in range(6):
        shas.append(G.child_commit(r, head(repo), {"claim": str(i).encode()}, f"c{i}", "K <k@x>"))
    ref = claim_ref("20260101T000000.000Z-p-000002")
    wins: list[str] = []
    barrier = threading.Barrier(len(shas))

    def claim(sha: str) -> None:
        barrier.wait()
        if bus.swap([Update(ref, sha, None)]):
            wins.append(sha)

    threads = [threading.Thread(target=claim, args=(s,)) for s in shas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert bus.ls_remote().refs[ref] == wins[0]


def test_an_unreachable_bus_is_a_clear_error(repo: Path, tmp_path: Path):
    for url in (f"git://127.0.0.1:{free_port()}/bus.git", str(tmp_path / "nothing-here.git")):
        bus = Bus(url, repo, timeout_s=30)
        with pytest.raises(BusUnreachable, match="cannot reach the bus"):
            bus.ls_remote()
        with pytest.raises(BusUnreachable, match="cannot push"):
            bus.swap([Update(claim_ref("20260101T000000.000Z-p-000003"), head(repo), None)])
        with pytest.raises(BusUnreachable, match="cannot fetch"):
            bus.fetch([done_ref("20260101T000000.000Z-p-000003")])
    bus = Bus(str(G.init_bare(tmp_path / "empty.git")), repo)
    with pytest.raises(BusError, match="couldn't find remote ref"):
        bus.fetch([done_ref("20260101T000000.000Z-p-000003")])
    bus.fetch([])
    with pytest.raises(BusError, match="git rev-parse"):
        G.run(repo, "rev-parse", "--verify", "nope")
    assert G.message(b"") == "no message"
