"""Runs as Slurm jobs, through Slurm's own command-line clients (no libslurm: the `-o`/`-P` formats used
here are stable from Slurm 22.05 to 25.x).

    sbatch --parsable --no-requeue --job-name=kakeya-<request id> --export=NONE ...  submit
    squeue -h -t all -u <user> -o FORMAT                                              all our jobs, one call
    scontrol -o show job ID   (then sacct -c -P)                                      how an ended job ended
    scancel ID                                                                        cancel, time limit

A job's files live in a control directory on the filesystem the runner and the nodes share: job.sh (the
batch script: it only execs bridge/run/slurm_job.py), job.json (the program's argv and environment, the
isolation asked for, mode 600, deleted by the job as it starts: nothing secret reaches sbatch's environment
or slurmctld), alloc.json (what Slurm allocated, and the isolation the node gave), launcher.json (the
program's exit status, bridge/run/launcher.py), slurm.out (Slurm's own words about the job), and sandbox/: the
program's own private directories (its copy of the subject in work/, its run directory out/, HOME, TMPDIR),
the only part of the control directory a sandboxed program sees. Where the compute node has bubblewrap the
program runs in the same sandbox a local run gets (bridge/run/isolation.py, chosen on the node); the runner
collects what it left in sandbox/out as a local run's is collected. The program's outcome is the launcher's status file; Slurm's
state says what happened only when that file is missing (node failure, out of memory, preemption, an
administrator's scancel).

The runner enforces the preset's time limit itself, counted from the job's start (RUNNING), with scancel to
the second; `--time` (whole minutes, checked every ~30 s) is only a backstop.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import pwd
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from bridge.bus.trust import key_file
from bridge.config import Config, SlurmLabel
from bridge.core import caps
from bridge.core.caps import collect as collect_files
from bridge.core.errors import KakeyaError
from bridge.core.logs import Redactor
from bridge.core.result import RunContext, RunResult, SchedulerJob, Status, iso_time, now
from bridge.presets.preset import Preset, Resources
from bridge.results.outcome import RunOutcome
from bridge.run.execute import (
    RunSetup,
    build_env,
    ended_outcome,
    over_limit,
    provenance,
    render_argv,
    secret_values,
)
from bridge.run.isolation import ROOT_RUNS_FOR_TESTS, Isolation

PREFIX = "kakeya-"
JOB_SCRIPT, JOB_SPEC, ALLOC, STATUS, SLURM_OUT, SANDBOX = (
    "job.sh",
    "job.json",
    "alloc.json",
    "launcher.json",
    "slurm.out",
    "sandbox",  # the program's private directories: HOME, TMPDIR, work (its copy of the subject), out
)
ON_NODE = " (a Slurm job)"  # how result.json's `isolation` says the node chose it
# The variables sbatch itself runs with (never the runner's whole environment).
SUBMIT_ENV = ("PATH", "SLURM_CONF", "HOME", "USER", "LOGNAME", "LANG", "TZ")
SQUEUE_FORMAT = "%i|%T|%r|%N|%P|%V|%S|%j"  # the name last: it is the only field that could hold a '|'
ENDED = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "REVOKED",
}  # fmt: skip
# What Slurm's state means when the program could not say how it ended (no launcher status).
LOST = {
    "NODE_FAIL": "its node failed",
    "OUT_OF_MEMORY": "it ran out of memory",
    "PREEMPTED": "it was preempted",
    "BOOT_FAIL": "its node failed to boot",
    "CANCELLED": "it was cancelled outside Kakeya (scancel)",
    "TIMEOUT": "Slurm's --time backstop ended it",
    "DEADLINE": "it passed its deadline",
    "FAILED": "its batch script failed",
    "COMPLETED": "it left no exit status",
}


class SlurmError(KakeyaError):
    """A Slurm client failed or Slurm could not be reached (the message carries its own words)."""


def job_name(request_id: str) -> str:
    return PREFIX + request_id


def _time(value: str) -> dt.datetime | None:
    """Slurm's local `2026-11-25T13:24:06` (or N/A, Unknown, None) as an aware datetime."""
    try:
        return dt.datetime.fromisoformat(value).astimezone()
    except ValueError:
        return None


