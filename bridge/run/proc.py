"""Process-tree control: every descendant of a run, and killing all of them (even ones that left its group)."""

from __future__ import annotations

import os
import signal
import subprocess

from bridge.run.launcher import descendants

__all__ = ["descendants", "kill_tree"]


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
