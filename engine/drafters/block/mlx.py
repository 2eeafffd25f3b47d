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

from engine.drafters.block.base import BlockDrafterBase, BlockRowsBase
from engine.drafters.block.config import BlockConfig, build_layer, read_config


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
        self.heads_, self.head_dim, self.theta = c.num_heads, c.head_dim, c.rope_theta
        build_layer(self, nn, RMSNorm, c)

    def heads(self, x: mx.array) -> mx.array:  # [rows, m, inner] -> [rows, heads, m, head_dim]
        return x.reshape(x.shape[0], -1, self.heads_, self.head_dim).transpose(0, 2, 1, 3)

    def rope(self, x: mx.array, offset: int | mx.array) -> mx.array:
        """RoPE at positions offset.. (an array: each row's own offset)."""
        return mx.fast.rope(x, self.head_dim, traditional=False, base=self.theta, scale=1.0, offset=offset)

    def kv(self, ctx: mx.array, offset: int | mx.array) -> tuple[mx.array, mx.array]:
        """The context's K/V [rows, heads, m, head_dim] from the projected features ctx [rows, m, hidden]
        at positions offset.. (per row when an array)."""
        return self.rope(self.heads(self.k(ctx)), offset), self.heads(self.v(ctx))

    def qkv(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The q, k, v projections [rows, m, inner] of x (before RoPE)."""
        h = self.attn_norm(x)
        return self.q(h), self.k(h), self.v(h)

    def __call__(
        self,
        x: mx.array,
        offset: int | mx.array,
        ck: mx.array,
        cv: mx.array,
        qkv: tuple[mx.array, mx.array, mx.array] | None = None,
        tail: bool = False,
        mask: mx.array | None = None,
    ) -> mx.array:
        """x [rows, m, hidden] at positions offset.. attending to the context ck/cv and to all of x (mask:
        [rows, 1, m, keys] where not everything); qkv: this layer's `qkv(x)` when known; tail: only block
        slots 1.. come out (slot 0 is attended to, nothing more)."""
        q, k, v = self.qkv(x) if qkv is None else qkv
        k = mx.concatenate((ck, self.rope(self.heads(k), offset)), 2)
        v = mx.concatenate((cv, self.heads(v)), 2)
        if tail:
            x, q, offset = x[:, 1:], q[:, 1:], offset + 1
            mask = None if mask is None else mask[:, :, 1:]
        q = self.rope(self.heads(q), offset)
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5, mask=mask)
        x = x + self.o(a.transpose(0, 2, 1, 3).reshape(x.shape[0], -1, self.heads_ * self.head_dim))
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
        lasts: list[int],
        k: int,
        offset: int | mx.array,
        kv: list[tuple[mx.array, mx.array]],
        mask_qkv: tuple[mx.array, mx.array, mx.array] | None = None,
        mask: mx.array | None = None,
    ) -> mx.array:
        """[rows, k, vocab]: the logits at the k mask slots of [last, MASK x k] of each row at positions
        offset.. (per row when an array; mask: `Layer`'s); mask_qkv: `mask_qkv()`, computed once: the
        first layer projects only the `lasts`."""
        e = self.embed(mx.array(lasts)[:, None])
        shape = (len(lasts), k, e.shape[-1])
        x = mx.concatenate((e, mx.broadcast_to(self.mask_embed, shape)), 1)
        q, k_, v = (
            mx.concatenate((p, mx.broadcast_to(m, (len(lasts), k, m.shape[-1]))), 1)
            for p, m in zip(self.layers[0].qkv(e), mask_qkv or self.mask_qkv(), strict=True)
        )
        for i, (layer, (ck, cv)) in enumerate(zip(self.layers, kv, strict=True)):
            qkv = (q, k_, v) if i == 0 else None
            x = layer(x, offset, ck, cv, qkv, tail=i == len(self.layers) - 1, mask=mask)
        return self.lm_head(self.norm(x))

    @classmethod
    def load(cls, path: Path) -> MLXBlockDrafterModel:
        model = cls(read_config(path))
        model.load_weights(str(path / "model.safetensors"))
        model.eval()
        return model


class Buffers:
    """What both MLX block drafters hold: the model, per-layer K/V buffers [rows, heads, capacity, head_dim]
    in the weights' dtype, and the mask slot's first-layer projections (the same every block)."""

    def __init__(self, model: MLXBlockDrafterModel) -> None:
        self.model = model
        self.dtype = model.fc.weight.dtype
        self.kv: list[tuple[mx.array, mx.array]] = []
        self.mask_qkv = model.mask_qkv()
        mx.eval(self.mask_qkv)

    def _empty(self, rows: int) -> None:
        c = self.model.config
        empty = mx.zeros((rows, c.num_heads, 0, c.head_dim), self.dtype)
        self.kv = [(empty, empty) for _ in range(c.num_layers)]

    def _capacity(self) -> int:
        return self.kv[0][0].shape[2]


class MLXBlockDrafter(Buffers, BlockDrafterBase):
    """The engine.speculative `FeatureDrafter` over an `MLXBlockDrafterModel` (bookkeeping: BlockDrafterBase);
    buffers [1, heads, capacity, head_dim] per layer, in float32 like the weights."""

    def __init__(self, model: MLXBlockDrafterModel) -> None:
        BlockDrafterBase.__init__(self, model.config)
        Buffers.__init__(self, model)

    def _reset(self) -> None:
        self._empty(1)

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
        # evaluated now (in the background), not with the next block: the prompt's context would
        # otherwise land in the first block's time (engine/draft_length.py DraftLength times blocks), and a
        # run of plain steps (k = 0) would pile its writes up into one graph
        mx.async_eval(self.kv)

    def block_logits(self, last: int, k: int) -> mx.array:
        """[k, vocab] (lazy): the block forward's logits at the k mask slots."""
        lo = max(0, self.length - self.window)
        kv = [(kb[:, :, lo : self.length], vb[:, :, lo : self.length]) for kb, vb in self.kv]
        return self.model.block_logits([last], k, self.position, kv, self.mask_qkv)[0]

    def _logits(self, last: int, k: int) -> mx.array:
        logits = self.block_logits(last, k)
        mx.eval(logits, self.kv)  # the writes `observe` queued, evaluated with the block
        return logits

    def _draft(self, last: int, k: int) -> list[int]:
        ids = mx.argmax(self.block_logits(last, k), axis=-1)
        mx.eval(ids, self.kv)  # the writes `observe` queued, evaluated with the block
        return ids.tolist()  # type: ignore[return-value]


class MLXBatchedBlockDrafter(Buffers, BlockRowsBase):
    """The engine.speculative `FeatureRows` over an `MLXBlockDrafterModel`: every row of a batched verifier
    observed and drafted in one forward each, lazily (one host sync per block, as `MLXBlockDrafter`);
    buffers [rows, heads, capacity, head_dim] per layer (bookkeeping: BlockRowsBase)."""

    def __init__(self, model: MLXBlockDrafterModel, rows: int) -> None:
        BlockRowsBase.__init__(self, model.config, rows)
        Buffers.__init__(self, model)

    def _reset(self) -> None:
        self._empty(self.rows)

    def _compact(self, starts: list[int], keep: list[int], size: int) -> None:
        def moved(buf: mx.array) -> mx.array:
            out = mx.zeros((buf.shape[0], buf.shape[1], size, buf.shape[3]), buf.dtype)
            for r, (start, n) in enumerate(zip(starts, keep, strict=True)):
                out[r, :, :n] = buf[r, :, start : start + n]
            return out

        self.kv = [(moved(kb), moved(vb)) for kb, vb in self.kv]

    def _observe(self, hidden: dict[int, Any], picked: list[tuple[int, int, int]]) -> None:
        index = mx.array([i for i, _, _ in picked])
        m = max(n for _, _, n in picked)
        feats = mx.concatenate([hidden[i][index, :m] for i in self.layers], -1).astype(self.dtype)
        ctx = self.model.context(feats)
        offsets = mx.array([self.position[r] for _, r, _ in picked])
        rows, at, src, j = (mx.array(x) for x in self.writes(picked))
        kv = []
        for layer, (kb, vb) in zip(self.model.layers, self.kv, strict=True):
            k, v = layer.kv(ctx, offsets)
            kb[rows, :, at] = k[src, :, j]
            vb[rows, :, at] = v[src, :, j]
            kv.append((kb, vb))
        self.kv = kv
        # evaluated now, not with the next block: a plain step (k = 0) drafts nothing, and the writes of
        # a run of them would pile up into one graph of whole-buffer copies
        mx.async_eval(self.kv)

    def _block_logits(self, lasts: list[int], ks: list[int]) -> mx.array:
        a, b, seen = self.block_mask(ks)
        kv = [(kb[:, :, a:b], vb[:, :, a:b]) for kb, vb in self.kv]
        mask = None if seen is None else mx.array(seen)[:, None]
        offsets = mx.array(self.position)
        logits = self.model.block_logits(lasts, max(ks), offsets, kv, self.mask_qkv, mask)
        mx.eval(logits, self.kv)  # the writes `observe_rows` queued, evaluated with the block
        return logits

    def _draft(self, lasts: list[int], ks: list[int]) -> list[list[int]]:
        a, b, seen = self.block_mask(ks)
        kv = [(kb[:, :, a:b], vb[:, :, a:b]) for kb, vb in self.kv]
        mask = None if seen is None else mx.array(seen)[:, None]
        offsets = mx.array(self.position)
        logits = self.model.block_logits(lasts, max(ks), offsets, kv, self.mask_qkv, mask)
        ids = mx.argmax(logits, axis=-1)
        mx.eval(ids, self.kv)  # the writes `observe_rows` queued, evaluated with the block
        return ids.tolist()  # type: ignore[return-value]

    def _keep(self, rows: list[int]) -> None:
        index = mx.array(rows)
        self.kv = [(kb[index], vb[index]) for kb, vb in self.kv]
