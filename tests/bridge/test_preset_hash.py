"""`Preset.content_hash` by one rule (fields at their defaults left out), and the hash of every preset as
shipped before the rule unchanged: signed evidence names the hash its run was made with, and a changed hash
would turn all of it into "preset mismatch" (bridge/evidence/judge.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bridge.presets.preset import SIGNED_AS, Preset
from bridge.presets.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]
# Each shipped preset's hash before the rule, computed by main at efc5b3d (the three exceptions, the policy
# and drafter parameters still regex strings): `{n: p.content_hash for n, p in load_registry().items()}`.
BEFORE = {
    "compression-table": "sha256:2f6ca24074be1bc2b6723fe5bcb4c7a27f09aaff33f1301f8f820218cc1f9aeb",
    "niah-ladder": "sha256:284b28b8c4f27ee12badf7156fd128b7fd1b81a4c80fd2c87e9b6c66b4fe9068",
    "niah-sink-window": "sha256:21e1ffcfd177b91f8a2ea96d072f523038015f6d1ff0ed91ab6cb9238120e9bb",
    "niah-smoke": "sha256:2bb708bc7fbf52925671a1a80cb5d97a9b2977a0eab91e72a99a6d894fa2c663",
    "parity": "sha256:d2ccdeae8685841480b1cf28a33f877ff16399d0561476e5d09b92cd2510cb2a",
    "probe": "sha256:46bfce41857ccf4d5d181bab2893c7d71b2d6ebfe32a586e828c7cfcc7bb2094",
    "restoration-study": "sha256:70ad00fd2fc03f621149c9b9e352a7217a83309c856c43d2bdaa6c69ad2eb72b",
    "throughput-code": "sha256:3e5ea04260f9e3ee3f0583ff968e0e982e8f5e52323c4e8485f314f8cfe4fd45",
}
# Definitions changed since, hashed by the rule (their old runs' evidence names the old definition, which
# no runner runs any more): compression-table's two drafter parameters became one `type: drafter` (issue 30).
CHANGED = {
    "compression-table": "sha256:5d7effbac6d1f626b6b12663af0a6bd5094f7321dd1ec5f064f563bc91fae835",
}

# Presets added since, hashed by the rule: serve-bench (issue 43).
ADDED = {
    "serve-bench": "sha256:5b0b5f6079fa9ae936771a8fe29b6e384fcf6aed1ad1295562144998f70d3c2e",
}


def shipped(name: str) -> dict:
    return yaml.safe_load((ROOT / "presets" / f"{name}.yaml").read_text())


def test_every_shipped_preset_hashes_as_before() -> None:
    assert {n: p.content_hash for n, p in load_registry(ROOT / "presets").items()} == BEFORE | CHANGED | ADDED
    # an alias for each unchanged definition as shipped, none for anything else
    assert sorted(SIGNED_AS.values()) == sorted(h for n, h in BEFORE.items() if n not in CHANGED)


@pytest.mark.parametrize(
    "field",
    [
        {"network": "none"},
        {"limits": {}},
        {"gate_on": {}},
        {"secrets": []},
        {"env": {}},
        {"resources": None},
    ],
)
def test_a_field_at_its_default_changes_no_hash(field: dict) -> None:
    """Spelled out or left out, a default is hashed the same: the rule, not a list of exceptions."""
    data = {k: v for k, v in shipped("probe").items() if k not in field}
    left_out = Preset.model_validate(data).content_hash
    assert Preset.model_validate({**data, **field}).content_hash == left_out


def test_a_param_field_at_its_default_changes_no_hash() -> None:
    data = shipped("niah-sink-window")
    data["params"]["policy"] |= {"precisions": [], "max_items": 1, "required": False, "description": ""}
    assert Preset.model_validate(data).content_hash == BEFORE["niah-sink-window"]


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("probe", {"timeout_s": 61}),
        ("probe", {"network": "host"}),
        ("probe", {"limits": {"processes": 64}}),
        ("probe", {"resources": {"gpus": 1}}),
        ("niah-sink-window", {"policy": {"max_sink": 9998}}),
        ("niah-smoke", {"policy": {"precisions": ["q8"]}}),
        ("throughput-code", {"drafter": {"kinds": ["lookup"], "default": "lookup"}}),
    ],
)
def test_any_change_changes_the_hash(name: str, change: dict) -> None:
    """A shipped definition edited in any way (a bound of its policy included) no longer hashes as the one its
    signed runs ran: the aliases cover the definitions exactly as shipped."""
    data = shipped(name)
    for key, value in change.items():
        if key in data.get("params", {}):
            data["params"][key] = {**data["params"][key], **value}
        else:
            data[key] = value
    new = Preset.model_validate(data).content_hash
    assert new != BEFORE[name] and new not in SIGNED_AS.values()
