"""The git bus (layout 2): only request branches under refs/heads (a push there triggers Actions); claims,
results, cancels, presence, the per-subject index and the layout marker under refs/kakeya/, which no clone
or `git fetch` of a teammate sees.

    refs/heads/kakeya/req/<label>/<id>   request commit: parent = the subject; adds .kakeya/request.json
    refs/kakeya/claim/<id>               claim commit on top of the request (then heartbeats); adds
                                         .kakeya/claim.json; created only if absent
    refs/kakeya/done/<id>                result commit on top of the claim; adds .kakeya/results/<id>/...
    refs/kakeya/by-subject/<sha>/<id>    the same done commit, indexed under the subject it ran
    refs/kakeya/cancel/<id>              cancel marker on top of the request; adds .kakeya/cancel.json
    refs/kakeya/runners/<name>           a runner's presence (bridge/bus/presence.py)
    refs/kakeya/layout/<n>               the bus layout's version (LAYOUT); a client of another layout stops

What is written under each ref (request.json, claim.json, cancel.json, the results) is read through the
models here (`Manifest`, `Claim`, `CancelMarker`); a listing becomes a `Snapshot` of `Entry`s, one per
request id; `Bus` (bridge/bus/bus.py) reads and writes them.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    model_validator,
)

from bridge.config import MAX_TTL
from bridge.core.errors import BusError, InvalidRequest, problems
from bridge.core.names import LABEL, LABEL_RE, NAME, RUNNER_NAME_RE, SHA_PATTERN
from bridge.core.text import clean
from bridge.wire import git

PREFIX = "refs/heads/kakeya/"  # the trigger namespace: request branches only
REQ_PREFIX = PREFIX + "req/"
NS = "refs/kakeya/"  # everything else the bus holds
CLAIM_PREFIX = NS + "claim/"
DONE_PREFIX = NS + "done/"
CANCEL_PREFIX = NS + "cancel/"
RUNNERS_PREFIX = NS + "runners/"
SUBJECT_PREFIX = NS + "by-subject/"
LAYOUT_PREFIX = NS + "layout/"
LAYOUT = 2  # this kakeya reads and writes bus layout 2
LAYOUT_KAKEYA = {2: "0.2"}  # the first kakeya version that speaks each layout
OLD_PREFIXES = tuple(PREFIX + k for k in ("claim/", "done/", "cancel/", "runners/"))  # layout 1
LIVE = (REQ_PREFIX, CLAIM_PREFIX, CANCEL_PREFIX)  # the requests not finished yet
MANIFEST_PATH = ".kakeya/request.json"
CLAIM_PATH = ".kakeya/claim.json"
CANCEL_PATH = ".kakeya/cancel.json"
RESULTS_DIR = ".kakeya/results"
ID_RE = re.compile(rf"^(\d{{8}}T\d{{6}}\.\d{{3}}Z)-({NAME})-([0-9a-f]{{6}})\Z")
ID_EPOCH = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)  # no request is older than this
ID_SKEW = dt.timedelta(days=1)  # how far ahead of this machine's clock an id's time may be (clocks differ)
ID_RULE = (
    "expected e.g. 20260614T101502.123Z-probe-a1b2c3: a UTC time from 2020 on and at most a day ahead "
    "of now, a preset name, six hex digits"
)
CREATED_AT_SLACK = dt.timedelta(seconds=60)  # how far a manifest's created_at may be from its id's time
MANIFEST_MAX_BYTES = 64 * 1024  # a request.json larger than this is refused unread


# --- ids and refs -----------------------------------------------------------------------------------


class RequestId(NamedTuple):
    time: dt.datetime  # when the request was made (UTC, milliseconds)
    preset: str
    suffix: str  # six random hex digits: two requests of the same millisecond differ


def new_id(preset: str, now: dt.datetime | None = None) -> str:
    """`20260614T101502.123Z-probe-a1b2c3`: sorts by creation time (UTC, milliseconds)."""
    now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{preset}-{secrets.token_hex(3)}"


def parse_id(request_id: str, now: dt.datetime | None = None) -> RequestId | None:
    """`request_id` as (time, preset, suffix), or None when it is not a request id: the whole text in the
    form `new_id` makes, a real calendar time, not before ID_EPOCH nor more than ID_SKEW ahead of `now`.
    Every reader of the bus goes through this: an id that does not parse is ignored, never trusted."""
    m = ID_RE.fullmatch(request_id)
    if not m:
        return None
    try:
        made = dt.datetime.strptime(m.group(1), "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=dt.UTC)
    except ValueError:  # 00000000T000000.000Z, a 13th month, a 61st second
        return None
    if not ID_EPOCH <= made <= (now or utcnow()) + ID_SKEW:
        return None
    return RequestId(made, m.group(2), m.group(3))


def checked_id(value: str) -> str:
    """`value` when `parse_id` accepts it; ValueError naming the rule otherwise (a pydantic validator)."""
    if parse_id(value) is None:
        raise ValueError(f"{value!r} is not a request id ({ID_RULE})")
    return value


IdStr = Annotated[str, AfterValidator(checked_id)]  # a request id field of a bus file
# text of a bus file that is shown, written by a run or by anyone who can push: no control or format
# characters, whoever wrote it (bridge/core/text.py)
Shown = Annotated[str, AfterValidator(clean)]


def id_time(request_id: str) -> dt.datetime:
    """When `request_id` was made; KakeyaError when it is not a request id (a user's typo). Ids from the
    bus never raise here: `Snapshot.parse` keeps only the ones `parse_id` accepts."""
    parsed = parse_id(request_id)
    if parsed is None:
        raise InvalidRequest(f"{request_id!r} is not a request id ({ID_RULE})", code="bad-id")
    return parsed.time


def id_preset(request_id: str) -> str:
    parsed = parse_id(request_id)
    return parsed.preset if parsed else ""


def req_ref(label: str, request_id: str) -> str:
    return f"{REQ_PREFIX}{label}/{request_id}"


def claim_ref(request_id: str) -> str:
    return f"{CLAIM_PREFIX}{request_id}"


def done_ref(request_id: str) -> str:
    return f"{DONE_PREFIX}{request_id}"


def subject_ref(subject: str, request_id: str) -> str:
    """The index ref of a done result under the subject it ran (what `gate pr` reads)."""
    return f"{SUBJECT_PREFIX}{subject}/{request_id}"


def indexed_subject(*named: str | None) -> str | None:
    """The first of `named` that is a commit sha (a subject an index ref or ledger path can carry); a result
    may name anything at all."""
    return next((s for s in named if s and re.fullmatch(SHA_PATTERN, s)), None)


def layout_ref(version: int = LAYOUT) -> str:
    return f"{LAYOUT_PREFIX}{version}"


ARCHIVE_PREFIX = "refs/kakeya-archive/"  # outside refs/heads: no clone fetches it, no status or gate reads it


def archive_ref(request_id: str) -> str:
    return f"{ARCHIVE_PREFIX}done/{request_id}"


STAGE_PREFIX = "refs/kakeya-stage/"  # outside refs/heads: a result's objects, pushed ahead of its done commit


def stage_ref(request_id: str, sha: str) -> str:
    """The side ref a runner pushes a result's objects to (while its lease keeps beating) before the small
    atomic push that creates the done ref; named by the staged commit, so two attempts never collide."""
    return f"{STAGE_PREFIX}{request_id}/{sha[:16]}"


def cancel_ref(request_id: str) -> str:
    return f"{CANCEL_PREFIX}{request_id}"


def runner_ref(name: str) -> str:
    return f"{RUNNERS_PREFIX}{name}"


def results_path(request_id: str) -> str:
    return f"{RESULTS_DIR}/{request_id}"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- files the bus carries --------------------------------------------------------------------------


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dump(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()


class Manifest(_File):
    """.kakeya/request.json: what was asked for. `params` are raw, as given; the runner re-validates."""

    schema_version: Literal[1] = 1
    id: IdStr
    preset: str
    params: dict[str, JsonValue] = {}
    subject: str = Field(pattern=SHA_PATTERN)
    runner: str = Field(pattern=f"^{LABEL}$")  # pydantic's regex: `$` is the end of the text
    requester: str
    created_at: AwareDatetime  # the time of `id`, within CREATED_AT_SLACK
    expires_at: AwareDatetime  # after created_at, at most MAX_TTL after it
    nonce: str
    snapshot_of: str | None = None  # the HEAD a dirty working tree was snapshotted on

    @model_validator(mode="after")
    def _times(self) -> Manifest:
        made = id_time(self.id)
        if abs(self.created_at - made) > CREATED_AT_SLACK:
            raise ValueError(
                f"created_at {self.created_at.isoformat()} is not the time of its id {self.id} "
                f"({made.isoformat()}, {CREATED_AT_SLACK.total_seconds():g} s allowed)"
            )
        if not self.created_at < self.expires_at <= self.created_at + MAX_TTL:
            raise ValueError(
                f"expires_at {self.expires_at.isoformat()} must be after created_at "
                f"{self.created_at.isoformat()} and at most {MAX_TTL.days} days after it"
            )
        return self


class WorkloadProgress(_File):
    """What a workload says of its own progress (the JSON file named by KAKEYA_PROGRESS)."""

    model_config = ConfigDict(extra="ignore")

    done: int = Field(ge=0)
    total: int | None = Field(default=None, ge=1)
    what: Shown = Field(default="", max_length=200)


class Progress(_File):
    """The progress record a runner puts on its claim at each heartbeat."""

    phase: Literal["checkout", "queued", "running", "gating", "pushing"]  # queued: in a scheduler's queue
    started_at: AwareDatetime  # when the request's serving began on this runner
    at: AwareDatetime  # when this record was made
    elapsed_s: float = Field(ge=0)
    log_tail: list[Shown] = Field(default=[], max_length=20)  # the last lines of the redacted logs
    workload: WorkloadProgress | None = None
    # a scheduler's word on the job (bridge/run/slurm.py): "pending (Resources)", "running on node17"
    scheduler: Shown | None = Field(default=None, max_length=200)


class Claim(_File):
    """.kakeya/claim.json: who holds a request and until when (heartbeats extend `lease_until`)."""

    schema_version: Literal[1] = 1
    id: str
    runner: str
    labels: list[str]
    host: str
    pid: int
    claimed_at: AwareDatetime
    lease_until: AwareDatetime
    heartbeat: int = 0
    takeover_of: str | None = None  # the runner whose expired lease this claim took over
    lease_s: float | None = None  # how long observers wait, on their own clocks, for the claim to move
    progress: Progress | None = None  # phase, elapsed time, log tail, the workload's own progress


class CancelMarker(_File):
    """.kakeya/cancel.json."""

    schema_version: Literal[1] = 1
    id: str
    by: str
    at: AwareDatetime
    reason: str = ""


_M = TypeVar("_M", bound=BaseModel)


def parse_or_none(cls: type[_M], data: bytes | None) -> _M | None:
    """`data` (JSON read from the bus) as a `cls`, or None when it is missing or not a valid `cls`."""
    if data is None:
        return None
    try:
        return cls.model_validate_json(data)
    except ValidationError:
        return None


def _manifest(data: bytes) -> Manifest | str:
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as exc:
        return problems(exc, "manifest", limit=5)


def read_manifests(repos: Sequence[Path | str], commits: Iterable[str]) -> dict[str, Manifest | str]:
    """commit -> the Manifest its .kakeya/request.json holds, or why there is none (missing, larger than
    MANIFEST_MAX_BYTES, invalid), from the first of the local `repos` that has the file. Sizes are asked
    first (`git.blob_sizes`): a request.json over the cap is never read."""
    found: dict[str, Manifest | str] = {}
    rest = {f"{c}:{MANIFEST_PATH}": c for c in commits}
    for repo in repos:
        sizes = git.blob_sizes(repo, list(rest))
        blobs = git.read_blobs(repo, [s for s, n in sizes.items() if n <= MANIFEST_MAX_BYTES])
        for spec, size in sizes.items():
            found[rest.pop(spec)] = (
                _manifest(blobs.get(spec, b""))
                if size <= MANIFEST_MAX_BYTES
                else f"{MANIFEST_PATH} is {size} bytes, over the {MANIFEST_MAX_BYTES}-byte cap"
            )
    for commit in rest.values():
        found[commit] = f"commit {commit[:12]} has no {MANIFEST_PATH}"
    return found


# --- the state of the bus from one ls-remote ---------------------------------------------------------


@dataclass
class Entry:
    """The refs of one request."""

    id: str
    label: str | None = None
    req: str | None = None
    claim: str | None = None
    done: str | None = None
    cancel: str | None = None

    @property
    def preset(self) -> str:
        return id_preset(self.id)

    @property
    def created_at(self) -> dt.datetime:
        return id_time(self.id)

    @property
    def state(self) -> str:
        """What the refs alone say (see `request_state`)."""
        return request_state(self)


def request_state(
    entry: Entry,
    now: dt.datetime | None = None,
    *,
    manifest: Manifest | None = None,
    claim: Claim | None = None,
    result_status: str | None = None,
) -> str:
    """The state of a request, from its refs and what is known of its files:

    requested -> claimed -> done (the result's status: succeeded, failed, ... when it is readable)
    requested -> expired           the manifest's expires_at passed before any runner claimed it
    claimed   -> stale             the claim's lease ran out (another runner may take it over)
    requested -> cancelled         a cancel marker before any claim
    claimed   -> cancelling        a cancel marker while a runner holds it (it ends in a done commit)
    """
    now = now or utcnow()
    if entry.done:
        return result_status or "done"
    if entry.cancel:
        return "cancelling" if entry.claim else "cancelled"
    if entry.claim:
        return "stale" if claim is not None and claim.lease_until < now else "claimed"
    if manifest is not None and manifest.expires_at < now:
        return "expired"
    return "requested"


@dataclass
class Snapshot:
    refs: dict[str, str]
    entries: dict[str, Entry]
    ignored: list[str]  # refs under the bus prefixes that are not bus refs (malformed names)
    runners: dict[str, str] = field(default_factory=dict)  # runner name -> its presence commit
    index: dict[str, tuple[str, str]] = field(
        default_factory=dict
    )  # id -> (subject, done) of by-subject refs
    layouts: list[str] = field(default_factory=list)  # the versions the layout marker refs name
    old: dict[str, str] = field(
        default_factory=dict
    )  # refs of layout 1 (refs/heads/kakeya/{claim,done,...}/)

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        snap = cls({}, {}, [])
        entries = snap.entries
        for line in text.splitlines():
            sha, _, ref = line.partition("\t")
            if not re.fullmatch(SHA_PATTERN, sha):
                continue
            if ref.startswith(LAYOUT_PREFIX):
                snap.layouts.append(ref[len(LAYOUT_PREFIX) :])
                continue
            if ref.startswith(OLD_PREFIXES):
                snap.old[ref] = sha
                continue
            if ref.startswith(PREFIX) and not ref.startswith(REQ_PREFIX):
                snap.ignored.append(ref)  # nothing but requests lives under refs/heads
                continue
            if ref.startswith(REQ_PREFIX):
                parts = ref[len(PREFIX) :].split("/")
            elif ref.startswith(NS):
                parts = ref[len(NS) :].split("/")
            else:
                continue
            snap.refs[ref] = sha
            kind, rid = parts[0], parts[-1]
            if kind == "runners" and len(parts) == 2 and RUNNER_NAME_RE.match(rid):
                snap.runners[rid] = sha
                continue
            if (
                kind == "by-subject"
                and len(parts) == 3
                and re.fullmatch(SHA_PATTERN, parts[1])
                and parse_id(rid) is not None
            ):
                snap.index[rid] = (parts[1], sha)
                continue
            shape_ok = (len(parts) == 3 and kind == "req" and LABEL_RE.match(parts[1])) or (
                len(parts) == 2 and kind in ("claim", "done", "cancel")
            )
            if not shape_ok or parse_id(rid) is None:
                snap.ignored.append(ref)
                continue
            entry = entries.setdefault(rid, Entry(rid))
            if kind == "req":
                if entry.req is not None:  # the same id under two labels: keep the first, flag the second
                    snap.ignored.append(ref)
                    continue
                entry.label, entry.req = parts[1], sha
            else:
                setattr(entry, kind, sha)
        snap.entries = dict(sorted(entries.items()))
        snap.runners = dict(sorted(snap.runners.items()))
        return snap

    def check_layout(self, url: str) -> None:
        """BusError when the bus is of another layout than this kakeya's: newer (upgrade kakeya) or layout 1
        (`kakeya bus migrate`)."""
        other = sorted(v for v in self.layouts if v != str(LAYOUT))
        if other and str(LAYOUT) not in self.layouts:
            need = other[-1]
            raise BusError(
                f"the bus at {url} has bus layout {need}; this kakeya speaks layout {LAYOUT}: "
                f"upgrade kakeya to a version for bus layout {need} or newer"
            )
        if self.old and str(LAYOUT) not in self.layouts:
            raise BusError(
                f"the bus at {url} has the old bus layout 1 ({len(self.old)} refs such as {next(iter(self.old))}); "
                f"this kakeya speaks layout {LAYOUT} (kakeya >= {LAYOUT_KAKEYA[LAYOUT]}): run "
                "`kakeya bus migrate` once, after every runner runs this version"
            )


# --- the remote -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """Set `ref` to `new` (None deletes it) only if it now holds `expect` (None = it must not exist)."""

    ref: str
    new: str | None
    expect: str | None
