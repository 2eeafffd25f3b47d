"""The block drafter in MLX: the twin of engine/drafters/block/torch.py (same module names, so it loads the same
model.safetensors), fed the MLX session's `Step.hidden` (mx arrays, from the verify forward itself).

Everything stays on the device and lazy: `observe` projects the committed positions' features and writes
their K/V into the buffers without evaluating anything; `propose` evaluates the block forward together
with those writes and copies the k argmax ids to the host: one host sync per block, no numpy.
The config and the bookkeeping (window, compaction, positions) are engine/drafters/block/config.py's and base.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from engine.drafters.block.base import BlockDrafterBase
from engine.drafters.block.config import BlockConfig, read_config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.ones((dim,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, self.weight, self.eps)


class Layer(nn.Module):
    def __init__(self, c: BlockConfig) -> None:
        super().__init__()
        inner = c.num_heads * c.head_dim
        self.heads_, self.head_dim, self.theta = c.num_heads, c.head_dim, c.rope_theta
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.q = nn.Linear(c.hidden_size, inner, bias=False)
        self.k = nn.Linear(c.hidden_size, inner, bias=False)
        self.v = nn.Linear(c.hidden_size, inner, bias=False)
        self.o = nn.Linear(inner, c.hidden_size, bias=False)
        self.mlp_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.gate = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def heads(self, x: mx.array) -> mx.array:  # [1, m, inner] -> [1, heads, m, head_dim]
        return x.reshape(1, -1, self.heads_, self.head_dim).transpose(0, 2, 1, 3)

    def rope(self, x: mx.array, offset: int) -> mx.array:
        return mx.fast.rope(x, self.head_dim, traditional=False, base=self.theta, scale=1.0, offset=offset)

    def kv(self, ctx: mx.array, offset: int) -> tuple[mx.array, mx.array]:
        """The context's K/V [1, heads, m, head_dim] from the projected features ctx [1, m, hidden] at
        positions offset.."""
        return self.rope(self.heads(self.k(ctx)), offset), self.heads(self.v(ctx))

    def qkv(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The q, k, v projections [1, m, inner] of x (before RoPE)."""
        h = self.attn_norm(x)
        return self.q(h), self.k(h), self.v(h)

    def __call__(
        self,
        x: mx.array,
        offset: int,
        ck: mx.array,
        cv: mx.array,
        qkv: tuple[mx.array, mx.array, mx.array] | None = None,
        tail: bool = False,
    ) -> mx.array:
        """x [1, m, hidden] at positions offset.. attending to the context ck/cv and to all of x; qkv: this
        layer's `qkv(x)` when known; tail: only rows 1.. come out (row 0 is attended to, nothing more)."""
        q, k, v = self.qkv(x) if qkv is None else qkv
        k = mx.concatenate((ck, self.rope(self.heads(k), offset)), 2)
        v = mx.concatenate((cv, self.heads(v)), 2)
        if tail:
            x, q, offset = x[:, 1:], q[:, 1:], offset + 1
        q = self.rope(self.heads(q), offset)
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5)
        x = x + self.o(a.transpose(0, 2, 1, 3).reshape(1, -1, self.heads_ * self.head_dim))
        h = self.mlp_norm(x)
        return x + self.down(nn.gelu_approx(self.gate(h)) * self.up(h))


