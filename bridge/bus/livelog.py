"""A run's stdout/stderr while it runs: carried on the bus by the claim's heartbeats, the way progress is, and
read back (`kakeya logs ID [-f]`, the MCP tool `logs`).

Runner side: `LiveLog(out)` reads out/logs/stdout.log and stderr.log (redacted as they were written,
bridge/core/logs.py; read as bridge/core/caps.py reads a run's files: no link, non-blocking, regular) from where the last
heartbeat that reached the bus left off. `take()` gives the next `.kakeya/live.json` (LIVE_PATH) for a
heartbeat commit, or None when nothing is new; the lease calls `ack()` once that heartbeat is on the bus, so a
heartbeat that failed is sent again, never lost. Each chunk goes through the run's `redact` too (a Slurm
job writes its logs unredacted; the runner's own are redacted as written). Bounded so that a run cannot flood the bus: at most
BEAT_BYTES of each stream a heartbeat (more than that since the last one: its last BEAT_BYTES, the rest counted
as skipped) and TOTAL_BYTES of each stream over the run (then the stream is `cut`: the final logs in the done
commit, under their own cap, have the rest). Chunks end at a line's end unless one line is longer than
BEAT_BYTES.

Reader side: `live_files` walks a claim's heartbeat commits (each carries the chunk of its beat; a beat with
nothing new keeps its parent's file, told apart by its offsets), `final_logs` reads the logs of the done
commit. Offsets are bytes of the run's log files, so what was shown live is not shown again from the final
logs (their first half is the same bytes, bridge/core/logs.py CappedLog). Everything read is hostile: sizes are
checked before a blob is read, the walk is bounded, and text is made printable (`printable`) before a terminal
sees it.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from bridge.bus.records import _File, results_path
from bridge.core.caps import Unsafe, open_regular
from bridge.core.logs import Redactor
from bridge.core.text import clean
from bridge.wire import git

LIVE_PATH = ".kakeya/live.json"
STREAMS: tuple[Literal["stdout"], Literal["stderr"]] = ("stdout", "stderr")
BEAT_BYTES = 16 * 1024  # of each stream, per heartbeat
TOTAL_BYTES = 1024 * 1024  # of each stream, over the whole run
LIVE_CAP = 16 * BEAT_BYTES  # bytes of one live.json a reader reads (JSON escapes grow a chunk up to 6 times)
MAX_BEATS = 100_000  # heartbeat commits a reader walks at most
FINAL_CAP = 64 * 1024 * 1024  # bytes of one final log a reader reads (the runner caps them far below)


class Chunk(BaseModel):
    """Bytes `start`..`end` of one stream's log (decoded as UTF-8, bad bytes replaced)."""

    model_config = ConfigDict(extra="forbid")
    stream: Literal["stdout", "stderr"]
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    text: str = Field(max_length=BEAT_BYTES)


class LiveFile(_File):
    """.kakeya/live.json: the chunk of one heartbeat. `started_at` tells one serving of the request from
    another (a takeover starts the logs again); `cut`: the streams whose TOTAL_BYTES ran out."""

    schema_version: Literal[1] = 1
    started_at: AwareDatetime
    chunks: list[Chunk] = Field(default=[], max_length=2)
    cut: list[Literal["stdout", "stderr"]] = Field(default=[], max_length=2)


class LiveLog:
    """What of a run's logs the next heartbeat carries (runner side; see the module's doc)."""

    def __init__(self, out: Path, started_at: dt.datetime):
        self.out, self.started_at = out, started_at
        self.sent = dict.fromkeys(STREAMS, 0)  # bytes of each log file the bus has (acknowledged beats)
        self.total = dict.fromkeys(STREAMS, 0)  # bytes of each stream sent
        self.pending: tuple[dict[str, int], dict[str, int]] | None = None
        # the run's secrets, for logs not redacted as they were written (a Slurm job's: bridge/run/slurm_job.py)
        self.redact = Redactor([])

    def take(self) -> bytes | None:
        """The live.json of the next heartbeat, or None when there is nothing new."""
        sent, total = dict(self.sent), dict(self.total)
        chunks, cut = [], []
        for stream in STREAMS:
            room = min(BEAT_BYTES, TOTAL_BYTES - total[stream])
            if room <= 0:
                cut.append(stream)
                continue
            got = self.read(stream, sent[stream], room)
            if got is None:
                continue
            start, end, data, size = got
            text = self.redact(data).decode(errors="replace")
            chunks.append(Chunk(stream=stream, start=start, end=end, text=text[:BEAT_BYTES]))
            sent[stream], total[stream] = end, total[stream] + len(data)
            if room < BEAT_BYTES and (start > self.sent[stream] or size - end >= room):
                total[stream] = TOTAL_BYTES  # the total held it back: this stream's live log ends here
                cut.append(stream)
        if not chunks:
            self.pending = None
            return None
        self.pending = (sent, total)
        return LiveFile(started_at=self.started_at, chunks=chunks, cut=cut).dump()

    def ack(self) -> None:
        """The last `take()` is on the bus: the next one starts after it."""
        if self.pending is not None:
            self.sent, self.total = self.pending
            self.pending = None

    def read(self, stream: str, start: int, room: int) -> tuple[int, int, bytes, int] | None:
        """(start, end, bytes, the log's size) of what is new in the log from `start`: at most `room` bytes, the newest ones
        when there is more (from a line's start), ending at a line's end where a line ends in it."""
        try:
            with open_regular(self.out, f"logs/{stream}.log") as fd:
                size = os.fstat(fd).st_size
                if size <= start:
                    return None
                first = max(start, size - room)
                data = os.pread(fd, size - first, first)
        except (Unsafe, OSError):
            return None
        if first > start:  # skipped: begin at the next line's start, when there is one
            nl = data.find(b"\n")
            if 0 <= nl < len(data) - 1:
                first, data = first + nl + 1, data[nl + 1 :]
        last = data.rfind(b"\n")
        if 0 <= last < len(data) - 1:  # a line still being written waits for the next beat
            data = data[: last + 1]
        elif last < 0 and len(data) < room:
            return None
        return first, first + len(data), data, size


