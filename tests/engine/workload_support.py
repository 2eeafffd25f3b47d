"""Helpers for the workload tests: a random transformers model saved with the zoo's tokenizer (a model
directory the workloads load by path), and a report judged by its schema and a preset's own gate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import gates
from bridge.presets.registry import load_registry
from engine.zoo import corpus, tokenizer

ZOO_VOCAB = len(corpus.VOCAB)  # the zoo tokenizer's vocabulary size: config vocab_size of a saved model
# a transformers config's fields for the zoo tokenizer: its vocabulary and special token ids
ZOO_TOKENS = {
    "vocab_size": ZOO_VOCAB,
    "eos_token_id": corpus.VOCAB.index(corpus.EOS),
    "bos_token_id": corpus.VOCAB.index(corpus.BOS),
    "pad_token_id": corpus.VOCAB.index(corpus.PAD),
}
# A tiny throughput run: 2 zoo prompts of 24 tokens, 20 new tokens each, blocks of k (once, no repeats)
TINY_THROUGHPUT = ["--prompts", "2", "--prompt-tokens", "24", "--new-tokens", "20", "--repeats", "1"]


# A compression table of two bounded policies (blocks of 3) at batch 1 and 64, 8K and 1M tokens, its formula
# cross-checked against caches prefilled with 12 and 40 tokens
CROSS_CHECKED = ["--policy", "sink_window:2:8,hybrid:2:8", "--k", "3", "--batches", "1,64"]
CROSS_CHECKED += ["--seq-lens", "8192,1048576", "--check-lens", "12,40"]


# The seeds' table (shared/seeds/000): sink 4 + window 24, plain decoding, a drafter that holds no K/V and
# weighs Qwen3-0.6B in bfloat16 (596,049,920 parameters)
SEEDS_TABLE = ["--policy", "sink_window:4:24", "--drafter", "none", "--k", "0"]
SEEDS_TABLE += ["--drafter-weights", str(596_049_920 * 2)]


def tiny_throughput(model: Path, *args: str, k: int = 3) -> list[str]:
    """throughput's flags for TINY_THROUGHPUT on `model` with blocks of `k`, then `args`."""
    return ["--model", str(model), "--k", str(k), *TINY_THROUGHPUT, *args]


def save_zoo_model(path: Path, model_class: Any, config: Any, seed: int) -> Path:
    """`model_class(config)` with weights seeded by `seed`, saved to `path` with the zoo tokenizer."""
    import torch

    torch.manual_seed(seed)
    model_class(config).save_pretrained(path)
    tokenizer.save(path)
    return path


ROOT = Path(__file__).resolve().parents[2]


def run_workload(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m engine.workloads.MODULE ARGS` from the repository root, in a bare environment as a runner
    gives it (PATH, this checkout on PYTHONPATH, one thread, offline)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}
    env |= {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", f"engine.workloads.{module}", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def gate(report: dict[str, Any], preset: str | None = None) -> gates.Verdict:
    """The report against its kind's schema and, given a shipped preset, that preset's gate (its report kind)."""
    if preset is None:
        return gates.evaluate(report, [], kind=report["kind"], schema_version=report["schema_version"])
    p = load_registry()[preset]
    return gates.evaluate(report, p.gate, kind=p.report.kind, schema_version=p.report.schema_version)
