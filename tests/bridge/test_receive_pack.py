"""bridge/wire/receive_pack.py: leased pushes in git's receive-pack protocol, against real buses (a path, file://,
git daemon, sshd) and fake servers that drop the connection, answer garbage or never answer."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.bus.records import Update
from bridge.core.errors import BusError, BusUnreachable
from bridge.wire import git as G
from bridge.wire import receive_pack as RP
from bridge.wire.pktline import Wire, pkt
from tests.bridge.bus_support import Daemon, FakeServer, git

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
HAS_SSHD = Path(SSHD).is_file() and os.geteuid() == 0
ENV = {
    "GIT_AUTHOR_NAME": "T",
    "GIT_AUTHOR_EMAIL": "t@x",
    "GIT_COMMITTER_NAME": "T",
    "GIT_COMMITTER_EMAIL": "t@x",
}
HOOKS = ("pre-receive", "update", "post-receive", "reference-transaction")


@pytest.fixture(name="served", params=["path", "file", "git", "ssh"])
def served_fixture(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch) -> Iterator[tuple[Bus, Path]]:
    """A bus (bare repository) reached over each transport, and its directory; the store is another bare repo."""
    store = G.init_bare(tmp_path / "store.git")
    kind = request.param
    if kind == "git":
        daemon = Daemon(tmp_path / "served").start()
        url, bus_dir = daemon.repo(), tmp_path / "served" / "bus.git"
        yield Bus(url, store, timeout_s=30), bus_dir
        daemon.stop()
        return
    bus_dir = G.init_bare(tmp_path / "bus.git")
    if kind == "ssh":
        if not HAS_SSHD:
            pytest.skip("needs OpenSSH's sshd and root to start it")
        from tests.bridge.test_bus_ssh import Sshd

        sshd = Sshd(tmp_path / "sshd", accept_env=False)
        monkeypatch.setenv("GIT_SSH_COMMAND", sshd.command)
        yield Bus(sshd.url(bus_dir), store, timeout_s=30), bus_dir
        sshd.stop()
        return
    yield Bus(str(bus_dir) if kind == "path" else f"file://{bus_dir}", store, timeout_s=30), bus_dir


def commit(repo: Path, message: str, *parents: str) -> str:
    """A commit of one file (`message`) on `parents`, written into `repo`."""
    blob = G.write_blobs(repo, [message.encode()])[0]
    tree = G.out(repo, "mktree", input=f"100644 blob {blob}\tfile\n".encode())
    args = [arg for p in parents for arg in ("-p", p)]
    return G.out(repo, "commit-tree", tree, *args, "-m", message, env=ENV)


def bus_refs(bus_dir: Path) -> dict[str, str]:
    return G.refs_under(bus_dir, "refs/")


def test_creations_moves_and_deletions_land_leased_and_connected(served):
    bus, bus_dir = served
    a = commit(bus.store, "a")
    b = commit(bus.store, "b", a)
    status = bus.push([Update("refs/kakeya/x", a, None), Update("refs/kakeya/y", b, None)], atomic=True)
    assert status == {"refs/kakeya/x": (True, "[new reference]"), "refs/kakeya/y": (True, "[new reference]")}
    assert bus_refs(bus_dir) == {"refs/kakeya/x": a, "refs/kakeya/y": b}
    git(bus_dir, "fsck", "--strict", "--no-dangling")  # the pack landed whole: b and its parent a
    # a move to an object the bus has (an empty pack), a deletion, and a creation of a new commit on top
    c = commit(bus.store, "c", b)
    status = bus.push(
        [Update("refs/kakeya/x", b, a), Update("refs/kakeya/y", None, b), Update("refs/kakeya/z", c, None)]
    )
    assert [ok for ok, _ in status.values()] == [True, True, True]
    assert status["refs/kakeya/y"] == (True, "[deleted]")
    assert bus_refs(bus_dir) == {"refs/kakeya/x": b, "refs/kakeya/z": c}
    git(bus_dir, "fsck", "--strict", "--no-dangling")
    # "must not exist" on a ref that exists, and a stale lease: refused, nothing moves
    status = bus.push([Update("refs/kakeya/x", c, None), Update("refs/kakeya/z", None, a)])
    assert status == {
        "refs/kakeya/x": (False, "[rejected] (stale info)"),
        "refs/kakeya/z": (False, "[rejected] (stale info)"),
    }
    assert bus_refs(bus_dir) == {"refs/kakeya/x": b, "refs/kakeya/z": c}
    # a ref that already holds what is pushed is up to date (a retry of a push that landed)
    assert bus.push([Update("refs/kakeya/x", b, a)]) == {"refs/kakeya/x": (True, "[up to date]")}
    assert bus.swap([Update("refs/kakeya/x", c, b), Update("refs/kakeya/z", None, c)])
    assert bus_refs(bus_dir) == {"refs/kakeya/x": c}


def test_an_atomic_push_lands_all_or_nothing(served):
    bus, bus_dir = served
    a = commit(bus.store, "a")
    bus.push([Update(f"refs/kakeya/r{i}", a, None) for i in range(3)])
    b = commit(bus.store, "b", a)
    # one stale lease (seen in the advertisement): nothing lands, the report says which
    updates = [
        Update("refs/kakeya/r0", b, a),
        Update("refs/kakeya/r1", None, b),
        Update("refs/kakeya/r2", None, a),
    ]
    status = bus.push(updates, atomic=True)
    assert status["refs/kakeya/r1"] == (False, "[rejected] (stale info)")
    assert status["refs/kakeya/r0"] == status["refs/kakeya/r2"] == (False, "[rejected] (atomic push failed)")
    # one command the server itself refuses (a name git does not allow): the others are rolled back
    status = bus.push([Update("refs/kakeya/r0", b, a), Update("refs/kakeya/bad..name", b, None)], atomic=True)
    assert not status["refs/kakeya/r0"][0] and not status["refs/kakeya/bad..name"][0]
    assert "[remote rejected]" in status["refs/kakeya/bad..name"][1]
    assert bus_refs(bus_dir) == {f"refs/kakeya/r{i}": a for i in range(3)}


def test_the_lease_is_the_servers_own_check(served, monkeypatch):
    """A writer that moves a ref between the advertisement and the commands: receive-pack refuses the command
    (its old value no longer matches), and an atomic push lands nothing."""
    bus, bus_dir = served
    a = commit(bus.store, "a")
    bus.push([Update("refs/kakeya/r0", a, None), Update("refs/kakeya/r1", a, None)])
    b = commit(bus.store, "b", a)
    seen = RP._advertisement

    def racing(lines: list[bytes]) -> tuple[dict[str, str], set[str], set[str]]:
        out = seen(lines)
        git(bus_dir, "update-ref", "-d", "refs/kakeya/r1")  # another writer, after the bus advertised r1
        git(bus_dir, "update-ref", "refs/kakeya/fresh", a)
        return out

    monkeypatch.setattr(RP, "_advertisement", racing)
    status = bus.push(
        [
            Update("refs/kakeya/r0", b, a),
            Update("refs/kakeya/r1", None, a),
            Update("refs/kakeya/fresh", b, None),
        ],
        atomic=True,
    )
    assert not any(ok for ok, _ in status.values())
    assert all(why.startswith("[remote rejected]") for _, why in status.values())
    assert bus_refs(bus_dir) == {"refs/kakeya/r0": a, "refs/kakeya/fresh": a}


def test_a_delete_only_push_sends_no_pack_and_many_deletions_go_in_one_push(tmp_path, monkeypatch):
    store, bus_dir = G.init_bare(tmp_path / "store.git"), G.init_bare(tmp_path / "bus.git")
    bus = Bus(str(bus_dir), store)
    sent: list[bytes] = []
    send = Wire.send
    monkeypatch.setattr(Wire, "send", lambda self, data: (sent.append(bytes(data)), send(self, data))[1])
    a = commit(store, "a")
    assert bus.push([Update("refs/kakeya/new", a, None)])["refs/kakeya/new"][0]
    assert b"PACK" in b"".join(sent)
    refs = [f"refs/kakeya/done/{i:05d}" for i in range(1500)]
    subprocess.run(
        ["git", "update-ref", "--stdin"],
        cwd=bus_dir,
        input="".join(f"create {r} {a}\n" for r in refs).encode(),
    ).check_returncode()
    sent.clear()
    status = bus.push([Update(r, None, a) for r in refs], atomic=True)
    assert all(status[r] == (True, "[deleted]") for r in refs)
    assert b"PACK" not in b"".join(sent)
    assert bus_refs(bus_dir) == {"refs/kakeya/new": a}


def test_no_hook_of_a_local_bus_runs(tmp_path):
    store, bus_dir = G.init_bare(tmp_path / "store.git"), G.init_bare(tmp_path / "bus.git")
    ran = tmp_path / "ran"
    for hook in HOOKS:
        (bus_dir / "hooks" / hook).write_text(f"#!/bin/sh\necho {hook} >> {ran}\nexit 1\n")
        (bus_dir / "hooks" / hook).chmod(0o755)
    a = commit(store, "a")
    for url in (str(bus_dir), f"file://{bus_dir}"):
        bus = Bus(url, store)
        assert bus.swap([Update("refs/kakeya/x", a, None)])
        assert bus.swap([Update("refs/kakeya/x", None, a)])
    assert not ran.exists()
    # the hooks are real: a plain git push runs them (and they refuse it)
    proc = subprocess.run(["git", "push", str(bus_dir), f"{a}:refs/kakeya/x"], cwd=store, capture_output=True)
    assert proc.returncode != 0 and "pre-receive" in ran.read_text()


def test_a_bus_without_atomic_pushes_is_refused_not_pushed_piecemeal(tmp_path):
    store, bus_dir = G.init_bare(tmp_path / "store.git"), G.init_bare(tmp_path / "bus.git")
    git(bus_dir, "config", "receive.advertiseAtomic", "false")
    bus = Bus(str(bus_dir), store)
    a = commit(store, "a")
    with pytest.raises(BusError, match="does not take atomic pushes"):
        bus.push([Update("refs/kakeya/x", a, None), Update("refs/kakeya/y", a, None)], atomic=True)
    assert bus_refs(bus_dir) == {}
    assert bus.push([Update("refs/kakeya/x", a, None)], atomic=True)["refs/kakeya/x"][
        0
    ]  # one ref: atomic anyway


def test_http_and_a_signed_push_keep_git_push(tmp_path):
    store = G.init_bare(tmp_path / "store.git")
    assert RP.speaks(store, str(tmp_path / "bus.git")) and RP.speaks(store, "git://h/bus.git")
    assert not RP.speaks(store, "https://example.com/bus.git")
    git(store, "config", "push.gpgSign", "if-asked")
    assert not RP.speaks(store, str(tmp_path / "bus.git"))
    git(store, "config", "push.gpgSign", "false")
    assert RP.speaks(store, str(tmp_path / "bus.git"))


SHA = "1" * 40
ADVERTISED = pkt(f"{SHA} refs/kakeya/x\0report-status delete-refs atomic\n") + b"0000"


def _hang_up(conn: socket.socket) -> None:
    conn.recv(4096)


def _garbage(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def _error(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(pkt("ERR access denied or repository not exported: /bus.git\n"))


def _lose_the_report(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(ADVERTISED)
    conn.recv(4096)  # the commands: then gone before the report


def _cut_report(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(ADVERTISED)
    conn.recv(4096)
    conn.sendall(pkt("unpack ok\n") + pkt("ok refs/kakeya/x\n"))  # no flush: the report never ended


def _silent(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.recv(4096)  # nothing more comes: it waits until the client gives up and closes


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (_hang_up, "closed the connection"),
        (_garbage, "malformed packet"),
        (_error, "access denied"),
        (_lose_the_report, "closed the connection before the end of its report"),
        (_cut_report, "closed the connection before the end of its report"),
    ],
)
def test_a_server_that_drops_or_garbles_the_push_is_unreachable_never_landed(tmp_path, answer, said):
    server = FakeServer(answer)
    try:
        bus = Bus(f"git://127.0.0.1:{server.port}/bus.git", G.init_bare(tmp_path / "store.git"), timeout_s=10)
        with pytest.raises(BusUnreachable, match=said):
            bus.push([Update("refs/kakeya/x", None, SHA)], atomic=True)
    finally:
        server.close()


def test_a_server_that_never_answers_times_out_saying_what_was_pushed(tmp_path):
    server = FakeServer(_silent)
    try:
        bus = Bus(f"git://127.0.0.1:{server.port}/bus.git", G.init_bare(tmp_path / "store.git"), timeout_s=1)
        with pytest.raises(BusError, match=r"pushing refs/kakeya/x to git://.* timed out after 1 s"):
            bus.push([Update("refs/kakeya/x", None, SHA)])
    finally:
        server.close()


def test_an_unreachable_bus_is_bus_unreachable(tmp_path):
    store = G.init_bare(tmp_path / "store.git")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for url in (f"git://127.0.0.1:{port}/bus.git", str(tmp_path / "nothing.git")):
        with pytest.raises(BusUnreachable, match="cannot push to the bus"):
            Bus(url, store, timeout_s=10).push([Update("refs/kakeya/x", None, SHA)])
