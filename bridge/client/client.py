"""The client side of the bus: request, status, wait, results, cancel, gc, and evidence for the gates.

    client = Client(load_config(), root=project_root())   # bus: config.remote, else origin, else .kakeya/bus.git
    manifest = client.request("probe", {}, "cpu")                 # pushes kakeya/req/cpu/<id>
    done = client.wait(manifest.id, timeout=600)
    result, out = client.results(manifest.id, Path("out/x"), done)

The client's object store is the project's own repository: request commits are written into it
(objects only) and pushed from it, and results are fetched into it without a ref or FETCH_HEAD; the
user's branches, index and files are never touched. Outside a git repository results go to a bare
cache under the state directory.
"""

from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import json
import platform
import re
import secrets
import sys
import time
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError

from bridge.bus import ledger as L
from bridge.bus.bus import Bus, is_local_path
from bridge.bus.presence import read_presences, refuse_unsigned
from bridge.bus.records import (
    CANCEL_PATH,
    CANCEL_PREFIX,
    CLAIM_PATH,
    CLAIM_PREFIX,
    DONE_PREFIX,
    ID_RE,
    ID_RULE,
    LAYOUT,
    LAYOUT_KAKEYA,
    LAYOUT_PREFIX,
    LIVE,
    MANIFEST_PATH,
    MAX_TTL,
    NS,
    OLD_PREFIXES,
    PREFIX,
    REQ_PREFIX,
    RUNNERS_PREFIX,
    STAGE_PREFIX,
    SUBJECT_PREFIX,
    CancelMarker,
    Claim,
    Entry,
    Manifest,
    Snapshot,
    Update,
    _File,
    archive_ref,
    cancel_ref,
    claim_ref,
    done_ref,
    id_time,
    layout_ref,
    new_id,
    parse_id,
    parse_or_none,
    read_manifests,
    req_ref,
    request_state,
    results_path,
    runner_ref,
    subject_ref,
    utcnow,
)
from bridge.bus.trust import Signers, done_problem, key_file, trusted_signers
from bridge.config import Config, project_root
from bridge.core.errors import BusError, InvalidRequest, KakeyaError, WaitTimeout, problems
from bridge.core.names import check_label
from bridge.core.result import RunResult
from bridge.wire import git

if TYPE_CHECKING:
    from bridge.presets.preset import Preset

# refs a gc push carries: through git push (http(s)) each is matched against every ref on the bus, so few; in
# receive-pack's protocol (bridge/wire/receive_pack.py) each costs the same whatever the bus holds, and only the
# advertisement of every ref, downloaded once a push, is worth sharing among many
GC_CHUNK = 500
GC_CHUNK_RECEIVE_PACK = 5000
IDEM_PREFIX = NS + "idem/"  # refs/kakeya/idem/<sha256 of the key>: the request a key made
IDEM_PATH = ".kakeya/idempotency.json"


def idem_ref(key_sha256: str) -> str:
    return f"{IDEM_PREFIX}{key_sha256}"


class Idempotency(_File):
    """.kakeya/idempotency.json, on a child of the request commit that `idem_ref` points at: the request a key
    made and the runner labels it was asked for (the rest of its content is its request.json)."""

    schema_version: Literal[1] = 1
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    labels: list[str] = Field(min_length=1, max_length=32)
    id: str

    @staticmethod
    def key_hash(key: str) -> str:
        if not key or len(key) > 200 or any(unicodedata.category(c) in ("Cc", "Cf") for c in key):
            raise InvalidRequest(
                f"idempotency key {key[:40]!r} must be 1 to 200 printable characters (e.g. a UUID)"
            )
        return hashlib.sha256(key.encode()).hexdigest()


def runner_labels(spec: str | Sequence[str]) -> list[str]:
    """'h200,h100' (or a list) -> the labels in order, each valid and given once."""
    labels = [lb.strip() for lb in spec.split(",")] if isinstance(spec, str) else [lb.strip() for lb in spec]
    if not labels or len(set(labels)) != len(labels):
        raise InvalidRequest(
            f"--runner {','.join(labels)!r} must name each runner label once, e.g. h200,h100"
        )
    return [check_label(lb) for lb in labels]


def state_dir(config: Config, root: Path) -> Path:
    """The state directory (default <project>/.kakeya), created with a .gitignore that ignores all of it."""
    path = Path(config.state_dir).expanduser() if config.state_dir else root / ".kakeya"
    path = path if path.is_absolute() else (root / path)
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text(
            "# kakeya state: the embedded bus, runner mirrors and run directories; never committed\n*\n"
        )
    return path


DEFAULT_REMOTE = "origin"  # inside a clone with no configured remote, the bus is the clone's own remote


