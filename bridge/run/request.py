"""A claimed request as a runner takes it: re-validated against the runner's own registry (never the request
commit's presets), and its subject's files checked for Git LFS pointers before anything runs.

    manifest, preset, values = validate(mirror, entry, registry, requesters)   # Rejected says why not
    not_started(manifest, cancelled, now)     # ("cancelled" | "expired", why), or None: it may run
    check_lfs(checkout)                                                          # KakeyaError on a pointer
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge.bus.records import Entry, Manifest, read_manifests
from bridge.bus.trust import Signers, signature_problem
from bridge.core.errors import InvalidRequest, KakeyaError, Rejected
from bridge.presets.preset import Preset
from bridge.wire import git

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def validate(
    mirror: Path, entry: Entry, registry: Mapping[str, Preset], requesters: Signers | None
) -> tuple[Manifest, Preset, dict[str, Any]]:
    """The request, re-validated against this runner's own registry; Rejected says why not."""
    assert entry.req is not None
    manifest = read_manifests([mirror], [entry.req])[entry.req]  # size-capped, parsed
    if not isinstance(manifest, Manifest):
        raise Rejected(f"invalid manifest: {manifest}")
    parents = git.parents(mirror, entry.req)
    for field, want in (("id", entry.id), ("runner", entry.label), ("preset", entry.preset)):
        if getattr(manifest, field) != want:
            raise Rejected(
                f"invalid manifest: {field} is {getattr(manifest, field)!r} but the bus ref says {want!r}"
            )
    if parents != [manifest.subject]:
        raise Rejected(f"invalid manifest: subject {manifest.subject} is not the request commit's parent")
    if requesters is not None:
        problem = signature_problem(mirror, entry.req, requesters, "the request commit")
        if problem:
            raise Rejected(f"{problem} (this runner requires requests signed by a key of {requesters.path})")
    preset = registry.get(manifest.preset)
    if preset is None:
        raise Rejected(
            f"unknown preset {manifest.preset!r}: this runner's registry has "
            f"{', '.join(sorted(registry)) or 'no presets'}"
        )
    try:
        preset.check_runs_on(manifest.runner)
    except InvalidRequest as exc:
        raise Rejected(str(exc)) from None
    try:
        values = preset.validate_params(manifest.params)
    except KakeyaError as exc:
        raise Rejected(f"bad parameters: {exc}") from None
    return manifest, preset, values


def not_started(manifest: Manifest, cancelled: bool, now: dt.datetime) -> tuple[str, str] | None:
    """(status, reason) of a request that must not run at all: cancelled, or expired before a runner started it."""
    if cancelled:
        return "cancelled", "cancelled before it started"
    if manifest.expires_at < now:
        return "expired", f"expired at {manifest.expires_at.isoformat()} before a runner started it"
    return None


def check_lfs(checkout: Path) -> None:
    """Refuse a checkout in which a Git LFS file is still a pointer (git-lfs missing or not pulled)."""
    pointers = []
    for dirpath, dirnames, filenames in os.walk(checkout):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            path = Path(dirpath) / name
            try:
                if path.is_symlink() or path.stat().st_size > 1024:
                    continue
                with path.open("rb") as fh:
                    head = fh.read(len(LFS_POINTER))
            except OSError:
                continue
            if head == LFS_POINTER:
                pointers.append(path.relative_to(checkout).as_posix())
    if pointers:
        shown = ", ".join(pointers[:5]) + (f" and {len(pointers) - 5} more" if len(pointers) > 5 else "")
        raise KakeyaError(
            f"the subject has {len(pointers)} Git LFS pointer file(s) that were not fetched ({shown}); "
            "install git-lfs on the runner (`git lfs install`) so checkouts get the real files"
        )
