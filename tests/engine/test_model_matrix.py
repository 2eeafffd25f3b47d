"""The support matrix (tests/engine/model_matrix.py) against its committed expectation
(tests/engine/model_matrix.json, written with docs/models.md by `python -m tests.engine.model_matrix --write`):
a family that drops (exact -> refused -> broken) fails here.

`make test` walks a fast subset (FAST: the families the engine is built for, the families of issue 32 and
one of each kind of refusal and fix, under a minute); KAKEYA_MODEL_MATRIX=all walks every causal-LM type
transformers ships (a few minutes on 2 cores)."""

from __future__ import annotations

import os

import pytest

from tests.engine import model_matrix as mm

FAST = [
    "llama", "qwen3", "mistral", "gemma2", "gemma3_text", "gpt_oss", "phi3", "olmo2", "gpt2",
    "qwen3_5_text", "qwen3_next", "lfm2",  # linear-attention / convolution hybrids
    "deepseek_v3", "deepseek_v2", "glm4_moe_lite", "minicpm3",  # multi-head latent attention
    "falcon_h1", "granitemoehybrid", "jamba", "nemotron_h", "bamba", "zamba2",  # Mamba hybrids
    "bart", "trocr", "roformer",  # positions numbered by the model from the cache's length
    "minimax", "llama4_text", "mpt", "bloom",  # refused kinds, ALiBi
    "xlnet", "xlm", "mllama", "cpmant",  # refused: own caches, cross-attention, prompt positions
    "bert",  # BERT as a decoder
]  # fmt: skip
EXPECTED = mm.Matrix.model_validate_json(mm.EXPECTED.read_text())
WALKED = sorted(EXPECTED.families) if os.environ.get("KAKEYA_MODEL_MATRIX") == "all" else FAST


@pytest.mark.parametrize("model_type", WALKED)
def test_no_family_drops_from_the_committed_matrix(model_type: str) -> None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        pytest.skip(
            f"transformers here has no {model_type} (the matrix was made with {EXPECTED.transformers})"
        )
    expected = EXPECTED.families[model_type]
    got = mm.check(model_type, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    assert not mm.drops(expected, got), f"{model_type}: {mm.drops(expected, got)}"


def test_the_fast_subset_is_in_the_matrix_and_covers_each_outcome() -> None:
    assert set(FAST) <= set(EXPECTED.families)
    outcomes = {mm.worst(EXPECTED.families[t]) for t in FAST if not EXPECTED.families[t].skipped}
    assert outcomes == {"exact", "refused"}


def test_no_family_is_broken() -> None:
    """Issue 32's promise: every family that can be built decodes exactly or is refused at load."""
    assert [t for t, f in EXPECTED.families.items() if not f.skipped and mm.worst(f) == "broken"] == []


def test_the_doc_is_generated_from_the_committed_matrix() -> None:
    assert mm.DOC.read_text() == mm.markdown(EXPECTED)
    c = EXPECTED.counts()
    assert f"**{c['exact']} exact, {c['refused']} refused, {c['broken']} broken**" in mm.DOC.read_text()


def test_a_drop_is_reported_and_an_improvement_is_not() -> None:
    exact = mm.Family(architecture="X", greedy="exact", hybrid="exact", speculative="exact")
    refused = mm.Family(
        architecture="X", greedy="refused: no", hybrid="refused: no", speculative="refused: no"
    )
    broken = exact.model_copy(update={"speculative": "broken: differs from generate at token 3"})
    assert mm.drops(exact, broken) == [
        "speculative: was 'exact', now 'broken: differs from generate at token 3'"
    ]
    assert mm.drops(exact, refused) and mm.drops(refused, broken) and not mm.drops(refused, exact)
    assert mm.drops(exact, mm.Family(architecture="X", skipped="cannot build small"))
    assert not mm.drops(mm.Family(architecture="X", skipped="why"), broken)


def test_a_refusal_is_a_value_error_the_engine_raised_not_one_from_the_model() -> None:
    import engine
    from tests.engine import tiny_models

    with pytest.raises(ValueError) as ours:
        tiny_models.qwen().session(engine.full(), rows=2).prefill([1, 2])  # the engine's own check
    assert mm.failed(ours.value).startswith("refused: this session decodes 2 rows")
    try:
        int("x")  # a ValueError raised outside engine/ (as a model forward would)
    except ValueError as exc:
        assert mm.failed(exc, "at load: ").startswith("broken: at load: ValueError: invalid literal")
