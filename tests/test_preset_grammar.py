"""The bridge's own grammars of cache policies and drafter specs (`type: policy`, `type: drafter` in
bridge/presets/grammar.py, docs/presets.md) never widen the engine's: every value a shipped preset's policy or
drafter parameter accepts is accepted by the engine's parsers (engine.workloads.cli.policies, which reads a
policy list with engine.policy.parse_policy, and engine.drafters.DrafterSpec.parse); bad values are refused
by both; the parameter's JSON Schema pattern matches what the bridge accepts. The bridge may not import the
engine; this test may import both."""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

import pytest

from bridge.presets.grammar import DrafterParam, PolicyParam, _upto
from bridge.presets.registry import load_registry
from engine.drafters.spec import DrafterSpec
from engine.workloads.cli import policies as engine_policies
from engine.workloads.compression import NO_DRAFTER

REGISTRY = load_registry()
TYPED = [
    pytest.param(spec, id=f"{name}-{pname}")
    for name, preset in sorted(REGISTRY.items())
    for pname, spec in preset.params.items()
    if isinstance(spec, PolicyParam | DrafterParam)
]


def accepts(spec: Any, value: str) -> bool:
    try:
        spec.parse(value)
    except ValueError:
        return False
    return True


def engine_accepts(spec: Any, value: str) -> bool:
    """`none` is no drafter: the one workload whose preset allows it (compression) reads it before a spec."""
    if isinstance(spec, DrafterParam) and spec.none and value == NO_DRAFTER:
        return True
    try:
        engine_policies(value) if isinstance(spec, PolicyParam) else DrafterSpec.parse(value)
    except ValueError:
        return False
    return True


def policy_values(spec: PolicyParam) -> list[str]:
    """Every kind at its bounds and in between, with and without each precision, in lists up to max_items."""
    ones = []
    for kind in spec.kinds:
        bases = (
            ["full"]
            if kind == "full"
            else [
                f"{kind}:{s}:{w}"
                for s in (0, 1, spec.max_sink // 3, spec.max_sink)
                for w in (1, 64, spec.max_window)
            ]
        )
        ones += [b + p for b in bases for p in ["", *(f":{q}" for q in spec.precisions)]]
    by_kind = {k: [o for o in ones if o.split(":")[0] == k] for k in spec.kinds}
    lists = [
        ",".join(picks)
        for n in range(2, spec.max_items + 1)
        for kinds in itertools.permutations(spec.kinds, n)
        for picks in itertools.product(*([by_kind[k][0], by_kind[k][-1]] for k in kinds))
    ]
    return ones + lists


def drafter_values(spec: DrafterParam) -> list[str]:
    refs = ["zoo:tiny-drafter", "zoo:x", "gemma-3-1b", "org/model.v2", "a" * 128]
    out = ["none"] if spec.none else []
    for kind in spec.kinds:
        if kind == "lookup":
            out.append("lookup")
            continue
        for ref in refs:
            out.append(f"{kind}:{ref}")
            for name, (low, top) in spec.options.get(kind, {}).items():
                out += [f"{kind}:{ref}:{name}={v}" for v in (low or 1, top)]
    return out


def mutants(values: list[str], n: int, seed: int) -> list[str]:
    """Values near the good ones: characters dropped, doubled, swapped for others of the grammars."""
    rng = random.Random(seed)
    alphabet = "0123456789:,=-_./abfghiklmnopqrstuvwyz"
    out = []
    for _ in range(n):
        v = list(rng.choice(values))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(v) + 1)
            op = rng.randrange(3)
            if op == 0 and i < len(v):
                del v[i]
            elif op == 1:
                v.insert(i, rng.choice(alphabet))
            elif i < len(v):
                v[i] = rng.choice(alphabet)
        out.append("".join(v))
    return out


@pytest.mark.parametrize("spec", TYPED)
def test_what_the_bridge_accepts_the_engine_accepts(spec: Any) -> None:
    good = policy_values(spec) if isinstance(spec, PolicyParam) else drafter_values(spec)
    assert all(accepts(spec, v) for v in good), [v for v in good if not accepts(spec, v)]
    assert spec.default is not None and accepts(spec, spec.default)
    accepted = [v for v in good + mutants(good, 3000, seed=30) if accepts(spec, v)]
    assert len(accepted) > len(good)  # the mutants reached some values the bridge also takes
    widened = [v for v in accepted if not engine_accepts(spec, v)]
    assert widened == [], f"the bridge accepts what the engine refuses: {widened[:10]}"


