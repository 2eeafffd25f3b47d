"""A runner whose label's runs are Slurm jobs: up to `max_in_flight` claims at once, each with its own lease
and heartbeat (carrying the job's Slurm state), one squeue per poll for all of them.

    SlurmRunner(runner, label, executor, jobs_dir).watch()     # until stopped
    SlurmRunner(runner, label, executor, jobs_dir).once()      # one request: submit, follow, done commit

It takes claims the way `Runner.once` does (bridge/run/claims.py: candidates, claim, takeover of an expired
lease), then submits the request's job, or, when Slurm already has a job named kakeya-<id> (this runner
restarted, or it took the request over from a runner that died), adopts that job instead of running the
request twice. A job's files
(control dir, out dir, checkout) live in `jobs_dir/<id>/`, on the filesystem the runner and the nodes
share, so whichever runner adopts the job finds them. A cancel on the bus scancels the job; a lease lost to
another runner leaves the job to that runner. Each ended job becomes a done commit on the one delivery path
of every executor (bridge/run/deliver.py).

Stopping (`runner.stop()`, a first SIGTERM/SIGINT) takes no new claim and follows the jobs in flight to their
done commits; `runner.abort()` (a second signal, or `stop_grace_s` after the first) scancels them, and each
still ends in a done commit saying why. A runner that dies (SIGKILL, a crash) leaves its jobs running in
Slurm: the next runner to take their claims adopts them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bridge.bus.progress import Tracker
from bridge.bus.records import Entry, Progress
from bridge.core import caps
from bridge.core.errors import KakeyaError, Rejected
from bridge.evidence import apply_baseline
from bridge.presets.preset import Preset
from bridge.results.outcome import RunOutcome, not_run
from bridge.run.claims import PREFETCH
from bridge.run.deliver import Served
from bridge.run.execute import gate
from bridge.run.lease import Lease
from bridge.run.request import not_started, validate
from bridge.run.runner import Runner
from bridge.run.slurm import (
    ALLOC,
    STATUS,
    Allocation,
    SlurmError,
    SlurmExecutor,
    SlurmJob,
    SlurmRun,
    job_name,
    read_model,
)
from bridge.wire import git


@dataclass
class Flight:
    """One claim this runner holds."""

    entry: Entry
    lease: Lease | None
    tracker: Tracker
    run: SlurmRun | None = None
    outcome: RunOutcome | None = None  # decided without a job (rejected, expired, cancelled before it ran)
    preset: Preset | None = None

    @property
    def phase(self) -> str:
        """The tracker's phase, except that a job still in Slurm's queue is `queued`, not running."""
        queued = self.tracker.phase == "running" and self.run is not None and self.run.queued
        return "queued" if queued else self.tracker.phase

    def progress(self) -> Progress | None:
        record = self.tracker.record()
        scheduler = self.run.describe() if self.run else None
        return record.model_copy(update={"phase": self.phase, "scheduler": scheduler})


class SlurmRunner:
    def __init__(self, runner: Runner, label: str, executor: SlurmExecutor, jobs_dir: Path):
        self.runner, self.label, self.ex = runner, label, executor
        self.jobs_dir = jobs_dir.resolve()
        self.flights: dict[str, Flight] = {}
        self.done: list[Served] = []
        self.serving: str | None = None  # what the presence says now

    @property
    def max_in_flight(self) -> int:
        return self.ex.label.max_in_flight

    def log(self, msg: str) -> None:
        self.runner.log(msg)

    # --- the loop -----------------------------------------------------------------------------------

    def watch(self, poll_s: float | None = None) -> None:
        """Serve until the runner is told to stop, then follow the jobs in flight to their done commits (or,
        once aborted, scancel them). Should this process die, its jobs go on in Slurm: their leases lapse and
        the runner that next takes their claims (this one restarted, or another) adopts them."""
        self.log(
            f"watching {self.runner.bus.url} for {self.label} (Slurm, up to {self.max_in_flight} in flight)"
        )
        self.follow(poll_s, until_idle=False)

    def once(self, request_id: str | None = None, poll_s: float | None = None) -> Served | None:
        """Claim one pending request for the label (or `request_id`), submit its job (or adopt the one Slurm
        has), follow it to its end and push its done commit; None when there was nothing to claim."""
        self.runner.outbox.flush()
        if not self.runner.presence.has_room():
            if request_id:
                raise KakeyaError(f"runner {self.runner.name} is {self.runner.presence.paused}")
            return None
        self.fill(request_id, room=1)
        self.follow(poll_s, until_idle=True)
        return self.done[-1] if self.done else None

    def follow(self, poll_s: float | None, until_idle: bool) -> None:
        """Poll until there is nothing in flight and either `until_idle` or the runner stops."""
        poll_s = poll_s or self.runner.config.poll_interval_s
        stopping = self.runner.stopping
        try:
            while self.flights or not (until_idle or stopping.is_set()):
                try:
                    self.step(fill=not until_idle)
                except KakeyaError as exc:
                    self.log(f"{exc}; retrying")
                if not self.flights and (until_idle or stopping.is_set()):
                    break
                if stopping.is_set():  # following the jobs in flight to their end: the event is set already
                    time.sleep(poll_s)
                else:
                    stopping.wait(poll_s)
        finally:
            self.close()
        if until_idle:
            return
        left = (
            f"; {len(self.flights)} Slurm job(s) go on, for the next runner to adopt" if self.flights else ""
        )
        self.log(f"stopped{left}")

    def step(self, fill: bool = True) -> None:
        """One poll: take claims while there is room (unless not `fill`, or stopping), one squeue for every
        job, cancels, the runner's abort and lost leases, then a done commit for each ended job."""
        runner = self.runner
        runner.outbox.flush()
        if fill and not runner.stopping.is_set() and len(self.flights) < self.max_in_flight:
            self.fill()
        for flight in list(self.flights.values()):
            if flight.outcome is not None:
                self.deliver(flight, flight.outcome)
        runs = [f.run for f in self.flights.values() if f.run is not None]
        try:
            self.ex.poll(runs)
        except SlurmError as exc:  # unreachable is not gone: keep every lease, decide nothing
            self.log(f"Slurm did not answer ({exc}); the jobs are left as they are")
            return
        for flight in list(self.flights.values()):
            run, lease = flight.run, flight.lease
            if run is None or lease is None:
                continue
            if lease.lost:  # another runner holds the claim now: the job is its to follow
                self.log(f"{flight.entry.id}: {lease.lost}; leaving Slurm job {run.job_id} to it")
                self.drop(flight)
                continue
            why = lease.should_stop()
            if why and run.stopped is None and not self.ex.ended(run):
                status = "cancelled" if why == "cancelled" else "error"
                self.log(f"{flight.entry.id}: {why}: scancel {run.job_id}")
                self.ex.stop(run, status, "cancelled while running" if status == "cancelled" else why)
            if self.ex.ended(run) and flight.preset is not None:
                flight.tracker.phase = "gating"
                outcome = gate(self.ex.collect(run), flight.preset, self.runner.config.report_cap_bytes)
                self.deliver(flight, apply_baseline(runner.bus, flight.preset, self.label, outcome))
        self.announce()

    def fill(self, request_id: str | None = None, room: int | None = None) -> None:
        """Claim pending requests of the label (or `request_id`) while fewer than `room` (max_in_flight) are
        in flight."""
        runner = self.runner
        room = self.max_in_flight if room is None else room
        snap = runner.bus.ls_remote()
        candidates = [
            (e, old) for e, old in runner.claims.candidates(snap, request_id) if e.id not in self.flights
        ]
        candidates = [(e, old) for e, old in candidates if e.label == self.label]
        runner.claims.prefetch([e for e, _ in candidates[:PREFETCH]])
        queue: dict[str, SlurmJob] | None = None
        for entry, old in candidates:
            if len(self.flights) >= room or runner.stopping.is_set():
                return
            claimed = runner.claims.claim(entry, old)
            if not claimed:
                continue
            if queue is None:
                queue = self.ex.slurm.queue()
            self.begin(entry, *claimed, queue)

    # --- one claim ----------------------------------------------------------------------------------

    def begin(self, entry: Entry, sha: str, claim: object, queue: dict[str, SlurmJob]) -> None:
        """Start following a claim: submit its job, or adopt the one Slurm already has by its name."""
        home = self.jobs_dir / entry.id
        out, control, work = home / "out", home / "control", home / "work"
        flight = Flight(entry, None, Tracker(out))
        live = flight.tracker.live  # its log since the last beat (bridge/bus/livelog.py)
        flight.lease = Lease(self.runner, entry.id, sha, claim, progress=flight.progress, live=live)  # type: ignore[arg-type]
        self.flights[entry.id] = flight
        flight.lease.start()
        context = self.runner.context(entry)
        preset_name, params = entry.preset, {}
        try:
            runner = self.runner
            manifest, preset, values = validate(runner.mirror, entry, runner.registry, runner.requesters)
            context.subject, preset_name, params = manifest.subject, preset.name, values
            existing = queue.get(job_name(entry.id))
            adopt = existing is not None or (control / STATUS).is_file()
            cancelled = flight.lease.cancelled or bool(entry.cancel)
            stop = None if adopt else not_started(manifest, cancelled, runner.now())
            if stop:
                caps.remove(home)  # whatever an earlier run left there, unreadable or not
                flight.outcome = not_run(out, stop[0], stop[1], preset_name=preset_name, params=params,
                                         context=context, preset_hash=preset.content_hash)  # fmt: skip
                return
            if not adopt:
                caps.remove(home)  # whatever an earlier run left there, unreadable or not
                work.parent.mkdir(parents=True, exist_ok=True)
                git.export(self.runner.mirror, manifest.subject, work)  # the subject's files, no .git
            flight.preset = preset
            setup = self.ex.setup(preset, values, work, out, control, context, self.runner.environ)
            flight.tracker.live.redact = setup.redact  # the job's logs are not redacted as written
            if adopt:
                # Slurm forgot the job (past MinJobAge) but it left its status: the job id from its alloc.json
                known = read_model(Allocation, control / ALLOC)
                job_id = known.job_id if known is not None and (known.job_id or "").isdigit() else "0"
                job = existing or SlurmJob(job_id=job_id, name=job_name(entry.id), state="GONE")
                flight.run = self.ex.adopt(setup, job)
                self.log(f"{entry.id}: adopts Slurm job {job.job_id} ({job.describe()})")
            else:
                flight.run = self.ex.launch(setup)
                self.log(f"{entry.id}: submitted Slurm job {flight.run.job_id or flight.run.start_error}")
            flight.tracker.phase = "running"
        except Rejected as exc:
            flight.outcome = not_run(
                out, "rejected", str(exc), preset_name=preset_name, params=params, context=context
            )
        except Exception as exc:  # noqa: BLE001 — any failure at any step still ends in a done commit
            flight.outcome = not_run(
                out, "error", f"runner {self.runner.name}: {exc}", preset_name=preset_name, params=params,
                context=context,
            )  # fmt: skip

    def deliver(self, flight: Flight, outcome: RunOutcome) -> None:
        """Deliver the outcome on the one path of every executor (bridge/run/deliver.py: caps, result,
        attestation, done commit; an `error` done commit if that raises), then forget the flight."""
        assert flight.lease is not None

        def set_phase(phase: str) -> None:
            flight.tracker.phase = phase

        served = self.runner.delivery.deliver(flight.entry, flight.lease, outcome, set_phase)
        self.done.append(served)
        self.drop(flight, remove=served.pushed)

    def drop(self, flight: Flight, remove: bool = False) -> None:
        if flight.lease is not None:
            flight.lease.stop()
        self.flights.pop(flight.entry.id, None)
        if remove:
            try:
                caps.remove(self.jobs_dir / flight.entry.id)
            except OSError as exc:
                self.log(f"{flight.entry.id}: could not remove its job directory: {exc}")

    def announce(self) -> None:
        """The runner's presence says what it serves: each request, its phase and its job's state
        (`r1 queued (pending (Resources))`, `r2 running (running on node1)`; pushed when that changes, not at
        every poll)."""
        presence = self.runner.presence
        shown = [
            f"{i} {f.phase} ({f.run.describe() if f.run else 'starting'})"
            for i, f in sorted(self.flights.items())
        ]
        serving = ", ".join(shown)[:2000] or None
        if presence.beacon is not None and serving != self.serving:
            presence.serving(serving)
            self.serving = serving  # what the presence was told

    def close(self) -> None:
        """Stop every lease thread (the jobs go on; a restarted runner adopts them)."""
        for flight in list(self.flights.values()):
            if flight.lease is not None:
                flight.lease.stop()
