"""The block drafter on MLX (engine/drafters/block/mlx.py): speculative decoding with the zoo drafter on
the MLX verifier emits exactly MLX greedy's tokens under full, hybrid and sink_window (long after the
window wrapped); the torch and MLX drafters propose the same tokens with the same probabilities (float32)
on the same context, across the window's compaction; each backend's drafter imports without the other's
framework; the throughput workload runs it on MLX."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")
torch = pytest.importorskip("torch")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.drafters.load import load_block_drafter  # noqa: E402
from engine.policy import Policy, full, hybrid, sink_window  # noqa: E402
from engine.zoo import corpus  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NEW = 150


@functools.cache
def _verifier(backend: str) -> engine.Model:
    return engine.load("zoo:tiny-hybrid", backend)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", [full(), hybrid(4, 16), sink_window(4, 16), sink_window(0, 12)], ids=str)
def test_zoo_block_drafter_on_mlx_is_exact(policy: Policy) -> None:
    verifier = _verifier("mlx")
    drafter = load_block_drafter("zoo:tiny-block-drafter", "mlx")
    assert type(drafter).__module__ == "engine.drafters.block.mlx"
    for seed in (5, 6):
        ids = verifier.encode(corpus.code_prompts(1, seed=seed, n_tokens=80)[0])
        want = engine.generate(verifier.session(policy), ids, engine.Stop(NEW))
        session = verifier.session(policy, max_block=9, prefill_chunk=32)  # the prompt in 3 chunks
        got = engine.speculative_generate(session, drafter, ids, 8, engine.Stop(NEW))
        assert got.tokens == want.tokens
        assert 0 < got.accepted < got.drafted
        assert session.position - 9 <= drafter.position < session.position == len(ids) + NEW - 1
        if policy == full():  # as on torch (card: 6.67 on code at k = 8)
            assert got.acceptance_length >= 4.0, got.position_acceptance
            assert got.position_acceptance[0] > 0.75


def test_torch_and_mlx_drafters_agree_in_float32() -> None:
    """Both drafters observe the same features (the torch verifier's, 300 prompt positions, then blocks
    of committed positions, compacting past the 256-position window) and propose the same tokens with
    probabilities within 1e-4 after each."""
    verifier = _verifier("torch")
    t = load_block_drafter("zoo:tiny-block-drafter", "torch")
    m = load_block_drafter("zoo:tiny-block-drafter", "mlx")
    assert t.config == m.config and t.config.window == 256
    ids = verifier.encode(corpus.code_prompts(1, seed=7, n_tokens=300)[0])
    text = [*ids, *engine.generate(verifier.session(full()), ids, engine.Stop(120)).tokens]
    session = verifier.session(full(), max_block=64, prefill_chunk=64)
    t.begin(ids)
    m.begin(ids)
    fed, compared = 0, 0
    for chunk in [64] * 4 + [44] + [7, 1, 13, 5] * 4:
        step = session.forward(text[fed : fed + chunk], hidden=t.layers)
        t.observe(step.hidden, chunk)
        m.observe({i: mx.array(h.numpy()) for i, h in step.hidden.items()}, chunk)
        fed += chunk
        assert t.position == m.position == fed and t.length == m.length
        if fed < len(ids):
            continue
        for k in (1, 8):
            pt = torch.softmax(t.block_logits(text[fed - 1], k), -1).numpy()  # type: ignore[attr-defined]
            pm = np.array(mx.softmax(m.block_logits(text[fed - 1], k), axis=-1))  # type: ignore[attr-defined]
            np.testing.assert_allclose(pm, pt, atol=1e-4, rtol=0)
            assert m.propose(text[fed - 1], k) == t.propose(text[fed - 1], k)
            compared += 1
    assert compared >= 32 and fed > t.window + 64 and t.length < fed  # compacted: the window, not all


def _run_without(blocked: list[str], code: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_each_backends_drafter_imports_without_the_other() -> None:
    mlx_only = _run_without(
        ["torch"],
        "from engine.drafters.load import load_block_drafter\n"
        "d = load_block_drafter('zoo:tiny-block-drafter', 'mlx')\n"
        "assert 'engine.drafters.block.torch' not in sys.modules and sys.modules['torch'] is None\n",
    )
    assert mlx_only.returncode == 0, mlx_only.stderr
    torch_only = _run_without(
        ["mlx", "mlx_lm"],
        "from engine.drafters.load import load_block_drafter\n"
        "d = load_block_drafter('zoo:tiny-block-drafter', 'torch')\n"
        "assert 'engine.drafters.block.mlx' not in sys.modules\n"
        "load_block_drafter('zoo:tiny-block-drafter', 'mlx')\n",
    )
    assert torch_only.returncode == 1 and "the mlx backend is not available here" in torch_only.stderr


def test_throughput_runs_the_block_drafter_on_mlx(tmp_path: Path) -> None:
    from engine.workloads import throughput

    report = tmp_path / "throughput.json"
    argv = ["--model", "zoo:tiny-hybrid", "--drafter", "zoo:tiny-block-drafter", "--backend", "mlx"]
    argv += ["--k", "8", "--prompts", "1", "--new-tokens", "40", "--repeats", "1", "--threads", "1"]
    argv += ["--batches", "1,2"]
    assert throughput.main([*argv, "--out", str(report), "--plot", "none"]) == 0
    data = json.loads(report.read_text())
    assert data["config"]["backend"] == "mlx"
    summary = data["summary"]
    assert summary["all_exact"] and len(summary["position_acceptance"]) == 8
    assert summary["position_acceptance"][0] > 0.5
    # batched too (one MLXBatchedBlockDrafter for the rows), every row exact
    assert [(b["batch"], b["speculative"]["exact"]) for b in data["batched"]] == [(1, True), (2, True)]
