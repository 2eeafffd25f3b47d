"""MLX backend specifics: the config keys mlx-lm needs, agreement with mlx-lm's own caches, dtypes,
layer-type mismatches caught, and backends importable without each other. The engine invariants run
on MLX through the `backend` fixture (tests/engine/conftest.py) in test_decode/test_speculative/test_cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")
torch = pytest.importorskip("torch")

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

import engine  # noqa: E402
from engine.backends.mlx.compat import mlx_config  # noqa: E402
from engine.backends.mlx.session import MLXModel, load_mlx  # noqa: E402
from engine.policy import expected_kv_bytes, full, hybrid, sink_window  # noqa: E402
from tests.engine import tiny_models  # noqa: E402
from tests.engine.backends import mlx_twin  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _mlx_lm_greedy(model, ids: list[int], n: int) -> list[int]:
    """mlx-lm's own generate loop and caches (Gemma: RotatingKVCache on sliding layers)."""
    steps = generate_step(mx.array(ids), model, max_tokens=n, prompt_cache=make_prompt_cache(model))
    return [int(t) for t, _ in steps]


@pytest.mark.parametrize(("model", "prompt_len"), [("gemma", 5), ("gemma", 70), ("qwen", 33)])
def test_greedy_equals_transformers_and_mlx_lm_own_caches(model: str, prompt_len: int) -> None:
    """Three implementations agree: transformers `generate`, mlx-lm's `generate_step` with its own
    caches (RotatingKVCache on Gemma's sliding layers), and our MLX policy cache."""
    tm = getattr(tiny_models, model)()
    mm = mlx_twin(tm)
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    ref = tiny_models.hf_greedy(tm, ids, 60)
    assert len(set(ref)) > 10
    assert _mlx_lm_greedy(mm.model, ids, 60) == ref
    for policy in (full(), hybrid(4, 4096)):
        assert engine.generate(mm.session(policy, prefill_chunk=16), ids, engine.Stop(60)).tokens == ref


def test_a_config_without_layer_types_slides_like_transformers() -> None:
    """Mistral: no `layer_types`, a `sliding_window`; mlx-lm's llama code builds no window, our masks do."""
    tm = tiny_models.mistral()
    mm = mlx_twin(tm)
    assert mm.layer_types == ["sliding_attention"] * 2 and mm.sliding_window == 12
    ids = tiny_models.prompt(30, seed=3)
    ref = tiny_models.hf_greedy(tm, ids, 40)
    assert len(ids) + 40 > 3 * 12 and len(set(ref)) > 10
    assert engine.generate(mm.session(full(), prefill_chunk=8), ids, engine.Stop(40)).tokens == ref


def _save_gemma(tmp_path: Path, **overrides) -> Path:
    tm = tiny_models.gemma()
    tm.model.save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(overrides)
    cfg_path.write_text(json.dumps(cfg))
    return tmp_path


