"""A claim kept alive while its request is served: heartbeats that fast-forward the claim (carrying the
progress record and the run's log since the last beat, bridge/bus/livelog.py), and checks for a cancel marker
or a takeover.

    lease = Lease(runner, request_id, claim_sha, claim)   # a thread: start(), should_stop(), stop()
    with lease.lock: ...                                  # no heartbeat while the result's final push runs

A heartbeat reads the run's files (its progress) before it takes the lock: no workload I/O ever happens
under it.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from bridge.bus.bus import Bus
from bridge.bus.livelog import LIVE_PATH, LiveLog
from bridge.bus.records import CLAIM_PATH, Claim, Progress, Update, cancel_ref, claim_ref
from bridge.config import Config
from bridge.core.errors import KakeyaError
from bridge.wire import git


class Holder(Protocol):
    """What a lease needs of the runner that holds it (bridge/run/runner.py Runner): no import of it, no circle."""

    config: Config
    bus: Bus
    mirror: Path
    name: str
    who: str
    sign_key: str | None
    abort_reason: str | None

    def progress(self) -> Progress | None: ...

    def log(self, msg: str) -> None: ...

    def holder(self, request_id: str, sha: str | None) -> str: ...

    def now(self) -> dt.datetime: ...


class Lease(threading.Thread):
    """Keeps a claim alive while the request is served: heartbeats, cancel markers, takeovers."""

    def __init__(
        self,
        runner: Holder,
        request_id: str,
        sha: str,
        claim: Claim,
        progress: Callable[[], Progress | None] | None = None,
        live: LiveLog | None = None,
    ):
        super().__init__(name=f"lease-{request_id}", daemon=True)
        self.runner, self.id, self.sha, self.claim = runner, request_id, sha, claim
        self.progress = progress or runner.progress  # what its heartbeats carry (one per claim in flight)
        self.live = live  # the run's log since the last beat (bridge/bus/livelog.py), carried as LIVE_PATH
        self.cancelled = False
        self.lost: str | None = None
        self.lock = threading.Lock()  # held by a heartbeat, and by the result's final push
        self._halt = threading.Event()
        lease_s = runner.config.lease_s
        self.tick_s = min(max(runner.config.poll_interval_s, 2.0), lease_s / 3)  # cancel/takeover checks
        self.beat_s = lease_s / 3

    def run(self) -> None:
        next_beat = self.beat_s
        waited = 0.0
        while not self._halt.wait(self.tick_s) and not self.lost:
            waited += self.tick_s
            try:
                self.check()
                if not self.lost and waited >= next_beat:
                    progress = self.progress()  # reads the run's files: never under the lock
                    live = self.live.take() if self.live is not None else None
                    with self.lock:
                        if not self.lost and not self._halt.is_set():
                            self.heartbeat(progress, live)
                    next_beat = waited + self.beat_s
            except KakeyaError as exc:  # the bus is unreachable for now: keep running, keep trying
                self.runner.log(f"{self.id}: heartbeat/check failed, will retry: {exc}")

    def check(self) -> None:
        snap = self.runner.bus.ls_remote(claim_ref(self.id), cancel_ref(self.id))
        if cancel_ref(self.id) in snap.refs:
            self.cancelled = True
        current = snap.refs.get(claim_ref(self.id))
        if current != self.sha:
            self.lost = f"lease lost: {self.runner.holder(self.id, current)}"

    def heartbeat(self, progress: Progress | None, live: bytes | None = None) -> None:
        claim = heartbeat_claim(self.claim, self.runner.config.lease_s, progress, self.runner.now())
        sha = git.child_commit(
            self.runner.mirror,
            self.sha,
            {CLAIM_PATH: claim.dump(), **({LIVE_PATH: live} if live is not None else {})},
            f"kakeya heartbeat {self.id} #{claim.heartbeat} by {self.runner.name}",
            self.runner.who,
            self.runner.sign_key,
        )
        if self.runner.bus.swap([Update(claim_ref(self.id), sha, self.sha)]):
            self.sha, self.claim = sha, claim
            if live is not None and self.live is not None:
                self.live.ack()
        else:
            self.lost = f"lease lost: {self.runner.holder(self.id, None)}"

    def should_stop(self) -> str | None:
        if self.lost:
            return self.lost
        if self.cancelled:
            return "cancelled"
        return self.runner.abort_reason

    def stop(self) -> None:
        self._halt.set()
        self.join()


def heartbeat_claim(claim: Claim, lease_s: float, progress: Progress | None, now: dt.datetime) -> Claim:
    """The claim a heartbeat pushes: one more beat, a lease from `now` (this runner's clock), and the progress
    record."""
    return claim.model_copy(
        update={
            "heartbeat": claim.heartbeat + 1,
            "lease_until": now + dt.timedelta(seconds=lease_s),
            "progress": progress,
        }
    )
