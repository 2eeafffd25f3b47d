"""Masked-diffusion proposer: k drafts by iterative unmasking, no K/V held between blocks (no torch/mlx).

Each block the drafter feeds its bidirectional model the tail of the committed context (the last
`context` tokens, positions 0..) followed by k mask slots, and unmasks them in at most `steps`
denoising forwards: each forward predicts every still-masked slot (the LM head runs on those slots
only) and fixes the most confident ones, an equal share of the remaining slots per remaining step.
Nothing but the committed token ids survives a block, so the proposer adds 0 bytes to the K/V held.
Whatever it proposes, the verifier decides: `speculative_generate` output stays exactly greedy.

    from engine.drafters.diffusion import DiffusionDrafter, load_dlm
    drafter = DiffusionDrafter(load_dlm("zoo:tiny-dlm", backend="torch"), steps=4)
    engine.speculative_generate(verifier_session, drafter, ids, k, stop)

Model directories (`zoo:tiny-dlm`) hold config.json (`DLMConfig`, model_type "kakeya-dlm"),
model.safetensors (read by both backends: engine/drafters/diffusion_torch.py, diffusion_mlx.py) and
the zoo tokenizer files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from engine.models import Backend, resolve

MODEL_TYPE = "kakeya-dlm"


class DLMConfig(BaseModel):
    """A small bidirectional transformer: token + learned position embeddings, pre-norm blocks, an LM
    head tied to the token embedding (over the `vocab_size` real tokens; `mask_id` = vocab_size)."""

    model_config = ConfigDict(extra="forbid")
    model_type: Literal["kakeya-dlm"] = MODEL_TYPE
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int  # context tail + mask slots fed at once
    context: int  # default tail of committed tokens the drafter feeds

    @property
    def mask_id(self) -> int:
        return self.vocab_size


def read_config(path: Path) -> DLMConfig:
    raw = json.loads((path / "config.json").read_text())
    if raw.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"{path} is not a masked-diffusion proposer (config model_type {raw.get('model_type')!r}, "
            f"expected {MODEL_TYPE!r}); train one with python -m engine.zoo.dlm"
        )
    return DLMConfig.model_validate(raw)


class Denoiser(Protocol):
    """A backend's bidirectional model: one forward over `ids` (mask slots hold `config.mask_id`)."""

    config: DLMConfig

    def predict(
        self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]
    ) -> tuple[list[int], list[float]]:
        """One bidirectional forward over `context` + `block` (`config.mask_id` at the `masked` slots of
        the block); the argmax token and its probability at each masked slot (logits there only)."""
        ...


def load_dlm(name: str, backend: Backend = "torch") -> Denoiser:
    """A masked-diffusion proposer by reference (`zoo:tiny-dlm` or a directory) on one backend."""
    path = resolve(name)
    config = read_config(path)
    if backend == "torch":
        from engine.drafters.diffusion_torch import load_torch_dlm

        return load_torch_dlm(path, config)
    if backend == "mlx":
        try:
            from engine.drafters.diffusion_mlx import load_mlx_dlm  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ValueError(f"the mlx backend is not available here: {exc}") from exc
        return load_mlx_dlm(path, config)
    raise ValueError(f"unknown backend {backend!r}: use torch or mlx")


class DiffusionDrafter:
    """The `Drafter` of engine/speculative.py over a masked-diffusion `Denoiser`."""

    def __init__(self, model: Denoiser, context: int | None = None, steps: int = 4) -> None:
        cfg = model.config
        self.context_len = cfg.context if context is None else context
        if not 1 <= self.context_len < cfg.max_positions:
            raise ValueError(f"context must be in [1, {cfg.max_positions - 1}] (got {self.context_len})")
        if steps < 1:
            raise ValueError(f"steps must be >= 1 (got {steps})")
        self.model, self.steps = model, steps
        self.max_k = cfg.max_positions - self.context_len
        self.committed: list[int] = []
        self.forwards = 0  # denoising forwards run (for reports)

    def begin(self, prompt: Sequence[int]) -> None:
        self.committed = list(prompt[-self.context_len :])

    def propose(self, last: int, k: int) -> list[int]:
        self.committed.append(last)
        del self.committed[: -self.context_len]  # only the tail is ever fed
        k = min(k, self.max_k)
        if k <= 0:
            return []
        tail = self.committed
        block, masked = [self.model.config.mask_id] * k, list(range(k))
        steps = min(self.steps, k)
        for step in range(steps):
            tokens, conf = self.model.predict(tail, block, masked)
            self.forwards += 1
            take = math.ceil(len(masked) / (steps - step))
            chosen = set(sorted(range(len(masked)), key=lambda i: (-conf[i], i))[:take])
            for i in chosen:
                block[masked[i]] = tokens[i]
            masked = [p for i, p in enumerate(masked) if i not in chosen]
        return block

    def accept(self, n: int, committed: Sequence[int]) -> None:
        self.committed.extend(committed[:-1])  # the last one comes back as `last`

    def kv_bytes(self) -> int:
        """K/V bytes held between blocks: none (only the committed token ids are kept)."""
        return 0
