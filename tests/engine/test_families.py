"""Model families at load (issue 32): a layer kind the engine does not handle is refused before the first
forward in one line naming the model type, the kind and what is supported, by `Geometry`, by a torch model,
by `engine.load` and by a workload's command line (exit 2, no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.backends.torch.session import TorchModel
from engine.geometry import MAMBA, MAMBA2, PARALLEL_MAMBA2, Geometry, UnsupportedModelError, layer_kinds
from tests.engine import tiny_families
from tests.engine.workload_support import run_workload


def test_jamba_is_refused_in_one_line_before_any_forward() -> None:
    config = tiny_families.jamba_config().to_dict()  # type: ignore[attr-defined]
    with pytest.raises(UnsupportedModelError) as err:
        Geometry.from_config(config)
    message = str(err.value)
    assert (
        "\n" not in message
        and "'jamba'" in message
        and "layer kind 'mamba' (Mamba state-space mixer)" in message
    )
    assert (
        "supported: full_attention, sliding_attention, linear_attention (gated delta-net), mamba2" in message
    )
    model = tiny_families.jamba_module()
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(UnsupportedModelError, match="jamba"):
        TorchModel(model)
    assert calls == []  # refused before the first forward


@pytest.mark.parametrize(
    ("config", "kinds"),
    [
        # Granite-4.0-H and Nemotron-H name their Mamba-2 layers linear_attention: told apart by mamba_* keys
        (
            {
                "model_type": "granitemoehybrid",
                "num_hidden_layers": 2,
                "mamba_d_state": 16,
                "layer_types": ["linear_attention", "attention"],
            },
            (MAMBA2, "full_attention"),
        ),
        (
            {
                "model_type": "nemotron_h",
                "num_hidden_layers": 3,
                "ssm_state_size": 16,
                "layers_block_type": ["linear_attention", "moe", "full_attention"],
            },
            (MAMBA2, "moe_block", "full_attention"),
        ),
        (
            {
                "model_type": "jamba",
                "num_hidden_layers": 4,
                "attn_layer_period": 2,
                "attn_layer_offset": 1,
                "mamba_d_state": 16,
            },
            (MAMBA, "full_attention", MAMBA, "full_attention"),
        ),
        ({"model_type": "falcon_h1", "num_hidden_layers": 1, "mamba_d_ssm": 64}, (PARALLEL_MAMBA2,)),
        # MiniMax's lightning attention is not gated delta-net
        (
            {
                "model_type": "minimax",
                "num_hidden_layers": 2,
                "layer_types": ["linear_attention", "full_attention"],
            },
            ("linear_attention(not gated delta-net)", "full_attention"),
        ),
        (
            {
                "model_type": "qwen3_5_text",
                "num_hidden_layers": 2,
                "linear_num_key_heads": 2,
                "linear_conv_kernel_dim": 4,
                "layer_types": ["linear_attention", "full_attention"],
            },
            ("linear_attention", "full_attention"),
        ),
    ],
)
def test_layer_kinds_tell_the_mixers_transformers_names_alike_apart(config: dict, kinds: tuple) -> None:
    assert layer_kinds(config) == kinds
    # refused in one line naming the model type: a kind the engine does not handle, or (a Mamba-2 or
    # gated delta-net config without its state sizes) the key it lacks, never an internal error
    with pytest.raises(UnsupportedModelError, match=f"^model type '{config['model_type']}': layer kind"):
        Geometry.from_config({**config, "num_attention_heads": 4, "hidden_size": 64, "vocab_size": 256})


def test_a_config_without_decoder_keys_is_refused_not_a_key_error() -> None:
    with pytest.raises(UnsupportedModelError, match="'rwkv'.*no 'num_attention_heads'"):
        Geometry.from_config({"model_type": "rwkv", "num_hidden_layers": 2, "hidden_size": 64})


def test_a_workload_exits_2_in_one_line_on_an_unsupported_family(tmp_path: Path) -> None:
    """The niah workload on a saved tiny Jamba config: exit 2 with one usage line naming the model type
    and the layer kind, before any weights load (there are none to load); no traceback, no report."""
    tiny_families.jamba_config().save_pretrained(tmp_path / "m")  # type: ignore[attr-defined]
    out = run_workload("niah", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "r.json"), timeout=300)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r.json").exists()
    last = out.stderr.strip().splitlines()[-1]
    assert "model type 'jamba': layer kind 'mamba'" in last and "supported:" in last


def test_mla_is_read_as_full_attention_with_its_own_k_and_v_sizes() -> None:
    """DeepSeek-V3 (multi-head latent attention) is accepted: test_mla.py decodes it."""
    geo = Geometry.from_config(tiny_families.deepseek_v3_config().to_dict())  # type: ignore[attr-defined]
    assert geo.layer_types == ("full_attention",) * 2 and (geo.kv_heads, geo.head_dim, geo.value_dim) == (
        1,
        16,
        8,
    )


def test_an_alibi_model_is_refused_a_bounded_policy_in_one_line_and_exact_under_full() -> None:
    """MPT biases each key by its index among the attended keys (ALiBi), so a ring buffer, which reorders
    them, would change its output: a bounded policy is refused; full equals `generate`."""
    import engine
    from tests.engine import model_matrix, tiny_models

    tm = TorchModel(model_matrix.build("mpt"))
    assert tm.geometry.alibi
    with pytest.raises(
        ValueError, match=r"^cache policy sink_window:2:8 bounds the K/V of a model with ALiBi"
    ):
        tm.session(engine.sink_window(2, 8))
    ids = tiny_models.prompt(12, seed=1)
    ours = engine.generate(tm.session(engine.full()), ids, engine.Stop(12)).tokens
    assert ours == tiny_models.hf_greedy(tm, ids, 12)
    assert not tiny_families.deepseek_v3().geometry.alibi
