"""The git wire as a type: one `Transport` per bus, chosen once from its URL (`for_url`; `Bus` holds it), as git
itself reads the URL:

    Local   a path (a bare repository, a working clone, its .git, `path`.git) or file://: git's upload-pack and
            receive-pack run here, with NO_HOOKS (no hook of the bus repository runs)
    Daemon  git://: a socket to git daemon (TCP_NODELAY, and TCP_QUICKACK before each read on Linux)
    Ssh     ssh://, git+ssh://, scp-like host:path: git-upload-pack / git-receive-pack on the server, through
            GIT_SSH_COMMAND, core.sshCommand or ssh, GIT_PROTOCOL sent (`-o SendEnv`)
    Http    http(s)://: git's own remote helper (`git remote-https`, its `stateless-connect`); pushes by `git push`
            (the helper owns authentication, credential helpers, http.extraHeader and proxies)

Each opens a conversation with the bus's upload-pack (protocol v2 asked) or receive-pack as a `pktline.Wire`;
on that, a listing asks only for the refs under its prefixes (`ls_refs`: protocol v2 `ls-refs` with
`ref-prefix`), the same for every transport. A server that answers in v0 sends every ref: filtered here, said
once per bus on stderr. `fetch` and `push` are git's own (`git fetch`, `git push`) with what the transport adds.
A URL that cannot be a bus (another remote helper's `name::address`, an unknown scheme, a bundle file) is
refused when the bus is opened, with what to name instead.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from bridge.core.errors import BusError
from bridge.wire import git
from bridge.wire.pktline import DELIM, FLUSH, Wire, pkt, pkt_lines, read_until_flush

Status = dict[str, tuple[bool, str]]  # a push's answer: ref -> (the bus took it, git's summary)
Updates = Sequence[tuple[str, str | None, str | None]]  # (ref, new or None to delete, expected or None)
OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only: ACK each segment at once
_SAID_V0: set[str] = set()


def for_url(url: str) -> Transport:
    """The transport of the bus `url`, as git reads the URL; BusError for one that cannot be a bus."""
    scheme, sep, _ = url.partition("://")
    if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        kinds: dict[str, type[Transport]] = {
            "git": Daemon, "http": Http, "https": Http, "ssh": Ssh, "git+ssh": Ssh, "ssh+git": Ssh, "file": Local
        }  # fmt: skip
        if scheme.lower() not in kinds:
            raise BusError(
                f"{url}: kakeya does not speak {scheme}:// to a bus; name it by a path, file://, ssh://, git:// "
                "or http(s):// URL"
            )
        return kinds[scheme.lower()](url)
    helper = re.match(r"([A-Za-z0-9+.-]+)::", url)
    if helper:
        raise BusError(
            f"{url}: a bus through git's remote helper {helper.group(1)!r} is not one kakeya speaks; name it by a "
            "path, file://, ssh://, git:// or http(s):// URL"
        )
    colon, slash = url.find(":"), url.find("/")
    return Local(url) if colon < 0 or 0 <= slash < colon else Ssh(url)  # scp-like host:path is ssh


def is_path(url: str) -> bool:
    """A bus named by a plain path on this host (not file://, not scp-like host:path)."""
    colon, slash = url.find(":"), url.find("/")
    return "://" not in url and (
        colon < 0 or 0 <= slash < colon
    )  # a helper's name::address is host:path here


def pushing(updates: Updates) -> str:
    """What a push carries, in a few words (for its error messages)."""
    refs = [ref for ref, _, _ in updates]
    return ", ".join(refs) if len(refs) <= 3 else f"{len(refs)} refs ({', '.join(refs[:2])}, ...)"


class Transport:
    """How the bridge reaches one bus `url`: conversations with its upload-pack and receive-pack, and what
    `git fetch` / `git push` need to reach it as the bridge does."""

    receive_pack_here: ClassVar[bool] = True  # pushes speak receive-pack here (bridge/wire/receive_pack.py)

    def __init__(self, url: str):
        self.url = url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # --- what each transport says -------------------------------------------------------------------

    def upload_pack(self, store: Path, deadline: float) -> contextlib.AbstractContextManager[Wire]:
        """A conversation with the bus's git-upload-pack, protocol v2 asked."""
        raise NotImplementedError

    def receive_pack(self, store: Path, deadline: float) -> contextlib.AbstractContextManager[Wire]:
        """A conversation with the bus's git-receive-pack."""
        raise NotImplementedError

    def git_args(self, program: str) -> list[str]:
        """What `git fetch` / `git push` add to reach the bus's git-upload-pack / git-receive-pack."""
        return []

    def v0_note(self) -> str:
        """What is said (once per bus) when it answers a listing in protocol v0."""
        return f"the bus at {self.url} answers in git protocol v0: every listing downloads every ref"

    def refusal(self, status: Status) -> str | None:
        """Why the bus refused what it refused in `status`, when no retry helps and the user can act."""
        return None

    # --- the same for every transport ---------------------------------------------------------------

    def ls_refs(self, store: Path, prefixes: Sequence[str], timeout: float) -> str:
        """The refs under `prefixes` as `git ls-remote` prints them, asking the server for only those (protocol
        v2 `ls-refs` with `ref-prefix`; `git ls-remote URL PATTERN` downloads every ref and filters on the
        client). BusError says why not."""
        try:
            with self.upload_pack(store, time.monotonic() + timeout) as wire:
                return self._listing(wire, prefixes)
        except TimeoutError:
            raise BusError(f"listing {', '.join(prefixes)} timed out after {timeout:.0f} s") from None
        except OSError as exc:
            raise BusError(str(exc)) from None

    def _listing(self, wire: Wire, prefixes: Sequence[str]) -> str:
        try:
            lines = pkt_lines(read_until_flush(wire.recv))  # the capability advertisement (or v0's refs)
            if lines[:1] == [b"version 2\n"]:
                if None not in lines:
                    raise BusError("the bus's capability advertisement was cut short")
                request = [pkt("command=ls-refs\n"), pkt("agent=kakeya\n"), DELIM]
                wire.send(b"".join([*request, *(pkt(f"ref-prefix {p}\n") for p in prefixes), FLUSH]))
                wire.end()
                return _refs_answer(pkt_lines(read_until_flush(wire.recv)))
        except TimeoutError:
            raise
        except (BusError, OSError) as exc:  # the server's, ssh's or the helper's own words say why
            said = wire.said()
            raise BusError(
                f"{exc}: {said}" if said and isinstance(exc, BusError) else said or str(exc)
            ) from None
        if None not in lines:  # no advertisement at all: ssh, git or the server said why
            raise BusError(wire.said() or "the bus closed the connection before its list of refs")
        if self.url not in _SAID_V0:
            _SAID_V0.add(self.url)
            print(f"kakeya: {self.v0_note()}", file=sys.stderr)
        refs = []
        for line in lines[: lines.index(None)]:
            assert line is not None
            sha, _, ref = line.split(b"\0")[0].decode(errors="replace").rstrip("\n").partition(" ")
            if OID.fullmatch(sha) and ref.startswith(tuple(prefixes)):
                refs.append(f"{sha}\t{ref}\n")
        return "".join(refs)

    def fetch(
        self,
        store: Path,
        refspecs: Sequence[str],
        timeout: float,
        depth: int | None = None,
        tree_filter: str | None = None,
        tips: Sequence[str] = (),
    ) -> str | None:
        """`git fetch` of `refspecs` into `store` in one go (`depth`: that many commits of each history;
        `tree_filter`: git's --filter, e.g. tree:0 for a tree without what it holds; `tips`: the local commits
        to tell the server we have, git's --negotiation-tip, so it sends nothing they reach), writing no
        FETCH_HEAD; git's message when it failed. A filtered fetch names the bus a promisor remote for that one
        git only (GIT_CONFIG_*), so git never writes that into the store's config; a server that does not
        filter (uploadpack.allowFilter) sends all."""
        promisor = None
        if tree_filter:  # after any GIT_CONFIG_* of the caller's own
            n = int(os.environ.get("GIT_CONFIG_COUNT", "0") or 0)
            promisor = {
                "GIT_CONFIG_COUNT": str(n + 2),
                f"GIT_CONFIG_KEY_{n}": f"remote.{self.url}.promisor",
                f"GIT_CONFIG_VALUE_{n}": "true",
                f"GIT_CONFIG_KEY_{n + 1}": f"remote.{self.url}.partialclonefilter",
                f"GIT_CONFIG_VALUE_{n + 1}": tree_filter,
            }
        flags = [
            *([f"--depth={depth}"] if depth else []),
            *([f"--filter={tree_filter}"] if tree_filter else []),
        ]
        flags += [f"--negotiation-tip={tip}" for tip in tips]
        flags += ["--no-write-fetch-head", "--no-auto-gc", "--no-tags", "--no-recurse-submodules", "-q"]
        proc = git.run(
            store,
            "fetch",
            *flags,
            "--stdin",
            *self.git_args("upload-pack"),
            self.url,
            input="".join(r + "\n" for r in refspecs).encode(),
            env=promisor,
            timeout=timeout,
            check=False,
        )
        return git.message(proc.stderr) if proc.returncode != 0 else None

    def push(self, store: Path, updates: Updates, atomic: bool, timeout: float) -> tuple[Status, str | None]:
        """One `git push` of (ref, new or None to delete, expected or None = must not exist), each leased with
        --force-with-lease; (ref -> (accepted, git's summary), git's error message when it failed). git matches
        every refspec and lease against every ref the bus advertises: bridge/wire/receive_pack.py pushes
        without that where it can."""
        args = ["push", "--porcelain", "--no-verify", "--no-recurse-submodules"]
        if atomic and len(updates) > 1:
            args.append("--atomic")
        args += [f"--force-with-lease={ref}:{expect or ''}" for ref, _, expect in updates]
        args += [*self.git_args("receive-pack"), self.url, *(f"{new or ''}:{ref}" for ref, new, _ in updates)]
        try:
            proc = git.run(store, *args, timeout=timeout, check=False)
        except BusError as exc:  # a time limit: say what was being pushed
            raise BusError(f"pushing {pushing(updates)} to {self.url}: {exc}") from None
        status: Status = {}
        for line in proc.stdout.decode(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and len(parts[0]) == 1 and ":" in parts[1]:
                status[parts[1].rsplit(":", 1)[1]] = (parts[0] in " +-*=", parts[2])
        return status, git.message(proc.stderr) if proc.returncode != 0 else None


@contextlib.contextmanager
def _process(
    program: str, argv: list[str], store: Path, deadline: float, env: Mapping[str, str] | None = None
) -> Iterator[Wire]:
    """A conversation with `argv` (git, ssh, git's remote helper) on its pipes, its stderr kept for `said`;
    stopped (its whole process group, past the deadline) at the end."""
    with tempfile.TemporaryFile() as err:
        proc = git.popen(program, argv, store, err, env)
        assert proc.stdin is not None and proc.stdout is not None

        def said() -> str:
            if wire.ended:  # it hung up: what it says on its way out is said before it exits
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(min(deadline - time.monotonic(), 5), 0.1))
            err.seek(0)
            return git.message(text) if (text := err.read()).strip() else ""

        wire = Wire(proc.stdout.fileno(), proc.stdin.fileno(), deadline, proc.stdin.close, said)
        try:
            yield wire
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(max(min(deadline - time.monotonic(), 5), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):  # it and its children, in a process group of their own
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()


def _refs_answer(lines: list[bytes | None]) -> str:
    """An `ls-refs` answer as `git ls-remote` prints it (raises when it was cut short)."""
    out = []
    for line in lines:
        if line is None:
            return "".join(out)
        sha, _, ref = line.decode(errors="replace").rstrip("\n").partition(" ")
        out.append(f"{sha}\t{ref.split(' ', 1)[0]}\n")
    raise BusError("the bus's list of refs was cut short")  # a ref missing from a list must never look absent


class Local(Transport):
    """A repository on this host, named by a path or file://, read as git reads it (a bare repository, a
    working clone, its .git directory, `path`.git): git's upload-pack and receive-pack run here."""

    def __init__(self, url: str):
        super().__init__(url)
        self.path = url.removeprefix("file://")
        if Path(self.path).is_file():
            raise BusError(
                f"{url} is a file, not a repository (a git bundle cannot be a bus: nothing can be pushed to it); "
                f"name a bare repository instead (git clone --bare {self.path} bus.git)"
            )

    @contextlib.contextmanager
    def upload_pack(self, store: Path, deadline: float) -> Iterator[Wire]:
        # not --strict: the path may be a working clone, its .git or `path`.git, as git reads it
        argv = ["git", *git.NO_HOOKS, "upload-pack", self.path]
        with _process("git", argv, store, deadline, {"GIT_PROTOCOL": "version=2"}) as wire:
            yield wire

    @contextlib.contextmanager
    def receive_pack(self, store: Path, deadline: float) -> Iterator[Wire]:
        with _process("git", ["git", *git.NO_HOOKS, "receive-pack", self.path], store, deadline) as wire:
            yield wire

    def git_args(self, program: str) -> list[str]:
        """git-upload-pack / git-receive-pack run here without our `-c` (git clears it for the other side):
        started with NO_HOOKS too, no hook of the bus repository runs."""
        return [f"--{program}=git {' '.join(git.NO_HOOKS)} {program}"]

    def refusal(self, status: Status) -> str | None:
        for ref, (ok, why) in status.items():
            if not ok and ("currently checked out" in why or "deletion of the current branch" in why):
                branch = ref.removeprefix("refs/heads/")
                return (
                    f"the bus at {self.url} is a working clone with {branch} checked out, and git moves no branch "
                    f"a work tree has checked out: switch that clone to another branch (git -C {self.path} "
                    f"switch --detach), or make the bus a bare repository (git clone --bare {self.path} bus.git)"
                )
        return None


class Daemon(Transport):
    """git:// (git daemon): a socket of our own, the service and repository asked for in its first packet."""

    def __init__(self, url: str):
        super().__init__(url)
        m = re.fullmatch(r"git://(\[[^\]]+\]|[^/:]+)(?::(\d+))?(/.*)", url)
        if not m:
            raise BusError(f"{url} is not a git:// URL")
        self.named, self.port, self.path = m.group(1), int(m.group(2) or 9418), m.group(3)
        self.host = self.named.strip("[]")
        self.virtual = f"{self.named}{f':{self.port}' if m.group(2) else ''}"

    def hello(self, service: str, extra: str = "") -> bytes:
        """The request packet that asks for `service` on the repository, with `extra` parameters."""
        return pkt(f"{service} {self.path}\0host={self.virtual}\0{extra}")

    @contextlib.contextmanager
    def _socket(self, service: str, deadline: float, extra: str = "") -> Iterator[Wire]:
        try:
            sock = socket.create_connection(
                (self.host, self.port), timeout=max(deadline - time.monotonic(), 0.1)
            )
        except TimeoutError:
            raise
        except OSError as exc:
            raise BusError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        with sock:
            sock.setblocking(False)
            sock.setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
            )  # no small write waits on a delayed ACK

            def quickack() -> None:  # the kernel clears it again after a while: set before each read
                if _QUICKACK is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)

            wire = Wire(sock.fileno(), sock.fileno(), deadline, lambda: sock.shutdown(socket.SHUT_WR))
            wire.before_read = quickack
            wire.send(self.hello(service, extra))
            yield wire

    def upload_pack(self, store: Path, deadline: float) -> contextlib.AbstractContextManager[Wire]:
        return self._socket("git-upload-pack", deadline, "\0version=2\0")

    def receive_pack(self, store: Path, deadline: float) -> contextlib.AbstractContextManager[Wire]:
        return self._socket("git-receive-pack", deadline)


