"""bridge/wire/upload_pack.py: blobs and trees fetched by id over git:// in protocol v2 on our own socket, against a
real git daemon and fake servers that refuse, drop the connection half-way, garble or never answer."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.core.errors import BusError, BusUnreachable
from bridge.wire import git as G
from bridge.wire import transport as T
from bridge.wire import upload_pack as UP
from bridge.wire.pktline import pkt
from tests.bridge.bus_support import Daemon, FakeServer, git


class Served:
    """A git daemon serving bus.git, which holds a blob, a tree `inner` of it and a tree `outer` of `inner`."""

    def __init__(self, tmp: Path):
        self.daemon = Daemon(tmp / "served").start()
        self.url = self.daemon.repo()
        self.repo = tmp / "served" / "bus.git"
        self.blob = G.write_blobs(self.repo, [b"a ledger entry\n"])[0]
        self.inner = G.out(self.repo, "mktree", input=f"100644 blob {self.blob}\tentry.json\n".encode())
        self.outer = G.out(self.repo, "mktree", input=f"040000 tree {self.inner}\tab\n".encode())


@pytest.fixture(name="served")
def served_fixture(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path)
    yield served
    served.daemon.stop()


@pytest.fixture(name="store")
def store_fixture(tmp_path: Path) -> Path:
    return G.init_bare(tmp_path / "store.git")


def packs(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "objects" / "pack").iterdir())


def test_blobs_and_trees_arrive_with_what_they_hold(served: Served, store: Path):
    UP.daemon_fetch(store, served.url, [served.blob, served.outer], 10)
    assert git(store, "cat-file", "-p", served.blob) == "a ledger entry"
    # no filter: the whole closure of the tree came (inner too), in one ordinary pack
    assert G.present(store, [served.inner]) == {served.inner}
    assert "ab" in git(store, "cat-file", "-p", served.outer)
    assert not [p for p in packs(store) if p.endswith(".promisor")]
    git(store, "fsck", "--strict", "--no-dangling", "--connectivity-only")


def test_a_tree_with_tree0_arrives_alone_in_a_promisor_pack(served: Served, store: Path):
    git(served.repo, "config", "uploadpack.allowFilter", "true")
    UP.daemon_fetch(store, served.url, [served.outer], 10, tree_filter="tree:0")
    assert G.present(store, [served.outer, served.inner, served.blob]) == {served.outer}
    assert G.tree_entries(store, [served.outer])[served.outer] == {"ab": ("40000", served.inner)}
    promisor = [p for p in packs(store) if p.endswith(".promisor")]
    assert len(promisor) == 1 and (store / "objects" / "pack" / promisor[0]).read_text().strip() == "kakeya"


def test_a_server_that_does_not_filter_sends_everything(served: Served, store: Path):
    git(served.repo, "config", "uploadpack.allowFilter", "false")
    UP.daemon_fetch(store, served.url, [served.outer], 10, tree_filter="tree:0")
    assert G.present(store, [served.outer, served.inner, served.blob]) == {
        served.outer,
        served.inner,
        served.blob,
    }
    assert not [p for p in packs(store) if p.endswith(".promisor")]


def test_an_object_the_bus_lacks_is_refused_in_the_servers_words(served: Served, store: Path):
    before = packs(store)
    with pytest.raises(BusError, match=f"upload-pack: not our ref {'2' * 40}"):
        UP.daemon_fetch(store, served.url, [served.blob, "2" * 40], 10)
    assert packs(store) == before
    # through Bus.fetch_ids: a refusal (BusError, with the hint), which ledger.refused() recognizes
    bus = Bus(served.url, store, timeout_s=10)
    with pytest.raises(BusError, match="cannot fetch 1 ledger maps .* not our ref") as info:
        bus.fetch_ids(["2" * 40], "ledger maps", standalone=True)
    assert not isinstance(info.value, BusUnreachable)


def test_bad_wants_are_refused_before_connecting(store: Path):
    with socket.socket() as s:  # a port where nothing listens: connecting would say so
        s.bind(("127.0.0.1", 0))
        url = f"git://127.0.0.1:{s.getsockname()[1]}/bus.git"
    for bad in ("xyz", "A" * 40, "1" * 39, f"{'1' * 40}\n", "HEAD"):
        with pytest.raises(BusError, match="is not a hex object id"):
            UP.daemon_fetch(store, url, ["1" * 40, bad], 10)
    with pytest.raises(BusError, match="cannot connect"):
        UP.daemon_fetch(store, url, ["1" * 40], 10)


def test_fetch_ids_speaks_upload_pack_only_for_standalone_objects_over_git(
    served: Served, store: Path, monkeypatch
):
    bus = Bus(served.url, store, timeout_s=10)
    fetched: list[str] = []
    real = T.Transport.fetch
    monkeypatch.setattr(T.Transport, "fetch", lambda *a, **k: (fetched.append("git fetch"), real(*a, **k))[1])
    bus.fetch_ids([served.blob], "ledger maps", standalone=True)
    assert fetched == [] and G.present(store, [served.blob]) == {served.blob}
    bus.fetch_ids([served.outer], "trees")  # not standalone: git fetch, as before
    assert fetched == ["git fetch"] and G.present(store, [served.outer]) == {served.outer}


# --- servers gone wrong --------------------------------------------------------------------------------

ADVERTISED = b"".join(pkt(f"{ln}\n") for ln in ("version 2", "agent=fake", "fetch=filter")) + b"0000"


def pack_of(repo: Path, *shas: str) -> bytes:
    return G.run(
        repo, "pack-objects", "--stdout", "-q", input="".join(f"{s}\n" for s in shas).encode()
    ).stdout


def answering(*parts: bytes, close: bool = True) -> Callable[[socket.socket], None]:
    """A server that reads the hello, advertises fetch, reads the command and sends `parts` (then hangs up, or
    with `close` False waits for the client to)."""

    def answer(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(ADVERTISED)
        conn.recv(65536)
        for part in parts:
            conn.sendall(part)
        if not close:
            conn.recv(4096)

    return answer


def band(n: int, data: bytes) -> bytes:
    return pkt(bytes([n]) + data)


def _silent(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.recv(4096)  # nothing comes: it waits until the client gives up and closes


def _refuse(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(pkt("ERR access denied or repository not exported: /bus.git\n"))


def _v0(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(pkt(f"{'1' * 40} HEAD\0multi_ack\n") + b"0000")


SENT: dict[str, Callable[[bytes], Callable[[socket.socket], None]]] = {
    "hang-up mid-pack": lambda p: answering(pkt("packfile\n"), band(1, p[: len(p) // 2])),
    "flush mid-pack": lambda p: answering(pkt("packfile\n"), band(1, p[:-1]), b"0000"),
    "garbage": lambda p: answering(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
    "sideband 3": lambda p: answering(
        pkt("packfile\n"), band(1, p[:20]), band(3, b"fatal: the pack could not be made\n"), close=False
    ),
    "ERR mid-answer": lambda p: answering(pkt("packfile\n"), pkt("ERR upload-pack: out of memory\n")),
    "no pack": lambda p: answering(pkt("acknowledgments\n"), pkt("NAK\n"), b"0000"),
    "bad band": lambda p: answering(pkt("packfile\n"), band(7, p)),
    "ERR at hello": lambda p: _refuse,
    "v0": lambda p: _v0,
    "never answers": lambda p: _silent,
}
SAID = {
    "hang-up mid-pack": "cut short",
    "flush mid-pack": "damaged pack",
    "garbage": "malformed packet",
    "sideband 3": "the bus failed the fetch: fatal: the pack could not be made",
    "ERR mid-answer": "upload-pack: out of memory",
    "no pack": "without a pack",
    "bad band": "malformed packet in its pack",
    "ERR at hello": "access denied or repository not exported",
    "v0": "does not speak git protocol version 2",
    "never answers": "fetching 1 object timed out after 1 s",
}


@pytest.mark.parametrize("case", sorted(SENT))
def test_a_server_gone_wrong_is_an_error_and_stores_nothing(tmp_path: Path, store: Path, case: str):
    source = G.init_bare(tmp_path / "source.git")
    blob = G.write_blobs(source, [b"x" * 3000])[0]
    server = FakeServer(SENT[case](pack_of(source, blob)))
    try:
        before = packs(store)
        url = f"git://127.0.0.1:{server.port}/bus.git"
        with pytest.raises(BusError, match=SAID[case]):
            UP.daemon_fetch(store, url, [blob], 1 if case == "never answers" else 10)
        assert packs(store) == before  # no pack, no idx, no tmp_pack
        assert G.present(store, [blob]) == set()
    finally:
        server.close()


def test_a_whole_pack_from_a_fake_server_is_stored(tmp_path: Path, store: Path):
    """The fake server's honest answer is taken (the failures above are the server's, not the fake's)."""
    source = G.init_bare(tmp_path / "source.git")
    blob = G.write_blobs(source, [b"x" * 3000])[0]
    pack = pack_of(source, blob)
    halves = [pack[:100], pack[100:]]
    server = FakeServer(
        answering(pkt("packfile\n"), band(2, b"progress\n"), *(band(1, h) for h in halves), b"0000")
    )
    try:
        UP.daemon_fetch(store, f"git://127.0.0.1:{server.port}/bus.git", [blob], 10)
        assert G.present(store, [blob]) == {blob}
        other = G.write_blobs(source, [b"y"])[0]  # a pack that lacks what was asked for
        with pytest.raises(BusError, match="lacks 1 of the objects asked for"):
            UP.daemon_fetch(store, f"git://127.0.0.1:{server.port}/bus.git", [other], 10)
    finally:
        server.close()