class MLXBlockDrafterModel(nn.Module):
    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.mask_embed = mx.zeros((c.hidden_size,))
        self.fc = nn.Linear(len(c.target_layers) * c.target_hidden_size, c.hidden_size, bias=False)
        self.ctx_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = [Layer(c) for _ in range(c.num_layers)]
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def context(self, features: mx.array) -> mx.array:
        return self.ctx_norm(self.fc(features))

    def mask_qkv(self) -> tuple[mx.array, mx.array, mx.array]:
        """The first layer's q, k, v projections [1, 1, inner] of a mask slot: the same in every block."""
        return self.layers[0].qkv(self.mask_embed[None, None])

    def block_logits(
        self,
        last: int,
        k: int,
        offset: int,
        kv: list[tuple[mx.array, mx.array]],
        mask_qkv: tuple[mx.array, mx.array, mx.array] | None = None,
    ) -> mx.array:
        """[k, vocab]: the logits at the k mask slots of [last, MASK x k] at positions offset.. (mask_qkv:
        `mask_qkv()`, computed once: the first layer projects only `last`)."""
        e = self.embed(mx.array([[last]]))
        x = mx.concatenate((e, mx.broadcast_to(self.mask_embed, (1, k, e.shape[-1]))), 1)
        q, k_, v = (
            mx.concatenate((p, mx.broadcast_to(m, (1, k, m.shape[-1]))), 1)
            for p, m in zip(self.layers[0].qkv(e), mask_qkv or self.mask_qkv(), strict=True)
        )
        for i, (layer, (ck, cv)) in enumerate(zip(self.layers, kv, strict=True)):
            x = layer(x, offset, ck, cv, (q, k_, v) if i == 0 else None, tail=i == len(self.layers) - 1)
        return self.lm_head(self.norm(x[0]))

    @classmethod
    def load(cls, path: Path) -> MLXBlockDrafterModel:
        model = cls(read_config(path))
        model.load_weights(str(path / "model.safetensors"))
        model.eval()
        return model


class MLXBlockDrafter(BlockDrafterBase):
    """The engine.speculative `FeatureDrafter` over an `MLXBlockDrafterModel` (bookkeeping: BlockDrafterBase);
    buffers [1, heads, capacity, head_dim] per layer, in float32 like the weights."""

    def __init__(self, model: MLXBlockDrafterModel) -> None:
        super().__init__(model.config)
        self.model = model
        self.dtype = model.fc.weight.dtype
        self.kv: list[tuple[mx.array, mx.array]] = []
        self.mask_qkv = model.mask_qkv()
        mx.eval(self.mask_qkv)

    def _reset(self) -> None:
        c = self.config
        empty = mx.zeros((1, c.num_heads, 0, c.head_dim), self.dtype)
        self.kv = [(empty, empty) for _ in range(c.num_layers)]

    def _capacity(self) -> int:
        return self.kv[0][0].shape[2]

    def _context_kv(self, hidden: dict[int, Any], rows: int) -> list[tuple[mx.array, mx.array]]:
        feats = mx.concatenate([hidden[i][:rows] for i in self.layers], -1).astype(self.dtype)
        ctx = self.model.context(feats[None])
        return [layer.kv(ctx, self.position) for layer in self.model.layers]

    def _compact(self, start: int, n: int, size: int) -> None:
        def moved(buf: mx.array) -> mx.array:
            pad = mx.zeros((*buf.shape[:2], size - n, buf.shape[3]), buf.dtype)
            return mx.concatenate((buf[:, :, start : start + n], pad), 2)

        self.kv = [(moved(kb), moved(vb)) for kb, vb in self.kv]

    def _write(self, new: list[tuple[mx.array, mx.array]], at: int) -> None:
        end = at + new[0][0].shape[2]
        for (kb, vb), (k, v) in zip(self.kv, new, strict=True):
            kb[:, :, at:end] = k
            vb[:, :, at:end] = v

    def block_logits(self, last: int, k: int) -> mx.array:
        """[k, vocab] (lazy): the block forward's logits at the k mask slots."""
        lo = max(0, self.length - self.window)
        kv = [(kb[:, :, lo : self.length], vb[:, :, lo : self.length]) for kb, vb in self.kv]
        return self.model.block_logits(last, k, self.position, kv, self.mask_qkv)

    def _logits(self, last: int, k: int) -> mx.array:
        logits = self.block_logits(last, k)
        mx.eval(logits, self.kv)  # the writes `observe` queued, evaluated with the block
        return logits

    def _draft(self, last: int, k: int) -> list[int]:
        ids = mx.argmax(self.block_logits(last, k), axis=-1)
        mx.eval(ids, self.kv)  # the writes `observe` queued, evaluated with the block
        return ids.tolist()  # type: ignore[return-value]
