"""The workloads on a linear-attention hybrid (Qwen3.5 `qwen3_5_text`, gated delta-net layers x3 + one
full-attention layer, random weights over the zoo vocabulary): niah, throughput, parity and compression
run end to end at tiny sizes and their reports pass their schemas (and their presets' gates); compression
shows the recurrent state apart from attention K/V and computes the table for the reference configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine.workloads import compression, niah, parity, throughput  # noqa: E402
from tests.engine import tiny_models  # noqa: E402
from tests.engine.backends import HAVE_MLX  # noqa: E402
from tests.engine.workload_support import (  # noqa: E402
    CROSS_CHECKED,
    SEEDS_TABLE,
    ZOO_TOKENS,
    save_zoo_model,
    tiny_throughput,
)
from tests.engine.workload_support import gate as _gate  # noqa: E402

SLOT = 2 * 2 * 16 * 4  # K and V of one position in the one attention layer: 2 heads x 16, float32
STATE = 3 * (4 * 16 * 16 * 4 + 3 * (2 * 2 * 16 + 4 * 16) * 4)  # 3 linear layers: recurrent + convolution
torch.set_num_threads(1)


def _save_qwen35(path: Path, seed: int) -> Path:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        **ZOO_TOKENS,
        **tiny_models.LINEAR_HYBRID,
        num_hidden_layers=4,
        tie_word_embeddings=False,
    )
    return save_zoo_model(path, Qwen3_5ForCausalLM, config, seed)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_qwen35(tmp_path_factory.mktemp("wl35") / "qwen35", 0)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Other random weights: it disagrees with the verifier, so blocks are partly rejected (rollback)."""
    return _save_qwen35(tmp_path_factory.mktemp("wl35") / "drafter", 1)


