"""Pushes to the bus in git's own receive-pack protocol, spoken here: each ref update costs the same whatever
the bus holds.

`git push` matches every refspec and every --force-with-lease against every ref the bus advertises (git's
remote.c), so N updates on a bus of R refs cost N x R (1,000 leased deletions against 20,000 refs: 24 s of
CPU). Here the ref advertisement is read once into a dict, and each update is one command `<old> <new> <ref>`:
old is the sha the lease expects, or zeros for "must not exist", and git-receive-pack refuses a command whose
ref does not hold old, so the lease is the server's own check (it is also checked against the advertisement
first, as git push does). Capabilities report-status and atomic (an atomic push of several refs to a bus
without atomic is refused, never made piecemeal); then the pack: none when every command deletes, else
`git pack-objects --revs --thin` of the new commits less what the bus advertises (as git send-pack builds it),
an empty one when the bus has them all; then the report (`unpack ok`, `ok <ref>` / `ng <ref> <why>`).

The conversation is the bus's `Transport.receive_pack` (bridge/wire/transport.py): git:// (a socket to git
daemon), ssh (`git-receive-pack '<path>'` through the ssh command, as listings use), a path or file://
(`git receive-pack <path>` here, with NO_HOOKS: no hook of the bus repository runs). http(s) keeps `git push` (git's remote helper owns authentication, credential
helpers, http.extraHeader and proxies), and so does a store whose git config asks for a signed push or push
options (push.gpgSign, push.pushOption): git speaks those.
"""

from __future__ import annotations

import hashlib
import re
import struct
import time
from pathlib import Path

from bridge.core.errors import BusError
from bridge.wire import git
from bridge.wire.pktline import FLUSH, Wire, packets_until_flush, pkt
from bridge.wire.transport import Status, Transport, Updates, for_url, pushing

_FALSE = ("false", "no", "off", "0")


class Refused(BusError):
    """A push this client will not make (the bus lacks a capability it needs, a pack cannot be built): no
    retry helps."""


def speaks(store: Path, way: Transport | str) -> bool:
    """Whether a push to the bus (its transport, or its URL) goes through this client: every transport but
    http(s), unless the store's git config asks for what only git push does (a signed push, push options)."""
    if not (for_url(way) if isinstance(way, str) else way).receive_pack_here:
        return False
    config = git.run(store, "config", "--get-regexp", r"^push\.(gpgsign|pushoption)$", check=False).stdout
    for line in config.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "push.pushoption" or value.strip().lower() not in _FALSE:
            return False
    return True


def push(
    store: Path, way: Transport | str, updates: Updates, atomic: bool, timeout: float
) -> tuple[Status, str | None]:
    """One push of `updates` to the bus (its transport, or its URL), each leased (as `Transport.push`): (ref ->
    (accepted, summary), the error when not all went through). An empty answer with an error when the bus could
    not be reached or its answer was lost (whether anything landed is then unknown); BusError when it took
    longer than `timeout` seconds; Refused."""
    way = for_url(way) if isinstance(way, str) else way
    url = way.url
    for ref, new, expect in updates:
        if new is None and expect is None:
            raise Refused(f"deleting {ref} needs the sha it is expected to hold")
    if not updates:
        return {}, None
    what = pushing(updates)
    try:
        with way.receive_pack(store, time.monotonic() + timeout) as wire:
            try:
                return _converse(store, wire, updates, atomic)
            except (TimeoutError, Refused):
                raise
            except (BusError, OSError) as exc:  # the bus went, or answered what is not git's protocol
                said = wire.said()
                return {}, f"{exc}: {said}" if said else str(exc)
    except TimeoutError:
        raise BusError(f"pushing {what} to {url} timed out after {timeout:.0f} s") from None
    except Refused as exc:
        raise Refused(f"pushing {what} to {url}: {exc}") from None
    except (BusError, OSError) as exc:  # could not connect
        return {}, str(exc)


def _advertisement(lines: list[bytes]) -> tuple[dict[str, str], set[str], set[str]]:
    """(ref -> sha, the `.have` shas, the capabilities) of receive-pack's ref advertisement."""
    refs: dict[str, str] = {}
    haves: set[str] = set()
    caps: set[str] = set()
    for i, raw in enumerate(lines):
        text = raw.decode(errors="replace").rstrip("\n")
        if i == 0 and text.startswith("version "):
            continue
        if "\0" in text:
            text, _, listed = text.partition("\0")
            caps = set(listed.split())
        if text.startswith("shallow "):
            continue
        sha, _, ref = text.partition(" ")
        if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha) or not ref:
            raise BusError(f"the bus sent a malformed ref advertisement ({text[:80]!r})")
        if ref == ".have":
            haves.add(sha)
        elif ref != "capabilities^{}":
            refs[ref] = sha
    return refs, haves, caps


