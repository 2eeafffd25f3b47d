"""Finding requests on the bus with prefix-scoped listings (never the whole bus): one request's refs
(`entry`, the ledger's shard of its day when it finished long ago), the id a prefix or a suffix names
(`resolve_id`), and the requests `kakeya status` lists (`listed`).
"""

from __future__ import annotations

import re

from bridge.bus import ledger as L
from bridge.bus.bus import Bus
from bridge.bus.records import (
    CANCEL_PREFIX,
    CLAIM_PREFIX,
    DONE_PREFIX,
    ID_RE,
    ID_RULE,
    LIVE,
    REQ_PREFIX,
    Entry,
    cancel_ref,
    claim_ref,
    done_ref,
    id_time,
    parse_id,
    req_ref,
)
from bridge.client.rows import recent_days, shown
from bridge.core.errors import InvalidRequest, KakeyaError


def entry(bus: Bus, url: str, request_id: str, label: str | None = None) -> Entry:
    """One request's refs, from one prefix-scoped listing of just its refs (and of the live requests of
    `label`, or of every label when it is not known)."""
    id_time(request_id)
    snap = bus.ls_remote(
        req_ref(label, request_id) if label else REQ_PREFIX,
        claim_ref(request_id),
        done_ref(request_id),
        cancel_ref(request_id),
        L.map_ref("date"),
    )
    entry = snap.entries.get(request_id)
    if entry is None:  # finished long ago: its done ref went into the ledger (its day's shard, by id)
        found = L.read(bus, L.read_map(bus, snap, "date"), [L.date_shard(request_id)])
        entry = L.as_entries(e for e in found if e.id == request_id).get(request_id)
    if entry is None:
        raise KakeyaError(f"no request {request_id} on the bus at {url}", code="not-found")
    return entry


def resolve_id(bus: Bus, url: str, text: str) -> str:
    """The request id `text` names: the id itself, a unique prefix of one that gives at least its date
    (`20261125T1615`), or the start of its six-hex suffix (`663f0b`) among the live requests and those of
    the last two days; from one prefix-scoped listing (never the whole bus). KakeyaError otherwise:
    `not-found`, `ambiguous-id` (naming the candidates) or `bad-id`."""
    if parse_id(text) is not None:
        return text
    if ID_RE.fullmatch(text):  # shaped as a whole id, but not one (a 13th month, far in the future)
        raise InvalidRequest(f"{text!r} is not a request id ({ID_RULE})", code="bad-id")
    if re.fullmatch(r"\d{8}[0-9A-Za-z._-]*", text):
        scoped = (CLAIM_PREFIX + text, DONE_PREFIX + text, CANCEL_PREFIX + text)
        snap = bus.ls_remote(REQ_PREFIX, *scoped, L.map_ref("date"))
        found = {rid for rid in snap.entries if rid.startswith(text)}
        ledger = L.read_map(bus, snap, "date")  # finished long ago: in the ledger's shard of that day
        found |= {e.id for e in L.read(bus, ledger, [L.date_shard(text)]) if e.id.startswith(text)}
    elif re.fullmatch(r"[0-9a-f]{4,6}", text):
        snap = bus.ls_remote(*LIVE, *(DONE_PREFIX + day for day in recent_days()))
        found = {rid for rid in snap.entries if rid.rsplit("-", 1)[1].startswith(text)}
    else:
        raise InvalidRequest(
            f"{text!r} is not a request id ({ID_RULE}), nor a prefix of one that gives at least its "
            "date (20261125T1615...), nor the start of its six-hex suffix (663f0b)",
            code="bad-id",
        )
    if len(found) == 1:
        return found.pop()
    if not found:
        raise KakeyaError(
            f"no request matching {text!r} on the bus at {url}",
            code="not-found",
            hint="`kakeya status` lists the requests (a six-hex suffix matches those of the last two days)",
        )
    candidates = sorted(found)
    raise KakeyaError(
        f"{text!r} matches {len(candidates)} requests: {shown(candidates, 10)}; give more of the id",
        code="ambiguous-id",
        candidates=candidates[:100],
    )


def listed(bus: Bus, everything: bool = False, days: int = 2) -> list[Entry]:
    """The live requests and those finished in the last `days` days (by id date; `everything`: every done ref,
    and the ledger's history) from one prefix-scoped listing, by id."""
    done = [DONE_PREFIX] if everything else [DONE_PREFIX + day for day in recent_days(days)]
    snap = bus.ls_remote(*LIVE, *done, *([L.map_ref("date")] if everything else []))
    if everything:  # the history in the ledger too: every day's shard, fetched by object id in one go
        ledger = L.read_map(bus, snap, "date")
        shards = list(ledger.shards if ledger else {})
        for rid, e in L.as_entries(L.read(bus, ledger, shards)).items():
            snap.entries.setdefault(rid, e)
    return sorted(snap.entries.values(), key=lambda e: e.id)
