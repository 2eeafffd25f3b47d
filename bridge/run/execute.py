"""Executing one preset, sandboxed and recorded, and gating its report.

`run_preset` renders the trusted preset's argv (no shell) into a frozen `RunSetup` (argv, environment,
the run's copy of the subject, its directories, isolation, caps, time limit, provenance) and hands it to an
`Executor`: launch, supervise (time limit, cancel, lost lease), collect. `LocalExecutor` runs it under
bridge/run/launcher.py (a child subreaper that ends every process the run started, setsid or not, at exit, at
the time limit and when the runner dies) inside the isolation of bridge/run/isolation.py (a bubblewrap sandbox
by default), with a scrubbed environment, a private HOME/TMPDIR/caches and stdout/stderr streamed to
capped, redacted files, then caps what the run left (bridge/core/caps.py). `gate` checks and gates the report.
It returns the `RunOutcome` in memory (nothing a run produced is lost: every path ends in one); `execute`
also writes it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import gates
from bridge.bus.progress import PROGRESS_FILE
from bridge.config import Config
from bridge.core import caps
from bridge.core.caps import REPORT, apply_caps
from bridge.core.caps import collect as collect_files
from bridge.core.errors import KakeyaError
from bridge.core.logs import CappedLog, Redactor, pump
from bridge.core.result import RunContext, RunResult, Status, iso_time, now
from bridge.host import host_fingerprint, tool_versions
from bridge.presets.preset import Limits, Preset, Resources
from bridge.results.outcome import RunOutcome
from bridge.run import launcher
from bridge.run.isolation import Isolation, RunLimits, bwrap_argv, choose, limit_reason, run_limits
from bridge.run.proc import kill_tree
from bridge.wire import git

# The only variables a run inherits from the runner's environment (plus the preset's own env).
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SYSTEMROOT")
POLL_S = 0.2
# Where a program may write as its user: all of it points into the run's private scratch directory.
PRIVATE_DIRS = {
    "HOME": "home",
    "TMPDIR": "tmp",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_CACHE_HOME": "home/.cache",
    "XDG_DATA_HOME": "home/.local/share",
    "XDG_STATE_HOME": "home/.local/state",
    "HF_HOME": "home/.cache/huggingface",
    "TORCH_HOME": "home/.cache/torch",
    "MPLCONFIGDIR": "home/.config/matplotlib",
}


def secret_values(
    preset: Preset, config: Config, environ: Mapping[str, str], env: Mapping[str, str]
) -> list[str]:
    names = set(preset.secrets) | set(config.secrets)
    return [v for n in names for v in (environ.get(n), env.get(n)) if v]


def provenance(preset: Preset, values: Mapping[str, Any], context: RunContext, **more: Any) -> dict[str, Any]:
    """What every result records of its run, whichever executor runs it: the preset, its content hash, the
    parameters, the host's fingerprint, the tool versions, who asked and where (`context`), and `more`."""
    return dict(
        preset=preset.name,
        preset_hash=preset.content_hash,
        params=dict(values),
        host=host_fingerprint(),
        tools=tool_versions(),
        **more,
        **context.model_dump(),
    )


def render_argv(
    preset: Preset, values: Mapping[str, Any], run_dir: Path, environ: Mapping[str, str]
) -> list[str]:
    """The preset's argv, its builtins filled for a program that writes in `run_dir`: `{python}` this
    interpreter, `{report}` run_dir/report.json, `{run_dir}`."""
    builtins = {"python": sys.executable, "report": str(run_dir / REPORT), "run_dir": str(run_dir)}
    return preset.render_argv(values, builtins, environ)