def _converse(store: Path, wire: Wire, updates: Updates, atomic: bool) -> tuple[Status, str | None]:
    refs, haves, caps = _advertisement(packets_until_flush(wire.recv, "its ref advertisement"))
    zero = "0" * (64 if "object-format=sha256" in caps else 40)
    status: Status = {}
    commands: list[tuple[str, str, str]] = []  # (old, new, ref)
    for ref, new, expect in updates:
        held = refs.get(ref)
        if new is not None and held == new:
            status[ref] = (True, "[up to date]")
        elif held != expect:
            status[ref] = (False, "[rejected] (stale info)")
        else:
            commands.append((held or zero, new or zero, ref))
    if atomic and len(updates) > 1:
        if "atomic" not in caps:
            raise Refused("the bus does not take atomic pushes (its receive.advertiseAtomic is false)")
        if any(not ok for ok, _ in status.values()):
            commands = []
            status = {
                ref: status.get(ref, (False, "[rejected] (atomic push failed)")) for ref, _, _ in updates
            }
    if any(new == zero for _, new, _ in commands) and "delete-refs" not in caps:
        raise Refused("the bus does not take deletions (its git-receive-pack lacks delete-refs)")
    if not commands:
        wire.send(FLUSH)
        wire.end()
        return status, None if all(ok for ok, _ in status.values()) else "some refs were rejected"
    pack = (
        None
        if all(new == zero for _, new, _ in commands)
        else _pack(store, commands, refs, haves, caps, zero, wire.deadline)
    )
    asked = ["report-status", *(c for c in ("atomic", "quiet") if c in caps and (c != "atomic" or atomic))]
    asked += [c for c in caps if c.startswith("object-format=")] + ["agent=kakeya"]
    lines = [f"{old} {new} {ref}" for old, new, ref in commands]
    lines[0] += "\0" + " ".join(asked)
    wire.send(b"".join(pkt(line + "\n") for line in lines) + FLUSH + (pack or b""))
    wire.end()
    return _report(wire, commands, status, zero)


def _report(
    wire: Wire, commands: list[tuple[str, str, str]], status: Status, zero: str
) -> tuple[Status, str | None]:
    """`status` with what receive-pack's report (`unpack ok`, `ok <ref>` / `ng <ref> <why>`) says of each
    of `commands`, and the error when not all went through."""
    report = [
        line.decode(errors="replace").rstrip("\n") for line in packets_until_flush(wire.recv, "its report")
    ]
    if not report or not report[0].startswith("unpack "):
        raise BusError(f"the bus answered the push with {report[0][:80] if report else 'nothing'!r}")
    unpack = report[0].removeprefix("unpack ")
    said: dict[str, tuple[bool, str]] = {}
    for line in report[1:]:
        kind, _, rest = line.partition(" ")
        ref, _, why = rest.partition(" ")
        if kind not in ("ok", "ng"):
            raise BusError(f"the bus's report has a line {line[:80]!r}")
        said[ref] = (kind == "ok", why)
    for old, new, ref in commands:
        ok, why = said.get(ref, (False, "no report of it"))
        ok = ok and unpack == "ok"
        done = "[deleted]" if new == zero else "[new reference]" if old == zero else f"{old[:7]}..{new[:7]}"
        status[ref] = (True, done) if ok else (False, f"[remote rejected] ({why or 'unpack ' + unpack})")
    if unpack != "ok":
        return status, f"the bus could not unpack the push: {unpack}"
    return status, None if all(ok for ok, _ in status.values()) else "some refs were rejected"


def _pack(
    store: Path,
    commands: list[tuple[str, str, str]],
    refs: dict[str, str],
    haves: set[str],
    caps: set[str],
    zero: str,
    deadline: float,
) -> bytes:
    """The pack of what the new shas need and the bus lacks, from `store`: `git pack-objects --revs` of the
    new shas the bus does not advertise, less (`^`) every advertised sha the store has (as git send-pack);
    an empty pack when the bus advertises every new sha."""
    advertised = set(refs.values()) | haves
    news = sorted({new for _, new, _ in commands if new != zero} - advertised)
    if not news:
        head = b"PACK" + struct.pack(">II", 2, 0)
        return head + hashlib.new("sha1" if len(zero) == 40 else "sha256", head).digest()
    known = git.present(store, sorted(advertised))
    argv = ["pack-objects", "--revs", "--stdout", "-q"]
    argv += [
        *([] if "no-thin" in caps else ["--thin"]),
        *(["--delta-base-offset"] if "ofs-delta" in caps else []),
    ]
    revs = "".join(f"{sha}\n" for sha in news) + "".join(f"^{sha}\n" for sha in sorted(known))
    proc = git.run(
        store, *argv, input=revs.encode(), timeout=max(deadline - time.monotonic(), 1), check=False
    )
    if proc.returncode != 0:
        raise Refused(f"cannot pack {', '.join(news[:3])} from {store}: {git.message(proc.stderr)}")
    return proc.stdout