def test_a_bus_that_never_answers_is_unreachable_through_fetch_ids(store: Path):
    server = FakeServer(_silent)
    try:
        bus = Bus(f"git://127.0.0.1:{server.port}/bus.git", store, timeout_s=1)
        with pytest.raises(
            BusUnreachable, match=r"cannot fetch 1 ledger maps from the bus at git://.*timed out"
        ):
            bus.fetch_ids(["1" * 40], "ledger maps", standalone=True)
    finally:
        server.close()


def commits_on(repo: Path, count: int) -> list[str]:
    """`count` commits, one after the other, each with a file of its own (oldest first)."""
    shas: list[str] = []
    for i in range(count):
        blob = G.write_blobs(repo, [f"file {i}\n".encode() * 50])[0]
        tree = G.out(repo, "mktree", input=f"100644 blob {blob}\tf{i}.txt\n".encode())
        shas.append(G.commit(repo, tree, shas[-1:], f"c{i}", "T <t@t>"))
    G.update_ref(repo, "refs/heads/main", shas[-1])
    return shas


def test_a_commit_at_depth_1_comes_alone_and_is_marked_shallow(served: Served, store: Path):
    c = commits_on(served.repo, 4)
    UP.daemon_fetch(store, served.url, [c[2]], 10, depth=1)
    assert G.present(store, c) == {c[2]}
    assert (store / "shallow").read_text().split() == [c[2]]
    assert git(store, "rev-list", "--count", c[2]) == "1"  # git walks it as a root: its parent is cut
    assert G.read_path(store, c[2], "f2.txt") == b"file 2\n" * 50
    # then its child, down to it: the commit we have is said, so nothing older comes
    UP.daemon_fetch(store, served.url, [c[3]], 10, haves=[c[2]])
    assert G.present(store, c) == {c[2], c[3]}
    assert git(store, "rev-list", "--count", c[3]) == "2"
    assert (store / "shallow").read_text().split() == [c[2]]


