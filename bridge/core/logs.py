"""Redaction of secret values and capped, redacted logs of a run's stdout/stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bridge.core.caps import Unsafe, atomic_write, read_file

REDACTED = "[REDACTED]"


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

    def scrub_file(self, path: Path, cap: int) -> None:
        """Redact a file of a run in place (read as bridge/core/caps.py reads: no link followed, at most `cap` bytes;
        one that cannot be read so is left for the caps to refuse)."""
        if not self.secrets:
            return
        try:
            data = read_file(path.parent, path.name, cap)
        except (Unsafe, OSError):
            return
        clean = self(data)
        if clean != data:
            atomic_write(path, clean)


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
            self.file.flush()  # so the runner's heartbeats can show the last lines while it runs
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


def pump(stream: Any, log: CappedLog) -> None:
    """Copy a program's output stream into `log` until it ends. A log that cannot be written (a full disk) is
    given up, but the stream is still drained, so the program never blocks on its output."""
    failed = False
    try:
        for chunk in iter(lambda: stream.read1(65536), b""):
            if not failed:
                try:
                    log.write(chunk)
                except OSError:
                    failed = True
    finally:
        with contextlib.suppress(OSError):
            log.close()
