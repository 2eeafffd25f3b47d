"""Runner presence: which runners are alive, for which labels, and what they serve.

Each runner (`kakeya runner once|watch`) keeps `refs/kakeya/runners/<name>` up to date: a single root commit
(no history piles up) holding .kakeya/presence.json, replaced when the runner starts, every `every_s`
seconds, when it starts or ends serving a request, and when it stops. A presence is live while
`seen_at + STALE_AFTER * every_s` has not passed and the runner has not said it stopped; after that it ages
out of `kakeya runners`. A presence that is unreadable, names another runner, or (when the project has an
allowed-signers file) is not signed by a runner key for its labels is shown as such and never counts as a
live runner for a label. A runner that rejects unsigned requests says so (`require_signed_requests`), and
`kakeya request` refuses up front an unsigned request that only such runners would see (`refuse_unsigned`).

    beacon = Beacon(bus, mirror, "h200-1", ["h200"], who, sign_key, every_s=30, log=print)
    beacon.start(); beacon.serving(request_id); beacon.serving(None); beacon.close()
    seen = read_presences(bus, snapshot.runners, signers)        # client side: [Seen]
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import AwareDatetime, Field, ValidationError

from bridge.bus.bus import Bus
from bridge.bus.records import RUNNERS_PREFIX, Update, _File, runner_ref, utcnow
from bridge.bus.trust import Signers, key_file, trusted_signers
from bridge.core.errors import InvalidRequest, KakeyaError
from bridge.core.names import RUNNER_NAME_RE
from bridge.host import host_fingerprint, tool_versions
from bridge.wire import git

PRESENCE_PATH = ".kakeya/presence.json"
STALE_AFTER = 3  # a presence not refreshed for this many intervals is stale


class Presence(_File):
    """.kakeya/presence.json."""

    schema_version: Literal[1] = 1
    name: str
    labels: list[str] = Field(min_length=1)
    host: str
    accelerator: str  # e.g. "cuda: NVIDIA H200", "metal: Apple M4", "none"
    version: str  # the kakeya version the runner runs
    pid: int
    started_at: AwareDatetime
    seen_at: AwareDatetime
    every_s: float = Field(gt=0, le=24 * 3600)  # how often it is refreshed
    state: Literal["idle", "serving", "stopped"]
    serving: str | None = None  # the request it is serving
    paused: str | None = Field(default=None, max_length=500)  # why it claims nothing now (a full disk)
    require_signed_requests: bool = False  # it rejects a request not signed by one of its allowed requesters

    def dump(self) -> bytes:
        """The file; `require_signed_requests` only when true, so that a presence of a runner that takes any
        request reads as before to clients that do not know the field."""
        skip = None if self.require_signed_requests else {"require_signed_requests"}
        return (self.model_dump_json(indent=2, exclude=skip) + "\n").encode()

    def live_until(self) -> dt.datetime:
        return self.seen_at + dt.timedelta(seconds=STALE_AFTER * self.every_s)


def accelerator(fingerprint: Mapping[str, object]) -> str:
    """One line for host.host_fingerprint()'s accelerator."""
    acc = fingerprint.get("accelerator")
    if isinstance(acc, dict):
        return f"{acc.get('kind')}: {', '.join(str(d) for d in acc.get('devices') or [])}"
    return "none"


class Beacon(threading.Thread):
    """Keeps one runner's presence ref up to date from a thread; a failed push is logged and retried later."""

    def __init__(
        self,
        bus: Bus,
        store: Path,
        name: str,
        labels: list[str],
        *,
        who: str,
        sign_key: str | None,
        every_s: float,
        host: str,
        accelerator: str,
        version: str,
        log: Callable[[str], None],
        paused: str | None = None,
        require_signed_requests: bool = False,
    ):
        super().__init__(name=f"presence-{name}", daemon=True)
        if not RUNNER_NAME_RE.match(name):
            raise KakeyaError(
                f"runner name {name!r} cannot name a presence ref: use letters, digits, '.', '-' or '_'"
            )
        self.bus, self.store, self.who, self.sign_key, self.log = bus, store, who, sign_key, log
        self.ref = runner_ref(name)
        now = utcnow()
        self.presence = Presence(
            name=name,
            labels=labels,
            host=host,
            accelerator=accelerator,
            version=version,
            pid=os.getpid(),
            started_at=now,
            seen_at=now,
            every_s=every_s,
            state="idle",
            paused=paused,
            require_signed_requests=require_signed_requests,
        )
        self.sha: str | None = None  # what we last pushed
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            self.publish()
            self._wake.wait(self.presence.every_s)
            self._wake.clear()

    def serving(self, request_id: str | None) -> None:
        """Say (at once, from the thread) that the runner now serves `request_id` (None: nothing)."""
        with self._lock:
            self.presence = self.presence.model_copy(
                update={"state": "serving" if request_id else "idle", "serving": request_id}
            )
        self._wake.set()

    def pause(self, why: str | None) -> None:
        """Say (at once, from the thread) why the runner claims nothing now; None: it claims again."""
        with self._lock:
            self.presence = self.presence.model_copy(update={"paused": why})
        self._wake.set()

    def close(self) -> None:
        """Stop the thread and say the runner stopped (its presence is no longer live)."""
        self._halt.set()
        self._wake.set()
        if self.is_alive():
            self.join()
        with self._lock:
            self.presence = self.presence.model_copy(update={"state": "stopped", "serving": None})
        self.publish()

    def publish(self) -> bool:
        with self._lock:
            presence = self.presence.model_copy(update={"seen_at": utcnow()})
        try:
            tree = git.tree_with(self.store, None, {PRESENCE_PATH: presence.dump()})
            message = f"kakeya presence {presence.name}: {presence.state}"
            sha = git.commit(self.store, tree, [], message, self.who, self.sign_key)
            # our last push; at start whatever is there (a restart, or a namesake): one listing, not a failed push
            expect = self.sha if self.sha is not None else self.bus.ls_remote(self.ref).refs.get(self.ref)
            for _ in range(2):  # our last push, else whatever is there (a restart, or a namesake)
                if self.bus.swap([Update(self.ref, sha, expect)], atomic=False):
                    self.sha = sha
                    return True
                expect = self.bus.ls_remote(self.ref).refs.get(self.ref)
            self.log(
                f"could not update the presence ref {self.ref}: it keeps changing (a runner of the same name?)"
            )
        except KakeyaError as exc:
            self.log(f"could not update the presence ref {self.ref}, will retry: {exc}")
        return False


