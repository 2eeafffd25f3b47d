"""The masked-diffusion drafter: k drafts by iterative unmasking, no K/V held between blocks (no torch/mlx).

Each block the drafter feeds its bidirectional model the tail of the committed context (the last
`context` tokens, positions 0..) followed by k mask slots, and unmasks them in at most `steps`
denoising forwards: each forward predicts every still-masked slot (the LM head runs on those slots
only) and fixes the most confident ones, an equal share of the remaining slots per remaining step.
Nothing but the committed token ids survives a block, so the drafter adds 0 bytes to the K/V held.
Whatever it proposes, the verifier decides: `speculative_generate` output stays exactly greedy.

    make = engine.load_drafter(engine.DrafterSpec.parse("diffusion:zoo:tiny-dlm:steps=4"), verifier, k=k)
    engine.speculative_generate(session, make(session), ids, k, stop)

Model directories (`zoo:tiny-dlm`) hold config.json (`DiffusionConfig`, model_type "kakeya-dlm"),
model.safetensors (read by both backends: engine/drafters/diffusion/torch.py, mlx.py) and the zoo
tokenizer files; a transformers DiffusionGemma directory works too (gemma.py, PyTorch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from engine.drafters.diffusion.config import DiffusionConfig
from engine.sampling import Sampling, draw


class DiffusionModel(Protocol):
    """A backend's bidirectional model: one forward over `ids` (mask slots hold `config.mask_id`)."""

    config: DiffusionConfig

    def predict(
        self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]
    ) -> tuple[list[int], list[float]]:
        """One bidirectional forward over `context` + `block` (`config.mask_id` at the `masked` slots of
        the block); the argmax token and its probability at each masked slot (logits there only)."""
        ...

    def masked_logits(self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]) -> Any:
        """The same forward's logits [len(masked), vocab] at the masked slots (any backend's array)."""
        ...


class DiffusionDrafter:
    """The `Drafter` of engine/speculative.py over a masked-diffusion `DiffusionModel`."""

    def __init__(self, model: DiffusionModel, context: int | None = None, steps: int = 4) -> None:
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

    def propose_sampled(
        self, last: int, k: int, sampling: Sampling, rng: np.random.Generator
    ) -> tuple[list[int], np.ndarray]:
        """Speculative sampling (engine.speculative's `SamplingDrafter`): the same denoising steps, but each
        step unmasks the leftmost slots (as many as `propose` would fix) and draws each from the model's
        distribution there under `sampling`. A slot's distribution then depends only on the context and
        slots to its left fixed at earlier steps, so given the drafts before it, draft j was drawn from
        q_j, as the rejection rule needs (confidence order would condition a draft on later ones)."""
        self.committed.append(last)
        del self.committed[: -self.context_len]
        k = min(k, self.max_k)
        if k <= 0:
            return [], np.zeros((0, self.model.config.vocab_size))
        tail = self.committed
        block, masked = [self.model.config.mask_id] * k, list(range(k))
        q = np.zeros((k, self.model.config.vocab_size))
        steps = min(self.steps, k)
        for step in range(steps):
            take = math.ceil(len(masked) / (steps - step))
            p = sampling.probs(self.model.masked_logits(tail, block, masked[:take]))
            self.forwards += 1
            for slot, tokens, row in zip(masked[:take], draw(p, rng), p, strict=True):
                block[slot], q[slot] = int(tokens), row
            masked = masked[take:]
        return block, q

    def accept(self, n: int, committed: Sequence[int]) -> None:
        self.committed.extend(committed[:-1])  # the last one comes back as `last`

    def kv_bytes(self) -> int:
        """K/V bytes held between blocks: none (only the committed token ids are kept)."""
        return 0
