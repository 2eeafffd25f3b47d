"""The one delivery path of every executor (the local runner, bridge/run/runner.py; the Slurm runner,
bridge/run/slurm_runner.py): a run's outcome becomes a done commit on the bus.

    delivery = Delivery(runner, outbox)
    served = delivery.deliver(entry, lease, outcome, set_phase)   # caps, result, attestation, done push
    served = delivery.fail(entry, lease, out, exc, step)            # serving raised: an `error` done commit

`deliver` checks the run's files (bridge/core/caps.py: what cannot be committed is removed), writes result.json
and the runner's attestation (any attestation.json the program left is replaced), builds the result tree, pushes
its objects ahead to a side ref while the lease beats, then commits on the lease's last beat and makes the one
atomic done push (bridge/run/outbox.py). Whatever raises on the way still ends in a done commit (`fail`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bridge.bus.records import CLAIM_PATH, Entry, Update, results_path, stage_ref
from bridge.bus.trust import principal
from bridge.core import caps
from bridge.core.errors import KakeyaError
from bridge.core.result import RunResult
from bridge.results import attest
from bridge.results.outcome import RunOutcome, not_run
from bridge.run.lease import Lease
from bridge.run.outbox import Outbox
from bridge.run.owner import Owner
from bridge.wire import git


@dataclass
class Served:
    """What `Runner.once` did with one request."""

    id: str
    status: str
    verdict: str | None = None
    reason: str | None = None
    done: str | None = None  # the done commit, when pushed
    pushed: bool = False


class Delivery:
    def __init__(self, runner: Owner, outbox: Outbox):
        self.runner, self.outbox = runner, outbox

    def deliver(
        self, entry: Entry, lease: Lease, outcome: RunOutcome, set_phase: Callable[[str], None]
    ) -> Served:
        """Check the run's files, write the result and the runner's attestation, commit them and push the done
        commit; the lease is stopped after. Any exception on the way ends in an `error` done commit (`fail`)
        that names the step that failed."""
        runner, config, out = self.runner, self.runner.config, outcome.out_dir
        step = "checking the run's files"
        try:
            outcome.result.dropped += caps.apply_caps(
                out,
                report_cap=config.report_cap_bytes,
                files_cap=config.files_cap_bytes,
                result_cap=config.result_cap_bytes,
                count_cap=config.files_count_cap,
                log_cap=config.log_cap_bytes,
            )
            step = "writing the result"
            result = outcome.write()
            # the runner's attestation replaces any the program left; it goes in the done commit
            attest.write(out, runner.sign_key, entry.label, principal(runner.name, runner.labels))
            set_phase("pushing")  # the lease keeps beating through commit and push
            served = Served(entry.id, result.status, result.verdict, result.reason)
            # The lease keeps beating while the result is committed and its objects are pushed ahead (however
            # long that takes); the final commit goes on the last beat, in a push of a few small objects.
            step = "committing the result"
            tree = self.result_tree(entry, lease.sha, out) if not lease.lost else ""
            staged = self.stage(entry.id, lease.sha, tree) if not lease.lost else None
            with lease.lock:
                if not lease.lost:
                    served.done = self.done_commit(entry, lease, tree, result)
                    step = "pushing the result"
                    served.pushed = self.outbox.push(entry.id, lease.sha, served.done, entry)
            lease.stop()
            if staged:
                self.unstage(*staged)
        except Exception as exc:  # noqa: BLE001 — whatever the run left or the disk did, a done commit
            return self.fail(entry, lease, out, exc, step, outcome)
        if served.done is None:
            runner.log(f"{entry.id}: {lease.lost}; its result is not pushed (kept in {out})")
            served.reason = lease.lost
        return served

    def fail(
        self,
        entry: Entry,
        lease: Lease,
        out: Path,
        exc: Exception,
        step: str,
        outcome: RunOutcome | None = None,
    ) -> Served:
        """The done commit of a request whose serving raised at `step`: status error, the reason, built in memory
        after the run's files are removed (a run that filled the disk gets its space back first); the run's
        provenance and what was dropped come from its `outcome`, when it ran, none of its files."""
        runner = self.runner
        why = f"runner {runner.name}: {step} failed: {exc.__class__.__name__}: {exc}"
        why = why.encode("utf-8", "backslashreplace").decode()  # a name that is not UTF-8 in the message
        runner.log(f"{entry.id}: {why}")
        try:
            caps.remove(out)
        except OSError as again:
            runner.log(f"could not remove {out}: {again}")
        served = Served(entry.id, "error", reason=why)
        if lease.lost:
            served.reason = f"{why}; {lease.lost}"
            return served
        try:
            if outcome is not None:
                result = outcome.result.model_copy(
                    update={"status": "error", "reason": why, "verdict": None, "report": None}
                )
                outcome = RunOutcome(out, result, redact=outcome.redact, places=outcome.places)
            else:
                context = runner.context(entry)
                outcome = not_run(out, "error", why, preset_name=entry.preset, params={}, context=context)
            prefix = results_path(entry.id)
            files = {f"{prefix}/{name}": data for name, data in outcome.files().items()}
            tree = git.tree_with(runner.mirror, lease.sha, files, without=prefix)
            with lease.lock:
                if lease.lost:
                    served.reason = f"{why}; {lease.lost}"
                    return served
                served.done = self.done_commit(entry, lease, tree, outcome.result)
                served.pushed = self.outbox.push(entry.id, lease.sha, served.done, entry)
        except Exception as again:  # noqa: BLE001 — the claim expires and another runner takes the request over
            runner.log(f"{entry.id}: could not record that either ({again}); the claim will expire")
        return served

    def result_tree(self, entry: Entry, claim_sha: str, out: Path) -> str:
        """The claim's tree without anything the request put under .kakeya/results/<id>/, plus the run's files
        there (read as bridge/core/caps.py reads: the caps have removed what cannot be committed)."""
        config = self.runner.config
        prefix = results_path(entry.id)
        found = caps.read_tree(out, 2 * config.result_cap_bytes + 4 * config.log_cap_bytes)
        files = {f"{prefix}/{rel}": data for rel, data in found.items()}
        return git.tree_with(self.runner.mirror, claim_sha, files, without=prefix)

    def stage(self, request_id: str, claim_sha: str, tree: str) -> tuple[str, str] | None:
        """Push the result's objects to a side ref (stage_ref) without holding the lease's lock, so heartbeats
        go on however long a big result takes to upload; the done push then sends only the done commit, its
        claim.json and two trees. (ref, sha) when staged; None when the bus did not take it (the done push
        then carries everything, or goes to the outbox)."""
        runner = self.runner
        sha = git.commit(
            runner.mirror, tree, [claim_sha], f"kakeya stage {request_id} by {runner.name}", runner.who
        )
        ref = stage_ref(request_id, sha)
        try:
            if runner.bus.swap([Update(ref, sha, None)], atomic=False):
                return ref, sha
        except KakeyaError as exc:
            runner.log(f"{request_id}: could not push the result ahead ({exc}); it goes with the done commit")
        return None

    def unstage(self, ref: str, sha: str) -> None:
        """Delete a side ref once the done push is over; one left behind (the bus went away) is harmless:
        it is outside refs/heads, so no clone fetches it and no status reads it."""
        try:
            self.runner.bus.swap([Update(ref, None, sha)], atomic=False)
        except KakeyaError as exc:
            self.runner.log(f"could not delete {ref}: {exc}")

    def done_commit(self, entry: Entry, lease: Lease, tree: str, result: RunResult) -> str:
        """The done commit on the lease's last heartbeat (its claim.json), holding `tree`'s results."""
        runner = self.runner
        tree = git.tree_with(runner.mirror, tree, {CLAIM_PATH: lease.claim.dump()})
        verdict = f", verdict {result.verdict}" if result.verdict else ""
        message = f"kakeya done {entry.id}: {result.status}{verdict}\n\n{result.reason or ''}".rstrip() + "\n"
        return git.commit(runner.mirror, tree, [lease.sha], message, runner.who, runner.sign_key)
