"""Caps on what a run commits: report.json, the program's other files, and the whole result.

What exceeds a cap is deleted from the run's directory before anything is committed and listed in
result.json (`dropped`), so a run that leaves a 200 MiB file still ends in one small done commit.
Links and special files are dropped too: only regular files are ever committed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

RUNNER_FILES = ("result.json", "verdict.json", "summary.md", "logs/stdout.log", "logs/stderr.log")
REPORT = "report.json"


def regular_files(root: Path) -> tuple[dict[str, int], list[str]]:
    """(relative path -> size for regular files, relative paths of everything else that is not a directory)."""
    files: dict[str, int] = {}
    other: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                files[rel] = st.st_size
            else:
                other.append(rel)
    return files, other


def apply_caps(out_dir: Path, *, report_cap: int, files_cap: int, result_cap: int) -> list[str]:
    """Delete what exceeds the caps from `out_dir`; one line per dropped path, for result.json."""
    files, other = regular_files(out_dir)
    dropped = []
    for rel in sorted(other):
        (out_dir / rel).unlink()
        dropped.append(f"{rel}: not a regular file")

    def drop(rel: str, why: str) -> None:
        (out_dir / rel).unlink()
        dropped.append(f"{rel} ({files.pop(rel)} bytes): {why}")

    if files.get(REPORT, 0) > report_cap:
        drop(REPORT, f"over the report cap of {report_cap} bytes")
    total = sum(size for rel, size in files.items() if rel in RUNNER_FILES or rel == REPORT)
    extra = 0
    for size, rel in sorted((s, r) for r, s in files.items() if r not in RUNNER_FILES and r != REPORT):
        if extra + size > files_cap:
            drop(rel, f"over the cap of {files_cap} bytes on the program's other files")
        elif total + size > result_cap:
            drop(rel, f"over the cap of {result_cap} bytes on the whole result")
        else:
            extra += size
            total += size
    if total > result_cap and REPORT in files:
        drop(REPORT, f"over the cap of {result_cap} bytes on the whole result")
    return dropped
