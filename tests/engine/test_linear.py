"""Linear-attention hybrids (Qwen3.5 `qwen3_5_text`: gated delta-net layers + full attention): greedy equals
transformers `generate` and mlx-lm, torch equals mlx in float32, speculative equals greedy with exact
rollback of the recurrent and convolution states, byte accounting, and a clear error for unknown kinds."""

from __future__ import annotations

import functools

import pytest

import engine
from engine.geometry import Geometry
from engine.policy import Policy, expected_kv_bytes, full, hybrid, sink_window
from tests.engine import tiny_models
from tests.engine.backends import BACKENDS, HAVE_MLX, on

NEW = 60
MLX_MARKS = BACKENDS[1].marks


@functools.cache
def _greedy(backend: str, policy: Policy, prompt_len: int) -> tuple[int, ...]:
    tm = on(backend, tiny_models.qwen35())
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(tm.session(policy, prefill_chunk=16), ids, engine.Stop(NEW)).tokens)


@pytest.mark.parametrize("policy", [full(), sink_window(4, 200), hybrid(2, 8)], ids=str)
@pytest.mark.parametrize("prompt_len", [1, 3, 40])
def test_covering_window_equals_transformers_generate(policy: Policy, prompt_len: int) -> None:
    tm = tiny_models.qwen35()
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    ours = engine.generate(tm.session(policy, prefill_chunk=16), ids, engine.Stop(NEW)).tokens
    assert ours == tiny_models.hf_greedy(tm, ids, NEW)


@pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")
def test_mlx_equals_mlx_lm_and_torch_in_float32() -> None:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    twin = on("mlx", tiny_models.qwen35())
    ids = tiny_models.prompt(40, seed=40)
    theirs = [
        int(t)
        for (t, _), _ in zip(
            generate_step(mx.array(ids), twin.model, max_tokens=NEW), range(NEW), strict=False
        )
    ]
    assert list(_greedy("mlx", full(), 40)) == theirs == list(_greedy("torch", full(), 40))
    # and step logits agree across backends (float32)
    rows = [
        on(b, tiny_models.qwen35()).session(full(), max_block=5).prefill(ids, logits=True).logits
        for b in ("torch", "mlx")
    ]
    import numpy as np

    assert np.abs(rows[0].numpy() - np.array(rows[1])).max() < 1e-3


def _drafter(backend: str, kind: str, k: int) -> engine.Drafter:
    if (
        kind == "narrow"
    ):  # the same hybrid as its own drafter, narrower attention: single-token forwards, trims
        return engine.ModelDrafter(
            on(backend, tiny_models.qwen35()).session(sink_window(1, 3), max_block=k + 1)
        )
    return engine.ModelDrafter(
        on(backend, tiny_models.qwen(seed=7, layers=1)).session(full(), max_block=k + 1)
    )


CASES = [
    pytest.param(p, "narrow", k, "torch", id=f"torch-{p}-{k}")
    for p in (full(), sink_window(4, 8), hybrid(2, 6))
    for k in (1, 4, 8)
] + [
    pytest.param(sink_window(0, 5), "random", 4, "torch", id="torch-random"),
    pytest.param(sink_window(4, 8), "narrow", 8, "mlx", marks=MLX_MARKS, id="mlx-sink_window-8"),
    pytest.param(full(), "narrow", 4, "mlx", marks=MLX_MARKS, id="mlx-full-4"),
    pytest.param(sink_window(0, 5), "random", 1, "mlx", marks=MLX_MARKS, id="mlx-random-1"),
]


