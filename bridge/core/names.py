"""The name rules, in one place: preset names, runner labels, requirements (PRESET[@LABEL] [PIN ...]) and
shas. A pin is PARAM OP VALUE with no spaces (`samples>=5`, `model==gemma-3-1b`; bridge/evidence/requirements.py types
it against the preset's parameter)."""

from __future__ import annotations

import re

from bridge.core.errors import InvalidRequest

NAME = r"[a-z][a-z0-9-]{0,62}"  # a preset name
LABEL = r"[a-z0-9][a-z0-9_-]{0,62}"  # a runner label
NAME_RE = re.compile(rf"^{NAME}\Z")
LABEL_RE = re.compile(rf"^{LABEL}\Z")
RUNNER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")  # a runner name (its presence ref)
PIN = r"[a-z][a-z0-9_]{0,62}(?:==|>=|<=|>|<)\S+"  # a requirement's parameter pin
PIN_RE = re.compile(r"^([a-z][a-z0-9_]{0,62})(==|>=|<=|>|<)(\S+)\Z")
REQUIREMENT_RE = re.compile(rf"^({NAME})(?:@({LABEL}))?((?:[ \t]+{PIN})*)\Z")
SHA_PATTERN = r"^([0-9a-f]{40}|[0-9a-f]{64})$"


def check_label(label: str) -> str:
    """`label`, when it is a valid runner label; InvalidRequest otherwise."""
    if not LABEL_RE.match(label):
        raise InvalidRequest(
            f"runner label {label!r} must be lowercase letters, digits, '-' or '_' (e.g. cpu, h200)"
        )
    return label
