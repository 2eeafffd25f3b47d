"""git's pkt-line framing and I/O bounded by a deadline, written once for every conversation the bridge has
with a git server (listings, pushes, fetches by id; bridge/wire/transport.py opens them).

A packet is four hex digits of length (the four included) and its payload; `0000` is a flush (None here),
`0001` a delim and `0002` a response-end (which git's remote helper adds after every answer). A `Wire` is the
two ends of one conversation (a socket, or a process's pipes): every read and write waits at most until its
deadline (TimeoutError past it), and it says what the other side said on stderr (`said`).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import time
from collections.abc import Callable

from bridge.core.errors import BusError

FLUSH = b"0000"
DELIM = b"0001"


def pkt(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return f"{len(raw) + 4:04x}".encode() + raw


def pkt_lines(data: bytes) -> list[bytes | None]:
    """The pkt-lines of `data` (None for a flush; a delim or response-end packet is left out, so that only a
    flush ends a list); raises on a server's ERR."""
    lines: list[bytes | None] = []
    i = 0
    while i + 4 <= len(data):
        try:
            size = int(data[i : i + 4], 16)
        except ValueError:
            raise BusError(f"the bus sent a malformed packet ({data[i : i + 4]!r})") from None
        if size < 4:
            if size == 0:
                lines.append(None)
            i += 4
            continue
        line = data[i + 4 : i + size]
        if line.startswith(b"ERR "):
            raise BusError(line[4:].decode(errors="replace").strip())
        lines.append(line)
        i += size
    return lines


def read_until_flush(recv: Callable[[], bytes]) -> bytes:
    """pkt-lines read with `recv` (b'' at the end) up to and including the first flush packet (or a
    response-end packet, which a remote helper adds after every answer, or an ERR packet, or the end)."""
    data = b""
    i = 0
    while True:
        while len(data) < i + 4:
            chunk = recv()
            if not chunk:
                return data
            data += chunk
        try:
            size = int(data[i : i + 4], 16)
        except ValueError:
            raise BusError(f"the bus sent a malformed packet ({data[i : i + 4]!r})") from None
        if size in (0, 2):
            return data[: i + 4]
        while len(data) < i + max(size, 4):
            chunk = recv()
            if not chunk:
                return data
            data += chunk
        if data[i + 4 : i + 8] == b"ERR ":
            return data[: i + size]
        i += max(size, 4)


def packets_until_flush(recv: Callable[[], bytes], what: str) -> list[bytes]:
    """The payloads of the pkt-lines up to a flush (raises when the bus ends, or says ERR, before it)."""
    lines = pkt_lines(read_until_flush(recv))
    if None not in lines:
        raise BusError(f"the bus closed the connection before the end of {what}")
    return [line for line in lines[: lines.index(None)] if line is not None]


class Packets:
    """The pkt-lines read with `recv` (b'' at the end of the connection), one at a time: `next` is the payload,
    None for a flush, b'' for a delim; BusError for a server's ERR, a malformed packet, or the end of the
    connection before a packet did."""

    def __init__(self, recv: Callable[[], bytes]):
        self.recv = recv
        self.data = bytearray()

    def _take(self, n: int) -> bytes:
        while len(self.data) < n:
            chunk = self.recv()
            if not chunk:
                raise BusError("the bus's answer was cut short: the connection ended before its end")
            self.data += chunk
        taken = bytes(self.data[:n])
        del self.data[:n]
        return taken

    def next(self) -> bytes | None:
        head = self._take(4)
        if not re.fullmatch(rb"[0-9a-f]{4}", head) or int(head, 16) == 3:
            raise BusError(f"the bus sent a malformed packet ({head!r})")
        size = int(head, 16)
        if size < 4:
            return None if size == 0 else b""
        line = self._take(size - 4)
        if line.startswith(b"ERR "):
            raise BusError(line[4:].decode(errors="replace").strip())
        return line


class Wire:
    """The two ends of a conversation with a git server (a socket, or a process's pipes), every read and
    write within `deadline` (TimeoutError past it). `end` says we have no more to send; `said` is what the
    other side said on stderr ('' when nothing); `before_read` runs before each read (a socket's TCP_QUICKACK)."""

    def __init__(
        self,
        rfd: int,
        wfd: int,
        deadline: float,
        end: Callable[[], None],
        said: Callable[[], str] = lambda: "",
        before_read: Callable[[], None] | None = None,
    ):
        self.rfd, self.wfd, self.deadline, self.end, self.said = rfd, wfd, deadline, end, said
        self.before_read = before_read
        self.pending = b""  # read past a line (`line`), given out first by `recv`
        self.ended = False  # the other side hung up (a read found the end)
        os.set_blocking(wfd, False)

    def left(self) -> float:
        """The seconds left before the deadline (TimeoutError when none are)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    def _wait(self, fd: int, write: bool) -> None:
        left = self.deadline - time.monotonic()
        ready = (
            select.select([], [fd], [], max(left, 0)) if write else select.select([fd], [], [], max(left, 0))
        )
        if left <= 0 or not any(ready):
            raise TimeoutError

    def recv(self) -> bytes:
        if self.pending:
            chunk, self.pending = self.pending, b""
            return chunk
        while True:
            if self.before_read is not None:
                self.before_read()
            self._wait(self.rfd, False)
            with contextlib.suppress(BlockingIOError):
                chunk = os.read(self.rfd, 65536)
                self.ended = not chunk
                return chunk

    def line(self) -> bytes:
        """One text line (without its newline; b'' at the end), for a remote helper's own commands."""
        data = b""
        while b"\n" not in data and (chunk := self.recv()):
            data += chunk
        first, _, self.pending = data.partition(b"\n")
        return first

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._wait(self.wfd, True)
            with contextlib.suppress(BlockingIOError):
                view = view[os.write(self.wfd, view[:65536]) :]
