"""The client side of the bus: request, status, wait, results and cancel (bus administration, gc, migrate and
compact, is client/admin.py's `Admin`).

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
import platform
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from bridge.bus.bus import Bus
from bridge.bus.presence import read_presences, refuse_unsigned
from bridge.bus.records import (
    CANCEL_PATH,
    LAYOUT_PREFIX,
    MANIFEST_PATH,
    RUNNERS_PREFIX,
    CancelMarker,
    Entry,
    Manifest,
    Update,
    cancel_ref,
    layout_ref,
    new_id,
    req_ref,
    results_path,
    utcnow,
)
from bridge.bus.trust import Signers, done_problem, key_file, trusted_signers
from bridge.client import lookup
from bridge.client.remote import default_remote, not_in_project, resolve_remote
from bridge.client.request import (
    IDEM_PATH,
    Idempotency,
    LabelChoice,
    earlier_request,
    idem_ref,
    layout_marker,
    request_content,
    rev_parse,
    runner_labels,
    working_subject,
)
from bridge.client.rows import Row, age, rows
from bridge.config import MAX_TTL, Config, project_root
from bridge.core.errors import BusError, InvalidRequest, KakeyaError, WaitTimeout, problems
from bridge.core.result import RunResult
from bridge.wire import git

if TYPE_CHECKING:
    from bridge.presets.preset import Preset


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
        # returned (`reused`), which of several labels it took and why (`label_choice`), and the untracked
        # files a runner will not see (`unsent`)
        self.reused = False
        self.label_choice: LabelChoice | None = None
        self.unsent: list[str] = []

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

        self.reused, self.label_choice, self.unsent = False, None, []
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
        made = working_subject(self.root, subject, allow_dirty, self.who())
        self.unsent = made.unsent
        content: str | None = None
        if idempotency_key is not None:
            content = request_content(self.bus, preset, values, labels, made.sha, made.snapshot_of)
            if (first := self.reuse(idempotency_key, preset, content)) is not None:
                return first
        chosen = self.pick_label(labels)
        refuse_unsigned(self.bus, chosen, self.config.signing_key, self.root)  # bridge/bus/presence.py
        now = utcnow()
        manifest = Manifest(
            id=new_id(preset.name, now),
            preset=preset.name,
            params=dict(raw),
            subject=made.sha,
            runner=chosen,
            requester=self.requester(),
            created_at=now,
            expires_at=now + dt.timedelta(seconds=ttl_s),
            nonce=secrets.token_hex(8),
            snapshot_of=made.snapshot_of,
        )
        if self.push_request(manifest, labels, idempotency_key):
            return manifest
        if idempotency_key is not None and content is not None:  # a concurrent retry pushed first
            first = self.reuse(idempotency_key, preset, content)
            if first is not None:
                return first
        raise BusError(f"request id {manifest.id} is already taken on the bus; try again")

    def push_request(self, manifest: Manifest, labels: Sequence[str], idempotency_key: str | None) -> bool:
        """Write the request commit on its subject (with `idempotency_key`, the key's commit on it) and push
        them in one atomic push: of two retries, one wins. A new bus gets its layout marker first. Whether the
        bus took them (False: the request id, or the key, is already there)."""
        rid, chosen = manifest.id, manifest.runner
        sha = git.child_commit(
            self.bus.store,
            manifest.subject,
            {MANIFEST_PATH: manifest.dump()},
            f"kakeya request {rid}: {manifest.preset} on {chosen}",
            self.who(),
            key_file(self.config.signing_key),
        )
        updates = [Update(req_ref(chosen, rid), sha, None)]
        if idempotency_key is not None:
            key = Idempotency.key_hash(idempotency_key)
            marker = Idempotency(key_sha256=key, labels=list(labels), id=rid).dump()
            idem = git.child_commit(
                self.bus.store, sha, {IDEM_PATH: marker}, f"kakeya key of {rid}", self.who()
            )
            updates.append(Update(idem_ref(key), idem, None))
        if not self.bus.ls_remote(LAYOUT_PREFIX).layouts:  # a new bus: say which layout it speaks
            self.bus.push([Update(layout_ref(), layout_marker(self.bus), None)])  # either writer's is fine
        return self.bus.swap(updates, atomic=True)

    def reuse(self, idempotency_key: str, preset: Preset, content: str) -> Manifest | None:
        """The request an earlier retry with this key made (`earlier_request`), noted in `reused`."""
        first = earlier_request(self.bus, idempotency_key, preset, content)
        self.reused = first is not None
        return first

    def pick_label(self, labels: Sequence[str]) -> str:
        """The first of `labels` a live runner serves (one listing of the presences); none: the first. With
        several labels, `label_choice` says which it took and whether a live runner serves it."""
        if len(labels) == 1:
            return labels[0]
        snap = self.bus.ls_remote(RUNNERS_PREFIX)
        now = utcnow()
        seen = read_presences(self.bus, snap.runners, trusted_signers(self.root) if self.in_repo else None)
        chosen = next((lb for lb in labels if any(s.serves(lb, now) for s in seen)), None)
        self.label_choice = LabelChoice(list(labels), chosen or labels[0], live=chosen is not None)
        return self.label_choice.chosen

    def rev_parse(self, rev: str) -> str:
        return rev_parse(self.root, rev)

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
        """One request's refs (client/lookup.py); KakeyaError `not-found`."""
        return lookup.entry(self.bus, self.url, request_id, label)

    def resolve_id(self, text: str) -> str:
        """The request id `text` names: the id, a unique prefix with its date or the start of its suffix
        (client/lookup.py); KakeyaError `not-found`, `ambiguous-id` or `bad-id`."""
        return lookup.resolve_id(self.bus, self.url, text)

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
        entries = lookup.listed(self.bus, everything, days)
        if fetch:
            self.ensure(entries, ("done", "claim"))  # a done request's claim is its done commit: no extra
        return rows(self.bus, entries)

    def status_one(self, request_id: str) -> Row:
        entry = self.entry(request_id)
        self.ensure([entry], ("req", "claim", "done"))
        return rows(self.bus, [entry])[0]

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
