"""The block drafter (DFlash-style, PyTorch): a small transformer conditioned on the verifier's hidden
states that proposes a whole block of k tokens in one forward.

Context: every position the verifier keeps fed (the prompt and each committed token) contributes its
features, the concatenated hidden states of `config.target_layers` from the very verifier forward that
fed it (engine.speculative hands them to `observe`). They are projected once (`fc` + RMSNorm) and each
drafter layer turns them into its own K/V, appended to a growing per-layer buffer: a block costs work in
the new positions only. Only committed positions are ever observed, so a rejection has nothing to roll
back. The drafter attends to the last `config.window` context positions.

Block: [last committed token, MASK x k] at positions p..p+k (p = positions the verifier has fed); every
query attends to the context and to the whole block (no causal mask inside it); row j predicts the token
at p + j. One forward, one host copy (the k argmax ids) per block.

A drafter directory holds config.json (`BlockConfig`, model_type "kakeya_block_drafter") and
model.safetensors; `engine.zoo.block` trains `zoo:tiny-block-drafter`. The config, the context
bookkeeping are backend-free (engine/drafters/block/config.py, base.py); engine/drafters/block/mlx.py is
the MLX twin of this module; engine.drafters.load picks between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from engine.drafters.block.base import BlockDrafterBase, BlockRowsBase
from engine.drafters.block.config import BlockConfig, build_layer, read_config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [..., heads, m, head_dim] at integer positions [m] or [batch, m]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = torch.cat((ang := positions.to(torch.float32)[..., None] * inv, ang), -1)
    if positions.dim() > 1:
        ang = ang.unsqueeze(-3)  # over the heads
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-x2, x1), -1) * sin


class Layer(nn.Module):
    def __init__(self, c: BlockConfig) -> None:
        super().__init__()
        self.c = c
        build_layer(self, nn, RMSNorm, c)

    def heads(self, x: torch.Tensor) -> torch.Tensor:  # [..., m, inner] -> [..., heads, m, head_dim]
        return x.unflatten(-1, (self.c.num_heads, self.c.head_dim)).transpose(-3, -2)

    def kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The context's K/V for this layer from the projected features ctx [..., m, hidden]."""
        return rope(self.heads(self.k(ctx)), positions, self.c.rope_theta), self.heads(self.v(ctx))

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ck: torch.Tensor,
        cv: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.attn_norm(x)
        q = rope(self.heads(self.q(h)), positions, self.c.rope_theta)
        k = torch.cat((ck, rope(self.heads(self.k(h)), positions, self.c.rope_theta)), -2)
        v = torch.cat((cv, self.heads(self.v(h))), -2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(a.transpose(-3, -2).flatten(-2))
        h = self.mlp_norm(x)
        return x + self.down(F.gelu(self.gate(h), approximate="tanh") * self.up(h))


class BlockDrafterModel(nn.Module):
    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.mask_embed = nn.Parameter(torch.zeros(c.hidden_size))
        self.fc = nn.Linear(len(c.target_layers) * c.target_hidden_size, c.hidden_size, bias=False)
        self.ctx_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Concatenated verifier features [..., m, layers * target_hidden] -> projected [..., m, hidden]."""
        return self.ctx_norm(self.fc(features))

    def block_input(self, last: torch.Tensor, k: int) -> torch.Tensor:
        """[..., 1 + k, hidden]: the last committed token's embedding, then k mask slots."""
        e = self.embed(last)[..., None, :]
        return torch.cat((e, self.mask_embed.expand(*e.shape[:-2], k, -1)), -2)

    def logits(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        for layer, (ck, cv) in zip(self.layers, kv, strict=True):
            x = layer(x, positions, ck, cv, mask)
        return self.lm_head(self.norm(x))

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(self.config.model_dump_json(indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(out / "model.safetensors"))

    @classmethod
    def load(cls, path: Path, device: str | torch.device = "cpu") -> BlockDrafterModel:
        model = cls(read_config(path))
        model.load_state_dict(load_file(str(path / "model.safetensors")))
        return model.to(device).eval()


class BlockDrafter(BlockDrafterBase):
    """The engine.speculative `FeatureDrafter` over a `BlockDrafterModel` (bookkeeping: BlockDrafterBase)."""

    def __init__(self, model: BlockDrafterModel) -> None:
        super().__init__(model.config)
        self.model = model.eval()
        self.param = next(model.parameters())
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _reset(self) -> None:
        c = self.config
        empty = self.param.new_empty((c.num_heads, 0, c.head_dim))
        self.kv = [(empty, empty) for _ in range(c.num_layers)]

    def _capacity(self) -> int:
        return self.kv[0][0].shape[1]

    @torch.inference_mode()
    def _context_kv(self, hidden: dict[int, Any], rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        feats = torch.cat([hidden[i][:rows] for i in self.layers], -1).to(self.param)
        pos = torch.arange(self.position, self.position + rows, device=self.param.device)
        ctx = self.model.context(feats)
        return [layer.kv(ctx, pos) for layer in self.model.layers]

    def _compact(self, start: int, n: int, size: int) -> None:
        self.kv = [(_moved(kb, start, n, size), _moved(vb, start, n, size)) for kb, vb in self.kv]

    @torch.inference_mode()
    def _write(self, new: list[tuple[torch.Tensor, torch.Tensor]], at: int) -> None:
        end = at + new[0][0].shape[1]
        for (kb, vb), (k, v) in zip(self.kv, new, strict=True):
            kb[:, at:end] = k
            vb[:, at:end] = v

    @torch.inference_mode()
    def block_logits(self, last: int, k: int) -> torch.Tensor:
        """[k, vocab]: the block forward's logits at the k mask slots."""
        lo = max(0, self.length - self.window)
        kv = [(kb[:, lo : self.length], vb[:, lo : self.length]) for kb, vb in self.kv]
        x = self.model.block_input(torch.tensor(last, device=self.param.device), k)
        pos = torch.arange(self.position, self.position + k + 1, device=self.param.device)
        return self.model.logits(x, pos, kv)[1:]

    def _logits(self, last: int, k: int) -> torch.Tensor:
        return self.block_logits(last, k)

    def _draft(self, last: int, k: int) -> list[int]:
        return self.block_logits(last, k).argmax(-1).tolist()


class BatchedBlockDrafter(BlockRowsBase):
    """The engine.speculative `FeatureRows` over a `BlockDrafterModel`: every row of a batched verifier
    observed and drafted in one forward each (bookkeeping: BlockRowsBase)."""

    def __init__(self, model: BlockDrafterModel, rows: int) -> None:
        super().__init__(model.config, rows)
        self.model = model.eval()
        self.param = next(model.parameters())
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _reset(self) -> None:
        c = self.config
        empty = self.param.new_empty((self.rows, c.num_heads, 0, c.head_dim))
        self.kv = [(empty, empty) for _ in range(c.num_layers)]

    def _capacity(self) -> int:
        return self.kv[0][0].shape[2]

    def _compact(self, starts: list[int], keep: list[int], size: int) -> None:
        def moved(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_empty((buf.shape[0], buf.shape[1], size, buf.shape[3]))
            for r, (start, n) in enumerate(zip(starts, keep, strict=True)):
                out[r, :, :n] = buf[r, :, start : start + n]
            return out

        self.kv = [(moved(kb), moved(vb)) for kb, vb in self.kv]

    @torch.inference_mode()
    def _observe(self, hidden: dict[int, Any], picked: list[tuple[int, int, int]]) -> None:
        dev = self.param.device
        index = torch.tensor([i for i, _, _ in picked], device=dev)
        m = max(n for _, _, n in picked)
        feats = torch.cat([hidden[i].index_select(0, index)[:, :m] for i in self.layers], -1).to(self.param)
        starts = torch.tensor([self.position[r] for _, r, _ in picked], device=dev)
        pos = starts[:, None] + torch.arange(m, device=dev)
        ctx = self.model.context(feats)
        rows, at, src, j = (torch.tensor(x, device=dev) for x in self.writes(picked))
        for layer, (kb, vb) in zip(self.model.layers, self.kv, strict=True):
            k, v = layer.kv(ctx, pos)
            kb[rows, :, at] = k[src, :, j]
            vb[rows, :, at] = v[src, :, j]

    @torch.inference_mode()
    def _block_logits(self, lasts: list[int], ks: list[int]) -> torch.Tensor:
        dev = self.param.device
        a, b, seen = self.block_mask(ks)
        kv = [(kb[:, :, a:b], vb[:, :, a:b]) for kb, vb in self.kv]
        x = self.model.block_input(torch.tensor(lasts, device=dev), max(ks))
        pos = torch.tensor(self.position, device=dev)[:, None] + torch.arange(1 + max(ks), device=dev)
        mask = None if seen is None else torch.from_numpy(seen).to(dev)[:, None]
        return self.model.logits(x, pos, kv, mask)[:, 1:]

    def _draft(self, lasts: list[int], ks: list[int]) -> list[list[int]]:
        return self._block_logits(lasts, ks).argmax(-1).tolist()

    def _keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, device=self.param.device)
        self.kv = [(kb.index_select(0, index), vb.index_select(0, index)) for kb, vb in self.kv]


def _moved(buf: torch.Tensor, start: int, n: int, size: int) -> torch.Tensor:
    """A new [heads, size, head_dim] buffer starting with buf[:, start : start + n]."""
    out = buf.new_empty((buf.shape[0], size, buf.shape[2]))
    out[:, :n] = buf[:, start : start + n]
    return out
