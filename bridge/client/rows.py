"""The requests as `kakeya status` (and the MCP server's status tool) shows them: one `Row` a request, built
from its refs and the commits already here (a request's state, verdict, holder, lease and progress).

    rows(bus, entries)      # one batch read of the result.json / claim.json files and the request.json files
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bridge.bus.bus import Bus
from bridge.bus.records import (
    CLAIM_PATH,
    Claim,
    Entry,
    Manifest,
    parse_or_none,
    read_manifests,
    request_state,
    results_path,
    utcnow,
)
from bridge.core.result import RunResult
from bridge.wire import git


def shown(items: Sequence[str], limit: int = 5) -> str:
    """The first `limit` items, and how many more."""
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def recent_days(days: int = 2) -> list[str]:
    """The UTC dates (YYYYMMDD) of today and the `days - 1` days before: what `status` shows by default."""
    today = utcnow()
    return sorted({f"{today - dt.timedelta(days=d):%Y%m%d}" for d in range(days)})


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(max(seconds, 0))}s"


@dataclass
class Row:
    """One request as `kakeya status` shows it."""

    id: str
    state: str
    preset: str
    runner: str | None
    created_at: str
    age_s: float
    verdict: str | None = None
    reason: str | None = None
    holder: str | None = None
    subject: str | None = None
    refs: dict[str, str] = field(default_factory=dict)
    progress: dict[str, Any] | None = (
        None  # a running request's last heartbeat record (bridge/bus/progress.py)
    )
    elapsed_s: float | None = None  # since its runner began serving it
    holder_live: bool | None = None  # whether the holder's lease still runs
    lease_until: str | None = None


def row_dict(row: Row) -> dict[str, Any]:
    return asdict(row)


def rows(bus: Bus, entries: Sequence[Entry]) -> list[Row]:
    """A row for each of `entries`, from the commits already here (none is fetched)."""
    specs: dict[str, str] = {}
    for e in entries:
        if e.done:
            specs[e.id] = f"{e.done}:{results_path(e.id)}/result.json"
        elif e.claim:
            specs[e.id] = f"{e.claim}:{CLAIM_PATH}"
    found = git.read_blobs_in(bus.repos(), list(specs.values()))
    # a finished request's commit went with its ref: its done commit holds the same request.json
    manifests = read_manifests(bus.repos(), [c for e in entries if (c := e.req or e.done)])
    now = utcnow()
    out = []
    for e in entries:
        manifest = m if isinstance(m := manifests.get(e.req or e.done or ""), Manifest) else None
        out.append(row(e, now, manifest, found.get(specs.get(e.id, ""))))
    return out


def row(e: Entry, now: dt.datetime, manifest: Manifest | None, data: bytes | None) -> Row:
    """One request's row: `data` is its result.json when it is done, else its claim.json when claimed."""
    result = parse_or_none(RunResult, data) if e.done else None
    claim = parse_or_none(Claim, data) if e.claim and not e.done else None
    status = result.status if result else None
    row = Row(
        e.id,
        request_state(e, now, manifest=manifest, claim=claim, result_status=status),
        e.preset,
        e.label or (manifest.runner if manifest else None),
        e.created_at.isoformat(timespec="milliseconds"),
        round((now - e.created_at).total_seconds(), 3),
        subject=manifest.subject if manifest else None,
        refs={k: v for k in ("req", "claim", "done", "cancel") if (v := getattr(e, k))},
    )
    if result:
        row.verdict, row.reason, row.holder = result.verdict, result.reason, result.runner_name
    elif row.state == "expired" and manifest is not None:  # unclaimed past its queue timeout
        row.reason = f"no runner started it before {manifest.expires_at.isoformat(timespec='seconds')}"
    elif claim:
        row.holder = claim.runner
        row.holder_live = claim.lease_until >= now
        row.lease_until = claim.lease_until.isoformat(timespec="seconds")
        if claim.progress is not None:
            row.progress = claim.progress.model_dump(mode="json")
            row.elapsed_s = round((now - claim.progress.started_at).total_seconds(), 1)
    return row
