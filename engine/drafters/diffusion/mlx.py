"""The masked-diffusion drafter's model in MLX (drafting only), on the torch model's safetensors."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.drafters.diffusion.config import DiffusionConfig, build_block, build_model


class Block(nn.Module):
    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__()
        build_block(self, nn, cfg)

    def __call__(self, x: mx.array) -> mx.array:
        b, n, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, d).transpose(2, 0, 3, 1, 4)
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=d**-0.5)  # bidirectional: no mask
        x = x + self.proj(a.transpose(0, 2, 1, 3).reshape(b, n, h))
        return x + self.fc2(nn.gelu(self.fc1(self.ln2(x))))


class TinyDLM(nn.Module):
    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__()
        build_model(self, nn, cfg)
        self.blocks = [Block(cfg) for _ in range(cfg.layers)]

    def hidden(self, ids: mx.array) -> mx.array:
        self.config.check_positions(ids.shape[1])
        x = self.embed(ids) + self.pos.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def logits(self, h: mx.array) -> mx.array:
        return h @ self.embed.weight[: self.config.vocab_size].T


class MLXDiffusionModel:
    """`DiffusionModel` (engine/drafters/diffusion/drafter.py) over the MLX TinyDLM."""

    def __init__(self, model: TinyDLM) -> None:
        self.model = model
        self.config = model.config

    def masked_logits(self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]) -> Any:
        """The logits [len(masked), vocab] of one forward at the masked slots."""
        h = self.model.hidden(mx.array([[*context, *block]]))[0, mx.array([len(context) + i for i in masked])]
        return self.model.logits(h)

    def predict(
        self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]
    ) -> tuple[list[int], list[float]]:
        probs = mx.softmax(self.masked_logits(context, block, masked), axis=-1)
        tokens, conf = mx.argmax(probs, axis=-1), mx.max(probs, axis=-1)
        mx.eval(tokens, conf)
        return tokens.tolist(), conf.tolist()


def load_model(path: Path, config: DiffusionConfig) -> MLXDiffusionModel:
    model = TinyDLM(config)
    model.load_weights(str(path / "model.safetensors"))  # strict: every name and shape must match
    mx.eval(model.parameters())
    return MLXDiffusionModel(model)