class SlurmJob(BaseModel):
    """One line of squeue: a job as Slurm sees it now."""

    model_config = ConfigDict(frozen=True)
    job_id: str
    name: str
    state: str
    reason: str = ""
    node: str = ""
    partition: str = ""
    submitted: dt.datetime | None = None
    started: dt.datetime | None = None

    @classmethod
    def parse(cls, line: str) -> SlurmJob | None:
        parts = line.split("|", 7)
        if len(parts) != 8 or not parts[0].isdigit():
            return None
        job_id, state, reason, node, partition, submitted, started, name = parts
        running = state not in ("PENDING", "CONFIGURING")
        return cls(
            job_id=job_id,
            name=name,
            state=state.split()[0],
            reason="" if reason in ("None", "(null)") else reason,
            node=node,
            partition=partition,
            submitted=_time(submitted),
            started=_time(started) if running else None,
        )

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    def describe(self) -> str:
        """What a heartbeat says: `pending (Resources)`, `running on node1`, `completing on node1`."""
        if self.state == "PENDING":
            return f"pending ({self.reason})" if self.reason else "pending"
        where = f" on {self.node}" if self.node else ""
        return f"{self.state.lower().replace('_', ' ')}{where}"


class JobEnd(BaseModel):
    """How an ended job ended, from `scontrol -o show job` (or `sacct -c` once slurmctld forgot it)."""

    model_config = ConfigDict(frozen=True)
    job_id: str
    state: str
    exit_code: str = ""  # code:signal
    reason: str = ""
    node: str = ""
    started: dt.datetime | None = None
    ended: dt.datetime | None = None

    def describe(self) -> str:
        why = LOST.get(self.state, f"it ended {self.state}")
        where = f" on {self.node}" if self.node else ""
        extra = f", reason {self.reason}" if self.reason and self.reason != "None" else ""
        return f"Slurm job {self.job_id} ended {self.state}{where} ({why}{extra})"


class Allocation(BaseModel):
    """alloc.json: what the job saw of its allocation (written inside the job by bridge/run/slurm_job.py)."""

    model_config = ConfigDict(extra="ignore")
    job_id: str | None = None
    node: str | None = None
    partition: str | None = None
    gpus: list[str] = []
    cuda_visible_devices: str | None = None
    gpu_names: list[str] = []
    isolation: str | None = None  # what the node gave the program (bridge/run/isolation.py's describe)
    network: str | None = None


@dataclass(frozen=True)
class JobSpec:
    """One run to submit: the program and where its files go."""

    request_id: str
    control: Path  # the job's own files (shared filesystem); the program's private ones under SANDBOX
    checkout: Path  # the runner's export of the subject, which the job copies into SANDBOX/work
    out_dir: Path  # where the job writes the logs (the runner collects SANDBOX/out into it)
    argv: list[str]
    env: dict[str, str]
    timeout_s: int
    log_cap_bytes: int
    resources: Resources | None
    isolation: str = "auto"  # config isolation and run_user: the node chooses with them (isolation.choose)
    run_user: str = "kakeya-run"
    network_none: bool = False
    signing_key: str | None = None  # the runner signs: the node refuses to run the program without a sandbox
    limits: dict[str, int | None] | None = None  # the preset's `limits`, as written: the node's defaults fill
    root_runs_for_tests: bool = False  # the runner's KAKEYA_TEST_ROOT_RUNS (isolation.ROOT_RUNS_FOR_TESTS)


def sbatch_argv(spec: JobSpec, label: SlurmLabel) -> list[str]:
    """The submit command: everything Kakeya decides, then the label's own options."""
    backstop_min = math.ceil(spec.timeout_s / 60) + 2
    argv = [
        "sbatch",
        "--parsable",
        "--no-requeue",
        f"--job-name={job_name(spec.request_id)}",
        "--export=NONE",
        f"--chdir={spec.control}",
        f"--output={spec.control / SLURM_OUT}",
        f"--time={backstop_min}",
    ]
    for flag, value in (("--partition", label.partition), ("--account", label.account), ("--qos", label.qos)):
        if value:
            argv.append(f"{flag}={value}")
    res = spec.resources
    gpus = res.gpus if res is not None and "gpus" in res.model_fields_set else label.gpus
    if gpus:
        argv.append(f"--gres=gpu:{label.gpu_type + ':' if label.gpu_type else ''}{gpus}")
    if res is not None:
        argv.append(f"--cpus-per-task={res.cpus}")
        if res.memory:
            argv.append(f"--mem={res.memory}")
    return [*argv, *label.sbatch_options, str(spec.control / JOB_SCRIPT)]


