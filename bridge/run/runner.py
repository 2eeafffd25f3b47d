"""The runner: claim a request from the bus, run its preset on a fresh export of the subject, push the result.

    runner = Runner(url, config=config, name="h200-1", labels=["h200"], workdir=Path(".kakeya/runners/h200-1"))
    runner.once()            # claim and serve one pending request (or `request_id`); None when idle
    runner.watch()           # the same in a loop until stop()

Serving one request, in the order `once` goes: push what an earlier done push left in the outbox
(bridge/run/outbox.py); list the bus (prefix-scoped: the request branches of the runner's labels, the live
claims and cancels) and take a claim (bridge/run/claims.py); while a `Lease` thread (bridge/run/lease.py)
heartbeats the claim and watches for a cancel marker or a takeover, re-validate the request against the
runner's own registry (bridge/run/request.py, never the request commit's presets), export the subject and run
the preset (bridge/run/execute.py); then deliver (bridge/run/deliver.py, the one path of every executor):
caps, result, attestation, result tree pushed ahead to a side ref, and one small atomic push that moves the
claim to the done commit, so a runner that lost its lease can never push a result. Every outcome, and every
failure after the claim, ends in a done commit. Between two polls the runner may compact the bus
(bridge/run/compaction.py); its presence ref says what it does (bridge/run/presence.py).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from bridge.bus.bus import Bus
from bridge.bus.progress import Tracker, say
from bridge.bus.records import (
    CANCEL_PREFIX,
    CLAIM_PREFIX,
    REQ_PREFIX,
    Claim,
    Entry,
    Progress,
    Update,
    cancel_ref,
    claim_ref,
    done_ref,
    id_time,
    utcnow,
)
from bridge.bus.trust import Signers, key_file, principal
from bridge.config import GIT_CREDENTIALS, Config, project_root, secret_file
from bridge.core import caps
from bridge.core.errors import KakeyaError, Rejected
from bridge.core.names import check_label
from bridge.core.result import RunContext
from bridge.evidence import apply_baseline
from bridge.host import hardware_for
from bridge.presets.preset import Preset
from bridge.presets.registry import load_registry
from bridge.results.outcome import RunOutcome, not_run
from bridge.run.claims import MAX_TRIES, PREFETCH, Claims
from bridge.run.compaction import Compaction
from bridge.run.deliver import Delivery, Served
from bridge.run.execute import Executor, LocalExecutor, run_preset
from bridge.run.isolation import choose, key_problem
from bridge.run.lease import Lease
from bridge.run.outbox import Outbox
from bridge.run.presence import Presence
from bridge.run.request import check_lfs, not_started, validate
from bridge.run.workdir import clear, lock_workdir, sweep
from bridge.wire import git

__all__ = ["Runner", "Served", "idle_wait", "requesters"]


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
        # every result names the forced labels). A label whose runs are scheduler jobs (config executors) has
        # its hardware on the nodes, not here.
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
        self.stopping = threading.Event()
        self.abort_reason: str | None = None
        self.signalled: str | None = None  # the first stop signal's name (set by the commands' handlers)
        self._log = log or say  # stderr; a reader that left never fails a run (bridge/bus/progress.py)
        self.contended = False  # the last poll lost a claim to another runner: look again at once
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
        self.claims = Claims(self)  # which requests to take, and the claim itself
        self.outbox = Outbox(self.bus, self.mirror, self.log)  # the done push, and those waiting for the bus
        self.delivery = Delivery(self, self.outbox)  # an outcome -> its done commit, for every executor
        self.presence = Presence(self)  # kakeya/runners/<name>, and the free-space floor
        self.presence_when_serving = False  # True: no presence until a request is served (`runner once`)
        self.compaction = Compaction(self)  # old results into the ledger, between two polls
        self.workdir_lock = lock_workdir(self.workdir)  # None: another runner process uses this workdir
        if self.workdir_lock is not None:  # in the background: a crashed run's million files delay nothing
            threading.Thread(target=sweep, args=(self.workdir, self.log), name="sweep", daemon=True).start()
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
        compact the bus when it is this runner's turn (bridge/run/compaction.py)."""
        try:
            return self.serve_one(request_id)
        finally:
            self.compaction.maybe()

    def serve_one(self, request_id: str | None = None) -> Served | None:
        self.outbox.flush()
        if not self.presence.has_room():
            if request_id:  # asked for this one (`kakeya run`, `runner once --request`): say why not
                raise KakeyaError(
                    f"runner {self.name} is {self.presence.paused}; free some space, or lower the floor"
                )
            return None
        if request_id:
            id_time(request_id)
            wanted = (REQ_PREFIX, claim_ref(request_id), done_ref(request_id), cancel_ref(request_id))
        else:
            wanted = (*(f"{REQ_PREFIX}{label}/" for label in self.labels), CLAIM_PREFIX, CANCEL_PREFIX)
        candidates = self.claims.candidates(self.bus.ls_remote(*wanted), request_id)
        self.contended = False
        self.claims.prefetch([e for e, _ in candidates[:PREFETCH]])
        for entry, old in candidates[:MAX_TRIES]:
            if self.stopping.is_set():
                return None
            claimed = self.claims.claim(entry, old)
            if claimed:
                return self.serve(entry, *claimed)
            self.contended = True  # another runner was faster: look again at once, not after a poll
        return None

    def serve(self, entry: Entry, sha: str, claim: Claim) -> Served:
        """Run a claimed request and deliver its outcome (bridge/run/deliver.py). Any exception after the claim
        ends in an `error` done commit that says what failed: a run cannot leave the request claimed and
        unfinished."""
        out = self.workdir / "runs" / entry.id
        self.tracker = Tracker(out)
        if self.presence_when_serving:
            self.presence.start(serving=entry.id)
        self.presence.serving(entry.id)
        lease = Lease(self, entry.id, sha, claim, live=self.tracker.live)
        lease.start()
        try:
            if self.stopping.is_set():  # nothing has run yet: give the request back
                lease.stop()
                return self.release(entry, lease.sha)
            step = "clearing the run directory"
            try:
                caps.remove(out)
                step = "serving the request"
                outcome = self.run_request(entry, lease, out)
            except Exception as exc:  # noqa: BLE001 — whatever the disk did, a done commit
                clear(self.log, self.workdir / "work" / entry.id)
                return self.delivery.fail(entry, lease, out, exc, step)
            served = self.delivery.deliver(entry, lease, outcome, self.set_phase)
            if served.pushed:
                clear(self.log, out)
            return served
        finally:
            lease.stop()
            self.tracker = None
            self.presence.serving(None)

    def release(self, entry: Entry, sha: str) -> Served:
        released = self.bus.swap([Update(claim_ref(entry.id), None, sha)])
        self.log(
            f"{entry.id}: released the claim before the run started"
            if released
            else f"{entry.id}: could not release the claim (it changed)"
        )
        return Served(entry.id, "released", reason="runner stopping before the run started")

    def context(self, entry: Entry) -> RunContext:
        """The provenance every result of `entry` starts from, whichever executor runs it."""
        return RunContext(
            request_id=entry.id,
            runner_name=self.name,
            runner_labels=self.labels,
            forced_labels=self.forced_labels,
            signed_by=principal(self.name, self.labels) if self.sign_key else None,
        )

    def run_request(self, entry: Entry, lease: Lease, out: Path) -> RunOutcome:
        """Validate, then run on this host (bridge/run/execute.py); every failure becomes a result (nothing
        raises past here)."""
        context = self.context(entry)
        preset_name, params, preset_hash = entry.preset, {}, None
        try:
            manifest, preset, values = validate(self.mirror, entry, self.registry, self.requesters)
            context.subject, preset_name, params = manifest.subject, preset.name, values
            preset_hash = preset.content_hash
            stop = not_started(manifest, lease.cancelled or bool(entry.cancel), self.now())
            if stop:
                return not_run(out, *stop, preset_name=preset_name, params=params, context=context,
                               preset_hash=preset_hash)  # fmt: skip
            checkout = self.workdir / "work" / entry.id  # the subject's files: no .git, nothing of the mirror
            clear(self.log, checkout)
            git.export(self.mirror, manifest.subject, checkout)
            try:
                check_lfs(checkout)
                self.log(f"{entry.id}: running {preset.name}")
                outcome = run_preset(
                    preset, values, checkout, out, config=self.config, environ=self.environ, context=context,
                    should_stop=lease.should_stop, on_phase=self.set_phase, on_run_dir=self.set_run_dir,
                    executor=self.executor,
                )  # fmt: skip
            finally:
                clear(self.log, checkout)
            return apply_baseline(self.bus, preset, entry.label, outcome)  # a preset's `baseline:`, if any
        except Rejected as exc:
            return not_run(out, "rejected", str(exc), preset_name=preset_name, params=params, context=context)
        except Exception as exc:  # noqa: BLE001 — any failure at any step still ends in a done commit
            return not_run(out, "error", f"runner {self.name}: {exc}", preset_name=preset_name, params=params,
                           context=context, preset_hash=preset_hash)  # fmt: skip

    # --- what the lease and the presence read -------------------------------------------------------

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

    def holder(self, request_id: str, sha: str | None) -> str:
        """Who holds the claim now, for a lease's messages (bridge/run/claims.py)."""
        return self.claims.holder(request_id, sha)

    def start_presence(self, serving: str | None = None) -> None:
        """Keep kakeya/runners/<name> up to date (bridge/run/presence.py) until stop_presence()."""
        self.presence.start(serving)

    def stop_presence(self) -> None:
        """Say this runner stopped (its presence is no longer live)."""
        self.presence.stop()

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
