"""Model families at load (issue 32): a layer kind the engine does not handle is refused before the first
forward in one line naming the model type, the kind and what is supported, by `Geometry`, by a torch model,
by `engine.load` and by a workload's command line (exit 2, no traceback)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.backends.torch.session import TorchModel
from engine.geometry import (
    CROSS_ATTENTION,
    MAMBA,
    MAMBA2,
    PARALLEL_MAMBA,
    PARALLEL_MAMBA2,
    PROMPTED,
    Geometry,
    UnsupportedModelError,
    layer_kinds,
)
from tests.engine import model_matrix, tiny_families
from tests.engine.workload_support import run_workload


def test_an_unsupported_kind_is_refused_in_one_line_before_any_forward() -> None:
    """MiniMax: lightning attention (a linear-attention kernel that is not gated delta-net)."""
    config = model_matrix.tiny_config("minimax")
    with pytest.raises(UnsupportedModelError) as err:
        Geometry.from_config(config.to_dict())
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "model type 'minimax': layer kind 'linear_attention(not gated delta-net)' (a linear-attention kernel "
        "other than gated delta-net) is not supported"
    )
    assert (
        "supported: full_attention, sliding_attention, linear_attention (gated delta-net), mamba2" in message
    )
    model = model_matrix.build("minimax")
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(UnsupportedModelError, match="minimax"):
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
        # Zamba names its Mamba (v1) layers as Zamba2 its Mamba-2 ones: told apart by the dt rank
        (
            {
                "model_type": "zamba",
                "num_hidden_layers": 2,
                "mamba_d_state": 16,
                "mamba_dt_rank": 4,
                "layers_block_type": ["linear_attention", "hybrid"],
            },
            (MAMBA, PARALLEL_MAMBA),
        ),
        (
            {
                "model_type": "zamba2",
                "num_hidden_layers": 2,
                "mamba_d_state": 16,
                "layers_block_type": ["linear_attention", "hybrid"],
            },
            (MAMBA2, PARALLEL_MAMBA2),
        ),
        # kinds refused: Mllama's cross-attention layers, CPM-Ant's prompt positions
        (
            {"model_type": "mllama_text_model", "num_hidden_layers": 2, "cross_attention_layers": [1]},
            ("full_attention", CROSS_ATTENTION),
        ),
        ({"model_type": "cpmant", "num_hidden_layers": 2, "prompt_length": 32}, (PROMPTED, PROMPTED)),
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
    """The niah workload on a saved tiny MiniMax config: exit 2 with one usage line naming the model type
    and the layer kind, before any weights load (there are none to load); no traceback, no report."""
    model_matrix.tiny_config("minimax").save_pretrained(tmp_path / "m")
    out = run_workload("niah", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "r.json"), timeout=300)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r.json").exists()
    last = out.stderr.strip().splitlines()[-1]
    assert "model type 'minimax': layer kind 'linear_attention(not" in last and "supported:" in last


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
    from tests.engine import tiny_models

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


@pytest.mark.parametrize(
    ("model_type", "what"),
    [
        ("openai-gpt", "layer kind 'own_cache' .* its forward takes no cache"),
        ("xlnet", "layer kind 'own_cache' .* its forward takes 'mems', no past_key_values"),
        ("xlm", "layer kind 'own_cache' .* its forward's cache is a dict of its own"),
        ("mllama", "layer kind 'cross_attention' \\(cross-attention to image features\\)"),
        ("cpmant", "layer kind 'prompted_attention' \\(attention over learned prompt positions"),
        ("bloom", "layer kind 'alibi\\(padding mask\\)' .* builds them from the 2-D padding mask"),
    ],
)
def test_a_model_the_engine_cannot_feed_is_refused_at_load_in_one_line(model_type: str, what: str) -> None:
    """Legacy models with their own past (GPT-1 keeps none, XLNet its mems, XLM a dict), Mllama's
    cross-attention layers, CPM-Ant's prompt positions and BLOOM's ALiBi from a padding mask: refused when
    the model is wrapped, before any forward, in one line naming the model type, what it has and what is
    supported."""
    model = model_matrix.build(model_type)
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(UnsupportedModelError) as err:
        TorchModel(model)
    message = str(err.value)
    assert re.match(f"^model type '{model_type}[^']*': {what}.* \\(supported: full_attention", message)
    assert "\n" not in message and calls == []


@pytest.mark.parametrize("model_type", ["bart", "trocr", "roformer", "hrm_text"])
def test_models_that_number_positions_themselves_decode_exactly(model_type: str) -> None:
    """BART-style (learned positions), TrOCR and RoFormer number the new tokens from the cache's length
    (`get_seq_length`: the positions before this forward, as transformers' caches count them); TrOCR
    returns every position's logits whatever `logits_to_keep` says; HRM-Text asks the cache whether it is
    initialized. Chunked greedy equals `generate`, speculative equals greedy after the window wraps."""
    import engine
    from tests.engine import tiny_models

    tm = TorchModel(model_matrix.build(model_type))
    assert tm.own_positions == (model_type != "hrm_text")
    ids = tiny_models.prompt(12, seed=1)
    assert len(tm.session(engine.full(), prefill_chunk=8).prefill(ids).tokens) == 1
    ours = engine.generate(tm.session(engine.full(), prefill_chunk=5), ids, engine.Stop(12)).tokens
    assert ours == tiny_models.hf_greedy(tm, ids, 12)
    assert model_matrix._speculative(tm, ids) == "exact"
    if tm.own_positions:  # one count for every row: rows at different positions would be numbered alike
        with pytest.raises(
            ValueError, match=r"rows=2\) needs a model that takes position_ids.*one at a time"
        ):
            tm.session(engine.full(), rows=2)
