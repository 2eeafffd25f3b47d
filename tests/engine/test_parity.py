"""The parity workload end to end: PyTorch vs MLX on a saved tiny Gemma-3 with the zoo tokenizer, run as
the preset's command line, its report gated with the preset's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")
torch = pytest.importorskip("torch")

import gates  # noqa: E402
from engine.workloads.cli import first_divergence  # noqa: E402
from engine.workloads.parity import prompts  # noqa: E402
from tests.engine import tiny_models  # noqa: E402
from tests.engine.workload_support import ZOO_TOKENS, run_workload, save_zoo_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Gemma-3 (sliding window 8, so 40-token prompts wrap it) over the zoo vocabulary."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **ZOO_TOKENS,
        **tiny_models.ATTENTION,
        num_hidden_layers=4,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        tie_word_embeddings=False,
    )
    return save_zoo_model(tmp_path_factory.mktemp("parity") / "gemma", Gemma3ForCausalLM, config, 0)


def _preset() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "presets" / "parity.yaml").read_text())


def test_parity_workload_report_passes_its_gate(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    args = ["--model", str(model_dir), "--policy", "hybrid:2:6", "--dtypes", "float32,bfloat16"]
    args += ["--prompts", "2", "--prompt-tokens", "40", "--new-tokens", "24", "--out", str(out)]
    done = run_workload("parity", *args, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "parity float32: agreement 1.0000, exact 2/2" in done.stdout
    report = json.loads(out.read_text())
    checks = gates.parse_checks(_preset()["gate"])
    verdict = gates.evaluate(report, checks, kind="parity", schema_version=1)
    assert verdict.status == "pass", verdict
    f32, bf16 = report["runs"]
    assert (f32["dtype"], bf16["dtype"]) == ("float32", "bfloat16")
    for s in f32["samples"]:
        assert s["first_divergence"] is None and s["torch_tokens"] == s["mlx_tokens"] == 24
        assert len(s["max_abs_logit_diff"]) == 24 and max(s["max_abs_logit_diff"]) < 1e-3
    assert bf16["max_abs_logit_diff"] > f32["max_abs_logit_diff"]  # bfloat16 rounding shows in the logits
    assert report["config"]["policy"] == "hybrid:2:6" and report["summary"]["float32_agreement"] == 1.0

    report["summary"]["float32_agreement"] = 0.75
    assert gates.evaluate(report, checks).status == "fail"
    del report["runs"][0]["samples"][0]["first_divergence"]
    failed = gates.evaluate(report, checks)
    assert failed.status == "fail" and any("first_divergence" in v.message for v in failed.violations)


def test_parity_refuses_bad_arguments_before_loading(tmp_path: Path) -> None:
    for bad in (["--dtypes", "float32,int8"], ["--policy", "hybrid:2:0"]):
        done = run_workload("parity", "--out", str(tmp_path / "r"), *bad, timeout=120)
        assert done.returncode == 2 and ("--dtypes" in done.stderr or "window" in done.stderr), done.stderr


def test_first_divergence_and_prompts() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 9]) == 2
    texts = prompts(3, 40, seed=1)
    assert len(texts) == 3 and len(set(texts)) == 3 and "?" in texts[1]  # a haystack ends in its query
