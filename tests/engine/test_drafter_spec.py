"""One drafter spec (engine/drafters/spec.py) and one loader (engine/drafters/load.py): specs print the form
they parse from; a malformed spec, or a model of another kind, is refused in one line that names what it
is; every kind loads through `load_drafter` and drafts exactly greedy output; what is not supported yet is
refused from the one `NOT_YET` table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import engine
from engine.drafters import KINDS, DrafterSpec, load_drafter, parse_drafter
from engine.drafters.spec import NOT_YET
from engine.policy import full, hybrid
from engine.zoo import corpus
from tests.engine import tiny_models

SPECS = [
    "lookup",
    "model:zoo:tiny-drafter",
    "block:zoo:tiny-block-drafter",
    "diffusion:zoo:tiny-dlm:steps=2",
    "gemma4-assistant:some/dir",
    "model:/abs/path:with:colons",
]


@pytest.mark.parametrize("text", SPECS)
def test_printed_form_round_trips(text: str) -> None:
    spec = DrafterSpec.parse(text)
    assert str(spec) == text and DrafterSpec.parse(str(spec)) == spec


def test_options_are_spelled_out_and_typed() -> None:
    spec = DrafterSpec.parse("diffusion:zoo:tiny-dlm")
    assert str(spec) == "diffusion:zoo:tiny-dlm:steps=4" and spec.option("steps") == 4
    assert (
        spec
        == DrafterSpec.parse("diffusion:zoo:tiny-dlm:steps=4")
        == DrafterSpec("diffusion", "zoo:tiny-dlm")
    )
    assert DrafterSpec.parse(" lookup ") == DrafterSpec("lookup")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "start with a kind"),
        ("dlm:zoo:tiny-dlm", "start with a kind"),
        ("diffusion", "diffusion needs a model: diffusion:REF"),
        ("model:", "model needs a model"),
        ("lookup:zoo:tiny-drafter", "lookup takes no model reference"),
        ("lookup:steps=2", "lookup takes no options"),
        ("model:zoo:tiny-drafter:steps=2", "model takes no options"),
        ("diffusion:zoo:tiny-dlm:steps=0", "steps: Input should be greater than or equal to 1"),
        ("diffusion:zoo:tiny-dlm:steps=x", "option steps takes a whole number"),
        ("diffusion:zoo:tiny-dlm:steps=2:steps=3", "option steps given twice"),
        ("diffusion:zoo:tiny-dlm:rm=1", "option rm: Extra inputs are not permitted"),
    ],
)
def test_malformed_specs_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        DrafterSpec.parse(text)
    assert "\n" not in str(err.value) and repr(text) in str(err.value)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("zoo:tiny-drafter", "model:zoo:tiny-drafter"),
        ("zoo:tiny-dlm", "diffusion:zoo:tiny-dlm:steps=4"),
        ("zoo:tiny-block-drafter", "block:zoo:tiny-block-drafter"),
        ("lookup", "lookup"),
    ],
)
def test_a_bare_reference_is_the_kind_its_config_says(text: str, kind: str) -> None:
    assert str(parse_drafter(text)) == kind


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "model:zoo:tiny-dlm",
            "zoo:tiny-dlm is a diffusion drafter .*'kakeya-dlm'.*use diffusion:zoo:tiny-dlm",
        ),
        ("block:zoo:tiny-dlm", "zoo:tiny-dlm is a diffusion drafter"),
        ("diffusion:zoo:tiny-block-drafter", "is a block drafter .*use block:zoo:tiny-block-drafter"),
        (
            "diffusion:zoo:tiny-hybrid",
            "is a model drafter \\(a causal LM; .*'gemma3_text'\\), not a diffusion",
        ),
        ("gemma4-assistant:zoo:tiny-drafter", "is a model drafter .* not a gemma4-assistant drafter"),
        ("zoo:nothing-here", "no zoo model 'zoo:nothing-here'"),
        ("model:../../etc", "not found"),
    ],
)
def test_a_model_of_another_kind_is_refused_naming_what_it_is(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        parse_drafter(text)
    assert "\n" not in str(err.value)


def test_the_workload_refuses_a_wrong_kind_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from engine.workloads import throughput

    with pytest.raises(SystemExit) as done:
        throughput.main(["--drafter", "model:zoo:tiny-dlm", "--out", "/nonexistent/x.json"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "is a diffusion drafter" in err and "use diffusion:zoo:tiny-dlm" in err and "Traceback" not in err


def test_the_preset_takes_one_drafter_parameter() -> None:
    from bridge.presets.registry import load_registry

    preset = load_registry()["throughput-code"]
    assert not {"draft", "proposer", "denoise_steps"} & set(preset.params)
    for text in ["diffusion:zoo:tiny-dlm:steps=2", "lookup", "gemma4-assistant:gemma-4-e2b-assistant"]:
        assert preset.validate_params({"drafter": text})["drafter"] == text
    # the bridge cannot open a model's config.json: a bare reference must name its kind (the engine's
    # parse_drafter still reads the kind from config.json for a bare reference given to the workload)
    with pytest.raises(Exception, match="must start with a drafter kind, one of lookup, model, block"):
        preset.validate_params({"drafter": "zoo:tiny-dlm"})
    for hostile in ["model:/etc", "/etc", "model:../x", "model:zoo:tiny-dlm;rm", "-rf"]:
        with pytest.raises(Exception, match="must start with a drafter kind|model needs a model"):
            preset.validate_params({"drafter": hostile})


def _assistant_dir(tmp: Path) -> Path:
    from engine.drafters.gemma4_assistant.torch import all_shared_kv

    out = tmp / "assistant"
    with all_shared_kv():
        tiny_models.gemma4_assistant().save_pretrained(str(out))
    return out


def test_every_kind_loads_and_drafts_exactly_greedy(tmp_path: Path) -> None:
    zoo = engine.load("zoo:tiny-hybrid")
    gemma4 = tiny_models.gemma4()
    cases = {
        "lookup": (zoo, "lookup"),
        "model": (zoo, "model:zoo:tiny-drafter"),
        "block": (zoo, "block:zoo:tiny-block-drafter"),
        "diffusion": (zoo, "diffusion:zoo:tiny-dlm:steps=2"),
        "gemma4-assistant": (gemma4, f"gemma4-assistant:{_assistant_dir(tmp_path)}"),
    }
    assert set(cases) == set(KINDS)
    for kind, (verifier, text) in cases.items():
        spec = parse_drafter(text)
        assert spec.kind == kind
        make = load_drafter(spec, verifier, k=4, policy=hybrid(2, 16))
        ids = (
            tiny_models.prompt(24, seed=2)
            if verifier is gemma4
            else zoo.encode(corpus.code_prompts(1, 3, 32)[0])
        )
        want = engine.generate(verifier.session(full()), ids, engine.Stop(20)).tokens
        for _ in range(2):  # a fresh drafter per generation, on the same weights
            session = verifier.session(full(), max_block=5)
            got = engine.speculative_generate(session, make(session), ids, 4, engine.Stop(20))
            assert got.tokens == want, kind


class _MLXVerifier:
    backend = "mlx"


@pytest.mark.parametrize("what", sorted({k for k, _ in NOT_YET} & set(KINDS)))
def test_what_is_not_supported_yet_is_refused_from_one_table(what: str) -> None:
    with pytest.raises(ValueError, match=re.escape(NOT_YET[(what, "mlx")])):
        load_drafter(DrafterSpec(what, "some/dir"), _MLXVerifier())  # type: ignore[arg-type]
