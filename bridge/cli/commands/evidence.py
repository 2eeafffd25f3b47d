"""`kakeya evidence SHA [--require 'PRESET[@LABEL] [PIN ...]' ...] [--request-missing] [--wait] [--json]`: the
evidence a commit needs, in one call.

Lists what is required (the --require entries, else .github/kakeya-required.yml of this checkout: the file the
PR gate reads), what the bus holds for SHA (the evidence used, and the results that name it but are no
evidence: untrusted, not run, mismatched, not meeting the pins) and what is pending (a live request of that
preset for SHA that meets the pins). --request-missing requests every missing one at once (its pins met by
the smallest values they allow; without @LABEL on the preset's labels in order, the first with a live
runner); --wait follows all of them concurrently, streaming each one's progress (--json: one JSON event per
line, each with its request "id"), then judges again. Exit 0 when every requirement passes, 1 otherwise (2 a
bad requirement, 3 no live runner for --no-runner-timeout).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge import evidence
from bridge.bus.records import LIVE, Manifest, read_manifests, utcnow
from bridge.bus.trust import Signers, evidence_signers
from bridge.cli.commands._common import add_remote, add_signer_args, client
from bridge.client.client import Client
from bridge.core.errors import InvalidRequest
from bridge.core.names import SHA_PATTERN
from bridge.evidence import REQUIRED_FILE, DoneResults, Outcome, Requirement
from bridge.evidence.requirements import ANY
from bridge.presets.preset import Preset
from bridge.presets.registry import load_registry


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "evidence",
        help="what evidence a commit needs, what the bus holds, and (--request-missing) request the rest",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "subject",
        nargs="?",
        default="HEAD",
        metavar="SHA",
        help="the commit (a full sha, or a rev of this repo; default HEAD)",
    )
    add_require(parser)
    parser.add_argument("--request-missing", action="store_true", help="request every missing run at once")
    parser.add_argument(
        "--wait", action="store_true", help="follow the requested and pending runs until all are done"
    )
    from bridge.cli.commands.wait import add_wait_args

    add_wait_args(parser, "with --wait: ")
    add_signer_args(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def add_require(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--require",
        action="append",
        metavar="'PRESET[@LABEL] [PARAM OP VALUE ...]'",
        help=f"evidence that must pass (repeatable; default: the entries of {REQUIRED_FILE}); without @LABEL "
        "a run on any label counts; pins (operators == >= <= > <; a list parameter's every item must meet "
        ">= <= > <) make a run whose parameters do not meet them no evidence, e.g. "
        "'niah-ladder@h200 contexts>=65536 samples>=5'",
    )


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
    return evidence.parse_required(text, str(path))


def requirements(c: Client, texts: Sequence[str] | None, registry: Mapping[str, Preset]) -> list[Requirement]:
    """The --require entries, else those of .github/kakeya-required.yml, parsed against `registry`."""
    return evidence.check_requirements(texts if texts else read_required(c.root), registry)


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
    """What the bus holds for `subject`, judged like `kakeya gate pr` (bridge/evidence.py)."""
    return evidence.gate_subject(DoneResults(c.bus, signers), subject, reqs, registry)


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


def run(args: argparse.Namespace) -> int:
    from bridge.cli.commands.wait import line
    from bridge.client.follow import follow_all

    registry = load_registry()
    c = client(args)
    reqs = requirements(c, args.require, registry)
    subject = subject_sha(c, args.subject)
    signers = signers_for(c, args.allowed_signers, args.allow_unsigned)
    emit = (lambda e: print(json.dumps(e), flush=True)) if args.json else None
    outcomes = judge(c, subject, reqs, registry, signers)
    waiting = pending(c, subject, outcomes, registry)
    made = request_missing(c, subject, outcomes, registry, waiting) if args.request_missing else {}
    for req, rid in waiting.items():
        say(emit, {"event": "pending", "id": rid, "requirement": req}, f"pending: {req}: {rid}")
    for req, m in made.items():
        say(emit, requested_event(req, m), f"requested: {req}: {m.id} on {m.runner}")
    ids = [*waiting.values(), *(m.id for m in made.values())]
    if args.wait and ids:
        for event in follow_all(c, ids, args.timeout, args.no_runner_timeout):
            if emit is not None:
                emit(event)
            else:
                print(f"{event['id']}: {line(event)}", flush=True)
        outcomes = judge(c, subject, reqs, registry, signers)
    if emit is not None:
        emit({"event": "evidence", "subject": subject, "outcomes": [o.as_dict() for o in outcomes]})
    else:
        print(f"evidence for {subject}:" if outcomes else f"no evidence is required for {subject}")
        for o in outcomes:
            print(o.line())
    return 0 if all(o.passed for o in outcomes) else 1


def requested_event(req: str, m: Manifest) -> dict[str, Any]:
    return {"event": "requested", "id": m.id, "requirement": req, "runner": m.runner, "params": m.params}


def say(emit: Any, event: dict[str, Any], line: str) -> None:
    if emit is not None:
        emit(event)
    else:
        print(line, flush=True)
