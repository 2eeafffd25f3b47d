"""Helpers for the workload tests: a random transformers model saved with the zoo's tokenizer (a model
directory the workloads load by path), and a report judged by its schema and a preset's own gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gates
from bridge.presets import load_registry
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


def gate(report: dict[str, Any], preset: str | None = None) -> gates.Verdict:
    """The report against its kind's schema and, given a shipped preset, that preset's gate (its report kind)."""
    if preset is None:
        return gates.evaluate(report, [], kind=report["kind"], schema_version=report["schema_version"])
    p = load_registry()[preset]
    return gates.evaluate(report, p.gate, kind=p.report.kind, schema_version=p.report.schema_version)
