"""What a runner tells the bus about itself: its presence ref (bridge/bus/presence.py Beacon: live, idle,
serving, paused, stopped), and whether it claims at all (`has_room`: a disk under config min_free_bytes pauses
it, and its presence says why).

    presence = Presence(runner)
    presence.start(serving=None)    # keep kakeya/runners/<name> up to date; stop() says the runner stopped
    presence.serving("r1")          # what it serves now (None: idle); nothing when no presence was started
    presence.has_room()             # False while the disk is under the floor
"""

from __future__ import annotations

import shutil

from bridge.bus.presence import Beacon, host_facts
from bridge.config import Config
from bridge.run.owner import Owner


class Presence:
    def __init__(self, runner: Owner):
        self.runner = runner
        self.beacon: Beacon | None = None  # the presence ref, once start() was called
        self.paused: str | None = None  # why this runner does not claim now (too little free space), or None

    def start(self, serving: str | None = None) -> None:
        """Keep kakeya/runners/<name> up to date until stop(); its first push says it serves `serving`, when
        given."""
        if self.beacon is not None:
            return
        r = self.runner
        host, acc, version = host_facts()
        self.beacon = Beacon(
            r.bus,
            r.mirror,
            r.name,
            r.labels,
            who=r.who,
            sign_key=r.sign_key,
            every_s=presence_every(r.config),
            host=host,
            accelerator=acc,
            version=version,
            log=r.log,
            paused=self.paused,
            require_signed_requests=r.requesters is not None,
        )
        if serving is not None:
            self.beacon.serving(serving)
        self.beacon.start()

    def stop(self) -> None:
        """Say this runner stopped (its presence is no longer live)."""
        if self.beacon is not None:
            self.beacon.close()
            self.beacon = None

    def serving(self, what: str | None) -> None:
        """Say what the runner serves now (a request id, a list of them; None: idle)."""
        if self.beacon is not None:
            self.beacon.serving(what)

    def has_room(self) -> bool:
        """Is there config min_free_bytes free where this runner works? If not, it claims nothing and says why
        (log, presence) until there is again: a full disk would fail every request it took."""
        floor, workdir = self.runner.config.min_free_bytes, self.runner.workdir
        free = shutil.disk_usage(workdir).free if floor else 0
        paused = (
            f"not claiming: {mib(free)} free in {workdir}, under the floor of {mib(floor)} (min_free_bytes)"
            if free < floor
            else None
        )
        if paused != self.paused:
            self.runner.log(paused or "claiming again: there is room on the disk")
            self.paused = paused
            if self.beacon is not None:
                self.beacon.pause(paused)
        return paused is None


def presence_every(config: Config) -> float:
    """How often an unchanged presence is refreshed: two leases (2 min by default); a change of state
    (serving, idle, stopped) is published at once."""
    return max(config.lease_s * 2, 1.0)


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"
