"""Objects fetched by id from a git daemon (git://) in git's upload-pack protocol v2, spoken here: blobs and
trees, which have no history and so nothing to negotiate, in one round trip on a socket of our own.

`git fetch` of one object from a git daemon on loopback took ~55 ms, ~40 of them a stall: neither git daemon
nor git's client sets TCP_NODELAY, so a small write waits for the ACK that the other side delays by 40 ms.
This socket sets TCP_NODELAY and re-arms TCP_QUICKACK before each read (Linux; elsewhere only NODELAY), and
there is no `git fetch` process, ref matching or connectivity walk.

The conversation (the bus's `Daemon.upload_pack`, bridge/wire/transport.py): the hello (with version=2), the capability advertisement (version 2,
`fetch`, and whether that lists `filter`), then `command=fetch` with ofs-delta, no-progress, the filter where
the server filters (else none: the server then sends everything, as git does), one `want` per object id and
`done`. The answer: sections up to `packfile`, then side-band pkt-lines (1: the pack, 2: progress, 3: the
server's error) up to a flush. The pack is read whole, its checksum checked, and only then stored with
`git index-pack --stdin` (with --promisor when filtered, as `git fetch --filter` marks its packs): index-pack
leaves a tmp_pack file behind when its input ends early, so an answer cut short never reaches it.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path

from bridge.core.errors import BusError
from bridge.wire import git
from bridge.wire.pktline import DELIM, FLUSH, Packets, Wire, pkt, pkt_lines, read_until_flush
from bridge.wire.transport import OID, Daemon


def daemon_fetch(
    store: Path | str,
    daemon: Daemon | str,
    wants: Sequence[str],
    timeout: float,
    tree_filter: str | None = None,
    depth: int | None = None,
    haves: Sequence[str] = (),
) -> None:
    """Fetch the objects `wants` from the git:// bus (its transport, or its URL) into `store` within `timeout`
    seconds (`tree_filter`: git's --filter, e.g. tree:0 for a tree without what it holds, sent when the server
    filters). Commits too: `haves` are commits here whose history the server then leaves out (git's
    negotiation, in one round: the store's shallow commits are said, so a shallow `have` stands for itself
    only), `depth` that many commits of each history (the commits cut there are added to the store's
    `shallow` file). BusError with the server's own words when it refuses (`upload-pack: not our ref <oid>`),
    or saying the answer was cut short, malformed or late; nothing is stored then."""
    bad = [w for w in [*wants, *haves] if not OID.fullmatch(w)]
    if bad:
        raise BusError(f"cannot fetch {bad[0]!r} by object id: it is not a hex object id")
    if not wants:
        return
    daemon = Daemon(daemon) if isinstance(daemon, str) else daemon
    deadline = time.monotonic() + timeout
    what = f"fetching {len(wants)} object{'s' if len(wants) > 1 else ''}"
    try:
        with daemon.upload_pack(Path(store), deadline) as wire:
            shallow = git.shallow_commits(_git_dir(Path(store)))
            pack, algo, filtered, cut = _converse(wire, wants, tree_filter, depth, haves, shallow)
    except TimeoutError:
        raise BusError(f"{what} timed out after {timeout:.0f} s") from None
    except OSError as exc:  # a reset: the server went half-way
        raise BusError(f"{what}: the answer was cut short ({exc})") from None
    _store(Path(store), pack, algo, filtered, wants, deadline)
    if cut:
        git.add_shallow(_git_dir(Path(store)), cut)


def _git_dir(store: Path) -> Path:
    """The git directory of `store` (a bare repository, or a working tree's .git directory)."""
    return store if (store / "objects").is_dir() else store / ".git"


def _capabilities(lines: list[bytes | None]) -> dict[str, list[str]]:
    """key -> values of a protocol v2 capability advertisement (raises when it is not one, or lacks `fetch`)."""
    if not lines or lines[0] != b"version 2\n":
        raise BusError("the bus does not speak git protocol version 2")
    if None not in lines:
        raise BusError("the bus's capability advertisement was cut short")
    caps = {
        key.decode(errors="replace"): value.decode(errors="replace").split()
        for line in lines[1 : lines.index(None)]
        if line is not None
        for key, _, value in [line.rstrip(b"\n").partition(b"=")]
    }
    if "fetch" not in caps:
        raise BusError("the bus does not offer the protocol v2 fetch command")
    return caps


def _converse(
    wire: Wire,
    wants: Sequence[str],
    tree_filter: str | None,
    depth: int | None,
    haves: Sequence[str],
    shallow: Sequence[str],
) -> tuple[bytes, str, bool, list[str]]:
    """(the pack, its hash algorithm, whether the filter was sent, the commits the server cut at `depth`) of
    one fetch on `wire` (its hello sent)."""
    # the server says nothing more until it has our command: reading up to the flush loses nothing
    caps = _capabilities(pkt_lines(read_until_flush(wire.recv)))
    algo = (caps.get("object-format") or ["sha1"])[0]
    if algo not in ("sha1", "sha256"):
        raise BusError(f"the bus stores objects in a format kakeya does not know ({algo})")
    filtered = bool(tree_filter) and "filter" in caps["fetch"]
    request = [
        "command=fetch",
        "agent=kakeya",
        *([f"object-format={algo}"] if "object-format" in caps else []),
        None,  # the delim: the command's arguments follow
        "ofs-delta",
        "no-progress",
        *([f"filter {tree_filter}"] if filtered else []),
        *(f"shallow {c}" for c in shallow),
        *([f"deepen {depth}"] if depth else []),
        *(f"want {w}" for w in wants),
        *(f"have {h}" for h in haves),
        "done",
    ]
    with contextlib.suppress(OSError):  # a server that stopped reading to say why (ERR) still answers
        wire.send(b"".join(DELIM if ln is None else pkt(ln + "\n") for ln in request) + FLUSH)
        wire.end()
    cut: list[str] = []
    return _read_pack(Packets(wire.recv), cut), algo, filtered, cut


def _read_pack(packets: Packets, cut: list[str]) -> bytes:
    """The pack of a fetch's answer: its sections up to `packfile` (of them, `shallow-info`'s `shallow <oid>`
    lines go into `cut`), then the side-band packets up to the flush."""
    while (line := packets.next()) != b"packfile\n":
        if line is None:
            raise BusError("the bus answered the fetch without a pack")
        if line.startswith(b"shallow "):
            oid = line[8:].decode(errors="replace").strip()
            if not OID.fullmatch(oid):
                raise BusError(f"the bus sent a malformed shallow line ({line[:60]!r})")
            cut.append(oid)
    pack = bytearray()
    while (line := packets.next()) is not None:
        band, data = line[:1], line[1:]
        if band == b"\1":
            pack += data
        elif band == b"\3":
            raise BusError(f"the bus failed the fetch: {data.decode(errors='replace').strip()}")
        elif band != b"\2":  # 2: progress (there is little, with no-progress)
            raise BusError(f"the bus sent a malformed packet in its pack ({line[:16]!r})")
    return bytes(pack)


def _store(
    store: Path, pack: bytes, algo: str, filtered: bool, wants: Sequence[str], deadline: float
) -> None:
    """`pack` into `store` (`git index-pack --stdin`, --promisor when filtered), each of `wants` in it."""
    size = hashlib.new(algo).digest_size
    if (
        len(pack) < 12 + size
        or pack[:4] != b"PACK"
        or hashlib.new(algo, pack[:-size]).digest() != pack[-size:]
    ):
        raise BusError(f"the bus sent a damaged pack ({len(pack)} bytes that are not a whole pack)")
    proc = git.run(
        store,
        "index-pack",
        "--stdin",
        *(["--promisor=kakeya"] if filtered else []),
        input=pack,
        timeout=max(deadline - time.monotonic(), 1),
        check=False,
    )
    if proc.returncode != 0:
        raise BusError(f"cannot store the pack the bus sent: {git.message(proc.stderr)}")
    if lacking := sorted(set(wants) - git.present(store, wants)):
        raise BusError(f"the bus's pack lacks {len(lacking)} of the objects asked for ({lacking[0]}, ...)")
