"""The evidence a commit needs, as a service for the front ends (`kakeya evidence`, `kakeya gate pr`, the MCP
server's gate_pr and evidence_for): the requirements (given, else .github/kakeya-required.yml), the subject's
sha, the trusted signers, what the bus holds judged like `kakeya gate pr`, the live requests that would
provide a missing requirement (`pending`) and a request for each one still missing (`request_missing`).

    reqs = requirements(c, None, registry)              # .github/kakeya-required.yml of c.root
    outcomes = judge(c, subject_sha(c, "HEAD"), reqs, registry, signers_for(c, None, False))
    made = request_missing(c, subject, outcomes, registry, pending(c, subject, outcomes, registry))
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.bus.records import LIVE, Manifest, read_manifests, utcnow
from bridge.bus.trust import Signers, evidence_signers
from bridge.client.client import Client
from bridge.core.errors import InvalidRequest
from bridge.core.names import SHA_PATTERN
from bridge.evidence.done import DoneResults
from bridge.evidence.judge import Outcome, gate_subject
from bridge.evidence.requirements import ANY, REQUIRED_FILE, Requirement, check_requirements, parse_required
from bridge.presets.preset import Preset


def read_required(root: Path) -> list[str]:
    """The entries of <root>/.github/kakeya-required.yml; InvalidRequest when it is missing or not valid."""
    path = root / REQUIRED_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InvalidRequest(
            f"no --require given and {path} does not exist: name the evidence with --require 'PRESET@LABEL'"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"{path}: cannot read it: {exc}") from None
    return parse_required(text, str(path))


def requirements(c: Client, texts: Sequence[str] | None, registry: Mapping[str, Preset]) -> list[Requirement]:
    """The --require entries, else those of .github/kakeya-required.yml, parsed against `registry`."""
    return check_requirements(texts if texts else read_required(c.root), registry)


def subject_sha(c: Client, given: str) -> str:
    """A full sha as given (it need not be in this clone), else a rev of this repository."""
    sha = given.strip().lower()
    return sha if re.fullmatch(SHA_PATTERN, sha) else c.rev_parse(given)


def signers_for(c: Client, allowed: Path | None, allow_unsigned: bool) -> Signers | None:
    return evidence_signers(c.root, allowed, bus=c.url, embedded=not c.remote, allow_unsigned=allow_unsigned)


def judge(
    c: Client,
    subject: str,
    reqs: Sequence[Requirement],
    registry: Mapping[str, Preset],
    signers: Signers | None,
) -> list[Outcome]:
    """What the bus holds for `subject`, judged like `kakeya gate pr` (bridge/evidence/judge.py)."""
    return gate_subject(DoneResults(c.bus, signers), subject, reqs, registry)


def params_for(req: Requirement, preset: Preset) -> dict[str, Any]:
    """Parameters that meet `req`'s pins (the bound itself for >= <= ==, the next value for > <; the other
    parameters at their defaults); InvalidRequest when the pins admit no allowed value."""
    values: dict[str, Any] = {}
    for pin in req.pins:
        if pin.param in values or pin.value == ANY:  # any value: the default
            continue
        value: Any = list(pin.value) if isinstance(pin.value, tuple) else pin.value
        if pin.op in (">", "<"):
            up = pin.op == ">"
            if isinstance(value, float):
                value = math.nextafter(value, math.inf if up else -math.inf)
            else:
                value += 1 if up else -1
        if preset.params[pin.param].type == "int_list" and not isinstance(value, list):
            value = [value]
        values[pin.param] = value
    try:
        typed = preset.validate_params(values)
    except InvalidRequest as exc:
        raise InvalidRequest(f"requirement {req}: no allowed parameters meet its pins ({exc})") from None
    unmet = req.unmet(typed)
    if unmet:
        raise InvalidRequest(f"requirement {req}: no single value meets its pins ({'; '.join(unmet)})")
    return values


def pending(
    c: Client, subject: str, outcomes: Sequence[Outcome], registry: Mapping[str, Preset]
) -> dict[str, str]:
    """requirement -> the id of a live request (queued or running) for `subject` that would provide it: one
    listing of the live requests, their request commits fetched by id."""
    wanted = {o.requirement.preset for o in outcomes if o.status == "missing"}
    if not wanted:
        return {}
    snap = c.bus.ls_remote(*LIVE)
    live = [e for e in snap.entries.values() if e.req and not e.done and not e.cancel and e.preset in wanted]
    c.ensure(live, ("req",))
    manifests = read_manifests(c.bus.repos(), [e.req for e in live if e.req])
    found: dict[str, str] = {}
    for o in outcomes:
        if o.status != "missing":
            continue
        req, preset = o.requirement, registry[o.requirement.preset]
        for e in live:
            m = manifests.get(e.req or "")
            if not isinstance(m, Manifest) or m.preset != req.preset or m.subject != subject:
                continue
            if req.label is not None and m.runner != req.label:
                continue
            if m.expires_at < utcnow():
                continue
            try:
                ok = not req.unmet(preset.validate_params(m.params))
            except InvalidRequest:
                ok = False
            if ok:
                found[str(req)] = m.id
                break
    return found


def request_missing(
    c: Client,
    subject: str,
    outcomes: Sequence[Outcome],
    registry: Mapping[str, Preset],
    already: Mapping[str, str],
) -> dict[str, Manifest]:
    """requirement -> the request made for each missing one not already pending (all made before any runs)."""
    made: dict[str, Manifest] = {}
    for o in outcomes:
        req = o.requirement
        if o.status != "missing" or str(req) in already:
            continue
        preset = registry[req.preset]
        made[str(req)] = c.request(
            preset.name,
            params_for(req, preset),
            [req.label] if req.label else preset.runners,
            subject=subject,
            registry=registry,
        )
    return made
