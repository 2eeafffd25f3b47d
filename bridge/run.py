"""One sandboxed, recorded run of a preset.

`execute` renders the trusted preset's argv (no shell), runs it in its own session/process group in
the checkout with a scrubbed environment, a time limit that kills the whole process tree, and
stdout/stderr streamed to capped, redacted files; then it checks and gates the report and writes
result.json and summary.md. Nothing a run produced is lost: every path ends in a result.json.

Files in out_dir: result.json, report.json (written by the program via $KAKEYA_REPORT), verdict.json,
summary.md, logs/stdout.log, logs/stderr.log, plus whatever the program put in $KAKEYA_RUN_DIR.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

import gates
from bridge.config import Config
from bridge.errors import KakeyaError
from bridge.presets import Preset

Status = Literal["succeeded", "failed", "timed-out", "error", "cancelled", "expired", "rejected"]

# The only variables a run inherits from the runner's environment (plus the preset's own env).
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SYSTEMROOT")
REDACTED = "[REDACTED]"
POLL_S = 0.2


class RunContext(BaseModel):
    """Who asked for the run and where it runs (filled by the bus runner; empty for `kakeya exec`)."""

    model_config = ConfigDict(extra="forbid")
    request_id: str | None = None
    subject: str | None = None
    runner_name: str | None = None
    runner_labels: list[str] = []


class RunResult(BaseModel):
    """result.json: the provenance and outcome of one run."""

    model_config = ConfigDict(extra="forbid")
    schema_version: Literal[1] = 1
    status: Status
    reason: str | None = None
    exit_code: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    argv: list[str] = []
    preset: str
    preset_hash: str | None = None
    params: dict[str, Any] = {}
    request_id: str | None = None
    subject: str | None = None
    runner_name: str | None = None
    runner_labels: list[str] = []
    host: dict[str, Any] = {}
    tools: dict[str, str] = {}
    report: str | None = None
    verdict: Literal["pass", "fail", "error"] | None = None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds")


# --- host fingerprint -------------------------------------------------------------------------------


def _cmd(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _cmd(["sysctl", "-n", "machdep.cpu.brand_string"]) or platform.processor() or "unknown"


def host_fingerprint() -> dict[str, Any]:
    """Hostname, OS, CPU, memory and accelerator, without importing torch or mlx."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    gpus = (
        _cmd(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        if shutil.which("nvidia-smi")
        else None
    )
    accelerator = None
    if gpus:
        accelerator = {"kind": "cuda", "devices": gpus.splitlines()}
    elif sys.platform == "darwin" and platform.machine() == "arm64":
        accelerator = {"kind": "metal", "devices": [_cpu_model()]}
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": memory,
        "accelerator": accelerator,
    }


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    git = _cmd(["git", "--version"])
    if git:
        versions["git"] = git.removeprefix("git version ")
    for dist in ("kakeya", "torch", "transformers", "mlx", "mlx-lm"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return versions


# --- redaction and capped logs ----------------------------------------------------------------------


class Redactor:
    """Replaces secret values in bytes; values shorter than 3 characters are ignored (too common)."""

    def __init__(self, secrets: Iterable[str]):
        self.secrets = sorted({s.encode() for s in secrets if len(s) >= 3}, key=len, reverse=True)
        self.longest = max((len(s) for s in self.secrets), default=0)

    def __call__(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, REDACTED.encode())
        return data

    def text(self, value: str) -> str:
        return self(value.encode()).decode(errors="replace")

    def scrub_file(self, path: Path) -> None:
        if not self.secrets or not path.is_file():
            return
        data = path.read_bytes()
        clean = self(data)
        if clean != data:
            path.write_bytes(clean)


class CappedLog:
    """Writes at most `cap` bytes: the first half as it comes, then the last half, with a marker for the cut.

    A stream is redacted before it is kept; a secret split across two reads is caught because the
    last `longest - 1` bytes are held back until more data (or the end) arrives.
    """

    def __init__(self, path: Path, cap: int, redact: Redactor):
        self.path, self.head_cap, self.tail_cap, self.redact = path, cap // 2, cap - cap // 2, redact
        self.file = path.open("wb")
        self.head_written = 0
        self.tail = bytearray()
        self.cut = 0
        self.pending = b""

    def write(self, chunk: bytes) -> None:
        data = self.redact(self.pending + chunk)
        keep = max(self.redact.longest - 1, 0)
        if keep:
            self.pending, data = data[-keep:], data[:-keep]
        self._emit(data)

    def _emit(self, data: bytes) -> None:
        room = self.head_cap - self.head_written
        if room > 0:
            self.file.write(data[:room])
            self.head_written += min(room, len(data))
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                excess = len(self.tail) - self.tail_cap
                self.cut += excess
                del self.tail[:excess]

    def close(self) -> None:
        self._emit(self.redact(self.pending))
        self.pending = b""
        if self.cut:
            self.file.write(
                f"\n[... kakeya cut {self.cut} bytes here to keep this log under its cap ...]\n".encode()
            )
        self.file.write(bytes(self.tail))
        self.file.close()


def _pump(stream: Any, log: CappedLog) -> None:
    try:
        for chunk in iter(lambda: stream.read1(65536), b""):
            log.write(chunk)
    finally:
        log.close()


# --- process tree -----------------------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    else:
        for line in (_cmd(["ps", "-A", "-o", "pid=,ppid="]) or "").splitlines():
            pid, ppid = (int(x) for x in line.split())
            children.setdefault(ppid, []).append(pid)
    return children


def descendants(pid: int) -> list[int]:
    children, out, todo = _children_map(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """SIGTERM the process group and every descendant (even ones that left the group), then SIGKILL."""
    tree = descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in tree:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
    proc.wait()


# --- the run ----------------------------------------------------------------------------------------


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
        }
    )
    if context.subject:
        env["KAKEYA_SUBJECT"] = context.subject
    return env