def read_live(repos: Sequence[Path], shas: Sequence[str]) -> list[LiveFile]:
    """The live.json of each heartbeat commit of `shas` that has a valid one, in order (one over LIVE_CAP is
    never read); a batch of reads on each repository, not one process a commit."""
    specs = [f"{sha}:{LIVE_PATH}" for sha in shas]
    found: dict[str, bytes] = {}
    for repo in repos:
        rest = [s for s in specs if s not in found]
        sizes = git.blob_sizes(repo, rest) if rest else {}
        found.update(git.read_blobs(repo, [s for s in rest if sizes.get(s, LIVE_CAP + 1) <= LIVE_CAP]))
    files = []
    for spec in specs:
        try:
            files.append(LiveFile.model_validate_json(found[spec]))
        except (KeyError, ValidationError):
            continue
    return files


def beats(repo: Path, tip: str, after: Sequence[str]) -> list[str]:
    """The commits from `tip` back to (not including) the commits `after` (the request commit, or the last
    heartbeat read), oldest first, at most MAX_BEATS."""
    rest = [f"^{s}" for s in after if git.has_object(repo, s)]
    listed = git.out(repo, "rev-list", "--reverse", f"--max-count={MAX_BEATS}", tip, *rest, "--")
    return listed.split()


def live_files(repos: Sequence[Path], tip: str, after: Sequence[str]) -> list[LiveFile]:
    """The live.json of each heartbeat commit after `after` up to `tip`, in order (a beat that kept its
    parent's file gives it again: a reader skips chunks by their offsets)."""
    return read_live(repos, beats(git.repo_having(list(repos), tip), tip, after))


def final_logs(repos: Sequence[Path], request_id: str, done: str) -> dict[str, bytes | str]:
    """Each stream's final log in the done commit: its bytes, or a line saying why not (missing, too big)."""
    logs: dict[str, bytes | str] = {}
    for stream in STREAMS:
        spec = f"{done}:{results_path(request_id)}/logs/{stream}.log"
        size = next((s for r in repos if (s := git.blob_sizes(r, [spec]).get(spec)) is not None), None)
        if size is None:
            logs[stream] = f"the done commit has no {stream}.log"
        elif size > FINAL_CAP:
            logs[stream] = f"{stream}.log is {size} bytes, over the {FINAL_CAP} bytes shown here"
        else:
            logs[stream] = git.read_blobs_in(list(repos), [spec]).get(spec, b"")
    return logs


# CSI, OSC (ended by BEL or ST) and the other two-byte escapes
def printable(text: str) -> str:
    """`text` safe for a terminal (bridge/core/text.py's `clean`, lines kept), a carriage return made a line end."""
    return clean(text.replace("\r\n", "\n").replace("\r", "\n"), multiline=True)


class Shown:
    """What a reader has shown of one request's logs (so nothing is shown twice): where each stream's shown
    bytes end, which serving they belong to, the last heartbeat commit read."""

    def __init__(self) -> None:
        self.started_at: dt.datetime | None = None
        self.end = dict.fromkeys(STREAMS, 0)
        self.cut: set[str] = set()
        self.last: str | None = None  # the last heartbeat commit read

    def live(self, files: Sequence[LiveFile]) -> list[dict[str, object]]:
        """The events (JSON objects without id and time) for what `files` add: `restarted` (another serving:
        a takeover), `log` (source live; `skipped`: bytes before it never carried), `log-cut`."""
        events: list[dict[str, object]] = []
        for f in files:
            if f.started_at != self.started_at:
                if self.started_at is not None:
                    events.append({"event": "restarted", "started_at": f.started_at.isoformat()})
                self.started_at, self.end, self.cut = f.started_at, dict.fromkeys(STREAMS, 0), set()
            for c in f.chunks:
                if c.end <= self.end[c.stream] or c.start < self.end[c.stream]:
                    continue  # shown already (a beat that kept its parent's file), or not after it
                skipped = c.start - self.end[c.stream]
                events.append(
                    {
                        "event": "log",
                        "source": "live",
                        "stream": c.stream,
                        "start": c.start,
                        "end": c.end,
                        "skipped": skipped,
                        "text": printable(c.text),
                    }
                )
                self.end[c.stream] = c.end
            for stream in set(f.cut) - self.cut:
                self.cut.add(stream)
                events.append({"event": "log-cut", "stream": stream, "bytes": TOTAL_BYTES})
        return events

    def final(self, logs: dict[str, bytes | str]) -> list[dict[str, object]]:
        """The events for the final logs: each stream from where what was shown live ends."""
        events: list[dict[str, object]] = []
        for stream, data in logs.items():
            if isinstance(data, str):
                events.append({"event": "log-missing", "stream": stream, "why": data})
                continue
            start = self.end[stream] if self.end[stream] <= len(data) else 0
            events.append(
                {
                    "event": "log",
                    "source": "final",
                    "stream": stream,
                    "start": start,
                    "end": len(data),
                    "skipped": 0,
                    "text": printable(data[start:].decode(errors="replace")),
                }
            )
        return events