@dataclass
class Seen:
    """One presence ref as a client reads it."""

    name: str
    sha: str
    presence: Presence | None
    problem: str | None = None  # why it is not trusted (malformed, unsigned, ...)

    def state(self, now: dt.datetime) -> str:
        """live states: idle, serving; else stopped, stale, or 'malformed'/'untrusted' (never routed to)."""
        if self.presence is None:
            return "malformed"
        if self.problem:
            return "untrusted"
        if self.presence.state == "stopped":
            return "stopped"
        if self.presence.live_until() < now:
            return "stale"
        return self.presence.state

    def live(self, now: dt.datetime) -> bool:
        return self.state(now) in ("idle", "serving")

    def serves(self, label: str, now: dt.datetime) -> bool:
        return self.live(now) and self.presence is not None and label in self.presence.labels

    def as_dict(self, now: dt.datetime) -> dict[str, object]:
        base: dict[str, object] = {"name": self.name, "state": self.state(now), "sha": self.sha}
        if self.problem:
            base["problem"] = self.problem
        if self.presence is not None:
            base.update(self.presence.model_dump(mode="json", exclude={"name", "state"}))
            base["seen_s_ago"] = round((now - self.presence.seen_at).total_seconds(), 1)
        return base


def read_presences(bus: Bus, refs: Mapping[str, str], signers: Signers | None = None) -> list[Seen]:
    """The presences named by `refs` (runner name -> commit, from a Snapshot), fetching the commits that are
    not here yet in one round trip; with `signers`, a presence must be signed by a runner key allowed for
    every label it claims."""
    repos = bus.repos()
    try:
        bus.fetch_ids(list(refs.values()), "presences")  # by object id, only those not here yet
    except KakeyaError:  # moved meanwhile: those show as malformed until the next look
        pass
    found = git.read_blobs_in(repos, [f"{s}:{PRESENCE_PATH}" for s in refs.values()])
    seen = []
    for name, sha in refs.items():
        raw = found.get(f"{sha}:{PRESENCE_PATH}")
        try:
            presence = Presence.model_validate_json(raw or b"")
        except ValidationError as exc:
            seen.append(Seen(name, sha, None, f"malformed presence: {exc.error_count()} problem(s)"))
            continue
        problem = None
        if presence.name != name:
            problem = f"names runner {presence.name!r}, not {name!r}"
        elif signers is not None:
            problem = signed_problem(git.repo_having(repos, sha), sha, presence, signers)
        seen.append(Seen(name, sha, presence, problem))
    return seen


def refuse_unsigned(bus: Bus, label: str, signing_key: str, root: Path) -> None:
    """Refuse an unsigned request (no `signing_key`) for `label` when every live runner of the label requires
    signed requests (their presences say so): it would only wait on the bus until one of them rejected it. A
    label with no live runner, or with one runner that takes unsigned requests, is not refused. `root`: the
    project, whose allowed-signers file (if any) decides which presences are trusted."""
    if key_file(signing_key) is not None:
        return
    now = utcnow()
    signers = trusted_signers(root) if git.is_repo(root) else None
    seen = read_presences(bus, bus.ls_remote(RUNNERS_PREFIX).runners, signers)
    live = [s for s in seen if s.presence is not None and s.serves(label, now)]
    if live and all(s.presence is not None and s.presence.require_signed_requests for s in live):
        names = ", ".join(sorted(s.name for s in live))
        raise InvalidRequest(
            f"the runners of label {label} ({names}) take only signed requests, and this one would be unsigned: "
            "set signing_key (KAKEYA_SIGNING_KEY) to your SSH key, listed in their allowed_requesters file, "
            "and request again"
        )


def signed_problem(repo: Path, sha: str, presence: Presence, signers: Signers) -> str | None:
    ok, code, who, key = git.verify_commit(repo, sha, signers.path)
    if not ok:
        return "unsigned" if code == "N" else f"not signed by a known runner key ({key or code})"
    extra = set(presence.labels) - signers.labels.get(who, frozenset())
    return f"{who} may not serve {', '.join(sorted(extra))}" if extra else None


def host_facts() -> tuple[str, str, str]:
    """(hostname, accelerator line, kakeya version) for a presence."""
    return platform.node(), accelerator(host_fingerprint()), tool_versions().get("kakeya", "unknown")