def test_config_supplies_what_mlx_lm_gemma3_needs(tmp_path: Path) -> None:
    path = _save_gemma(tmp_path)
    saved = json.loads((path / "config.json").read_text())
    assert (
        "sliding_window_pattern" not in saved
    )  # transformers writes only a private `_sliding_window_pattern`
    extra = mlx_config(path)
    assert extra == {"sliding_window_pattern": 2, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
    mm = load_mlx(path)
    assert [layer.self_attn.is_sliding for layer in mm.model.layers] == [True, False, True, False]
    assert mm.layer_types == tiny_models.gemma().layer_types and mm.sliding_window == 16
    assert mm.tokenizer is None
    with pytest.raises(ValueError, match="without a tokenizer"):
        mm.encode("x")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sliding_window_pattern": 3}, "contradicts layer_types"),
        (
            {"layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]},
            "repeat",
        ),
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ],
)
def test_configs_mlx_lm_would_misread_are_refused(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_mlx(_save_gemma(tmp_path, **overrides))


def test_a_model_whose_mlx_code_ignores_the_sliding_window_fails_loudly() -> None:
    """Qwen3's mlx-lm code builds one causal mask; a config claiming sliding layers must not pass silently."""
    twin = mlx_twin(tiny_models.qwen())
    config = {**twin.config, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}
    lying = MLXModel(twin.model, config)
    with pytest.raises(ValueError, match="groups its layers differently"):
        lying.session(full()).prefill([5, 6, 7])
    gemma = mlx_twin(tiny_models.gemma())
    wrong_window = MLXModel(gemma.model, {**gemma.config, "sliding_window": 12})
    with pytest.raises(ValueError, match="window_size=16"):
        wrong_window.session(full()).prefill([5, 6, 7])


@pytest.mark.parametrize(("dtype", "itemsize"), [("bfloat16", 2), ("float16", 2), ("float32", 4)])
def test_dtypes_load_decode_and_count_their_bytes(dtype: str, itemsize: int) -> None:
    twin = mlx_twin(tiny_models.gemma())
    mm = load_mlx(twin.path, dtype)
    assert mm.dtype == getattr(mx, dtype)
    ids = tiny_models.prompt(50, seed=5)
    seq = mm.session(sink_window(4, 8), max_block=3, prefill_chunk=16)
    gen = engine.generate(seq, ids, engine.Stop(20))
    assert len(gen.tokens) == 20
    slot = [2 * 2 * 16 * itemsize] * 4  # K + V, 2 kv heads x head_dim 16
    assert seq.kv_bytes() == expected_kv_bytes(seq.specs, seq.position, 3, slot)
    with pytest.raises(ValueError, match="unknown dtype"):
        load_mlx(twin.path, "int8")


def _run_without(blocked: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter where `blocked` packages are absent (None in sys.modules makes
    `import` fail and `importlib.util.find_spec` return None, as on a host without them)."""
    prelude = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_each_backend_runs_without_the_other_installed() -> None:
    twin = mlx_twin(tiny_models.qwen())
    mlx_only = _run_without(
        ["torch"],
        (
            "import engine\n"
            f"m = engine.load({str(twin.path)!r}, backend='mlx')\n"
            "g = engine.generate(m.session(engine.sink_window(2, 6)), [5, 6, 7, 8], engine.Stop(12))\n"
            "assert len(g.tokens) == 12 and sys.modules['torch'] is None\n"
            "try:\n    engine.load('x', backend='torch')\nexcept Exception as e:\n    print('no torch:', type(e).__name__)\n"
        ),
    )
    assert mlx_only.returncode == 0, mlx_only.stderr
    torch_only = _run_without(
        ["mlx", "mlx_lm"],
        (
            "import engine, engine.backends.torch.session\n"
            f"m = engine.load({str(twin.path)!r}, backend='torch')\n"
            "assert len(engine.generate(m.session(engine.full()), [5, 6, 7], engine.Stop(5)).tokens) == 5\n"
            f"engine.load({str(twin.path)!r}, backend='mlx')\n"
        ),
    )
    assert torch_only.returncode == 1 and "the mlx backend is not available here" in torch_only.stderr


def test_zoo_models_load_on_mlx_and_match_torch() -> None:
    tm = engine.load("zoo:tiny-hybrid", "torch")
    mm = engine.load("zoo:tiny-hybrid", "mlx")
    assert mm.layer_types == tm.layer_types and mm.sliding_window == tm.sliding_window
    assert mm.eos_ids == tm.eos_ids
    ids = mm.encode("def add(a, b):\n    return")
    assert ids == tm.encode("def add(a, b):\n    return")
    for policy in (full(), hybrid(4, 16)):
        want = engine.generate(tm.session(policy), ids, engine.Stop(40, tm.eos_ids))
        assert engine.generate(mm.session(policy), ids, engine.Stop(40, mm.eos_ids)).tokens == want.tokens