def test_niah_on_a_qwen35(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "niah.json"
    args = ["--model", str(model_dir), "--policy", "hybrid:2:8,sink_window:2:8", "--contexts", "32,96"]
    assert niah.main([*args, "--samples", "1", "--depths", "0,1", "--plot", "none", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert _gate(report).status == "pass", _gate(report).reasons()
    assert report["geometry"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    short, long = report["rungs"]
    assert long["needles_evicted"] and not short["needles_evicted"]
    sw, hy = long["policies"]["sink_window"], long["policies"]["hybrid"]
    # attention K/V only (one layer): sink + window - 1 + 1 slots; hybrid keeps the full layer exact
    assert sw["kv_bytes"] == sw["kv_bytes_bound"] == (2 + 8) * SLOT
    assert (
        hy["kv_bytes"] == hy["kv_bytes_full"] == long["oracle"]["kv_bytes"] == 100 * SLOT
    )  # + 4 answer tokens
    # the linear layers' state summarizes the whole prompt: nothing is out of reach
    assert sw["farthest_position"] == 0 and sw["reach"] == 96


@pytest.mark.parametrize(
    "backend", ["torch", pytest.param("mlx", marks=pytest.mark.skipif(not HAVE_MLX, reason="mlx"))]
)
def test_throughput_on_a_qwen35_is_exact_with_rejections(
    backend: str, model_dir: Path, drafter_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tp.json"
    args = ["--drafter", str(drafter_dir), "--backend", backend, "--policy", "sink_window:2:8"]
    args += ["--min-speedup", "0", "--plot", "none", "--out", str(out)]
    assert throughput.main(tiny_throughput(model_dir, *args, k=4)) == 0
    report = json.loads(out.read_text())
    assert _gate(report, "throughput-code").status == "pass", _gate(report, "throughput-code").reasons()
    assert report["summary"]["all_exact"] and report["config"]["backend"] == backend
    sp = [p["speculative"] for p in report["prompts"]]
    assert all(s["tokens"] == 20 for s in sp)
    assert sum(s["accepted"] for s in sp) < sum(s["drafted"] for s in sp)  # rollbacks happened


@pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")
def test_parity_on_a_qwen35(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "parity.json"
    args = ["--model", str(model_dir), "--policy", "sink_window:2:6", "--dtypes", "float32"]
    assert (
        parity.main(
            [*args, "--prompts", "2", "--prompt-tokens", "24", "--new-tokens", "12", "--out", str(out)]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert _gate(report, "parity").status == "pass", _gate(report, "parity").reasons()
    for s in report["runs"][0]["samples"]:
        assert s["first_divergence"] is None and s["torch_tokens"] == s["mlx_tokens"] == 12
        assert max(s["max_abs_logit_diff"]) < 1e-3


def test_compression_cross_checks_the_state_and_shows_it_apart(
    model_dir: Path, drafter_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "c.json"
    args = ["--model", str(model_dir), "--drafter", str(drafter_dir), *CROSS_CHECKED]
    assert compression.main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert _gate(report, "compression-table").status == "pass", _gate(report, "compression-table").reasons()
    assert report["summary"]["checks"] == 8 and report["config"]["reference"] is None
    assert report["geometry"]["state_bytes_per_sequence"] == STATE
    assert all(c["measured_bytes"] > STATE for c in report["checks"])  # the state is in what caches hold
    for r in report["table"]:
        assert r["state_bytes"] == r["batch"] * STATE
        if r["policy"] == "sink_window:2:8":
            assert r["kv_bytes"] == r["batch"] * (2 + 8 - 1 + 4) * SLOT
        # the drafter is a Qwen3.5 too: its K/V and its state
        assert (
            r["net_bytes"]
            == r["kv_bytes"] + r["state_bytes"] + r["drafter_kv_bytes"] + r["drafter_weight_bytes"]
        )
        assert r["drafter_kv_bytes"] >= r["batch"] * STATE
    sw = report["summary"]["policies"]["sink_window"]
    assert sw["state_bytes_per_token"] == pytest.approx(64 * STATE / (64 * 1048576))


def test_compression_reference_configs_from_the_cli(model_dir: Path, tmp_path: Path) -> None:
    """`--reference`: the table for a published architecture; the seeds' Qwen3-1.7B numbers, and Qwen3.5
    (transformers' qwen3_5_text defaults) with its recurrent state apart; the cross-check loads --model."""
    out = tmp_path / "c.json"
    args = [*SEEDS_TABLE, "--batches", "8,64", "--seq-lens", "8192,131072", "--check-lens", "none"]
    args += ["--out", str(out)]
    rows = {}
    for ref in ("qwen3-1.7b", "qwen3.5-text-defaults"):
        assert compression.main([*args, "--reference", ref]) == 0
        report = json.loads(out.read_text())
        assert _gate(report).status == "pass" and report["config"]["reference"] == ref
        assert report["config"]["dtype"] == "bfloat16"  # auto: the reference's
        rows[ref] = {(r["batch"], r["seq_len"]): r for r in report["table"]}
    q3, q35 = rows["qwen3-1.7b"], rows["qwen3.5-text-defaults"]
    assert (
        round(q3[8, 8192]["net_bytes_per_token"], 1) == 18582
        and round(q3[64, 131072]["compression_ratio"], 2) == 688.36
    )
    assert q3[8, 8192]["state_bytes"] == 0 and q3[8, 8192]["full_bytes_per_token"] == 28 * 2 * 8 * 128 * 2
    state = 24 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)  # 24 linear layers: recurrent float32 + convolution bf16
    r = q35[64, 131072]
    assert r["state_bytes"] == 64 * state and r["kv_bytes"] == 64 * (4 + 23 + 1) * 8 * 2 * 4 * 256 * 2
    assert r["full_bytes"] == 64 * (131072 * 8 * 2 * 4 * 256 * 2 + state)
    assert r["compression_ratio"] < q3[64, 131072]["compression_ratio"]

    # with a cross-check, the model given is what loads (here a Qwen3.5 with the same layer kinds)
    assert (
        compression.main(
            [
                *args[:-4],
                "--check-lens",
                "12",
                "--out",
                str(out),
                "--model",
                str(model_dir),
                "--reference",
                "qwen3.5-text-defaults",
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert (
        report["summary"]["check_passed"] is True and report["geometry"]["state_bytes_per_sequence"] == state
    )
    with pytest.raises(SystemExit):
        compression.main([*args, "--reference", "qwen9"])
