"""The runner: claim a request from the bus, run its preset on a fresh export of the subject, push the result.

    runner = Runner(url, config=config, name="h200-1", labels=["h200"], workdir=Path(".kakeya/runners/h200-1"))
    runner.once()            # claim and serve one pending request (or `request_id`); None when idle
    runner.watch()           # the same in a loop until stop()

Claim = create refs/kakeya/claim/<id> only if absent. While the request is served (run, commit and push) a
`Lease` thread heartbeats (fast-forwards the claim) and watches for a cancel marker or a takeover. A
lease is judged expired by how long this runner has seen the claim unchanged on its own monotonic clock
(longer than the claim's lease_s), never by comparing another host's timestamp with ours, so clock skew
cannot run a request twice; a runner that finds an expired lease takes it over with a lease on the sha
it saw. The result's objects are pushed first to a side ref while the lease keeps beating (a big result
cannot outlast the lease); then one small atomic push moves the claim to the done commit (leased on this
runner's last claim sha), creates the done ref and its by-subject index ref, and deletes the request, claim
and cancel refs: a runner that lost its lease can never push a result, and finished work leaves the live
namespaces. A poll asks only for the request branches of the runner's labels and the live claims and
cancels (prefix-scoped), and fetches what it needs by object id.
Presets come from the runner's own registry, never from the request commit. Every outcome ends in a done
commit.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import platform
import random
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from bridge.bus import ledger
from bridge.bus.bus import Bus
from bridge.bus.presence import Beacon, host_facts
from bridge.bus.progress import Tracker, say
from bridge.bus.records import (
    CANCEL_PREFIX,
    CLAIM_PATH,
    CLAIM_PREFIX,
    DONE_PREFIX,
    REQ_PREFIX,
    Claim,
    Entry,
    Manifest,
    Progress,
    Snapshot,
    Update,
    cancel_ref,
    claim_ref,
    done_ref,
    id_time,
    indexed_subject,
    parse_or_none,
    read_manifests,
    req_ref,
    results_path,
    stage_ref,
    subject_ref,
    utcnow,
)
from bridge.bus.trust import Signers, key_file, principal, signature_problem
from bridge.config import GIT_CREDENTIALS, Config, project_root, secret_file
from bridge.core import caps
from bridge.core.errors import BusError, InvalidRequest, KakeyaError, Rejected
from bridge.core.names import check_label
from bridge.core.result import RunContext, RunResult
from bridge.evidence import apply_baseline
from bridge.host import hardware_for
from bridge.presets.preset import Preset
from bridge.presets.registry import load_registry
from bridge.results import attest
from bridge.results.outcome import RunOutcome, not_run
from bridge.run.execute import Executor, LocalExecutor, run_preset
from bridge.run.isolation import choose, key_problem
from bridge.run.lease import Lease
from bridge.wire import git

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
CLAIM_WINDOW = 8  # runners pick at random among the oldest few pending requests, so they rarely collide
PREFETCH = 16  # requests fetched ahead in one fetch
MAX_TRIES = 4  # claims tried per poll before looking at the bus again
COMPACT_BATCH = 1000  # done results a runner moves into the ledger at a time, between two polls


@dataclass
class Served:
    """What `Runner.once` did with one request."""

    id: str
    status: str
    verdict: str | None = None
    reason: str | None = None
    done: str | None = None  # the done commit, when pushed
    pushed: bool = False


class Runner:
    def __init__(
        self,
        url: str,
        *,
        config: Config,
        name: str,
        labels: list[str],
        workdir: Path,
        registry: Mapping[str, Preset] | None = None,
        environ: Mapping[str, str] | None = None,
        log: Callable[[str], None] | None = None,
        force_labels: bool = False,
    ):
        self.config, self.name, self.labels = config, name, [check_label(lb) for lb in labels]
        if not labels:
            raise KakeyaError("a runner needs at least one label (--labels cpu,h200 or KAKEYA_LABELS)")
        # A label means its hardware: refuse one whose accelerator this host lacks, unless forced (then
        # every result names the forced labels).
        # a label whose runs are scheduler jobs (config executors) has its hardware on the nodes, not here
        local = [lb for lb in self.labels if config.executor_for(lb).executor == "local"]
        self.forced_labels = hardware_for(local, force=force_labels)
        self.registry = dict(registry) if registry is not None else load_registry()
        self.environ = os.environ if environ is None else environ
        self.workdir = workdir.resolve()
        self.mirror = git.init_bare(self.workdir / "mirror.git")
        self.bus = Bus(url, self.mirror, config.git_timeout_s)
        self.who = f"kakeya runner {name} <{name}@kakeya.invalid>"
        self.sign_key = key_file(config.signing_key)
        self.requesters = requesters(config)
        self.leases: dict[str, Claim | None] = {}  # claim sha -> its claim.json (immutable, so cached)
        self.seen: dict[str, float] = {}  # claim sha -> when (time.monotonic) this runner first saw it
        self.stopping = threading.Event()
        self.abort_reason: str | None = None
        self.signalled: str | None = None  # the first stop signal's name (set by the commands' handlers)
        self._log = log or say  # stderr; a reader that left never fails a run (bridge/bus/progress.py)
        self.served = 0
        self.contended = False
        self.outbox_pending = True  # look once at start; then only after a push failed
        self.compact_next = 0.0  # time.monotonic() before which this runner does not look at compacting
        self.presence_when_serving = False  # True: no presence until a request is served (`runner once`)
        self.isolation = choose(config.isolation, config.run_user)
        self.executor: Executor = LocalExecutor()  # launches, supervises and collects each run
        problem = key_problem(self.sign_key, self.isolation, self.environ)
        if problem:
            raise KakeyaError(f"refusing to start: {problem}")
        untrusted = [lb for lb in self.labels if lb in config.untrusted_labels]
        if untrusted and self.isolation.kind == "none":
            raise KakeyaError(
                f"label(s) {', '.join(untrusted)} are marked untrusted-subjects (untrusted_labels) and this "
                "runner has no isolation: set isolation = auto (or bwrap / user / userns) in its config "
                "(KAKEYA_ISOLATION); `kakeya doctor` says what this host allows"
            )
        self.tracker: Tracker | None = None  # the request being served: phase, start, its out dir
        self.beacon: Beacon | None = None  # the presence ref, once start_presence() was called
        self.step = "serving the request"  # what serving does now, for the reason of an error done commit
        self.outcome: RunOutcome | None = None  # the outcome of the request being served, once it ran
        self.paused: str | None = None  # why this runner does not claim now (too little free space), or None
        self.workdir_lock = lock_workdir(self.workdir)  # None: another runner process uses this workdir
        if self.workdir_lock is not None:  # in the background: a crashed run's million files delay nothing
            threading.Thread(target=self.sweep, name="sweep", daemon=True).start()
        shutil.rmtree(self.mirror / "worktrees", ignore_errors=True)  # what older runners left: never used
        credentials = secret_file(config, GIT_CREDENTIALS)  # the bus token: in a file, never in os.environ
        if credentials is not None:
            git.use_credential_store(self.mirror, credentials)

    def now(self) -> dt.datetime:
        """This runner's wall clock (plus config clock_offset_s, with which tests fake a skewed host)."""
        return utcnow() + dt.timedelta(seconds=self.config.clock_offset_s)

    def log(self, msg: str) -> None:
        self._log(f"{dt.datetime.now().astimezone():%H:%M:%S} kakeya runner {self.name}: {msg}")

    # --- stopping -----------------------------------------------------------------------------------

    def stop(self, why: str = "stop requested") -> None:
        """Take no new request; the current one is finished (or released if it has not started)."""
        if not self.stopping.is_set():
            self.log(f"{why}: finishing the current request, then stopping")
        self.stopping.set()

    def abort(self, why: str) -> None:
        """Kill the current run; it still ends in a done commit (status error, `why`)."""
        self.stopping.set()
        self.abort_reason = why

    # --- one request --------------------------------------------------------------------------------

    def once(self, request_id: str | None = None) -> Served | None:
        """Claim and serve one pending request for our labels (or `request_id`); None if there was none. Then
        compact the bus when it is this runner's turn (`maybe_compact`)."""
        try:
            return self.serve_one(request_id)
        finally:
            self.maybe_compact()

    def serve_one(self, request_id: str | None = None) -> Served | None:
        self.flush_outbox()
        if not self.has_room():
            if request_id:  # asked for this one (`kakeya run`, `runner once --request`): say why not
                raise KakeyaError(f"runner {self.name} is {self.paused}; free some space, or lower the floor")
            return None
        if request_id:
            id_time(request_id)
            snap = self.bus.ls_remote(
                REQ_PREFIX, claim_ref(request_id), done_ref(request_id), cancel_ref(request_id)
            )
        else:
            snap = self.bus.ls_remote(
                *(f"{REQ_PREFIX}{label}/" for label in self.labels), CLAIM_PREFIX, CANCEL_PREFIX
            )
        candidates = self.candidates(snap, request_id)
        self.contended = False
        self.prefetch([e for e, _ in candidates[:PREFETCH]])
        for entry, old in candidates[:MAX_TRIES]:
            if self.stopping.is_set():
                return None
            claimed = self.claim(entry, old)
            if claimed:
                return self.serve(entry, *claimed)
            self.contended = True  # another runner was faster: look again at once, not after a poll
        return None

    def prefetch(self, entries: list[Entry]) -> None:
        """Fetch the requests we may claim (and their subjects) in one go; a backlog costs one fetch, not one each."""
        shas = [e.req for e in entries if e.req]
        missing = sorted(set(shas) - git.present(self.mirror, shas))
        if missing:
            self.bus.fetch_ids(missing, "requests", in_store=True)
            # One local ref, moved to a fetched request, keeps the subjects' history as `have`s for the next fetch.
            git.update_ref(self.mirror, "refs/kakeya/last", missing[0])

    def candidates(
        self, snap: Snapshot, request_id: str | None
    ) -> list[tuple[Entry, tuple[str, Claim] | None]]:
        """Requests we may claim, oldest first: unclaimed ones, and claimed ones whose lease has expired."""
        if request_id:
            entry = snap.entries.get(request_id)
            if entry is not None and entry.done:  # finished (its request ref went with the done push)
                return []
            if entry is None or entry.req is None:
                raise KakeyaError(f"no request {request_id} on the bus at {self.bus.url}")
            if entry.label not in self.labels:
                raise KakeyaError(
                    f"request {request_id} is for runner label {entry.label!r}; "
                    f"this runner serves {', '.join(self.labels)}"
                )
            pool = [entry]
        else:
            pool = [e for e in snap.entries.values() if e.req and not e.done and e.label in self.labels]
        self._learn_leases([e for e in pool if e.claim])
        live = {e.claim for e in snap.entries.values() if e.claim}
        self.leases = {sha: c for sha, c in self.leases.items() if sha in live}
        now = time.monotonic()
        self.seen = {sha: t for sha, t in self.seen.items() if sha in live}
        out: list[tuple[Entry, tuple[str, Claim] | None]] = []
        for e in pool:
            if e.claim is None:
                out.append((e, None))
                continue
            first_seen = self.seen.setdefault(e.claim, now)
            claim = self.leases.get(e.claim)
            if claim is None:  # unreadable or missing claim (logged when learnt): treat as expired
                wall = self.now()
                unknown = Claim(
                    id=e.id, runner="unknown", labels=[], host="", pid=0, claimed_at=wall, lease_until=wall
                )
                out.append((e, (e.claim, unknown)))
            elif now - first_seen > (claim.lease_s or self.config.lease_s):
                out.append((e, (e.claim, claim)))
        head = out[:CLAIM_WINDOW]
        random.shuffle(head)
        return head + out[CLAIM_WINDOW:]

    def _learn_leases(self, claimed: list[Entry]) -> None:
        unknown = [e for e in claimed if e.claim not in self.leases]
        if not unknown:
            return
        try:
            self.bus.fetch_ids([e.claim for e in unknown if e.claim], "claims", in_store=True)
        except BusError as exc:  # a claim moved or went away meanwhile: look again next time
            self.log(f"could not read claims: {exc}")
            return
        present = git.present(self.mirror, [e.claim for e in unknown if e.claim])
        for e in unknown:
            assert e.claim is not None
            if e.claim not in present:
                self.log(
                    f"{e.id}: claim {e.claim[:12]} could not be read after the fetch; treating it as expired"
                )
                self.leases[e.claim] = None
                continue
            raw = git.read_path(self.mirror, e.claim, CLAIM_PATH)
            try:
                self.leases[e.claim] = Claim.model_validate_json(raw or b"")
            except ValidationError:
                self.log(f"{e.id}: claim {e.claim[:12]} has no valid {CLAIM_PATH}; treating it as expired")
                self.leases[e.claim] = None

    def holder(self, request_id: str, sha: str | None) -> str:
        """Who holds the claim now, for messages."""
        try:
            snap = self.bus.ls_remote(claim_ref(request_id), done_ref(request_id))
            if done_ref(request_id) in snap.refs:
                return "the request was finished by another runner"
            sha = snap.refs.get(claim_ref(request_id))
            if sha is None:
                return "the claim was deleted"
            self.bus.fetch_ids([sha], "the claim", in_store=True)
            raw = git.read_path(self.mirror, sha, CLAIM_PATH)
            return f"taken over by runner {Claim.model_validate_json(raw or b'').runner}"
        except (KakeyaError, ValidationError):
            return f"the claim is now {sha or 'gone'}"

    def claim(self, entry: Entry, old: tuple[str, Claim] | None) -> tuple[str, Claim] | None:
        """Create (or take over) the claim; None if another runner got there first."""
        assert entry.req is not None and entry.label is not None
        if not git.has_object(self.mirror, entry.req):
            self.prefetch([entry])
        now = self.now()
        claim = Claim(
            id=entry.id,
            runner=self.name,
            labels=self.labels,
            host=platform.node(),
            pid=os.getpid(),
            claimed_at=now,
            lease_until=now + dt.timedelta(seconds=self.config.lease_s),
            takeover_of=old[1].runner if old else None,
            lease_s=self.config.lease_s,
        )
        base = old[0] if old else entry.req
        verb = f"takes over {entry.id} from {old[1].runner}" if old else f"claims {entry.id}"
        sha = git.child_commit(
            self.mirror,
            base,
            {CLAIM_PATH: claim.dump()},
            f"kakeya: {self.name} {verb}",
            self.who,
            self.sign_key,
        )
        if not self.bus.swap([Update(claim_ref(entry.id), sha, old[0] if old else None)]):
            self.log(f"{entry.id}: another runner claimed it first")
            return None
        self.log(f"{verb} ({entry.preset} on {entry.label})")
        return sha, claim

    def serve(self, entry: Entry, sha: str, claim: Claim) -> Served:
        """Run a claimed request and push its done commit. Any exception after the claim ends in an `error` done
        commit that says what failed (`fail`): a run cannot leave the request claimed and unfinished."""
        out = self.workdir / "runs" / entry.id
        self.tracker = Tracker(out)
        if self.presence_when_serving:
            self.start_presence(serving=entry.id)
        if self.beacon is not None:
            self.beacon.serving(entry.id)
        lease = Lease(self, entry.id, sha, claim, live=self.tracker.live)
        lease.start()
        try:
            if self.stopping.is_set():  # nothing has run yet: give the request back
                lease.stop()
                return self.release(entry, lease.sha)
            self.step, self.outcome = "clearing the run directory", None
            try:
                return self.finish(entry, lease, out)
            except Exception as exc:  # noqa: BLE001 — whatever the run left or the disk did, a done commit
                return self.fail(entry, lease, out, exc)
        finally:
            lease.stop()
            self.tracker = None
            if self.beacon is not None:
                self.beacon.serving(None)

    def finish(self, entry: Entry, lease: Lease, out: Path) -> Served:
        """Run, then deliver its outcome (`deliver`)."""
        caps.remove(out)
        self.step = "serving the request"
        outcome = self.outcome = self.run_request(entry, lease, out)
        served = self.deliver(entry, lease, outcome, self.set_phase)
        if served.pushed:
            self.clear(out)
        return served

    def deliver(
        self, entry: Entry, lease: Lease, outcome: RunOutcome, set_phase: Callable[[str], None]
    ) -> Served:
        """The one delivery path of every executor (this runner's `finish`, bridge/run/slurm_runner.py): check the
        run's files (bridge/core/caps.py), write the result and the runner's attestation (any attestation.json the
        program left is replaced), commit them and push the done commit; the lease is stopped after."""
        out = outcome.out_dir
        self.step = "checking the run's files"
        outcome.result.dropped += caps.apply_caps(
            out,
            report_cap=self.config.report_cap_bytes,
            files_cap=self.config.files_cap_bytes,
            result_cap=self.config.result_cap_bytes,
            count_cap=self.config.files_count_cap,
            log_cap=self.config.log_cap_bytes,
        )
        self.step = "writing the result"
        result = outcome.write()
        attest.write(out, self.sign_key, entry.label, principal(self.name, self.labels))  # in the done commit
        set_phase("pushing")  # the lease keeps beating through commit and push
        served = Served(entry.id, result.status, result.verdict, result.reason)
        # The lease keeps beating while the result is committed and its objects are pushed ahead (however
        # long that takes); the final commit goes on the last beat, in a push of a few small objects.
        self.step = "committing the result"
        tree = self.result_tree(entry, lease.sha, out) if not lease.lost else ""
        staged = self.stage(entry.id, lease.sha, tree) if not lease.lost else None
        with lease.lock:
            if not lease.lost:
                served.done = self.done_commit(entry, lease, tree, result)
                self.step = "pushing the result"
                served.pushed = self.push_done(entry.id, lease.sha, served.done, entry)
        lease.stop()
        if staged:
            self.unstage(*staged)
        if served.done is None:
            self.log(f"{entry.id}: {lease.lost}; its result is not pushed (kept in {out})")
            served.reason = lease.lost
        return served

    def fail(self, entry: Entry, lease: Lease, out: Path, exc: Exception) -> Served:
        """The done commit of a request whose serving raised: status error, the reason, built in memory after
        the run's files are removed (a run that filled the disk gets its space back first)."""
        why = f"runner {self.name}: {self.step} failed: {exc.__class__.__name__}: {exc}"
        why = why.encode("utf-8", "backslashreplace").decode()  # a name that is not UTF-8 in the message
        self.log(f"{entry.id}: {why}")
        self.clear(out, self.workdir / "work" / entry.id)
        served = Served(entry.id, "error", reason=why)
        if lease.lost:
            served.reason = f"{why}; {lease.lost}"
            return served
        try:
            if self.outcome is not None:  # the run's provenance and what was dropped; none of its files
                result = self.outcome.result.model_copy(
                    update={"status": "error", "reason": why, "verdict": None, "report": None}
                )
                outcome = RunOutcome(out, result, redact=self.outcome.redact, places=self.outcome.places)
            else:
                context = RunContext(request_id=entry.id, runner_name=self.name, runner_labels=self.labels)
                outcome = not_run(out, "error", why, preset_name=entry.preset, params={}, context=context)
            prefix = results_path(entry.id)
            files = {f"{prefix}/{name}": data for name, data in outcome.files().items()}
            tree = git.tree_with(self.mirror, lease.sha, files, without=prefix)
            with lease.lock:
                if lease.lost:
                    served.reason = f"{why}; {lease.lost}"
                    return served
                served.done = self.done_commit(entry, lease, tree, outcome.result)
                served.pushed = self.push_done(entry.id, lease.sha, served.done, entry)
        except Exception as again:  # noqa: BLE001 — the claim expires and another runner takes the request over
            self.log(f"{entry.id}: could not record that either ({again}); the claim will expire")
        return served

    def clear(self, *paths: Path) -> None:
        """Remove a run's directories; what cannot be removed now is left for the next start (`sweep`)."""
        for path in paths:
            try:
                caps.remove(path)
            except OSError as exc:
                self.log(f"could not remove {path}: {exc}")

    def sweep(self) -> None:
        """Remove what runs of an earlier start of this runner left (runs/*, work/*): a crash, a full disk. Run
        in the background from the start (a run's names are its request's: none of these is served again)."""
        for top in ("runs", "work"):
            folder = self.workdir / top
            left = sorted(folder.iterdir()) if folder.is_dir() else []
            if left:
                started = time.monotonic()
                many = f"{len(left)} stale director{'y' if len(left) == 1 else 'ies'} in {folder}"
                self.log(f"removing {many} in the background")
                self.clear(*left)
                self.log(f"removed {many} in {time.monotonic() - started:.1f} s")

    def release(self, entry: Entry, sha: str) -> Served:
        released = self.bus.swap([Update(claim_ref(entry.id), None, sha)])
        self.log(
            f"{entry.id}: released the claim before the run started"
            if released
            else f"{entry.id}: could not release the claim (it changed)"
        )
        return Served(entry.id, "released", reason="runner stopping before the run started")

    def run_request(self, entry: Entry, lease: Lease, out: Path) -> RunOutcome:
        """Validate, then run; every failure becomes a result (nothing raises past here)."""
        context = RunContext(
            request_id=entry.id,
            runner_name=self.name,
            runner_labels=self.labels,
            forced_labels=self.forced_labels,
            signed_by=principal(self.name, self.labels) if self.sign_key else None,
        )
        preset_name, params, preset_hash = entry.preset, {}, None
        try:
            manifest, preset, values = self.validate(entry)
            context.subject, preset_name, params = manifest.subject, preset.name, values
            preset_hash = preset.content_hash
            if lease.cancelled or entry.cancel:
                return not_run(
                    out,
                    "cancelled",
                    "cancelled before it started",
                    preset_name=preset_name,
                    params=params,
                    context=context,
                    preset_hash=preset_hash,
                )
            if manifest.expires_at < self.now():
                return not_run(
                    out,
                    "expired",
                    f"expired at {manifest.expires_at.isoformat()} before a runner started it",
                    preset_name=preset_name,
                    params=params,
                    context=context,
                    preset_hash=preset_hash,
                )
            checkout = self.export_subject(entry.id, manifest.subject)
            try:
                check_lfs(checkout)
                self.log(f"{entry.id}: running {preset.name}")
                outcome = run_preset(
                    preset,
                    values,
                    checkout,
                    out,
                    config=self.config,
                    environ=self.environ,
                    context=context,
                    should_stop=lease.should_stop,
                    on_phase=self.set_phase,
                    on_run_dir=self.set_run_dir,
                    executor=self.executor,
                )
            finally:
                self.clear(checkout)
            return apply_baseline(self.bus, preset, entry.label, outcome)  # a preset's `baseline:`, if any
        except Rejected as exc:
            return not_run(out, "rejected", str(exc), preset_name=preset_name, params=params, context=context)
        except Exception as exc:  # noqa: BLE001 — any failure at any step still ends in a done commit
            return not_run(
                out,
                "error",
                f"runner {self.name}: {exc}",
                preset_name=preset_name,
                params=params,
                context=context,
                preset_hash=preset_hash,
            )

    def validate(self, entry: Entry) -> tuple[Manifest, Preset, dict[str, Any]]:
        """The request, re-validated against this runner's own registry; Rejected says why not."""
        assert entry.req is not None
        manifest = read_manifests([self.mirror], [entry.req])[entry.req]  # size-capped, parsed
        if not isinstance(manifest, Manifest):
            raise Rejected(f"invalid manifest: {manifest}")
        parents = git.parents(self.mirror, entry.req)
        for field, want in (("id", entry.id), ("runner", entry.label), ("preset", entry.preset)):
            if getattr(manifest, field) != want:
                raise Rejected(
                    f"invalid manifest: {field} is {getattr(manifest, field)!r} but the bus ref says {want!r}"
                )
        if parents != [manifest.subject]:
            raise Rejected(f"invalid manifest: subject {manifest.subject} is not the request commit's parent")
        if self.requesters is not None:
            problem = signature_problem(self.mirror, entry.req, self.requesters, "the request commit")
            if problem:
                raise Rejected(
                    f"{problem} (this runner requires requests signed by a key of {self.requesters.path})"
                )
        preset = self.registry.get(manifest.preset)
        if preset is None:
            raise Rejected(
                f"unknown preset {manifest.preset!r}: this runner's registry has "
                f"{', '.join(sorted(self.registry)) or 'no presets'}"
            )
        try:
            preset.check_runs_on(manifest.runner)
        except InvalidRequest as exc:
            raise Rejected(str(exc)) from None
        try:
            values = preset.validate_params(manifest.params)
        except KakeyaError as exc:
            raise Rejected(f"bad parameters: {exc}") from None
        return manifest, preset, values

    # --- progress and presence ---------------------------------------------------------------------

    def set_phase(self, phase: str) -> None:
        if self.tracker is not None:
            self.tracker.phase = phase

    def set_run_dir(self, run_dir: Path) -> None:
        if self.tracker is not None:
            self.tracker.run_dir = run_dir

    def progress(self) -> Progress | None:
        """The progress record of the request being served (None when none is), for its heartbeats."""
        tracker = self.tracker
        try:
            return tracker.record() if tracker is not None else None
        except Exception as exc:  # noqa: BLE001 — progress is a courtesy: it never stops a heartbeat
            self.log(f"no progress record this time: {exc}")
            return None

    def has_room(self) -> bool:
        """Is there config min_free_bytes free where this runner works? If not, it claims nothing and says why
        (log, presence) until there is again: a full disk would fail every request it took."""
        floor = self.config.min_free_bytes
        free = shutil.disk_usage(self.workdir).free if floor else 0
        paused = (
            f"not claiming: {mib(free)} free in {self.workdir}, under the floor of {mib(floor)} (min_free_bytes)"
            if free < floor
            else None
        )
        if paused != self.paused:
            self.log(paused or "claiming again: there is room on the disk")
            self.paused = paused
            if self.beacon is not None:
                self.beacon.pause(paused)
        return paused is None

    def start_presence(self, serving: str | None = None) -> None:
        """Keep kakeya/runners/<name> up to date (bridge/bus/presence.py) until stop_presence(); its first push
        says it serves `serving`, when given."""
        if self.beacon is None:
            host, acc, version = host_facts()
            self.beacon = Beacon(
                self.bus,
                self.mirror,
                self.name,
                self.labels,
                who=self.who,
                sign_key=self.sign_key,
                every_s=presence_every(self.config),
                host=host,
                accelerator=acc,
                version=version,
                log=self.log,
                paused=self.paused,
                require_signed_requests=self.requesters is not None,
            )
            if serving is not None:
                self.beacon.serving(serving)
            self.beacon.start()

    def stop_presence(self) -> None:
        """Say this runner stopped (its presence is no longer live)."""
        if self.beacon is not None:
            self.beacon.close()
            self.beacon = None

    def maybe_compact(self) -> None:
        """Move done results older than config compact_after_days into the bus's ledger (bridge/bus/ledger.py),
        at most every compact_every_s on this runner, and only while it holds the compaction lease, which
        keeps every other runner from starting one for compact_every_s after each of its pushes. One listing
        when there is nothing to move; a failure or a lost race is logged, and tried again next time."""
        days, every = self.config.compact_after_days, self.config.compact_every_s
        if not days or time.monotonic() < self.compact_next or self.stopping.is_set():
            return
        self.compact_next = time.monotonic() + every
        try:
            cutoff = self.now() - dt.timedelta(days=days)
            if not ledger.due(self.bus, cutoff, self.now()):
                return
            held = ledger.take_lease(self.bus, self.name, every, self.who, self.now())
            if held is None:
                return
            lease = (self.name, held, every)
            moved = ledger.compact(self.bus, cutoff, self.who, lease=lease, log=self.log, limit=COMPACT_BATCH)
            self.log(
                f"compacted the bus: {len(moved)} refs of results older than {days:g} days into the ledger"
            )
            if sum(ref.startswith(DONE_PREFIX) for ref in moved) >= COMPACT_BATCH:
                self.compact_next = 0.0  # more left (a bus's first compaction): go on after the next poll
        except Exception as exc:  # a side job: whatever the bus holds, it never takes the runner down
            self.log(f"no compaction this time: {exc}")

    # --- the subject --------------------------------------------------------------------------------

    def export_subject(self, request_id: str, subject: str) -> Path:
        """The run's own copy of the subject's files: no .git, nothing that points into the mirror (a run that
        writes there reaches nothing of the runner's)."""
        path = self.workdir / "work" / request_id
        self.clear(path)
        git.export(self.mirror, subject, path)
        return path

    # --- results ------------------------------------------------------------------------------------

    def result_tree(self, entry: Entry, claim_sha: str, out: Path) -> str:
        """The claim's tree without anything the request put under .kakeya/results/<id>/, plus the run's files
        there (read as bridge/core/caps.py reads: the caps have removed what cannot be committed)."""
        prefix = results_path(entry.id)
        found = caps.read_tree(out, 2 * self.config.result_cap_bytes + 4 * self.config.log_cap_bytes)
        files = {f"{prefix}/{rel}": data for rel, data in found.items()}
        return git.tree_with(self.mirror, claim_sha, files, without=prefix)

    def stage(self, request_id: str, claim_sha: str, tree: str) -> tuple[str, str] | None:
        """Push the result's objects to a side ref (stage_ref) without holding the lease's lock, so heartbeats
        go on however long a big result takes to upload; the done push then sends only the done commit, its
        claim.json and two trees. (ref, sha) when staged; None when the bus did not take it (the done push
        then carries everything, or goes to the outbox)."""
        sha = git.commit(
            self.mirror, tree, [claim_sha], f"kakeya stage {request_id} by {self.name}", self.who
        )
        ref = stage_ref(request_id, sha)
        try:
            if self.bus.swap([Update(ref, sha, None)], atomic=False):
                return ref, sha
        except KakeyaError as exc:
            self.log(f"{request_id}: could not push the result ahead ({exc}); it goes with the done commit")
        return None

    def unstage(self, ref: str, sha: str) -> None:
        """Delete a side ref once the done push is over; one left behind (the bus went away) is harmless:
        it is outside refs/heads, so no clone fetches it and no status reads it."""
        try:
            self.bus.swap([Update(ref, None, sha)], atomic=False)
        except KakeyaError as exc:
            self.log(f"could not delete {ref}: {exc}")

    def done_commit(self, entry: Entry, lease: Lease, tree: str, result: RunResult) -> str:
        """The done commit on the lease's last heartbeat (its claim.json), holding `tree`'s results."""
        tree = git.tree_with(self.mirror, tree, {CLAIM_PATH: lease.claim.dump()})
        verdict = f", verdict {result.verdict}" if result.verdict else ""
        message = f"kakeya done {entry.id}: {result.status}{verdict}\n\n{result.reason or ''}".rstrip() + "\n"
        return git.commit(self.mirror, tree, [lease.sha], message, self.who, self.sign_key)

    def push_done(self, request_id: str, claim_sha: str, done_sha: str, entry: Entry | None = None) -> bool:
        """One atomic push (`done_updates`): the done ref and its index ref created, the claim (leased on our
        last sha), request and cancel refs deleted. Kept locally if the bus cannot be reached, and pushed by a
        later `once`."""
        try:
            pushed = self.bus.swap(self.done_push(request_id, claim_sha, done_sha, entry), atomic=True)
        except KakeyaError as exc:
            git.update_ref(self.mirror, f"refs/kakeya/outbox/{request_id}", done_sha)
            self.outbox_pending = True
            self.log(f"{request_id}: result {done_sha[:12]} not pushed yet ({exc}); will retry")
            return False
        self.log(
            f"{request_id}: done {done_sha[:12]} pushed"
            if pushed
            else f"{request_id}: lease lost before the result could be pushed; result dropped"
        )
        self.served += 1
        if self.served % 50 == 0:
            git.gc_auto(self.mirror)
        return pushed

    def done_push(self, request_id: str, claim_sha: str, done_sha: str, entry: Entry | None) -> list[Update]:
        """The done push of `done_sha` for `request_id`: the request, claim and cancel refs as the bus holds
        them now (one prefix-scoped listing), the subject from the done commit's request and result."""
        label = entry.label if entry is not None else None
        m = read_manifests([self.mirror], [done_sha]).get(done_sha)
        manifest = m if isinstance(m, Manifest) else None
        label = label or (manifest.runner if manifest else None)
        result = parse_or_none(
            RunResult, git.read_path(self.mirror, done_sha, f"{results_path(request_id)}/result.json")
        )
        # the request's subject (validated with its manifest); a result's only when it is a sha at all
        subject = indexed_subject(manifest.subject if manifest else None, result.subject if result else None)
        index = [subject_ref(subject, request_id)] if subject else []
        wanted = [cancel_ref(request_id)] + ([req_ref(label, request_id)] if label else [])
        refs = self.bus.ls_remote(*wanted, *index).refs
        updates = done_updates(
            request_id,
            claim_sha,
            done_sha,
            subject=subject,
            drop={ref: sha for ref in wanted if (sha := refs.get(ref))},
        )
        # an index ref someone put there first is replaced (leased on what was seen), never a reason to fail
        return [replace(u, expect=refs.get(u.ref)) if u.ref in index else u for u in updates]

    def flush_outbox(self) -> None:
        """Push results that an earlier attempt could not deliver."""
        if not self.outbox_pending:
            return
        for ref, done_sha in git.refs_under(self.mirror, "refs/kakeya/outbox/").items():
            request_id = ref.rsplit("/", 1)[1]
            claim_sha = git.parents(self.mirror, done_sha)[0]
            # raises while the bus is still unreachable
            pushed = self.bus.swap(self.done_push(request_id, claim_sha, done_sha, None), atomic=True)
            self.log(
                f"{request_id}: delayed result pushed"
                if pushed
                else f"{request_id}: lease lost while the result waited; dropped"
            )
            git.update_ref(self.mirror, ref, None)
        self.outbox_pending = False

    # --- the loop -----------------------------------------------------------------------------------

    def watch(self, poll_s: float | None = None, max_backoff_s: float = 60.0) -> None:
        """Serve requests until stop(): poll every `poll_s`, back off (doubling) while the bus fails."""
        poll_s = poll_s or self.config.poll_interval_s
        backoff, idle = 0.0, 0
        self.log(f"watching {self.bus.url} for {', '.join(self.labels)} every {poll_s:g} s")
        while not self.stopping.is_set():
            try:
                served = self.once()
                backoff = 0.0
            except Exception as exc:  # noqa: BLE001 — one request, or the bus, never ends the loop
                backoff = min(max(backoff * 2, poll_s), max_backoff_s)
                what = (
                    str(exc)
                    if isinstance(exc, KakeyaError)
                    else f"unexpected {exc.__class__.__name__}: {exc}"
                )
                self.log(f"{what}; retrying in {poll_s + backoff:.1f} s")
                served = None
            idle = idle + 1 if served is None and not self.contended else 0
            if served is None and not self.contended:
                self.stopping.wait(idle_wait(poll_s, idle) + backoff)
        self.log("stopped")


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def lock_workdir(workdir: Path) -> IO[bytes] | None:
    """An exclusive lock on `workdir`, held while the returned file is open (while this runner lives), or None
    when another runner holds it (two `kakeya run` in one project): only the holder removes stale run dirs."""
    workdir.mkdir(parents=True, exist_ok=True)
    lock = (workdir / "lock").open("ab")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None
    return lock