@pytest.mark.parametrize("spec", TYPED)
def test_the_json_schema_pattern_matches_what_the_bridge_accepts(spec: Any) -> None:
    schema = spec.json_schema()
    pattern = re.compile(schema["pattern"])
    good = policy_values(spec) if isinstance(spec, PolicyParam) else drafter_values(spec)
    for value in good + mutants(good, 3000, seed=31):
        matched = pattern.fullmatch(value) is not None
        # one policy per kind is the one rule a pattern does not say (the description does)
        kinds = [p.split(":")[0] for p in value.split(",")]
        if isinstance(spec, PolicyParam) and len(set(kinds)) != len(kinds):
            assert not accepts(spec, value), value
            continue
        assert matched == accepts(spec, value), (value, matched)


POLICY = PolicyParam(type="policy", kinds=["full", "sink_window", "hybrid"], max_sink=99999, max_window=999999,
                     precisions=["q8", "q4", "k8v4"], max_items=3)  # fmt: skip
DRAFTER = DrafterParam(
    type="drafter", kinds=["lookup", "model", "block", "diffusion", "gemma4-assistant"],
    options={"diffusion": {"steps": (1, 64)}},
)  # fmt: skip


BAD_POLICIES = ["", "lru:4:64", "hybrid:4", "hybrid:4:0", "hybrid:-1:64", "full:4:64", "hybrid:4:64:q3",
                "hybrid:4:64,hybrid:8:64", "hybrid:x:64", "sink_window:4:64:q8:g32:x", "hybrid::64"]  # fmt: skip
BAD_DRAFTERS = ["", "none", "zoo:tiny-dlm", "lookup:zoo:x", "model", "diffusion", "diffusion:zoo:x:steps=0",
                "telepathy:zoo:x", "model:zoo:x:steps=4", "diffusion:zoo:x:steps=2:steps=3",
                "diffusion:zoo:x:steps=four", "Lookup"]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "bad"), [(POLICY, b) for b in BAD_POLICIES] + [(DRAFTER, b) for b in BAD_DRAFTERS]
)
def test_a_bad_value_is_refused_by_both(spec: Any, bad: str) -> None:
    assert not accepts(spec, bad)
    assert not engine_accepts(spec, bad)


@pytest.mark.parametrize(
    "bad", ["model:../weights", "model:/etc/x", "block:a/../../b", "diffusion:zoo:x:steps=65", "model:zoo:X"]
)
def test_the_bridge_refuses_what_the_preset_does_not_allow(bad: str) -> None:
    """A model reference that leaves the models directory, or an option beyond the preset's range."""
    assert not accepts(DRAFTER, bad)


@pytest.mark.parametrize("sloppy", ["hybrid:4:64:", ",hybrid:4:64", "hybrid:04:64", " full", "full:q8:g32"])
def test_the_bridge_refuses_sloppy_spellings_the_engine_would_take(sloppy: str) -> None:
    """The bridge's grammar is the canonical form only (what a report prints back): no empty precision or
    item, no leading zeros or blanks, no group size (no preset allows one)."""
    assert not accepts(POLICY, sloppy)


def test_a_preset_narrows_the_kinds_and_bounds() -> None:
    sw = REGISTRY["niah-sink-window"].params["policy"]
    assert accepts(sw, "sink_window:9999:64") and not accepts(sw, "sink_window:10000:64")
    assert not accepts(sw, "hybrid:4:64") and not accepts(sw, "sink_window:4:64:q8")  # kind, precision


@pytest.mark.parametrize("top", [0, 1, 7, 9, 10, 64, 99, 100, 4096, 99999])
@pytest.mark.parametrize("low", [0, 1])
def test_upto_matches_exactly_the_numbers_in_range(top: int, low: int) -> None:
    pattern = re.compile(_upto(top, low))
    for n in range(0, min(top * 2 + 12, 20000)):
        assert (pattern.fullmatch(str(n)) is not None) == (low <= n <= top), n
    assert not pattern.fullmatch("0" + str(top))  # no leading zeros