def build_env(
    preset_env: Mapping[str, str],
    environ: Mapping[str, str],
    checkout: Path,
    out_dir: Path,
    context: RunContext,
    scratch: Path | None = None,
) -> dict[str, str]:
    """The program's environment; with `scratch`, HOME, TMPDIR, XDG_* and the model caches point into it."""
    env = {k: environ[k] for k in BASE_ENV if k in environ}
    if scratch is not None:
        env.update({k: str(scratch / sub) for k, sub in PRIVATE_DIRS.items()})
    env.update(preset_env)
    env.update(
        {
            "PYTHONPATH": str(checkout),
            "PYTHONUNBUFFERED": "1",
            "KAKEYA_REPORT": str(out_dir / "report.json"),
            "KAKEYA_RUN_DIR": str(out_dir),
            "KAKEYA_PROGRESS": str(
                out_dir / PROGRESS_FILE
            ),  # the workload's own progress (bridge/bus/progress.py)
        }
    )
    if context.subject:
        env["KAKEYA_SUBJECT"] = context.subject
    return env


def execute(preset: Preset, values: Mapping[str, Any], checkout: Path, out_dir: Path, **kw: Any) -> RunResult:
    """`run_preset`, then write its outcome (result.json, verdict.json, summary.md): `kakeya exec`."""
    return run_preset(preset, values, checkout, out_dir, **kw).write()


