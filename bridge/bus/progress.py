"""Progress of a request while a runner serves it: the record heartbeats put on the claim, and how it reads.

The runner tracks the phase (checkout, queued in a scheduler's queue, running, gating, pushing) and when serving began; each heartbeat
adds the last lines of the run's redacted logs and the workload's own progress: the JSON file named by
KAKEYA_PROGRESS in the run's environment (`{"done": 3, "total": 5, "what": "rung 3 of 5"}`), read capped,
and ignored when it is missing, huge, malformed or not a regular file (it never fails a run). Nothing here
blocks: a FIFO or a link at either path is refused at open (bridge/core/caps.py), and the runner builds the record
before it takes its lease's lock.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from bridge.bus.livelog import LiveLog
from bridge.bus.records import Progress, WorkloadProgress, utcnow
from bridge.core.caps import Unsafe, open_regular, read_capped, read_file
from bridge.core.text import clean

PROGRESS_FILE = "progress.json"  # under the run's out dir; KAKEYA_PROGRESS names it; removed after the run
PROGRESS_CAP = 4096  # bytes; a bigger progress file is ignored
TAIL_BYTES = 4096  # read from the end of each log
TAIL_LINES = 3  # per log
LINE_CAP = 160  # characters per line
BAR_COLUMNS = 20  # the live bar's width on a terminal
PLAIN_COLUMNS = 120  # the width of a plain progress line when the output is no terminal and COLUMNS is unset
# A line of a workload's own progress bar (tqdm's `60%|######    | 3/5 [00:03<...`, block or ### bars):
# never echoed under our bar, which says the same
WORKLOAD_BAR = re.compile(r"\d+%\||[\u2588-\u258f]|\[[#=>.\- ]{8,}\]|\d+/\d+ \[\d+:\d\d")


@dataclass
class Tracker:
    """What the runner knows of the request it serves now (updated from the serving thread)."""

    out: Path
    phase: str = "checkout"
    started_at: dt.datetime = field(default_factory=utcnow)
    run_dir: Path | None = None  # where the program writes its progress file, when not `out` (a sandbox)
    workload: WorkloadProgress | None = None  # the last progress the workload told (its bar stays at the end)
    live: LiveLog = field(
        init=False
    )  # the logs since the last heartbeat, for the lease (bridge/bus/livelog.py)

    def __post_init__(self) -> None:
        self.live = LiveLog(self.out, self.started_at)

    def record(self) -> Progress:
        now = utcnow()
        # a progress file gone (the run over, its sandbox torn down) or unreadable keeps the last one read
        self.workload = read_workload((self.run_dir or self.out) / PROGRESS_FILE) or self.workload
        return Progress(
            phase=self.phase,  # type: ignore[arg-type]
            started_at=self.started_at,
            at=now,
            elapsed_s=round((now - self.started_at).total_seconds(), 1),
            log_tail=[self.live.redact.text(line) for line in log_tail(self.out)],
            workload=self.workload,
        )


def read_workload(path: Path) -> WorkloadProgress | None:
    """The workload's progress file, or None when it is missing, not a regular file (a FIFO, a link: never
    waited on nor followed, bridge/core/caps.py), over PROGRESS_CAP or not a valid record."""
    try:
        data = read_file(path.parent, path.name, PROGRESS_CAP)
    except (Unsafe, OSError):
        return None
    try:
        return WorkloadProgress.model_validate_json(data)
    except ValidationError:
        return None


def log_tail(out: Path) -> list[str]:
    """The last lines of logs/stdout.log then logs/stderr.log under `out` (already redacted as they were
    written), each cut short; read as bridge/core/caps.py reads a run's files."""
    lines: list[str] = []
    for name in ("stdout.log", "stderr.log"):
        try:
            with open_regular(out, f"logs/{name}") as fd:
                os.lseek(fd, max(0, os.lseek(fd, 0, os.SEEK_END) - TAIL_BYTES), os.SEEK_SET)
                text = read_capped(fd, TAIL_BYTES).decode(errors="replace")
        except (Unsafe, OSError):
            continue
        kept = [ln.rstrip() for ln in text.splitlines()[1 if len(text) >= TAIL_BYTES else 0 :] if ln.strip()]
        lines += [f"{name.split('.')[0]}: {ln[:LINE_CAP]}" for ln in kept[-TAIL_LINES:]]
    return lines


def bar(done: int, total: int | None, width: int = 20) -> str:
    """`[########------------] 2/5`, or `2 done` when the total is unknown."""
    if not total:
        return f"{done} done"
    filled = min(width, round(width * done / total))
    return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total}"


def describe(progress: Progress, now: dt.datetime | None = None) -> str:
    """One line: phase, the workload's bar and words, elapsed time."""
    now = now or utcnow()
    elapsed = max(progress.elapsed_s, (now - progress.started_at).total_seconds())
    parts = [progress.phase]
    if progress.workload is not None:
        w = progress.workload
        parts.append(bar(w.done, w.total) + (f" {w.what}" if w.what else ""))
    parts.append(f"elapsed {clock(elapsed)}")
    return "  ".join(parts)