def requesters(config: Config) -> Signers | None:
    """The allowed requesters when the runner requires signed requests (its trusted config says so)."""
    if not config.require_signed_requests:
        return None
    if not config.allowed_requesters:
        raise KakeyaError("require_signed_requests needs `allowed_requesters`: an allowed-signers file")
    path = Path(config.allowed_requesters).expanduser()
    return Signers.load(path if path.is_absolute() else project_root() / path, runners=False)


IDLE_CAP = 8  # an idle `watch` polls at most this many times slower than its poll interval


def idle_wait(poll_s: float, idle: int) -> float:
    """How long an idle `watch` waits before its next poll: `poll_s`, growing by half with each idle poll in a
    row after the tenth, up to IDLE_CAP times `poll_s` (and never past 30 s unless `poll_s` is longer)."""
    if idle <= 10:
        return poll_s
    return min(poll_s * 1.5 ** (idle - 10), max(poll_s, min(poll_s * IDLE_CAP, 30.0)))


def presence_every(config: Config) -> float:
    """How often an unchanged presence is refreshed: two leases (2 min by default); a change of state
    (serving, idle, stopped) is published at once."""
    return max(config.lease_s * 2, 1.0)


def done_updates(
    request_id: str, claim_sha: str, done_sha: str, subject: str | None = None, drop: Mapping[str, str] = {}
) -> list[Update]:
    """The result push, atomic: the claim (leased on the runner's last claim sha) is deleted and the done ref
    created (it must not exist), so a runner that lost its lease can never push a result; the index ref under
    the subject is created and the request and cancel refs in `drop` (ref -> the sha seen) are deleted. The
    done commit descends from the request and every claim commit, so nothing is lost with them."""
    updates = [
        Update(claim_ref(request_id), None, claim_sha),
        Update(done_ref(request_id), done_sha, None),
    ]
    if subject:
        updates.append(Update(subject_ref(subject, request_id), done_sha, None))
    return updates + [Update(ref, None, sha) for ref, sha in drop.items()]


def check_lfs(checkout: Path) -> None:
    """Refuse a checkout in which a Git LFS file is still a pointer (git-lfs missing or not pulled)."""
    pointers = []
    for dirpath, dirnames, filenames in os.walk(checkout):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = Path(dirpath) / name
            try:
                if path.is_symlink() or path.stat().st_size > 1024:
                    continue
                with path.open("rb") as fh:
                    head = fh.read(len(LFS_POINTER))
            except OSError:
                continue
            if head == LFS_POINTER:
                pointers.append(path.relative_to(checkout).as_posix())
    if pointers:
        shown = ", ".join(pointers[:5]) + (f" and {len(pointers) - 5} more" if len(pointers) > 5 else "")
        raise KakeyaError(
            f"the subject has {len(pointers)} Git LFS pointer file(s) that were not fetched ({shown}); "
            "install git-lfs on the runner (`git lfs install`) so checkouts get the real files"
        )
