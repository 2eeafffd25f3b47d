"""`Owner`: what the runner's parts (claims, delivery, presence, compaction) see of the runner that holds
them (bridge/run/runner.py `Runner`), written once; a protocol, so none of them imports the runner."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Protocol

from bridge.bus.bus import Bus
from bridge.bus.records import Entry
from bridge.bus.trust import Signers
from bridge.config import Config
from bridge.core.result import RunContext


class Owner(Protocol):
    config: Config
    bus: Bus
    mirror: Path
    workdir: Path
    name: str
    labels: list[str]
    who: str
    sign_key: str | None
    requesters: Signers | None
    stopping: threading.Event

    def log(self, msg: str) -> None: ...

    def now(self) -> dt.datetime: ...

    def context(self, entry: Entry) -> RunContext: ...