def write_job(spec: JobSpec) -> None:
    """The control directory's job.sh and job.json (mode 600: the environment may hold secrets)."""
    spec.control.mkdir(parents=True, exist_ok=True)
    for name in (STATUS, ALLOC, SLURM_OUT):
        (spec.control / name).unlink(missing_ok=True)
    job_py = Path(__file__).resolve().with_name("slurm_job.py")
    script = f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I {shlex.quote(str(job_py))} "
    script += f"{shlex.quote(str(spec.control))}\n"
    (spec.control / JOB_SCRIPT).write_text(script)
    data = {
        "argv": spec.argv,
        "checkout": str(spec.checkout),
        "env": spec.env,
        "out_dir": str(spec.out_dir),
        "log_cap_bytes": spec.log_cap_bytes,
        "isolation": spec.isolation,
        "run_user": spec.run_user,
        "network_none": spec.network_none,
        "signing_key": spec.signing_key,
        "limits": spec.limits or {},
        "root_runs_for_tests": spec.root_runs_for_tests,
    }
    fd = os.open(spec.control / JOB_SPEC, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)


def parse_keyvalues(line: str) -> dict[str, str]:
    """`scontrol -o` output: space-separated Key=Value pairs (values without spaces but the last few)."""
    out: dict[str, str] = {}
    for item in line.split():
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out