class Ssh(Transport):
    """ssh (ssh://, git+ssh://, scp-like host:path): git-upload-pack / git-receive-pack on the server, as git
    itself reaches it. A server whose sshd does not accept GIT_PROTOCOL (OpenSSH's AcceptEnv) answers in v0."""

    def __init__(self, url: str):
        super().__init__(url)
        m = re.fullmatch(r"(?:ssh|git\+ssh|ssh\+git)://([^/]+?)(?::(\d+))?(/.*)", url)
        scp = re.fullmatch(r"([^/:]+):(.+)", url)
        if (m is None and scp is None) or "'" in url:
            raise BusError(f"{url} is not an ssh URL kakeya can use")
        host, port, path = m.groups() if m else (scp.group(1), None, scp.group(2))  # type: ignore[union-attr]
        if host.startswith("-"):  # `ssh -oProxyCommand=...`: an option, not a host (as git refuses it)
            raise BusError(f"{url}: the host {host!r} starts with '-': refused (it would be an ssh option)")
        self.host, self.port, self.path = host, port, path[1:] if path.startswith("/~") else path

    def _ssh(self, store: Path) -> list[str]:
        """The ssh argv up to the host: GIT_SSH_COMMAND, core.sshCommand or ssh (as git reads them, each time)."""
        ssh = (
            os.environ.get("GIT_SSH_COMMAND")
            or git.run(store, "config", "--get", "core.sshCommand", check=False).stdout.decode().strip()
            or "ssh"
        )
        port = ["-p", self.port] if self.port else []
        return [*shlex.split(ssh), "-o", "SendEnv=GIT_PROTOCOL", *port, self.host]

    @contextlib.contextmanager
    def upload_pack(self, store: Path, deadline: float) -> Iterator[Wire]:
        argv = [*self._ssh(store), f"git-upload-pack '{self.path}'"]
        with _process("ssh", argv, store, deadline, {"GIT_PROTOCOL": "version=2"}) as wire:
            yield wire

    @contextlib.contextmanager
    def receive_pack(self, store: Path, deadline: float) -> Iterator[Wire]:
        with _process("ssh", [*self._ssh(store), f"git-receive-pack '{self.path}'"], store, deadline) as wire:
            yield wire

    def v0_note(self) -> str:
        return (
            f"the bus at {self.url} answered over ssh in git protocol v0 (its sshd does not accept GIT_PROTOCOL): "
            "every listing downloads every ref"
        )