def run_preset(
    preset: Preset,
    values: Mapping[str, Any],
    checkout: Path,
    out_dir: Path,
    *,
    config: Config,
    environ: Mapping[str, str] | None = None,
    context: RunContext | None = None,
    should_stop: Callable[[], str | None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_run_dir: Callable[[Path], None] | None = None,
    executor: Executor | None = None,
) -> RunOutcome:
    """Run `preset` with validated `values` in `checkout` (by `executor`, a LocalExecutor by default); always
    returns a RunOutcome (not yet written). `on_phase` hears "running" once the program has started and
    "gating" once it has ended; `on_run_dir` hears where the program writes ($KAKEYA_RUN_DIR: its progress
    file is there) before it starts."""
    environ = os.environ if environ is None else environ
    context = context or RunContext()
    checkout, out_dir = checkout.resolve(), out_dir.resolve()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    base = provenance(preset, values, context)
    redact = Redactor(secret_values(preset, config, environ, {}))
    scratch = Path(tempfile.mkdtemp(prefix="kakeya-run-"))
    try:
        try:
            iso = choose(config.isolation, config.run_user, network_none=preset.network == "none")
            base.update(isolation=iso.describe, network=iso.network)
            limits = run_limits(preset.limits, iso)
            preset_env = preset.render_env(environ)
            redact = Redactor(secret_values(preset, config, environ, preset_env))
            run_dir = scratch / "out" if iso.private else out_dir  # where the program writes
            argv = render_argv(preset, values, run_dir, environ)
        except KakeyaError as exc:
            result = RunResult(status="error", reason=f"could not start: {exc}", **base)
            return RunOutcome(out_dir, result, redact=redact)
        cwd = private_dirs(checkout, scratch, iso)
        if iso.kind == "bwrap":
            iso = dataclasses.replace(iso, wrap=bwrap_argv(iso, scratch, cwd, environ))
        setup = RunSetup(
            argv=tuple(argv),
            env=MappingProxyType(build_env(preset_env, environ, cwd, run_dir, context, scratch)),
            cwd=cwd,
            scratch=scratch,
            run_dir=run_dir,
            out_dir=out_dir,
            isolation=iso,
            timeout_s=preset.timeout_s,
            config=config,
            provenance=MappingProxyType({**base, "argv": [redact.text(a) for a in argv]}),
            redact=redact,
            resources=preset.resources,
            limits=limits,
        )
        executor = executor or LocalExecutor()
        if on_run_dir is not None:
            on_run_dir(run_dir)
        handle = executor.launch(setup)
        if on_phase is not None and handle.start_error is None:
            on_phase("running")
        outcome = executor.collect(handle, executor.supervise(handle, should_stop))
        if on_phase is not None:
            on_phase("gating")
        outcome.places.update({str(run_dir): ".", str(scratch): ".."})
        return gate(outcome, preset, config.report_cap_bytes)
    finally:
        try:  # whatever the run left there, however named or locked
            caps.remove(scratch)
        except OSError:
            pass


def private_dirs(checkout: Path, scratch: Path, iso: Isolation) -> Path:
    """The private directories of a run; where it runs. Under isolation 'user' and 'bwrap' the program gets a
    copy of the checkout (without .git) and its own run directory (scratch/out), owned by its user."""
    for sub in set(PRIVATE_DIRS.values()):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    if not iso.private:
        return checkout
    work, run_dir = scratch / "work", scratch / "out"
    copy_subject(checkout, work)
    run_dir.mkdir()
    if iso.uid is None:
        return work
    scratch.chmod(0o755)
    for top in ("home", "tmp", "work", "out"):
        for dirpath, dirnames, filenames in os.walk(scratch / top):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.lchown(name, iso.uid, iso.gid if iso.gid is not None else iso.uid)
    return work


def copy_subject(checkout: Path, work: Path) -> None:
    """The run's copy of `checkout`, without .git: of a git working tree (`kakeya exec` in a project) the files
    git tracks or would track (not its venv, state or outputs), of anything else (the runner's export) all."""
    if not (checkout / ".git").exists():
        shutil.copytree(checkout, work, symlinks=True, ignore=shutil.ignore_patterns(".git"))
        return
    listed = git.run(checkout, "ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout
    work.mkdir()
    for raw in filter(None, listed.split(b"\0")):
        rel = os.fsdecode(raw)
        src, dst = checkout / rel, work / rel
        if not src.is_symlink() and not src.is_file():
            continue  # deleted in the working tree, or a submodule
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


@dataclass(frozen=True)
class RunSetup:
    """One run, decided before it starts; what an `Executor` launches. `cwd` holds the run's copy of the subject
    (or the checkout itself without a private isolation), `scratch` its private directories (HOME, TMPDIR),
    `run_dir` where the program writes ($KAKEYA_RUN_DIR), `out_dir` where its files are collected;
    `provenance` is what result.json says of it whatever happens (preset, params, host, tools, argv...)."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    scratch: Path
    run_dir: Path
    out_dir: Path
    isolation: Isolation
    timeout_s: float
    config: Config  # the caps on logs, the report, the files and the result
    provenance: Mapping[str, Any]
    redact: Redactor
    resources: Resources | None = None  # what a scheduler's executor asks for (the preset's `resources`)
    limits: RunLimits | None = None  # memory, processes, file size (bridge/run/isolation.py's `run_limits`)
    asked_limits: Limits | None = (
        None  # the preset's `limits` as written (a scheduler's node fills its defaults)
    )


class Launched(Protocol):
    start_error: str | None  # why the program could not start (None: it is running)


class Executor(Protocol):
    """Launches, supervises and collects one run (LocalExecutor: a process on this host; a batch scheduler's
    executor plugs in here). Nothing it does raises for what the program did: every run ends in a RunOutcome."""

    def launch(self, setup: RunSetup) -> Any: ...

    def supervise(
        self, handle: Any, should_stop: Callable[[], str | None] | None
    ) -> tuple[Status, str] | None:
        """Wait for the end: None when the program exited, else why it was ended (time limit, cancel, ...)."""
        ...

    def collect(self, handle: Any, stopped: tuple[Status, str] | None) -> RunOutcome: ...


@dataclass
class LocalRun:
    """A run started by LocalExecutor: bridge/run/launcher.py (in the sandbox) and its program."""

    setup: RunSetup
    started: dt.datetime
    proc: subprocess.Popen[bytes] | None = None
    lifeline: int = -1  # our end of the launcher's lifeline (closed: end the run)
    status: int = -1  # our end of the launcher's status pipe (out of the run's reach: no file to plant)
    pumps: list[threading.Thread] = field(default_factory=list)
    start_error: str | None = None


class LocalExecutor:
    """The run as a process tree on this host, under bridge/run/launcher.py, wrapped in the isolation's sandbox."""

    def launch(self, setup: RunSetup) -> LocalRun:
        iso = setup.isolation
        run = LocalRun(setup, now())
        lifeline_r, run.lifeline = os.pipe()
        run.status, status_w = os.pipe()
        ids = ["--uid", str(iso.uid), "--gid", str(iso.gid)] if iso.uid is not None else []
        ids += setup.limits.launcher_args() if setup.limits is not None else []
        wrapped = [
            *iso.wrap,
            *(sys.executable, "-I", launcher.__file__, "--status-fd", str(status_w)),
            *("--lifeline", str(lifeline_r), *ids, "--", *setup.argv),
        ]
        try:
            run.proc = subprocess.Popen(
                wrapped,
                cwd=setup.cwd,
                env=dict(setup.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(lifeline_r, status_w),
            )
        except OSError as exc:
            os.close(run.lifeline)
            run.lifeline, run.start_error = -1, f"could not start {wrapped[0]!r}: {exc}"
            return run
        finally:
            os.close(lifeline_r)
            os.close(status_w)
        logs = setup.out_dir / "logs"
        cap = setup.config.log_cap_bytes
        run.pumps = [
            threading.Thread(
                target=pump, args=(stream, CappedLog(logs / name, cap, setup.redact)), daemon=True
            )
            for stream, name in ((run.proc.stdout, "stdout.log"), (run.proc.stderr, "stderr.log"))
        ]
        for t in run.pumps:
            t.start()
        return run

    def supervise(
        self, run: LocalRun, should_stop: Callable[[], str | None] | None
    ) -> tuple[Status, str] | None:
        proc = run.proc
        if proc is None:
            return None
        stopped: tuple[Status, str] | None = None
        timeout_s = run.setup.timeout_s
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                stopped = ("timed-out", f"killed after the preset's time limit of {timeout_s:g} s")
            elif should_stop is not None and (why := should_stop()):
                stopped = ("cancelled", "cancelled while running") if why == "cancelled" else ("error", why)
            if stopped:
                # The launcher reads EOF on its lifeline and ends every process of the run (counting strays);
                # should it not, the whole tree is killed from here.
                os.close(run.lifeline)
                run.lifeline = -1
                try:
                    proc.wait(timeout=launcher.GRACE_S + 3)
                except subprocess.TimeoutExpired:
                    kill_tree(proc)
                break
            try:  # returns as soon as the program exits, not at the next poll
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
        else:
            # The launcher ended what the program left; anything that escaped it dies with the run.
            kill_tree(proc, grace_s=0.5)
        return stopped

    def collect(self, run: LocalRun, stopped: tuple[Status, str] | None) -> RunOutcome:
        setup, base = run.setup, dict(run.setup.provenance)
        out_dir, config = setup.out_dir, setup.config
        if run.lifeline >= 0:
            os.close(run.lifeline)
            run.lifeline = -1
        for t in run.pumps:
            t.join(timeout=5)
        ended = now()
        status = launcher_status(run.status)
        run.status = -1
        if not status:
            status = {"exit_code": run.proc.returncode if run.proc else None, "strays": None}
        if run.start_error or status.get("start_error"):
            reason = run.start_error or f"could not start {setup.argv[0]!r}: {status['start_error']}"
            result = RunResult(status="error", reason=reason, started_at=iso_time(run.started), **base)
            return RunOutcome(out_dir, result, redact=setup.redact)
        collected = (
            collect_files(setup.run_dir, out_dir, config.result_cap_bytes, config.files_count_cap)
            if setup.run_dir != out_dir
            else []
        )
        returncode = status.get("exit_code")
        returncode = run.proc.returncode if returncode is None and run.proc else returncode
        base["strays_killed"] = status.get("strays")
        outcome = ended_outcome(setup, base, returncode, run.started, ended, stopped, collected)
        return over_limit(outcome, status, setup.limits)


STATUS_CAP = 64 * 1024  # bytes of the launcher's status at most (it writes a few dozen)


def launcher_status(fd: int) -> dict[str, Any]:
    """What the launcher said of the run on its status pipe (read without waiting: it has exited), closed
    after; {} when it said nothing that parses (it was killed, or its sandbox failed to start)."""
    if fd < 0:
        return {}
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, STATUS_CAP)
    except OSError:  # BlockingIOError: a process of the run holds the pipe and the launcher wrote nothing
        data = b""
    finally:
        os.close(fd)
    try:
        word = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(word, dict):
        return {}
    types = {"exit_code": int, "strays": int, "start_error": str, "limit": str, "why": str, "limits": dict}
    out = {
        k: word.get(k)
        for k, kind in types.items()
        if word.get(k) is None or (isinstance(word[k], kind) and not isinstance(word[k], bool))
    }
    if isinstance(out.get("limits"), dict):
        out["limits"] = {
            k: v for k, v in out["limits"].items() if k in ("memory", "processes", "file") and type(v) is int
        }
    return out


def over_limit(outcome: RunOutcome, word: Mapping[str, Any], asked: RunLimits | None) -> RunOutcome:
    """A run whose launcher said (its status `word`) it reached a limit ends in `error` naming it (whichever
    executor ran it: the launcher knows by how the program ended, not by anything the run wrote)."""
    if outcome.result.status in ("succeeded", "failed", "timed-out") and (why := limit_reason(word, asked)):
        outcome.result.status, outcome.result.reason = "error", why
    return outcome


def ended_outcome(
    setup: RunSetup,
    base: dict[str, Any],
    returncode: int | None,
    started: dt.datetime,
    ended: dt.datetime,
    stopped: tuple[Status, str] | None,
    collected: list[str] | None = None,
) -> RunOutcome:
    """The outcome of a program that ran (whichever executor ran it) and left its files in out_dir, not yet
    gated: what it left is capped; `stopped` says why it was ended (the time limit, a cancel), if it was;
    `collected`: what collecting its files from its own run directory dropped."""
    out_dir, config = setup.out_dir, setup.config
    dropped = (collected or []) + apply_caps(
        out_dir,
        report_cap=config.report_cap_bytes,
        files_cap=config.files_cap_bytes,
        result_cap=config.result_cap_bytes,
        count_cap=config.files_count_cap,
        log_cap=config.log_cap_bytes,
    )
    base["dropped"] = dropped
    try:  # it said how the run went; the result says the rest
        (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    except OSError:
        pass
    result = RunResult(
        status="succeeded",
        exit_code=returncode,
        started_at=iso_time(started),
        ended_at=iso_time(ended),
        duration_s=round((ended - started).total_seconds(), 3),
        **base,
    )
    if stopped:
        result.status, result.reason = stopped
    elif returncode != 0:
        result.status, result.reason = "failed", f"exited with code {returncode}"
    if result.status == "succeeded" and (
        why := next((d for d in dropped if d.startswith(f"{REPORT} ")), None)
    ):
        result.status, result.reason = "error", f"the report was dropped: {why}"
    return RunOutcome(out_dir, result, redact=setup.redact)


def gate(outcome: RunOutcome, preset: Preset, report_cap: int) -> RunOutcome:
    """Check and gate the report of a run that ended (succeeded or failed); a gate that raises keeps the run's
    provenance and says so."""
    result = outcome.result
    report_path = outcome.out_dir / REPORT
    outcome.redact.scrub_file(report_path, report_cap)
    try:  # as bridge/core/caps.py reads a run's files: no link followed, never waited on, capped
        data: bytes | None = caps.read_file(outcome.out_dir, REPORT, report_cap)
    except (caps.Unsafe, OSError):
        data = None
    if data is not None:
        result.report = REPORT
    if result.status not in ("succeeded", "failed"):
        return outcome
    try:
        if data is None:
            raise gates.ReportError(f"the program wrote no report at {REPORT} ($KAKEYA_REPORT)")
        outcome.report = gates.parse_report(data, REPORT)
    except Exception as exc:  # noqa: BLE001 — ReportError, or what the parser raises on hostile JSON (a
        # 10,000-digit integer, nesting past the recursion limit): the run's exit code and provenance are kept
        if result.status == "succeeded":
            why = str(exc) if isinstance(exc, gates.ReportError) else f"{REPORT} is not valid: {exc}"
            result.status, result.reason = "error", why[:2000]
        return outcome
    try:
        outcome.verdict = gates.evaluate(
            outcome.report, preset.gate, kind=preset.report.kind, schema_version=preset.report.schema_version
        )
    except Exception as exc:  # noqa: BLE001 — the run's provenance (exit code, argv, times) is kept
        result.status, result.reason = "error", f"gating failed: {type(exc).__name__}: {exc}"
    else:
        result.verdict = outcome.verdict.status
    return outcome