class Slurm:
    """Slurm's clients, run with a minimal environment; each call either answers or raises SlurmError."""

    def __init__(self, environ: Mapping[str, str] | None = None, timeout_s: float = 60.0):
        environ = os.environ if environ is None else environ
        self.env = {k: environ[k] for k in SUBMIT_ENV if k in environ}
        self.timeout_s = timeout_s
        self.user = pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self.env,
                stdin=subprocess.DEVNULL,
                timeout=self.timeout_s,
            )
        except FileNotFoundError:
            raise SlurmError(
                f"{argv[0]} is not installed here (Slurm's client commands are needed)"
            ) from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer in {self.timeout_s:g} s: is slurmctld up?") from None
        if check and proc.returncode:
            words = (proc.stderr or proc.stdout).strip().splitlines()
            raise SlurmError(f"{' '.join(argv[:2])} failed: {words[-1] if words else proc.returncode}")
        return proc

    def submit(self, spec: JobSpec, label: SlurmLabel) -> str:
        """Submit the run; its job id."""
        write_job(spec)
        out = self._run(sbatch_argv(spec, label)).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed no job id: {out!r}")
        return job_id

    def queue(self) -> dict[str, SlurmJob]:
        """All of this user's Kakeya jobs Slurm still knows, by job name (one squeue); where a name has several
        jobs, the live one, else the newest."""
        out = self._run(["squeue", "-h", "-t", "all", "-u", self.user, "-o", SQUEUE_FORMAT]).stdout
        jobs: dict[str, SlurmJob] = {}
        for line in out.splitlines():
            job = SlurmJob.parse(line)
            if job is None or not job.name.startswith(PREFIX):
                continue
            old = jobs.get(job.name)
            if old is None or (not old.ended, int(old.job_id)) < (not job.ended, int(job.job_id)):
                jobs[job.name] = job
        return jobs

    def end(self, job_id: str) -> JobEnd | None:
        """How job `job_id` ended (None: Slurm does not know it any more)."""
        proc = self._run(["scontrol", "-o", "show", "job", job_id], check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            kv = parse_keyvalues(proc.stdout)
            return JobEnd(
                job_id=job_id,
                state=kv.get("JobState", "UNKNOWN"),
                exit_code=kv.get("ExitCode", ""),
                reason=kv.get("Reason", ""),
                node=kv.get("NodeList", ""),
                started=_time(kv.get("StartTime", "")),
                ended=_time(kv.get("EndTime", "")),
            )
        proc = self._run(
            ["sacct", "-c", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,Start,End,NodeList"],
            check=False,  # no job completion log here, or it lost the job: Slurm cannot say more
        )
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 6 and parts[0] == job_id:
                return JobEnd(
                    job_id=job_id,
                    state=parts[1].split()[0],
                    exit_code=parts[2],
                    node=parts[5],
                    started=_time(parts[3]),
                    ended=_time(parts[4]),
                )
        return None

    def cancel(self, job_id: str) -> None:
        self._run(["scancel", job_id])

    def check(self, label: SlurmLabel) -> str:
        """`kakeya doctor`'s line for a Slurm label: squeue answers, the partition exists (sinfo) and sbatch
        would take a job with the label's partition, account, QoS and GPU type (`--test-only`: nothing runs).
        SlurmError says what does not."""
        self._run(["squeue", "-h", "-u", self.user, "-o", "%i"])
        part = ["-p", label.partition] if label.partition else []
        rows = [
            r.split("|") for r in self._run(["sinfo", "-h", *part, "-o", "%P|%a|%D|%G"]).stdout.splitlines()
        ]
        rows = [
            r for r in rows if len(r) == 4 and (not label.partition or r[0].rstrip("*") == label.partition)
        ]
        if not rows:
            raise SlurmError(
                f"partition {label.partition!r} does not exist (`sinfo -h -p {label.partition}` lists none)"
                if label.partition
                else "Slurm has no default partition: set the label's `partition`"
            )
        name, avail, nodes, gres = rows[0]
        spec = JobSpec("doctor", Path("/"), Path("/"), Path("/"), [], {}, 60, 0, Resources(gpus=1))
        argv = [a for a in sbatch_argv(spec, label)[:-1] if not a.startswith(("--chdir", "--output"))]
        self._run(["sbatch", "--test-only", *argv[1:], "--wrap=true"])
        return (
            f"Slurm label: partition {name.rstrip('*')} ({avail}, {nodes} node(s), {gres}); squeue answers; "
            "sbatch --test-only takes a 1-GPU job (the GPUs are the nodes', not checked on this host); a run "
            + (
                f"whose preset names no GPUs (`resources`) asks for {label.gpus} (the label's `gpus`)"
                if label.gpus
                else "whose preset names no GPUs asks for none (the label's `gpus` is 0: set `gpus = 1` for a GPU "
                "partition; the shipped presets name no `resources`)"
            )
        )


class LauncherStatus(BaseModel):
    """launcher.json (bridge/run/launcher.py), as the job left it."""

    model_config = ConfigDict(extra="ignore")
    exit_code: int | None = None
    strays: int | None = None
    start_error: str | None = None
    lost: str | None = (
        None  # bridge/run/slurm_job.py: the launcher was killed, so the program's status is unknown
    )
    refused: str | None = None  # bridge/run/slurm_job.py: why the program was not started on the node
    limits: dict[str, int] | None = None  # what the launcher set (bytes; processes)
    limit: str | None = None  # the limit the program reached (the launcher's word), and what showed it
    why: str | None = None


def read_model(model: type[BaseModel], path: Path) -> Any:
    """A small file of the job's control directory, read as bridge/core/caps.py reads a run's files (no link
    followed, never waited on, at most 64 KiB); None when it is not there or not a `model`."""
    try:
        return model.model_validate_json(caps.read_file(path.parent, path.name, 64 * 1024))
    except (OSError, caps.Unsafe, ValidationError):
        return None


@dataclass
class SlurmRun:
    """One run's job, as the runner follows it (the Executor seam's handle)."""

    setup: RunSetup
    spec: JobSpec
    job_id: str
    job: SlurmJob | None = None  # the last squeue line seen
    stopped: tuple[Status, str] | None = None  # the runner ended it: status, reason
    start_error: str | None = None  # the Executor seam's: why it could not be submitted

    @property
    def name(self) -> str:
        return job_name(self.spec.request_id)

    @property
    def out_dir(self) -> Path:
        return self.setup.out_dir

    def describe(self) -> str:
        """The heartbeat's words for it: `pending (Resources)`, `running on node1`."""
        return self.job.describe() if self.job is not None else "submitted"

    @property
    def queued(self) -> bool:
        """Is the job still waiting in Slurm's queue (submitted, pending, or its node still booting)?"""
        return self.start_error is None and (self.job is None or self.job.state in ("PENDING", "CONFIGURING"))


class SlurmExecutor:
    """Runs presets as Slurm jobs for one label (bridge/run/execute.py's Executor seam: launch, supervise,
    collect), and, for a runner with many jobs in flight, `poll` (one squeue for all), `stop` (scancel) and
    `adopt` (a job a previous runner submitted)."""

    def __init__(self, label: SlurmLabel, config: Config, slurm: Slurm | None = None, poll_s: float = 1.0):
        self.label, self.config, self.poll_s = label, config, poll_s
        self.slurm = slurm or Slurm()

    def setup(
        self,
        preset: Preset,
        values: Mapping[str, Any],
        checkout: Path,
        out_dir: Path,
        control: Path,
        context: RunContext,
        environ: Mapping[str, str] | None = None,
    ) -> RunSetup:
        """The run, decided (nothing submitted): `control` (on the shared filesystem) holds the job's own
        files, and under SANDBOX the program's private directories, which the job makes on the node (the
        program runs in `SANDBOX/work`, its copy of `checkout`, and writes in `SANDBOX/out`, whatever
        isolation the node gives it); KakeyaError where the preset cannot render."""
        environ = os.environ if environ is None else environ
        checkout, out_dir, control = checkout.resolve(), out_dir.resolve(), control.resolve()
        scratch = control / SANDBOX
        cwd, run_dir = scratch / "work", scratch / "out"
        (out_dir / "logs").mkdir(parents=True, exist_ok=True)
        preset_env = preset.render_env(environ)
        redact = Redactor(secret_values(preset, self.config, environ, preset_env))
        argv = render_argv(preset, values, run_dir, environ)
        env = build_env(preset_env, environ, cwd, run_dir, context, scratch)
        base = provenance(
            preset,
            values,
            context,
            isolation=f"not chosen: the job never started{ON_NODE}",  # the node chooses (alloc.json)
            network="host",
            argv=[redact.text(a) for a in argv],
        )
        return RunSetup(
            argv=tuple(argv),
            env=MappingProxyType(env),
            cwd=checkout,  # the runner's export: the job copies it into SANDBOX/work
            scratch=scratch,
            run_dir=run_dir,
            out_dir=out_dir,
            isolation=Isolation(
                self.config.isolation, network="none" if preset.network == "none" else "host"
            ),
            timeout_s=preset.timeout_s,
            config=self.config,
            provenance=MappingProxyType(base),
            redact=redact,
            resources=preset.resources,
            asked_limits=preset.limits,
        )

    def _spec(self, setup: RunSetup) -> JobSpec:
        return JobSpec(
            request_id=str(setup.provenance.get("request_id") or f"local-{os.getpid()}-{id(setup)}"),
            control=setup.scratch.parent,
            checkout=setup.cwd,
            out_dir=setup.out_dir,
            argv=list(setup.argv),
            env=dict(setup.env),
            timeout_s=math.ceil(setup.timeout_s),
            log_cap_bytes=setup.config.log_cap_bytes,
            resources=setup.resources,
            isolation=setup.isolation.kind,
            run_user=setup.config.run_user,
            network_none=setup.isolation.network == "none",
            signing_key=key_file(setup.config.signing_key),
            limits=setup.asked_limits.model_dump() if setup.asked_limits is not None else None,
            root_runs_for_tests=os.environ.get(ROOT_RUNS_FOR_TESTS) == "1",
        )

    def launch(self, setup: RunSetup) -> SlurmRun:
        """Submit the run's job (a SlurmRun with `start_error` when sbatch refused it)."""
        spec = self._spec(setup)
        try:
            return SlurmRun(setup, spec, self.slurm.submit(spec, self.label))
        except SlurmError as exc:
            return SlurmRun(setup, spec, "", start_error=f"could not submit the Slurm job: {exc}")

    def adopt(self, setup: RunSetup, job: SlurmJob) -> SlurmRun:
        """Follow a job a previous runner submitted (found by its name) instead of submitting another."""
        return SlurmRun(setup, self._spec(setup), job.job_id, job=job)

    def supervise(
        self, run: SlurmRun, should_stop: Callable[[], str | None] | None
    ) -> tuple[Status, str] | None:
        """Follow one job to its end (a runner with many jobs calls `poll` instead)."""
        while run.start_error is None and not self.ended(run):
            why = should_stop() if should_stop is not None else None
            if why and run.stopped is None:
                self.stop(
                    run, *(("cancelled", "cancelled while running") if why == "cancelled" else ("error", why))
                )
            time.sleep(self.poll_s)
            try:
                self.poll([run])
            except SlurmError:  # unreachable is not gone: look again
                pass
        return run.stopped

    def poll(self, runs: list[SlurmRun], clock: dt.datetime | None = None) -> None:
        """One squeue for every run: each run's `job` is updated, and a job past its preset's time limit
        (counted from when it started running) is cancelled and marked timed-out."""
        runs = [r for r in runs if r.start_error is None]
        if not runs:
            return
        jobs = self.slurm.queue()
        clock = clock or now()
        for run in runs:
            job = jobs.get(run.name)
            if job is None or job.job_id != run.job_id:  # Slurm forgot it (or another job has the name)
                gone = {"state": "GONE"}
                run.job = (
                    run.job.model_copy(update=gone)
                    if run.job
                    else SlurmJob(job_id=run.job_id, name=run.name, **gone)
                )
                continue
            run.job = job
            limit = run.spec.timeout_s
            started = job.started
            if job.running and started and run.stopped is None and (clock - started).total_seconds() >= limit:
                self.stop(run, "timed-out", f"killed after the preset's time limit of {limit} s")

    def stop(self, run: SlurmRun, status: Status, reason: str) -> None:
        """End the run's job (scancel): a cancel on the bus, the time limit, the runner stopping."""
        if run.stopped is None:
            run.stopped = (status, reason)
        self.slurm.cancel(run.job_id)

    @staticmethod
    def ended(run: SlurmRun) -> bool:
        return run.start_error is not None or (
            run.job is not None and (run.job.ended or run.job.state == "GONE")
        )

    def collect(self, run: SlurmRun, stopped: tuple[Status, str] | None = None) -> RunOutcome:
        """The outcome of an ended job (not yet gated): the program's own exit status where the launcher
        wrote it, else what Slurm says happened; provenance from Slurm and the job's alloc.json."""
        setup, base = run.setup, dict(run.setup.provenance)
        stopped = stopped or run.stopped
        if run.start_error is not None:
            result = RunResult(status="error", reason=run.start_error, **base)
            return RunOutcome(setup.out_dir, result, redact=setup.redact)
        control = run.spec.control
        status: LauncherStatus | None = read_model(LauncherStatus, control / STATUS)
        alloc: Allocation = read_model(Allocation, control / ALLOC) or Allocation()
        end = self.slurm.end(run.job_id)
        if alloc.isolation:  # what the node gave the program
            base.update(isolation=alloc.isolation + ON_NODE, network=alloc.network or "host")
        job = run.job
        submitted = job.submitted if job else None
        started = (end.started if end else None) or (job.started if job else None)
        ended = (end.ended if end else None) or now()
        base["scheduler"] = SchedulerJob(
            job_id=run.job_id,
            state=end.state if end else None,
            partition=alloc.partition or (job.partition if job else None),
            node=alloc.node or (end.node if end else None) or (job.node if job else None),
            gpus=alloc.gpus,
            gpu_names=alloc.gpu_names,
            queue_wait_s=round((started - submitted).total_seconds(), 3) if started and submitted else None,
            run_time_s=round((ended - started).total_seconds(), 3) if started else None,
        )
        killed_by_slurm = (
            stopped is None
            and end is not None
            and end.state not in ("COMPLETED", "FAILED")
            and status is not None
            and (status.exit_code or 0) < 0
        )  # the program was signalled as Slurm ended the job (an admin's scancel, preemption, OOM)
        # what the program left in its own run directory, however it ended (a killed run's too)
        collected = (
            collect_files(setup.run_dir, setup.out_dir, setup.config.result_cap_bytes)
            if setup.run_dir.is_dir()
            else []
        )
        if (
            status is not None
            and status.start_error is None
            and status.lost is None
            and status.refused is None
            and not killed_by_slurm
        ):
            base["strays_killed"] = status.strays
            outcome = ended_outcome(
                setup, base, status.exit_code, started or ended, ended, stopped, collected
            )
            return over_limit(outcome, status.model_dump(), None)
        if stopped is not None:
            state, reason = stopped
        elif status is not None and status.refused is not None:
            state, reason = "error", f"Slurm job {run.job_id}: {status.refused}"
        elif status is not None and status.start_error is not None:
            state, reason = "error", f"could not start {setup.argv[0]!r}: {status.start_error}"
        elif status is not None and status.lost is not None:
            state, reason = (
                "error",
                f"Slurm job {run.job_id}: {status.lost}; the program's exit status is unknown",
            )
        elif killed_by_slurm and end is not None and status is not None:
            state, reason = (
                "error",
                f"{end.describe()}; the program was killed by signal {-(status.exit_code or 0)}",
            )
        elif end is None:
            state, reason = "error", f"Slurm job {run.job_id} is gone and left no exit status"
        else:
            state, reason = "error", end.describe()
        times = {"started_at": iso_time(started)} if started else {}
        base["dropped"] = collected
        result = RunResult(status=state, reason=reason, ended_at=iso_time(ended), **times, **base)
        return RunOutcome(setup.out_dir, result, redact=setup.redact)
