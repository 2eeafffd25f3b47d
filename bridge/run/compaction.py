"""A runner's side job between two polls: move done results older than config compact_after_days into the bus's
ledger (bridge/bus/ledger.py).

    compaction = Compaction(runner)
    compaction.maybe()     # at most every compact_every_s, and only while it holds the compaction lease
"""

from __future__ import annotations

import datetime as dt
import time

from bridge.bus import ledger
from bridge.bus.records import DONE_PREFIX
from bridge.run.owner import Owner

COMPACT_BATCH = 1000  # done results a runner moves into the ledger at a time, between two polls


class Compaction:
    def __init__(self, runner: Owner):
        self.runner = runner
        self.next = 0.0  # time.monotonic() before which this runner does not look at compacting

    def maybe(self) -> None:
        """Move done results older than config compact_after_days into the bus's ledger, at most every
        compact_every_s on this runner, and only while it holds the compaction lease, which keeps every other
        runner from starting one for compact_every_s after each of its pushes. One listing when there is
        nothing to move; a failure or a lost race is logged, and tried again next time."""
        r = self.runner
        days, every = r.config.compact_after_days, r.config.compact_every_s
        if not days or time.monotonic() < self.next or r.stopping.is_set():
            return
        self.next = time.monotonic() + every
        try:
            cutoff = r.now() - dt.timedelta(days=days)
            if not ledger.due(r.bus, cutoff, r.now()):
                return
            held = ledger.take_lease(r.bus, r.name, every, r.who, r.now())
            if held is None:
                return
            lease = (r.name, held, every)
            moved = ledger.compact(r.bus, cutoff, r.who, lease=lease, log=r.log, limit=COMPACT_BATCH)
            r.log(f"compacted the bus: {len(moved)} refs of results older than {days:g} days into the ledger")
            if sum(ref.startswith(DONE_PREFIX) for ref in moved) >= COMPACT_BATCH:
                self.next = 0.0  # more left (a bus's first compaction): go on after the next poll
        except Exception as exc:  # a side job: whatever the bus holds, it never takes the runner down
            r.log(f"no compaction this time: {exc}")