def execute(
    preset: Preset,
    values: Mapping[str, Any],
    checkout: Path,
    out_dir: Path,
    *,
    config: Config,
    environ: Mapping[str, str] | None = None,
    context: RunContext | None = None,
    should_stop: Callable[[], str | None] | None = None,
) -> RunResult:
    """Run `preset` with validated `values` in `checkout`; always returns (and writes) a RunResult."""
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
        return _finish(out_dir, RunResult(status="error", reason=f"could not start: {exc}", **base), redact)

    env = build_env(preset_env, environ, checkout, out_dir, context)
    base["argv"] = [redact.text(a) for a in argv]
    started = _now()
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
        return _finish(
            out_dir,
            RunResult(
                status="error", reason=f"could not start {argv[0]!r}: {exc}", started_at=_iso(started), **base
            ),
            redact,
        )
    pumps = [
        threading.Thread(
            target=_pump,
            args=(stream, CappedLog(out_dir / "logs" / name, config.log_cap_bytes, redact)),
            daemon=True,
        )
        for stream, name in ((proc.stdout, "stdout.log"), (proc.stderr, "stderr.log"))
    ]
    for t in pumps:
        t.start()

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
    ended = _now()

    result = RunResult(
        status="succeeded",
        exit_code=proc.returncode,
        started_at=_iso(started),
        ended_at=_iso(ended),
        duration_s=round((ended - started).total_seconds(), 3),
        **base,
    )
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
            report = gates.load_report(report_path)
        except gates.ReportError as exc:
            if result.status == "succeeded":
                result.status, result.reason = "error", str(exc)
        else:
            verdict = gates.evaluate(
                report, preset.gate, kind=preset.report.kind, schema_version=preset.report.schema_version
            )
            (out_dir / "verdict.json").write_text(verdict.model_dump_json(indent=2) + "\n")
            result.verdict = verdict.status
    return _finish(out_dir, result, redact)


def write_outcome(
    out_dir: Path,
    status: Status,
    reason: str,
    *,
    preset_name: str,
    params: Mapping[str, Any],
    context: RunContext | None = None,
    preset_hash: str | None = None,
) -> RunResult:
    """Record an outcome where nothing ran (rejected, expired, cancelled before start)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = RunResult(
        status=status,
        reason=reason,
        preset=preset_name,
        preset_hash=preset_hash,
        params=dict(params),
        host=host_fingerprint(),
        tools=tool_versions(),
        ended_at=_iso(_now()),
        **(context or RunContext()).model_dump(),
    )
    return _finish(out_dir, result, Redactor([]))


def _finish(out_dir: Path, result: RunResult, redact: Redactor) -> RunResult:
    atomic_write(out_dir / "result.json", redact.text(result.model_dump_json(indent=2)) + "\n")
    atomic_write(out_dir / "summary.md", redact.text(summary_markdown(result, out_dir)))
    for path in out_dir.rglob("*"):
        redact.scrub_file(path)
    return result


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _fmt(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    return json.dumps(value) if not isinstance(value, str) else value


def summary_markdown(result: RunResult, out_dir: Path) -> str:
    """The same facts as result.json, for a human; plus the gate table and any plots."""
    lines = [
        f"# {result.preset}: {result.status}" + (f" — verdict {result.verdict}" if result.verdict else ""),
        "",
    ]
    if result.reason:
        lines += [f"**Reason:** {result.reason}", ""]
    rows = [
        ("request", result.request_id),
        ("subject", result.subject),
        ("runner", result.runner_name),
        ("labels", ", ".join(result.runner_labels) or None),
        ("exit code", result.exit_code),
        ("started", result.started_at),
        ("ended", result.ended_at),
        ("duration", f"{result.duration_s:.2f} s" if result.duration_s is not None else None),
        ("preset hash", result.preset_hash),
        (
            "host",
            f"{result.host.get('hostname')} · {result.host.get('os')} · {result.host.get('cpu')}"
            if result.host
            else None,
        ),
    ]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in rows if v is not None] + [""]
    if result.params:
        lines += ["## Parameters", "", "| name | value |", "|---|---|"]
        lines += [f"| {k} | `{_fmt(v)}` |" for k, v in result.params.items()] + [""]
    if result.argv:
        lines += ["## Command", "", "```", shlex.join(result.argv), "```", ""]
    verdict_path = out_dir / "verdict.json"
    if verdict_path.is_file():
        verdict = gates.Verdict.model_validate_json(verdict_path.read_text())
        lines += ["## Gate", "", verdict.to_markdown(), ""]
    plots = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*.png"))
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    logs = [p for p in ("logs/stdout.log", "logs/stderr.log") if (out_dir / p).is_file()]
    if logs:
        lines += (
            ["## Logs", ""] + [f"- [{p}]({p}) ({(out_dir / p).stat().st_size} bytes)" for p in logs] + [""]
        )
    if result.tools:
        lines += ["## Tools", "", ", ".join(f"{k} {v}" for k, v in result.tools.items()), ""]
    return "\n".join(lines)