def default_remote(config: Config, root: Path) -> str:
    """The bus when no --remote is given: the configured remote (kakeya.toml / KAKEYA_REMOTE), else the
    clone's `origin`, else '' (the embedded .kakeya/bus.git: for `kakeya run` and clones with no remote)."""
    if config.remote:
        return config.remote
    if git.is_repo(root) and git.remote_url(root, DEFAULT_REMOTE) is not None:
        return DEFAULT_REMOTE
    return ""


def resolve_remote(remote: str, root: Path, config: Config) -> str:
    """A git remote name of the project, a URL, a path, or '' for the embedded bus (.kakeya/bus.git).
    A bare name that is neither a remote of the project nor an existing path is refused (InvalidRequest)."""
    if not remote:
        return str(git.init_bare(state_dir(config, root) / "bus.git"))
    if re.fullmatch(r"[A-Za-z0-9._-]+", remote):
        named = git.remote_url(root, remote) if git.is_repo(root) else None
        if named is not None:
            return named
        if not remote.endswith(".git") and not Path(remote).expanduser().exists():
            known = git.remote_names(root) if git.is_repo(root) else []
            raise InvalidRequest(
                f"{remote!r} is not a git remote of {root} (remotes: {', '.join(known) or 'none'}); "
                f"give a remote name, a URL, or a path such as ./{remote}",
                code="unknown-remote",
            )
    if is_local_path(remote):
        return str(Path(remote).expanduser().resolve())
    return remote


def not_in_project(where: Path) -> InvalidRequest:
    """A bus verb outside a git checkout: it would read an empty bus and write a bus or an object store into
    whatever directory it was started in (an MCP client starts servers in its own)."""
    return InvalidRequest(
        f"not in a git project: pass --project DIR ({where} is not in a git checkout)", code="not-in-project"
    )


def describe_bus(remote: str, url: str) -> str:
    """Which bus, for the stderr line every bus command prints (credentials in a URL are not shown)."""
    shown = re.sub(r"://[^/@]*@", "://", url)
    if not remote:
        return f"{shown} (embedded)"
    return (
        f"remote {remote} ({shown})" if re.fullmatch(r"[A-Za-z0-9._-]+", remote) and remote != url else shown
    )


def exit_code(result: RunResult) -> int:
    """0 succeeded with a passing (or no) verdict, 2 rejected (invalid request, nothing ran), 1 otherwise."""
    if result.status == "rejected":
        return 2
    return 0 if result.status == "succeeded" and result.verdict in (None, "pass") else 1


def shown(items: Sequence[str], limit: int = 5) -> str:
    """The first `limit` items, and how many more."""
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def recent_days(days: int = 2) -> list[str]:
    """The UTC dates (YYYYMMDD) of today and the `days - 1` days before: what `status` shows by default."""
    today = utcnow()
    return sorted({f"{today - dt.timedelta(days=d):%Y%m%d}" for d in range(days)})


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, unit_required: bool = False) -> float:
    """'90', '90s', '15m', '2h', '7d', or compound, largest unit first: '1h30m', '2d12h', '1m30s' -> seconds
    (`unit_required`: a bare number is refused)."""
    bad = InvalidRequest(
        f"duration {text!r} must look like 90s, 15m, 2h, 7d or 1h30m (a number and a unit, or several, largest first)"
    )
    compact = text.strip().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise bad
    units = [u for _, u in parts]
    if len(parts) > 1 and ("" in units or units != sorted(set(units), key=lambda u: -_UNITS[u])):
        raise bad  # every part with its own unit, each unit once, largest first
    total = sum(float(n) * _UNITS[u] for n, u in parts)
    if total <= 0 or (unit_required and not units[-1]):
        raise bad
    return total


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(max(seconds, 0))}s"


@dataclass
class Row:
    """One request as `kakeya status` shows it."""

    id: str
    state: str
    preset: str
    runner: str | None
    created_at: str
    age_s: float
    verdict: str | None = None
    reason: str | None = None
    holder: str | None = None
    subject: str | None = None
    refs: dict[str, str] = field(default_factory=dict)
    progress: dict[str, Any] | None = (
        None  # a running request's last heartbeat record (bridge/bus/progress.py)
    )
    elapsed_s: float | None = None  # since its runner began serving it
    holder_live: bool | None = None  # whether the holder's lease still runs
    lease_until: str | None = None