def test_what_we_say_we_have_is_left_out(served: Served, store: Path):
    c = commits_on(served.repo, 3)
    blob0 = G.out(served.repo, "rev-parse", f"{c[0]}:f0.txt")
    UP.daemon_fetch(store, served.url, [c[2]], 10, haves=[c[0]])  # we say we have c0 (and so its past)
    assert G.present(store, [*c, blob0]) == {c[1], c[2]}
    with pytest.raises(BusError, match="not a hex object id"):
        UP.daemon_fetch(store, served.url, [c[2]], 10, haves=["main"])


def test_a_malformed_shallow_line_is_refused(tmp_path: Path, store: Path):
    source = G.init_bare(tmp_path / "source.git")
    blob = G.write_blobs(source, [b"x" * 3000])[0]
    server = FakeServer(
        answering(
            pkt("shallow-info\n"),
            pkt("shallow ../../etc\n"),
            b"0001",
            pkt("packfile\n"),
            band(1, pack_of(source, blob)),
            b"0000",
        )
    )
    try:
        with pytest.raises(BusError, match="malformed shallow line"):
            UP.daemon_fetch(store, f"git://127.0.0.1:{server.port}/bus.git", [blob], 10, depth=1)
        assert not (store / "shallow").exists() and G.present(store, [blob]) == set()
    finally:
        server.close()
