"""A runner's work directory: `runs/<id>` (a run's out dir), `work/<id>` (its copy of the subject), `mirror.git`
and `lock`, held while the runner lives so that only one runner process removes what crashed runs left.

    lock = lock_workdir(workdir)          # None: another runner process uses this workdir
    clear(log, *paths)                    # remove run directories; what cannot go now is left for `sweep`
    sweep(workdir, log)                   # at start, in the background: runs/* and work/* of earlier starts
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from bridge.core import caps


def lock_workdir(workdir: Path) -> IO[bytes] | None:
    """An exclusive lock on `workdir`, held while the returned file is open (while this runner lives), or None
    when another runner holds it (two `kakeya run` in one project): only the holder removes stale run dirs."""
    workdir.mkdir(parents=True, exist_ok=True)
    lock = (workdir / "lock").open("ab")
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return None
    return lock


def clear(log: Callable[[str], None], *paths: Path) -> None:
    """Remove a run's directories; what cannot be removed now is left for the next start (`sweep`)."""
    for path in paths:
        try:
            caps.remove(path)
        except OSError as exc:
            log(f"could not remove {path}: {exc}")


def sweep(workdir: Path, log: Callable[[str], None]) -> None:
    """Remove what runs of an earlier start of this runner left (runs/*, work/*): a crash, a full disk. Run
    in the background from the start (a run's names are its request's: none of these is served again)."""
    for top in ("runs", "work"):
        folder = workdir / top
        left = sorted(folder.iterdir()) if folder.is_dir() else []
        if left:
            started = time.monotonic()
            many = f"{len(left)} stale director{'y' if len(left) == 1 else 'ies'} in {folder}"
            log(f"removing {many} in the background")
            clear(log, *left)
            log(f"removed {many} in {time.monotonic() - started:.1f} s")