class Client:
    def __init__(self, config: Config, root: Path | None = None, remote: str | None = None):
        self.config = config
        self.root = (root or project_root()).resolve()
        self.in_repo = git.is_repo(self.root)
        if not self.in_repo:  # checked first: nothing (no embedded bus, no object store) is made here
            raise not_in_project(self.root)
        self.remote = default_remote(config, self.root) if remote is None else remote
        self.url = resolve_remote(self.remote, self.root, config)
        self.bus = Bus(self.url, self.root, config.git_timeout_s)
        # what the last `request` did that its caller should say: the earlier request an idempotency key
        # returned (`reused`), and why it chose the label it did among several (`label_note`)
        self.reused = False
        self.label_note: str | None = None

    @property
    def bus_dir(self) -> Path | None:
        """The bus repository, when it is on a local path."""
        return self.bus.local_dir()

    # --- request ------------------------------------------------------------------------------------

    def request(
        self,
        preset_name: str,
        raw: Mapping[str, Any],
        label: str | Sequence[str],
        *,
        subject: str | None = None,
        expires_s: float | None = None,
        allow_dirty: bool = False,
        registry: Mapping[str, Preset] | None = None,
        idempotency_key: str | None = None,
    ) -> Manifest:
        """Validate against the local registry, build the request commit on the subject, push it.

        `label`: one runner label, or several in order of preference ('h200,h100'): the first with a live
        runner wins, none live: the first. `expires_s`: a request no runner has started by then ends as
        `expired` (the manifest's expires_at, at most MAX_TTL). `idempotency_key`: a retry with the same key
        and the same content (preset, parameters, labels, subject) returns the first request, queued, running
        or done; other content under the same key is refused (`IDEM_PREFIX`)."""
        from bridge.presets.registry import get_preset, load_registry

        self.reused, self.label_note = False, None
        preset = get_preset(registry if registry is not None else load_registry(), preset_name)
        labels = runner_labels(label)
        for each in labels:
            preset.check_runs_on(each)
        values = preset.validate_params(raw)
        ttl_s = expires_s or self.config.request_ttl_s
        if ttl_s > MAX_TTL.total_seconds():
            raise InvalidRequest(
                f"--expires {age(ttl_s)} is too long: a request waits for a runner at most "
                f"{age(MAX_TTL.total_seconds())}; give --expires 7d or less"
            )
        subject_sha, snapshot_of = self.subject(subject, allow_dirty)
        key: str | None = None
        content: str | None = None
        if idempotency_key is not None:
            key = Idempotency.key_hash(idempotency_key)
            content = self.content(preset, values, labels, subject_sha, snapshot_of)
            first = self.idempotent(idempotency_key, preset, content)
            if first is not None:
                self.reused = True
                return first
        chosen = self.pick_label(labels)
        refuse_unsigned(self.bus, chosen, self.config.signing_key, self.root)  # bridge/bus/presence.py
        now = utcnow()
        rid = new_id(preset.name, now)
        manifest = Manifest(
            id=rid,
            preset=preset.name,
            params=dict(raw),
            subject=subject_sha,
            runner=chosen,
            requester=self.requester(),
            created_at=now,
            expires_at=now + dt.timedelta(seconds=ttl_s),
            nonce=secrets.token_hex(8),
            snapshot_of=snapshot_of,
        )
        sha = git.child_commit(
            self.bus.store,
            subject_sha,
            {MANIFEST_PATH: manifest.dump()},
            f"kakeya request {rid}: {preset.name} on {chosen}",
            self.who(),
            key_file(self.config.signing_key),
        )
        updates = [Update(req_ref(chosen, rid), sha, None)]
        if key is not None:  # the request and its key in one atomic push: of two retries, one wins
            marker = Idempotency(key_sha256=key, labels=labels, id=rid).dump()
            idem = git.child_commit(
                self.bus.store, sha, {IDEM_PATH: marker}, f"kakeya key of {rid}", self.who()
            )
            updates.append(Update(idem_ref(key), idem, None))
        if not self.bus.ls_remote(LAYOUT_PREFIX).layouts:  # a new bus: say which layout it speaks
            self.bus.push([Update(layout_ref(), self.layout_marker(), None)])  # either writer's is fine
        if not self.bus.swap(updates, atomic=True):
            if idempotency_key is not None and content is not None:  # a concurrent retry pushed first
                first = self.idempotent(idempotency_key, preset, content)
                if first is not None:
                    self.reused = True
                    return first
            raise BusError(f"request id {rid} is already taken on the bus; try again")
        return manifest

    def pick_label(self, labels: Sequence[str]) -> str:
        """The first of `labels` a live runner serves (one listing of the presences); none: the first. With
        several labels, `label_note` says which it took and why."""
        if len(labels) == 1:
            return labels[0]
        snap = self.bus.ls_remote(RUNNERS_PREFIX)
        now = utcnow()
        seen = read_presences(self.bus, snap.runners, trusted_signers(self.root) if self.in_repo else None)
        chosen = next((lb for lb in labels if any(s.serves(lb, now) for s in seen)), None)
        if chosen is None:
            self.label_note = f"no live runner serves {', '.join(labels)}: queued on {labels[0]}, the first"
            return labels[0]
        if chosen != labels[0]:
            skipped = labels[: labels.index(chosen)]
            self.label_note = f"no live runner serves {', '.join(skipped)}: fell back to {chosen}"
        else:
            self.label_note = f"a live runner serves {chosen}, the first choice"
        return chosen

    def content(
        self,
        preset: Preset,
        values: Mapping[str, Any],
        labels: Sequence[str],
        subject: str,
        snapshot_of: str | None,
    ) -> str:
        """What an idempotent retry must match, hashed: the preset, its typed parameters, the runner labels in
        order and the subject (a snapshot of a dirty tree: its files, not the new commit each one makes)."""
        shown = subject
        if snapshot_of:
            tree = git.out(self.repo_with(subject), "rev-parse", subject + "^{tree}")
            shown = f"snapshot of {snapshot_of}: tree {tree}"
        content = {"preset": preset.name, "params": dict(values), "labels": list(labels), "subject": shown}
        return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def idempotent(self, given: str, preset: Preset, content: str) -> Manifest | None:
        """The request made earlier with the key hashed `key` (its one ref, `idem_ref`), or None when there is
        none. Its content is read from its own request.json, never taken on trust from the key's file:
        InvalidRequest when it differs from `content`, BusError when the key's ref names no request."""
        key = Idempotency.key_hash(given)
        ref = idem_ref(key)
        sha = self.bus.ls_remote(ref).refs.get(ref)
        if sha is None:
            return None
        self.bus.fetch_ids([sha], "the idempotency key's request")
        first = parse_or_none(Idempotency, self.local_files([f"{sha}:{IDEM_PATH}"]).get(f"{sha}:{IDEM_PATH}"))
        manifest = read_manifests(self.bus.repos(), [sha]).get(sha)
        if (
            first is None
            or first.key_sha256 != key
            or not isinstance(manifest, Manifest)
            or manifest.id != first.id
            or manifest.runner not in first.labels
        ):
            raise BusError(f"the idempotency key's ref {ref} on the bus is not a request's; delete it")
        try:
            same = manifest.preset == preset.name and content == self.content(
                preset,
                preset.validate_params(manifest.params),
                first.labels,
                manifest.subject,
                manifest.snapshot_of,
            )
        except InvalidRequest:  # parameters this registry does not take: not the same request
            same = False
        if not same:
            raise InvalidRequest(
                f"idempotency key {given!r} was used for request {first.id} with other content (preset, "
                "parameters, runner labels or subject differ); use a new key for a new request"
            )
        return manifest

    def layout_marker(self) -> str:
        """The commit the layout marker ref (`layout_ref`) points at: a root commit that says the layout."""
        text = f"kakeya bus layout {LAYOUT} (kakeya >= {LAYOUT_KAKEYA[LAYOUT]})\n"
        tree = git.tree_with(self.bus.store, None, {".kakeya/layout.txt": text.encode()})
        return git.commit(self.bus.store, tree, [], text, "kakeya <kakeya@kakeya.invalid>")

    def subject(self, rev: str | None, allow_dirty: bool) -> tuple[str, str | None]:
        """(subject sha, HEAD it snapshots or None): REV, or HEAD when the tree is clean, or a snapshot."""
        if not self.in_repo:
            raise InvalidRequest(f"{self.root} is not a git repository: a request runs a commit of one")
        if rev:
            if allow_dirty:
                raise InvalidRequest(
                    "--allow-dirty snapshots the working tree on HEAD; it cannot go with --subject"
                )
            return self.rev_parse(rev), None
        head = self.rev_parse("HEAD")
        dirty = self.dirty_paths()
        if not dirty:
            return head, None
        if allow_dirty:
            return self.snapshot(head), head
        # only changes to tracked files block: untracked ones (results/, notes) are only said
        tracked = self.dirty_paths(untracked=False)
        if not tracked:
            print(
                f"kakeya: warning: {len(dirty)} untracked file(s) ({shown(dirty)}) are not sent: a runner "
                "sees HEAD (--allow-dirty sends a snapshot with them)",
                file=sys.stderr,
            )
            return head, None
        raise InvalidRequest(
            f"the working tree has uncommitted changes ({shown(tracked)}): a runner would not see them. "
            "Commit them, or pass --allow-dirty to send a snapshot of the working tree",
            code="dirty-tree",
            hint="commit the changes, or pass --allow-dirty",
        )

    def rev_parse(self, rev: str) -> str:
        sha = git.rev_parse(self.root, rev)
        if sha is None:
            raise InvalidRequest(f"{rev!r} is not a commit in {self.root}")
        return sha

    def dirty_paths(self, untracked: bool = True) -> list[str]:
        return [p for p in git.dirty_paths(self.root, untracked) if not p.startswith(".kakeya/")]

    def snapshot(self, head: str) -> str:
        """A commit of the working tree (tracked and untracked, minus ignored) on HEAD: the user's branch,
        index and files stay as they are."""
        tree = git.working_tree(self.root)
        return git.commit(
            self.root, tree, [head], f"kakeya: snapshot of the working tree on {head[:12]}", self.who()
        )

    def who(self) -> str:
        """'Name <email>' as git would sign a commit here (env and config), else user@host."""
        m = re.match(r"^(.*?) <(.*)> \d+ [+-]\d{4}$", git.ident(self.bus.store))
        if m and m.group(2):
            return f"{m.group(1)} <{m.group(2)}>"
        return f"{getpass.getuser()} <{getpass.getuser()}@{platform.node()}>"

    def requester(self) -> str:
        return self.who().rsplit("<", 1)[1].rstrip(">")

    # --- reading the bus ----------------------------------------------------------------------------

    def entry(self, request_id: str, label: str | None = None) -> Entry:
        """One request's refs, from one prefix-scoped listing of just its refs (and of the live requests of
        `label`, or of every label when it is not known)."""
        id_time(request_id)
        snap = self.bus.ls_remote(
            req_ref(label, request_id) if label else REQ_PREFIX,
            claim_ref(request_id),
            done_ref(request_id),
            cancel_ref(request_id),
            L.map_ref("date"),
        )
        entry = snap.entries.get(request_id)
        if entry is None:  # finished long ago: its done ref went into the ledger (its day's shard, by id)
            found = L.read(self.bus, L.read_map(self.bus, snap, "date"), [L.date_shard(request_id)])
            entry = L.as_entries(e for e in found if e.id == request_id).get(request_id)
        if entry is None:
            raise KakeyaError(f"no request {request_id} on the bus at {self.url}", code="not-found")
        return entry

    def resolve_id(self, text: str) -> str:
        """The request id `text` names: the id itself, a unique prefix of one that gives at least its date
        (`20261125T1615`), or the start of its six-hex suffix (`663f0b`) among the live requests and those of
        the last two days; from one prefix-scoped listing (never the whole bus). KakeyaError otherwise:
        `not-found`, `ambiguous-id` (naming the candidates) or `bad-id`."""
        if parse_id(text) is not None:
            return text
        if ID_RE.fullmatch(text):  # shaped as a whole id, but not one (a 13th month, far in the future)
            raise InvalidRequest(f"{text!r} is not a request id ({ID_RULE})", code="bad-id")
        if re.fullmatch(r"\d{8}[0-9A-Za-z._-]*", text):
            scoped = (CLAIM_PREFIX + text, DONE_PREFIX + text, CANCEL_PREFIX + text)
            snap = self.bus.ls_remote(REQ_PREFIX, *scoped, L.map_ref("date"))
            found = {rid for rid in snap.entries if rid.startswith(text)}
            ledger = L.read_map(
                self.bus, snap, "date"
            )  # finished long ago: in the ledger's shard of that day
            found |= {e.id for e in L.read(self.bus, ledger, [L.date_shard(text)]) if e.id.startswith(text)}
        elif re.fullmatch(r"[0-9a-f]{4,6}", text):
            snap = self.bus.ls_remote(*LIVE, *(DONE_PREFIX + day for day in recent_days()))
            found = {rid for rid in snap.entries if rid.rsplit("-", 1)[1].startswith(text)}
        else:
            raise InvalidRequest(
                f"{text!r} is not a request id ({ID_RULE}), nor a prefix of one that gives at least its "
                "date (20261125T1615...), nor the start of its six-hex suffix (663f0b)",
                code="bad-id",
            )
        if len(found) == 1:
            return found.pop()
        if not found:
            raise KakeyaError(
                f"no request matching {text!r} on the bus at {self.url}",
                code="not-found",
                hint="`kakeya status` lists the requests (a six-hex suffix matches those of the last two days)",
            )
        candidates = sorted(found)
        raise KakeyaError(
            f"{text!r} matches {len(candidates)} requests: {shown(candidates, 10)}; give more of the id",
            code="ambiguous-id",
            candidates=candidates[:100],
        )

    def local_files(self, specs: Sequence[str]) -> dict[str, bytes]:
        """`<sha>:<path>` -> content for the objects this machine already has (and a local bus has)."""
        return git.read_blobs_in(self.bus.repos(), specs)

    def ensure(
        self, entries: Iterable[Entry], kinds: Sequence[str] = ("done",), in_store: bool = False
    ) -> None:
        """Fetch (one round trip) the given refs of `entries` whose commits are not here yet (in the store or,
        unless `in_store`, in a local bus)."""
        wanted = sorted({sha for e in entries for k in kinds if (sha := getattr(e, k))})
        self.bus.fetch_ids(wanted, "commits", in_store=in_store)

    def repo_with(self, sha: str) -> Path:
        """The local repository that has `sha`: the store, or a local bus."""
        return git.repo_having(self.bus.repos(), sha)

    def status(self, fetch: bool = False, everything: bool = False, days: int = 2) -> list[Row]:
        """The live requests and those finished in the last `days` days (by id date; `everything`:
        every done ref) from one prefix-scoped listing; verdicts and leases for commits already here (`fetch`
        fetches the missing done commits first: one more round trip)."""
        done = [DONE_PREFIX] if everything else [DONE_PREFIX + day for day in recent_days(days)]
        snap = self.bus.ls_remote(*LIVE, *done, *([L.map_ref("date")] if everything else []))
        if everything:  # the history in the ledger too: every day's shard, fetched by object id in one go
            ledger = L.read_map(self.bus, snap, "date")
            days = list(ledger.shards if ledger else {})
            for rid, e in L.as_entries(L.read(self.bus, ledger, days)).items():
                snap.entries.setdefault(rid, e)
        entries = sorted(snap.entries.values(), key=lambda e: e.id)
        if fetch:
            self.ensure(entries, ("done", "claim"))  # a done request's claim is its done commit: no extra
        return self.rows(entries)

    def status_one(self, request_id: str) -> Row:
        entry = self.entry(request_id)
        self.ensure([entry], ("req", "claim", "done"))
        return self.rows([entry])[0]

    def rows(self, entries: Sequence[Entry]) -> list[Row]:
        specs: dict[str, str] = {}
        for e in entries:
            if e.done:
                specs[e.id] = f"{e.done}:{results_path(e.id)}/result.json"
            elif e.claim:
                specs[e.id] = f"{e.claim}:{CLAIM_PATH}"
        found = self.local_files(list(specs.values()))
        # a finished request's commit went with its ref: its done commit holds the same request.json
        manifests = read_manifests(self.bus.repos(), [c for e in entries if (c := e.req or e.done)])
        now = utcnow()
        rows = []
        for e in entries:
            created = e.created_at
            data = found.get(specs.get(e.id, ""))
            manifest = m if isinstance(m := manifests.get(e.req or e.done or ""), Manifest) else None
            result = parse_or_none(RunResult, data) if e.done else None
            claim = parse_or_none(Claim, data) if e.claim and not e.done else None
            status = result.status if result else None
            row = Row(
                e.id,
                request_state(e, now, manifest=manifest, claim=claim, result_status=status),
                e.preset,
                e.label or (manifest.runner if manifest else None),
                created.isoformat(timespec="milliseconds"),
                round((now - created).total_seconds(), 3),
                subject=manifest.subject if manifest else None,
                refs={k: v for k in ("req", "claim", "done", "cancel") if (v := getattr(e, k))},
            )
            if result:
                row.verdict, row.reason, row.holder = result.verdict, result.reason, result.runner_name
            elif row.state == "expired" and manifest is not None:  # unclaimed past its queue timeout
                row.reason = (
                    f"no runner started it before {manifest.expires_at.isoformat(timespec='seconds')}"
                )
            elif claim:
                row.holder = claim.runner
                row.holder_live = claim.lease_until >= now
                row.lease_until = claim.lease_until.isoformat(timespec="seconds")
                if claim.progress is not None:
                    row.progress = claim.progress.model_dump(mode="json")
                    row.elapsed_s = round((now - claim.progress.started_at).total_seconds(), 1)
            rows.append(row)
        return rows

    def wait(self, request_id: str, timeout: float | None = None, poll_s: float | None = None) -> str:
        """The done commit of `request_id`, once there is one (polls with ls-remote)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        poll_s = poll_s or self.config.poll_interval_s
        label = None
        while True:
            entry = self.entry(request_id, label)
            label = entry.label or label
            if entry.done:
                return entry.done
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"timed out after {timeout:g} s waiting for {request_id} (state: {entry.state})",
                    id=request_id,
                    state=entry.state,
                )
            time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))

    def results(
        self, request_id: str, out: Path, done: str | None = None, signers: Signers | None = None
    ) -> RunResult:
        """Fetch the done commit and write its .kakeya/results/<id>/ files into `out`; with `signers`, only
        when it is a runner's signed done commit for its request (KakeyaError says why not)."""
        entry = self.entry(request_id) if done is None else Entry(request_id, done=done)
        if entry.done is None:
            raise KakeyaError(
                f"{request_id} has no results yet (state: {entry.state}); `kakeya wait {request_id}`",
                code="not-done",
            )
        self.ensure([entry])
        repo = self.repo_with(entry.done)
        files = git.read_dir(repo, entry.done, results_path(request_id))
        if signers is not None:
            problem = done_problem(repo, request_id, entry.done, entry.req, entry.label, signers)
            if problem:
                raise KakeyaError(f"{request_id}: its results are not trusted: {problem}", code="untrusted")
        if "result.json" not in files:
            raise KakeyaError(f"done commit {entry.done[:12]} of {request_id} has no result.json")
        out.mkdir(parents=True, exist_ok=True)
        for rel, data in files.items():
            parts = PurePosixPath(rel).parts
            if not parts or any(p in ("", ".", "..") for p in parts):
                continue
            target = out.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        try:
            return RunResult.model_validate_json(files["result.json"])
        except ValidationError as exc:
            raise KakeyaError(
                f"result.json of {request_id} is not a valid result: {problems(exc, 'result', limit=1)}"
            ) from None

    # --- writing ------------------------------------------------------------------------------------

    def cancel(self, request_id: str, reason: str = "") -> str:
        """Push a cancel marker; returns the state the request was in."""
        entry = self.entry(request_id)
        if entry.done:
            raise KakeyaError(f"{request_id} is already done; nothing to cancel", code="already-done")
        if entry.cancel:
            return "cancelled"
        if entry.req is None:
            raise KakeyaError(f"{request_id} has no request ref on the bus; nothing to cancel")
        self.ensure([entry], ("req",), in_store=True)
        marker = CancelMarker(id=request_id, by=self.requester(), at=utcnow(), reason=reason)
        sha = git.child_commit(
            self.bus.store,
            entry.req,
            {CANCEL_PATH: marker.dump()},
            f"kakeya cancel {request_id}",
            self.who(),
        )
        self.bus.swap([Update(cancel_ref(request_id), sha, None)], atomic=False)
        return entry.state

    def gc(self, older_than_days: float, dry_run: bool = False, archive_done: bool = False) -> list[str]:
        """Delete the req/claim/cancel refs of finished requests older than the cutoff (and the branches of
        requests no runner will run: cancelled before a claim, or expired unclaimed); done refs stay, or with
        `archive_done` move to refs/kakeya-archive/done/<id> (kept, but out of every clone's fetch and of
        `kakeya status` and `gate pr`). Result side refs left behind (refs/kakeya-stage/<id>/...) of done or
        vanished requests go too, whatever their age, and the idempotency keys of requests older than the
        cutoff (`stale_keys`). Returns the refs deleted (or that would be)."""
        cutoff = utcnow() - dt.timedelta(days=older_than_days)
        snap = self.bus.ls_remote(*LIVE, DONE_PREFIX, *([SUBJECT_PREFIX] if archive_done else []))
        entries = [e for e in snap.entries.values() if e.done and e.created_at < cutoff]
        # side refs a runner could not delete after its done push (stage_ref): useless once the request
        # is done (the done commit holds the result) or gone; a request still running keeps its own
        stale = [
            Update(ref, None, sha)
            for ref, sha in self.bus.stage_refs().items()
            if (e := snap.entries.get(ref[len(STAGE_PREFIX) :].split("/")[0])) is None or e.done
        ]
        stale += self.stale_keys(cutoff, {rid for rid, e in snap.entries.items() if e.req and not e.done})
        updates = [
            Update(ref, None, sha)
            for e in entries
            for ref, sha in (
                (req_ref(e.label or "", e.id), e.req),
                (claim_ref(e.id), e.claim),
                (cancel_ref(e.id), e.cancel),
                (done_ref(e.id), e.done if archive_done else None),
            )
            if sha
        ]
        # requests no runner will ever run: cancelled before any claim, or unclaimed for longer than any request
        # may wait (MAX_TTL: expired, whatever the manifest says). A runner of their label closes them with a
        # done commit; where no runner serves the label their branches stay under refs/heads: gc deletes them.
        past_ttl = utcnow() - MAX_TTL
        never = [
            e
            for e in snap.entries.values()
            if e.req and not e.claim and not e.done and e.created_at < cutoff
            if e.cancel or e.created_at < past_ttl
        ]
        updates += [
            Update(ref, None, sha)
            for e in never
            for ref, sha in ((req_ref(e.label or "", e.id), e.req), (cancel_ref(e.id), e.cancel))
            if sha
        ]
        # a cancel marker left behind by a request that finished (or went) meanwhile
        updates += [
            Update(cancel_ref(e.id), None, e.cancel)
            for e in snap.entries.values()
            if e.cancel and not e.req and not e.claim and not e.done
        ]
        if archive_done:  # the archive ref is created in the same atomic push that deletes the done ref
            updates += [Update(archive_ref(e.id), e.done, None) for e in entries]
            updates += [  # and the index refs go with it: gate pr reads what is not archived
                Update(subject_ref(subject, e.id), None, sha)
                for e in entries
                if e.id in snap.index
                for subject, sha in [snap.index[e.id]]
            ]
        if dry_run:
            return [u.ref for u in stale + updates if u.new is None]
        deleted = self._push_chunks(stale)
        if archive_done:
            self.ensure(entries, ("done",), in_store=True)  # pushing the archive ref needs its commit here
            of: dict[str, list[Update]] = {}
            for u in updates:
                of.setdefault(u.ref.rsplit("/", 1)[1], []).append(u)
            for i in range(0, len(entries), self._gc_chunk()):
                chunk = [u for e in entries[i : i + self._gc_chunk()] for u in of.get(e.id, [])]
                status = self.bus.push(chunk, atomic=True)
                deleted += [u.ref for u in chunk if u.new is None and status.get(u.ref, (False, ""))[0]]
            return deleted
        return deleted + self._push_chunks(updates)

    def stale_keys(self, cutoff: dt.datetime, live: set[str]) -> list[Update]:
        """Deletions of the idempotency key refs (`IDEM_PREFIX`) of requests made before `cutoff` that are not
        live (a retry after that makes a new request), and of key refs that name no request."""
        text = self.bus.list([IDEM_PREFIX])
        refs = {ref: sha for sha, _, ref in (line.partition("\t") for line in text.splitlines()) if ref}
        self.bus.fetch_ids(sorted(set(refs.values())), "idempotency keys")
        found = self.local_files([f"{sha}:{IDEM_PATH}" for sha in refs.values()])
        out = []
        for ref, sha in refs.items():
            key = parse_or_none(Idempotency, found.get(f"{sha}:{IDEM_PATH}"))
            made = parse_id(key.id) if key is not None else None
            if key is None or made is None or (made.time < cutoff and key.id not in live):
                out.append(Update(ref, None, sha))
        return out

    def migrate(self, dry_run: bool = False) -> list[str]:
        """Upgrade a bus of layout 1 (everything under refs/heads/kakeya/) to layout 2: each claim, done, cancel
        and presence ref moves under refs/kakeya/, each done result is indexed under its subject, and the
        request, claim and cancel refs of finished requests go; then the layout marker is written. Every
        update is leased on the sha seen, so a runner of layout 1 that moves a claim meanwhile loses that
        lease (it stops), never a result; run it again (idempotent) until it moves nothing. Returns the refs
        written or deleted (or that would be)."""
        snap = self.bus.ls_remote(*OLD_PREFIXES, *LIVE, DONE_PREFIX, SUBJECT_PREFIX, check=False)
        old = Snapshot.parse("".join(f"{sha}\t{NS}{ref[len(PREFIX) :]}\n" for ref, sha in snap.old.items()))
        updates: list[Update] = []
        dones = [e for e in old.entries.values() if e.done]
        # every commit it pushes must be in the store (a push packs from there), and the done results are read
        self.bus.fetch_ids(sorted(set(snap.old.values())), "layout 1 commits", in_store=True)
        manifests = read_manifests(self.bus.repos(), [e.done for e in dones if e.done])
        for e in old.entries.values():
            now = snap.entries.get(e.id)
            for kind in ("claim", "done", "cancel"):
                sha = getattr(e, kind)
                if sha is None:
                    continue
                ref = f"{NS}{kind}/{e.id}"
                keep = kind == "done" or not e.done  # a finished request keeps only its done ref
                if keep and (now is None or getattr(now, kind) is None):
                    updates.append(Update(ref, sha, None))
                updates.append(Update(f"{PREFIX}{kind}/{e.id}", None, sha))
            if e.done:
                manifest = manifests.get(e.done)
                if isinstance(manifest, Manifest) and e.id not in snap.index:
                    updates.append(Update(subject_ref(manifest.subject, e.id), e.done, None))
                if now is not None and now.req:
                    updates.append(Update(req_ref(now.label or "", e.id), None, now.req))
        for name, sha in old.runners.items():
            if name not in snap.runners:
                updates.append(Update(runner_ref(name), sha, None))
            updates.append(Update(f"{PREFIX}runners/{name}", None, sha))
        if str(LAYOUT) not in snap.layouts:
            updates.append(Update(layout_ref(), None if dry_run else self.layout_marker(), None))
        if dry_run:
            return [u.ref for u in updates]
        return self._push_chunks(updates)

    def compact(self, older_than_days: float, dry_run: bool = False) -> list[str]:
        """Move the done results made more than `older_than_days` ago into the ledger (bridge/bus/ledger.py), and
        delete the shard refs an earlier ledger kept. Returns the refs deleted (or that would be)."""
        cutoff = utcnow() - dt.timedelta(days=older_than_days)
        return L.compact(self.bus, cutoff, self.who(), dry_run=dry_run)

    def _gc_chunk(self) -> int:
        return GC_CHUNK_RECEIVE_PACK if self.bus.receive_pack else GC_CHUNK

    def _push_chunks(self, updates: list[Update]) -> list[str]:
        """Push ref updates (deletions, moves) in chunks, each leased on its sha; the refs the bus took."""
        done: list[str] = []
        for i in range(0, len(updates), self._gc_chunk()):
            chunk = updates[i : i + self._gc_chunk()]
            status = self.bus.push(chunk)
            done += [u.ref for u in chunk if status.get(u.ref, (False, ""))[0]]
        return done


def row_dict(row: Row) -> dict[str, Any]:
    return asdict(row)
