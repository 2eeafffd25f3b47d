"""Executing one preset, sandboxed and recorded, and gating its report.

`run_preset` renders the trusted preset's argv (no shell), runs it in its own session/process group in
the checkout with a scrubbed environment, a time limit that kills the whole process tree, and
stdout/stderr streamed to capped, redacted files; then it checks and gates the report. It returns the
`RunOutcome` in memory (nothing a run produced is lost: every path ends in one); `execute` also writes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gates
from bridge.config import Config
from bridge.errors import KakeyaError
from bridge.host import host_fingerprint, tool_versions
from bridge.logs import CappedLog, Redactor, pump
from bridge.presets import Preset
from bridge.proc import kill_tree
from bridge.progress import PROGRESS_FILE
from bridge.result import RunContext, RunOutcome, RunResult, Status, iso, now

# The only variables a run inherits from the runner's environment (plus the preset's own env).
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SYSTEMROOT")
POLL_S = 0.2


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
) -> dict[str, str]:
    env = {k: environ[k] for k in BASE_ENV if k in environ}
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
    try:
        preset_env = preset.render_env(environ)
        redact = Redactor(secret_values(preset, config, environ, preset_env))
        builtins = {"python": sys.executable, "report": str(out_dir / "report.json"), "run_dir": str(out_dir)}
        argv = preset.render_argv(values, builtins, environ)
    except KakeyaError as exc:
        return RunOutcome(
            out_dir, RunResult(status="error", reason=f"could not start: {exc}", **base), redact=redact
        )

    env = build_env(preset_env, environ, checkout, out_dir, context)
    base["argv"] = [redact.text(a) for a in argv]
    started = now()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=checkout,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        reason = f"could not start {argv[0]!r}: {exc}"
        result = RunResult(status="error", reason=reason, started_at=iso(started), **base)
        return RunOutcome(out_dir, result, redact=redact)
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
            kill_tree(proc)
            break
        try:  # returns as soon as the program exits, not at the next poll
            proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
    else:
        # The program exited; anything it left behind in its group dies with the run.
        kill_tree(proc, grace_s=0.5)
    for t in pumps:
        t.join(timeout=30)
    ended = now()
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
            exit_code=proc.returncode,
            started_at=iso(started),
            ended_at=iso(ended),
            duration_s=round((ended - started).total_seconds(), 3),
            **base,
        ),
        redact=redact,
    )
    result = outcome.result
    report_path = out_dir / "report.json"
    redact.scrub_file(report_path)
    if stopped:
        result.status, result.reason = stopped
    elif proc.returncode != 0:
        result.status, result.reason = "failed", f"exited with code {proc.returncode}"
    if report_path.is_file():
        result.report = "report.json"
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