class Http(Transport):
    """http(s): git's own remote helper, with the store's config (its credential helper) and no hooks, as git
    itself speaks protocol v2 over HTTP (`stateless-connect`). Pushes go through `git push`."""

    receive_pack_here = False

    @contextlib.contextmanager
    def upload_pack(self, store: Path, deadline: float) -> Iterator[Wire]:
        """The helper's `stateless-connect git-upload-pack`; a server of v0/v1 only makes it answer `fallback`:
        then its `list` (the full advertisement it already holds), given out as v0's advertisement."""
        scheme = self.url.partition("://")[0]
        argv = ["git", *git.NO_HOOKS, "-c", "protocol.version=2", f"remote-{scheme}", self.url, self.url]
        with _process("git", argv, store, deadline) as wire:
            wire.send(b"stateless-connect git-upload-pack\n")
            if wire.line() == b"fallback":  # the server spoke v0/v1: every ref came already
                wire.send(b"list\n")
                refs = []
                while text := wire.line().decode(errors="replace"):
                    value, _, ref = text.partition(" ")
                    if OID.fullmatch(value):
                        refs.append(pkt(f"{value} {ref.split(' ', 1)[0]}\n"))
                wire.pending = b"".join(refs) + FLUSH if refs or not wire.ended else b""
            yield wire

    def receive_pack(self, store: Path, deadline: float) -> contextlib.AbstractContextManager[Wire]:
        raise BusError(f"{self.url}: pushes over http(s) go through git push")

    def v0_note(self) -> str:
        return (
            f"the bus at {re.sub(r'//[^/@]*@', '//', self.url)} speaks only git protocol v0/v1: every listing "
            "downloads every ref (a server with protocol v2 sends only those asked)"
        )
