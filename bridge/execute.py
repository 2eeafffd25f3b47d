"""Executing one preset, sandboxed and recorded, and gating its report.

`run_preset` renders the trusted preset's argv (no shell), runs it under bridge/launcher.py (a child
subreaper that ends every process the run started, setsid or not, at exit, at the time limit and when
the runner dies) in the checkout, with a scrubbed environment, a private HOME/TMPDIR/caches, the
isolation of bridge/isolation.py, and stdout/stderr streamed to capped, redacted files; then it caps
what the run left (bridge/caps.py) and checks and gates the report. It returns the
`RunOutcome` in memory (nothing a run produced is lost: every path ends in one); `execute` also writes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gates
from bridge import launcher
from bridge.caps import REPORT, apply_caps, collect
from bridge.config import Config
from bridge.errors import KakeyaError
from bridge.host import host_fingerprint, tool_versions
from bridge.isolation import Isolation, choose
from bridge.logs import CappedLog, Redactor, pump
from bridge.presets import Preset
from bridge.proc import kill_tree
from bridge.progress import PROGRESS_FILE
from bridge.result import RunContext, RunOutcome, RunResult, Status, now
from bridge.result import iso as iso_time

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
            ),  # the workload's own progress (bridge/progress.py)
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
) -> RunOutcome:
    """Run `preset` with validated `values` in `checkout`; always returns an RunOutcome (not yet written).
    `on_phase` hears "running" once the program has started and "gating" once it has ended."""
    environ = os.environ if environ is None else environ
    context = context or RunContext()
    checkout, out_dir = checkout.resolve(), out_dir.resolve()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    base = dict(
        preset=preset.name,
        preset_hash=preset.content_hash,
        params=dict(values),
        host=host_fingerprint(),
        tools=tool_versions(),
        **context.model_dump(),
    )
    redact = Redactor(secret_values(preset, config, environ, {}))
    scratch = Path(tempfile.mkdtemp(prefix="kakeya-run-"))
    try:
        try:
            iso = choose(config.isolation, config.run_user, network_none=preset.network == "none")
            base.update(isolation=iso.describe, network=iso.network)
            preset_env = preset.render_env(environ)
            redact = Redactor(secret_values(preset, config, environ, preset_env))
            run_dir = scratch / "out" if iso.uid is not None else out_dir  # where the program writes
            builtins = {"python": sys.executable, "report": str(run_dir / REPORT), "run_dir": str(run_dir)}
            argv = preset.render_argv(values, builtins, environ)
        except KakeyaError as exc:
            result = RunResult(status="error", reason=f"could not start: {exc}", **base)
            return RunOutcome(out_dir, result, redact=redact)
        cwd = _sandbox(checkout, scratch, iso)
        env = build_env(preset_env, environ, cwd, run_dir, context, scratch)
        return _run(
            preset,
            argv,
            env,
            cwd,
            out_dir,
            run_dir,
            scratch,
            iso,
            config,
            should_stop,
            on_phase,
            base,
            redact,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _sandbox(checkout: Path, scratch: Path, iso: Isolation) -> Path:
    """The private directories of a run; where it runs. Under isolation 'user' the program gets a copy of
    the checkout and its own run directory (scratch/out), owned by its user."""
    for sub in set(PRIVATE_DIRS.values()):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    if iso.uid is None:
        return checkout
    work, run_dir = scratch / "work", scratch / "out"
    shutil.copytree(checkout, work, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    run_dir.mkdir()
    scratch.chmod(0o755)
    for top in ("home", "tmp", "work", "out"):
        for dirpath, dirnames, filenames in os.walk(scratch / top):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.lchown(name, iso.uid, iso.gid if iso.gid is not None else iso.uid)
    return work


def _run(
    preset: Preset,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    out_dir: Path,
    run_dir: Path,
    scratch: Path,
    iso: Isolation,
    config: Config,
    should_stop: Callable[[], str | None] | None,
    on_phase: Callable[[str], None] | None,
    base: dict[str, Any],
    redact: Redactor,
) -> RunOutcome:
    status_file = scratch / "launcher.json"
    lifeline_r, lifeline_w = os.pipe()
    ids = ["--uid", str(iso.uid), "--gid", str(iso.gid)] if iso.uid is not None else []
    wrapped = [
        *iso.wrap,
        sys.executable,
        "-I",
        launcher.__file__,
        "--status",
        str(status_file),
        "--lifeline",
        str(lifeline_r),
        *ids,
        "--",
        *argv,
    ]
    base["argv"] = [redact.text(a) for a in argv]
    started = now()
    try:
        proc = subprocess.Popen(
            wrapped,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(lifeline_r,),
        )
    except OSError as exc:
        os.close(lifeline_w)
        reason = f"could not start {wrapped[0]!r}: {exc}"
        result = RunResult(status="error", reason=reason, started_at=iso_time(started), **base)
        return RunOutcome(out_dir, result, redact=redact)
    finally:
        os.close(lifeline_r)
    pumps = [
        threading.Thread(
            target=pump,
            args=(stream, CappedLog(out_dir / "logs" / name, config.log_cap_bytes, redact)),
            daemon=True,
        )
        for stream, name in ((proc.stdout, "stdout.log"), (proc.stderr, "stderr.log"))
    ]
    for t in pumps:
        t.start()
    if on_phase is not None:
        on_phase("running")

    stopped: tuple[Status, str] | None = None
    deadline = time.monotonic() + preset.timeout_s
    while proc.poll() is None:
        if time.monotonic() > deadline:
            stopped = ("timed-out", f"killed after the preset's time limit of {preset.timeout_s} s")
        elif should_stop is not None and (why := should_stop()):
            stopped = ("cancelled", "cancelled while running") if why == "cancelled" else ("error", why)
        if stopped:
            # The launcher reads EOF on its lifeline and ends every process of the run (counting strays);
            # should it not, the whole tree is killed from here.
            os.close(lifeline_w)
            lifeline_w = -1
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
    if lifeline_w >= 0:
        os.close(lifeline_w)
    for t in pumps:
        t.join(timeout=5)
    ended = now()
    try:
        status = json.loads(status_file.read_text())
    except (OSError, ValueError):
        status = {"exit_code": proc.returncode, "strays": None}
    if status.get("start_error"):
        reason = f"could not start {argv[0]!r}: {status['start_error']}"
        result = RunResult(status="error", reason=reason, started_at=iso_time(started), **base)
        return RunOutcome(out_dir, result, redact=redact)
    collected = collect(run_dir, out_dir, config.result_cap_bytes) if run_dir != out_dir else []
    dropped = collected + apply_caps(
        out_dir,
        report_cap=config.report_cap_bytes,
        files_cap=config.files_cap_bytes,
        result_cap=config.result_cap_bytes,
    )
    base.update(strays_killed=status.get("strays"), dropped=dropped)
    returncode = status.get("exit_code")
    returncode = proc.returncode if returncode is None else returncode
    try:  # it said how the run went; the result says the rest
        (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    except OSError:
        pass
    if on_phase is not None:
        on_phase("gating")

    outcome = RunOutcome(
        out_dir,
        RunResult(
            status="succeeded",
            exit_code=returncode,
            started_at=iso_time(started),
            ended_at=iso_time(ended),
            duration_s=round((ended - started).total_seconds(), 3),
            **base,
        ),
        redact=redact,
    )
    result = outcome.result
    report_path = out_dir / "report.json"
    redact.scrub_file(report_path, config.report_cap_bytes)
    if stopped:
        result.status, result.reason = stopped
    elif returncode != 0:
        result.status, result.reason = "failed", f"exited with code {returncode}"
    if report_path.is_file():
        result.report = "report.json"
    elif result.status == "succeeded" and (
        why := next((d for d in dropped if d.startswith(f"{REPORT} ")), None)
    ):
        result.status, result.reason = "error", f"the report was dropped: {why}"
    if result.status in ("succeeded", "failed"):
        try:
            if not report_path.is_file():
                raise gates.ReportError(f"the program wrote no report at {report_path} ($KAKEYA_REPORT)")
            outcome.report = gates.load_report(report_path)
        except gates.ReportError as exc:
            if result.status == "succeeded":
                result.status, result.reason = "error", str(exc)
        else:
            outcome.verdict = gates.evaluate(
                outcome.report,
                preset.gate,
                kind=preset.report.kind,
                schema_version=preset.report.schema_version,
            )
            result.verdict = outcome.verdict.status
    return outcome
