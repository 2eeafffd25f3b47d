"""The geometry sweep's fixed budget (issue 44; tests/engine/geometry_sweep.py): for every family, draws of
its geometry fields that transformers can build and generate with decode exactly (greedy == generate,
speculative == greedy after the window wraps) or are refused at load in one line naming a field. The
larger budget is `python -m benchmarks.geometry_sweep`."""

from __future__ import annotations

import pytest

from tests.engine import geometry_sweep
from tests.engine.backends import HAVE_MLX

needs_mlx = pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")

BUDGET = 2  # draws per family here, seed 0: about 1 s a family on one core


@pytest.mark.parametrize("family", list(geometry_sweep.FAMILIES))
def test_every_drawn_geometry_decodes_exactly_or_is_refused_in_one_line(family: str) -> None:
    outcomes = [geometry_sweep.check(family, 0, i) for i in range(BUDGET)]
    broken = [f"{o.id} [{o.run}] {o.fields_text()}: {o.detail}" for o in outcomes if o.status == "broken"]
    assert not broken, "\n".join(broken)
    for o in outcomes:
        if o.status == "refused":
            assert "\n" not in o.detail and any(f in o.detail for f in o.fields)


def test_a_draw_is_a_function_of_family_seed_and_index() -> None:
    assert geometry_sweep.draw("deepseek_v3", 0, 3) == geometry_sweep.draw("deepseek_v3", 0, 3)
    assert geometry_sweep.draw("deepseek_v3", 0, 3) != geometry_sweep.draw("deepseek_v3", 1, 3)


def test_the_sweep_draws_v_head_dim_below_equal_to_and_above_qk_head_dim() -> None:
    """MLA's v_head_dim on every side of qk_nope + qk_rope, with and without K/V head groups."""
    draws = [geometry_sweep.draw("deepseek_v3", 0, i) for i in range(40)]
    sides = {
        (d["v_head_dim"] > (qk := d["qk_nope_head_dim"] + d["qk_rope_head_dim"])) - (d["v_head_dim"] < qk)
        for d in draws
    }
    assert sides == {-1, 0, 1}
    assert {d["num_key_value_heads"] < d["num_attention_heads"] for d in draws} == {False, True}


def test_an_engine_refusal_counts_only_in_one_line_naming_a_field() -> None:
    def raised(exc: BaseException) -> BaseException:
        try:
            from engine.geometry import Geometry

            Geometry.from_config(
                {
                    "model_type": "x",
                    "num_hidden_layers": 2,
                    "layer_types": ["sliding_attention"] * 2,
                    "num_attention_heads": 2,
                    "hidden_size": 8,
                    "vocab_size": 8,
                }
            )
        except ValueError as e:
            return e
        return exc

    exc = raised(RuntimeError())
    assert geometry_sweep.refusal(exc, {"sliding_window": 4}) is not None
    assert geometry_sweep.refusal(exc, {"head_dim": 4}) is None  # names no drawn field
    assert geometry_sweep.refusal(RuntimeError("sliding_window"), {"sliding_window": 4}) is None  # not ours


# Draws (seed 0) the sweep found broken on the mlx backend, each now refused at load in one line naming the
# field: mlx-lm builds these models from fewer config fields than transformers (before: a crash at load or
# at the first forward, or, for Qwen3.5 with no linear layer, other tokens than generate).
MLX_FOUND = [
    ("qwen3", 0, "layer_types="),  # mlx-lm's qwen3 builds one mask for sliding and full layers
    ("gemma2", 4, "layer_types="),  # mlx-lm's gemma2 alternates its layers by index
    ("deepseek_v3", 0, "tie_word_embeddings=True"),  # mlx-lm's deepseek_v3 has no tied head
    ("gemma2", 0, "tie_word_embeddings=False"),  # mlx-lm's gemma2 has no untied head
    ("mixtral", 1, "head_dim=16"),  # mlx-lm's mixtral derives head_dim from hidden / heads
    ("qwen3_5_text", 3, "layer_types="),  # no linear layer: decoded other tokens than generate
    ("gpt_oss", 1, "layer kind 'weights'"),  # mlx-lm's gpt_oss reads another expert layout
    ("glm", 0, "partial_rotary_factor=0.25"),  # mlx-lm's glm rotates the whole head: other tokens before
]


@needs_mlx
@pytest.mark.parametrize(("family", "index", "field"), MLX_FOUND, ids=[f"{f}/{i}" for f, i, _ in MLX_FOUND])
def test_what_the_sweep_found_on_mlx_is_refused_at_load_in_one_line(
    family: str, index: int, field: str
) -> None:
    outcome = geometry_sweep.check(family, 0, index, mlx=True)
    assert outcome.status == "exact"  # on torch
    mlx = outcome.extra["mlx"]
    assert mlx.startswith(f"refused: model type {family!r}: ") and field in mlx and "\n" not in mlx


@needs_mlx
def test_rope_parameters_per_layer_type_reach_mlx_lm() -> None:
    """OLMo 3 writes one rope dict per layer type; mlx-lm reads a flat rope_theta (before: a TypeError at
    load). Now the full layers' rope goes to mlx-lm and the draw decodes exactly on MLX."""
    outcome = geometry_sweep.check("olmo3", 0, 0, mlx=True)
    assert outcome.status == "exact" and outcome.extra["mlx"] == "exact"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads=3"),
        ({"num_attention_heads": 0}, "num_attention_heads=0"),
        ({"layer_types": ["sliding_attention"] * 2, "sliding_window": -4}, "sliding_window=-4"),
    ],
)
def test_the_geometry_reader_checks_what_it_assumes(fields: dict, named: str) -> None:
    """Head counts and windows `Geometry` builds on are checked at load, refused in one line naming the field;
    MLA's latent goes to every head, so its num_key_value_heads is not held to dividing the heads."""
    from engine.geometry import Geometry, UnsupportedConfigError

    base = {
        "model_type": "x",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "vocab_size": 8,
    }
    with pytest.raises(UnsupportedConfigError, match=f"^model type 'x': {named} is not supported: "):
        Geometry.from_config({**base, **fields})
    mla = {**base, "num_key_value_heads": 3, "kv_lora_rank": 16, "qk_rope_head_dim": 8}
    assert Geometry.from_config(mla).kv_heads == 1