def is_progress(event: dict[str, Any]) -> bool:
    """Is this follow event a heartbeat's progress (running, gating, queued in a scheduler's queue)?"""
    return "elapsed_s" in event


def progress_line(e: dict[str, Any]) -> str:
    """A progress event in words: phase, our bar and the workload's words, elapsed time, and the last line the
    run printed on stdout that is not the workload's own bar (never its stderr: warnings, tracebacks and
    library bars are no progress; `kakeya results` has the logs)."""
    w = e["workload"]
    work = f"  {bar(w['done'], w['total'])}{' ' + w['what'] if w['what'] else ''}" if w else ""
    said = (ln for ln in reversed(e["log_tail"]) if ln.startswith("stdout: "))
    echo = next((ln for ln in said if not WORKLOAD_BAR.search(ln)), None)
    where = f" ({e['scheduler']})" if e.get("scheduler") else ""
    return f"{e['event']}{where}{work}  elapsed {clock(e['elapsed_s'])}" + (f"  | {echo}" if echo else "")


def cut(line: str, width: int) -> str:
    """`line`, ending in an ellipsis where it would pass `width` characters."""
    if len(line) <= width:
        return line
    return line[: width - 1] + "\u2026" if width > 0 else ""


class View:
    """How a person sees a request's events (`kakeya wait`, `request --wait`). On a terminal: one live bar
    (rich) for its progress, no log echo, every other event a line above the bar. Elsewhere (a pipe, a file,
    TERM=dumb): one plain line per event, a progress line cut to the terminal width (COLUMNS, else
    PLAIN_COLUMNS). `line` puts any event in words (`progress_line` for progress events)."""

    def __init__(self, line: Callable[[dict[str, Any]], str], stream: TextIO | None = None):
        self.line, self.stream = line, stream or sys.stdout
        self.bar: Any = None  # rich.progress.Progress while a progress event is shown on a terminal
        self.task: Any = None

    @functools.cached_property
    def console(self) -> Any:
        """rich's Console on the stream, made when first needed (`--json` never imports rich)."""
        from rich.console import Console

        # on the stream beneath bridge/cli/main.py's filter (bridge/core/text.py): the bar draws with escape sequences
        # of its own; every text it is given is cleaned here
        return Console(file=getattr(self.stream, "unfiltered", self.stream), highlight=False)

    @property
    def live(self) -> bool:
        """Is the stream a terminal that can redraw a bar in place?"""
        return bool(self.console.is_terminal and not self.console.is_dumb_terminal)

    def show(self, e: dict[str, Any]) -> None:
        if not is_progress(e):
            if e["event"] == "finished":
                self.close()
            self.put(self.line(e))
        elif not self.live:
            self.put(cut(self.line(e), shutil.get_terminal_size((PLAIN_COLUMNS, 24)).columns))
        else:
            self.update(e)

    def put(self, text: str) -> None:
        text = clean(text, multiline=True)
        if self.bar is not None:  # above the live bar
            self.bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stream, flush=True)

    def update(self, e: dict[str, Any]) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        w = e["workload"] or {}
        fields = {
            "phase": clean(e["event"] + (f" ({e['scheduler']})" if e.get("scheduler") else "")),
            "count": f"{w['done']}/{w['total']}" if w.get("total") else "",
            "elapsed": clock(e["elapsed_s"]),
        }
        if self.bar is None:
            self.bar = Progress(
                # markup=False: a run's words are never rich markup ("[green]✓ pass" shows as written)
                TextColumn("{task.fields[phase]}", markup=False),
                BarColumn(bar_width=BAR_COLUMNS),
                TextColumn("{task.fields[count]}", markup=False),
                TextColumn("elapsed {task.fields[elapsed]}", markup=False),
                TextColumn("{task.description}", markup=False),
                console=self.console,
                transient=True,
            )
            self.task = self.bar.add_task("", total=None, **fields)
            self.bar.start()
        # the workload's words, cut to what the terminal has left: the bar is one row, never wrapped
        room = (
            self.console.width - sum(len(f) + 1 for f in fields.values()) - BAR_COLUMNS - len("elapsed  ") - 1
        )
        self.bar.update(
            self.task,
            description=cut(clean(w.get("what") or ""), max(room, 0)),
            completed=w.get("done", 0),
            total=w.get("total"),
            **fields,
        )
        self.bar.refresh()

    def close(self) -> None:
        """Take the live bar down (what it said is in the events' lines and the result)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def say(line: str, stream: TextIO | None = None) -> None:
    """Write `line` to stderr (or `stream`), never failing the caller: when the reader is gone (EPIPE: a
    `| head` that ended, a `| tee` stopped by the same Ctrl-C; EIO: its terminal closed) the stream is pointed
    at /dev/null and what follows is dropped. A runner's log line is a courtesy; the run it tells of is not."""
    stream = stream or sys.stderr
    try:
        print(line, file=stream, flush=True)
    except (OSError, ValueError):  # ValueError: the stream was closed
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass


def clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