@pytest.mark.parametrize(("policy", "drafter", "k", "backend"), CASES)
def test_speculative_equals_greedy_after_partial_rejections(
    policy: Policy, drafter: str, k: int, backend: str
) -> None:
    prompt_len = [3, 40, 17][k % 3]
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    verifier = on(backend, tiny_models.qwen35()).session(policy, max_block=k + 1, prefill_chunk=16)
    gen = engine.speculative_generate(verifier, _drafter(backend, drafter, k), ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(backend, policy, prompt_len)
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # blocks were partly rejected: rollback was exercised
    assert verifier.position == prompt_len + NEW - 1


def test_rollback_restores_the_state_after_the_last_kept_token(backend: str) -> None:
    """Feed a block, trim part of it, and continue: the logits equal a session that never saw the rest."""
    import numpy as np

    tm = on(backend, tiny_models.qwen35())
    ids = tiny_models.prompt(30, seed=5)
    a = tm.session(sink_window(2, 6), max_block=6, prefill_chunk=16)
    b = tm.session(sink_window(2, 6), max_block=6, prefill_chunk=16)
    a.prefill(ids[:20])
    b.prefill(ids[:20])
    a.forward(ids[20:26])
    a.trim(4)  # keeps ids[20:22]
    for t in ids[20:22]:  # one token at a time, then a trim that crosses forwards
        b.forward([t])
    b.forward(ids[22:24])
    b.forward(ids[24:25])
    b.trim(3)
    assert a.position == b.position == 22
    la = np.array(a.forward(ids[22:26], logits=True).logits.tolist())
    lb = np.array(b.forward(ids[22:26], logits=True).logits.tolist())
    assert np.abs(la - lb).max() < 1e-4
    with pytest.raises(ValueError, match="max_block"):
        a.trim(7)


def test_bytes_attention_kv_and_recurrent_state_separately(backend: str) -> None:
    tm = on(backend, tiny_models.qwen35())
    geo = tm.geometry
    assert geo.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    s = tm.session(sink_window(2, 6), max_block=3)
    engine.generate(s, tiny_models.prompt(20, seed=1), engine.Stop(10))
    slot = geo.slot_bytes("float32")
    assert slot[:3] == [0, 0, 0] and slot[3] == 2 * 2 * 16 * 4
    assert s.kv_bytes() == expected_kv_bytes(s.specs, s.position, s.max_block, slot)
    assert s.kv_bytes()[:3] == [0, 0, 0] and s.kv_bytes()[3] == (2 + 6 - 1 + 3) * slot[3]
    # recurrent: 4 heads x 16 x 16 float32; convolution: kernel-1 = 3 inputs of 2*2*16 + 4*16 channels
    assert s.state_bytes() == geo.state_bytes("float32") == [4 * 16 * 16 * 4 + 3 * 128 * 4] * 3 + [0]


def test_unknown_layer_kind_fails_naming_it_and_the_supported_kinds() -> None:
    config = {
        "num_hidden_layers": 2,
        "layer_types": ["rwkv", "full_attention"],
        "num_attention_heads": 4,
        "hidden_size": 64,
        "vocab_size": 256,
    }
    with pytest.raises(ValueError, match="'rwkv'.*full_attention, sliding_attention, linear_attention"):
        Geometry.from_config(config)


def test_compression_counts_the_linear_state_once_per_sequence_for_a_qwen35_config() -> None:
    from engine.workloads.compression import REFERENCE_CONFIGS, per_sequence

    geo = Geometry.from_config(REFERENCE_CONFIGS["qwen3.5-text-defaults"])
    # 8 full-attention layers of 4 K/V heads x 256 in bf16; 24 linear layers: a 32 x 128 x 128 float32
    # recurrent state + 3 convolution inputs of 2 x 16 x 128 + 32 x 128 bf16 channels
    kv, state = 8 * 2 * 4 * 256 * 2, 24 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)
    assert sum(geo.slot_bytes("bfloat16")) == kv and sum(geo.state_bytes("bfloat16")) == state
    assert per_sequence(geo, full(), 1000, 1, "bfloat16") == 1000 * kv + state
    assert per_sequence(geo, sink_window(4, 64), 1000, 9, "bfloat16") == (4 + 63 + 9) * kv + state


def test_qwen3_next_greedy_mlx_and_speculative_are_exact(backend: str) -> None:
    """Qwen3-Next (gated delta-net + full attention, MoE MLPs): greedy equals `generate` (torch) and torch
    (mlx, float32); speculative decoding with partly rejected blocks equals greedy."""
    ref = tiny_models.qwen3_next()
    tm = on(backend, ref)
    assert tm.geometry.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    ids = tiny_models.prompt(30, seed=3)
    greedy = engine.generate(tm.session(sink_window(2, 6), prefill_chunk=16), ids, engine.Stop(40)).tokens
    covering = engine.generate(tm.session(full()), ids, engine.Stop(40)).tokens
    assert covering == tiny_models.hf_greedy(ref, ids, 40)
    drafter = engine.ModelDrafter(
        tm.session(sink_window(1, 3), max_block=5)
    )  # itself, narrower: agrees partly
    verifier = tm.session(sink_window(2, 6), max_block=5, prefill_chunk=16)
    gen = engine.speculative_generate(verifier, drafter, ids, 4, engine.Stop(40))
    assert gen.tokens == greedy and 0 < gen.accepted < gen.drafted


def test_mlx_hidden_states_equal_torch_in_float32() -> None:
    """Step.hidden on a Qwen3.5 (the layers' inputs, 0: embeddings, and the final norm's output): the mlx
    recorder and transformers' output_hidden_states agree, in prefill and in a later block forward."""
    if not HAVE_MLX:
        pytest.skip("mlx / mlx-lm not installed")
    import numpy as np

    ids = tiny_models.prompt(24, seed=9)
    layers = (0, 1, 3, 4)
    steps = {}
    for b in ("torch", "mlx"):
        s = on(b, tiny_models.qwen35()).session(sink_window(2, 6), max_block=4, prefill_chunk=8)
        steps[b] = (s.prefill(ids[:20], hidden=layers), s.forward(ids[20:24], hidden=layers))
    for t, m in zip(steps["torch"], steps["mlx"], strict=True):
        assert sorted(t.hidden) == sorted(m.hidden) == list(layers)
        for i in layers:
            a, b = np.array(t.hidden[i].tolist()), np.array(m.hidden[i].tolist())
            assert a.shape == b.shape and np.abs(a - b).max() < 1e-4 * max(1.0, np.abs(a).max()), (
                i
            )  # float32 ulps
    assert not np.allclose(steps["mlx"][1].hidden[1], steps["mlx"][1].hidden[3], atol=1e-2)  # distinct layers
    assert steps["torch"][1].hidden[0].shape[-2:] == (4, 64)  # one row per fed token
