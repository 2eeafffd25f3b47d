"""K/V restoration (torch backend only): a bounded-cache session whose evicted positions' K/V are supplied
at attention time, and f_theta, a low-rank map from a drafter's K/V to the verifier's.

`restored_session` is a `TorchSession` under any policy whose declared hook (`SupplyRestorer`, the
session's `Restorer`) appends, to the slots the cache holds, K/V that a `Supply` provides for the
positions the policy evicted. Each query
then sees exactly the positions the model's own attention sees (its native rule: causal, and the native
window on sliding layers): a held position through the cache when its policy (sink + window) lets the
query see it, any other one through the supply. The group (engine/cache.py) still owns the slots; the
supplied K/V are never written to the cache, so the bytes the session holds stay the policy's.

A `Supply` holds per-layer post-RoPE K/V [1, kv_heads, T, head_dim] for the positions [0, T) of a prompt:
- `truth(trace)`: the verifier's own K/V (captured from one full forward): the identity control, which
  must reproduce the full-cache oracle;
- `FTheta.supply(drafter_trace, ...)`: f_theta's restoration from the drafter's pre-RoPE K/V, rotated
  with the verifier's RoPE tables;
- `mix(alpha, truth, restored)`: alpha * true + (1 - alpha) * restored (after normalisation, before
  RoPE - the two commute, RoPE is linear).

`capture(model, ids)` runs one plain forward with hooks on each attention layer and returns its `Trace`:
queries and keys after q_norm / k_norm and before RoPE, values, and the layer's RoPE tables. It needs a
transformers attention with q_norm / k_norm (Gemma 3 style) or without them (Llama style, the projections
are taken as they are); MLX has no such session here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from engine.backends.torch.session import TorchModel, TorchSession
from engine.cache import Forward, Group, visible_mask
from engine.geometry import SLIDING_ATTENTION
from engine.policy import LayerSpec, Policy


@dataclass
class Trace:
    """One forward's attention inputs per layer, batch dropped: q [heads, T, d], k and v [kv_heads, T, d]
    (q and k after their norms, before RoPE), cos / sin [T, d]."""

    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    cos: list[torch.Tensor]
    sin: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.k[0].shape[1]

    def features(self) -> torch.Tensor:
        """[T, layers * 2 * kv_heads * d]: every layer's K and V at each position (f_theta's input)."""
        parts = [
            x.permute(1, 0, 2).reshape(self.length, -1) for kv in zip(self.k, self.v, strict=True) for x in kv
        ]
        return torch.cat(parts, dim=1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate [heads, T, d] by the tables [T, d] (transformers' apply_rotary_pos_emb)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[None] + rotated * sin[None]


@torch.no_grad()
def capture(model: TorchModel, ids: Sequence[int]) -> Trace:
    """One full forward of `ids` (no cache, the model's own masks) recording each layer's Trace."""
    attns = model.attention_modules()
    n = len(attns)
    out: dict[str, list[Any]] = {name: [None] * n for name in ("q", "k", "v", "cos", "sin")}
    handles = []

    def heads(x: torch.Tensor, d: int) -> torch.Tensor:  # [1, h, T, d] or [1, T, h * d] -> [h, T, d]
        return x[0] if x.dim() == 4 else x[0].view(x.shape[1], -1, d).transpose(0, 1)

    for i, attn in enumerate(attns):
        d = attn.head_dim

        def pre(module: Any, args: Any, kwargs: dict[str, Any], i: int = i) -> None:
            cos, sin = kwargs["position_embeddings"]
            out["cos"][i], out["sin"][i] = cos[0], sin[0]

        def put(name: str, i: int = i, d: int = d) -> Any:
            def hook(module: Any, args: Any, output: torch.Tensor) -> None:
                out[name][i] = heads(output, d).clone()

            return hook

        handles.append(attn.register_forward_pre_hook(pre, with_kwargs=True))
        for name, sub in (("q", "q_norm"), ("k", "k_norm"), ("v", "v_norm")):
            module = getattr(attn, sub, None) or getattr(attn, f"{name}_proj")
            handles.append(module.register_forward_hook(put(name)))
    try:
        model.model.model(input_ids=torch.tensor([list(ids)]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return Trace(**out)


class Supply:
    """Post-RoPE K/V per layer [1, kv_heads, T, d] for positions [0, T), handed out by position."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor]) -> None:
        self.k, self.v = k, v
        self.length = k[0].shape[2]

    def kv(self, layer: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer].index_select(2, positions), self.v[layer].index_select(2, positions)


def truth(trace: Trace) -> Supply:
    """The verifier's own K/V: the identity restoration."""
    return supply_from(trace.k, trace.v, trace)


def supply_from(k: list[torch.Tensor], v: list[torch.Tensor], tables: Trace) -> Supply:
    """A supply from pre-RoPE keys and values [kv_heads, T, d], rotated with `tables`' RoPE."""
    return Supply(
        [rope(x, c, s)[None] for x, c, s in zip(k, tables.cos, tables.sin, strict=True)],
        [x[None] for x in v],
    )


def mix(alpha: float, true: Supply, restored: Supply) -> Supply:
    return Supply(
        [alpha * a + (1 - alpha) * b for a, b in zip(true.k, restored.k, strict=True)],
        [alpha * a + (1 - alpha) * b for a, b in zip(true.v, restored.v, strict=True)],
    )


def rel_mse(attended: Supply, true: Supply, layers: Sequence[int], positions: torch.Tensor) -> float:
    """||attended - true||^2 / ||true||^2 over K and V of `layers` at `positions`."""
    err = ref = 0.0
    for i in layers:
        for a, t in ((attended.k[i], true.k[i]), (attended.v[i], true.v[i])):
            a, t = a.index_select(2, positions), t.index_select(2, positions)
            err += float(((a - t) ** 2).sum())
            ref += float((t**2).sum())
    return err / ref if ref else 0.0


# --- the session ------------------------------------------------------------------------------------


def restored_mask(fwd: Forward, keys: np.ndarray, held: int, native: LayerSpec) -> np.ndarray:
    """The mask [queries, keys] of a forward whose `keys[:held]` are the cache's slots (masked by the
    policy) and `keys[held:]` supplied positions (masked by `native`, and hidden from a query that
    already sees the position through the cache)."""
    qp = fwd.queries
    cached = visible_mask(fwd.spec, qp, keys[:held])
    supplied = keys[held:]
    seen = np.isin(supplied, keys[:held])[None, :] & visible_mask(fwd.spec, qp, supplied)
    return np.concatenate((cached, visible_mask(native, qp, supplied) & ~seen), axis=1)


class SupplyRestorer:
    """The session hook (`engine.backends.torch.session.Restorer`) that restores, from `supply`, the
    positions below its length that a bounded group evicted and the model's own attention would see."""

    def __init__(self, supply: Supply, native_window: int | None) -> None:
        self.supply = supply
        self.native_window = native_window
        self.restoring: dict[int, torch.Tensor] = {}  # id(group) -> positions restored this forward

    def plan(self, group: Group, fwd: Forward) -> tuple[Forward, np.ndarray | None]:
        self.restoring.pop(id(group), None)
        if fwd.spec.window is None:  # an unbounded layer evicts nothing
            return fwd, None
        native = LayerSpec(0, self.native_window) if group.layer_type == SLIDING_ATTENTION else LayerSpec()
        end = min(fwd.start + fwd.plan.m, self.supply.length)
        lo = 0 if native.window is None else max(0, fwd.start - native.window + 1)
        if lo >= end:
            return fwd, None
        held = fwd.keys.size
        candidates = np.arange(lo, end, dtype=np.int64)
        needed = restored_mask(fwd, np.concatenate((fwd.keys, candidates)), held, native)[:, held:].any(
            axis=0
        )
        if not needed.any():
            return fwd, None
        chosen = candidates[needed]
        self.restoring[id(group)] = torch.from_numpy(chosen)
        keys = np.concatenate((fwd.keys, chosen))
        plan = replace(fwd.plan, sinks_hidden=False)  # restored keys follow: a mask of its own
        return replace(fwd, plan=plan, keys=keys), restored_mask(fwd, keys, held, native)

    def kv(self, layer: int, group: Group) -> tuple[torch.Tensor, torch.Tensor] | None:
        positions = self.restoring.get(id(group))
        return None if positions is None else self.supply.kv(layer, positions)


def restored_session(
    model: TorchModel, policy: Policy, supply: Supply, max_block: int = 1, prefill_chunk: int = 512
) -> TorchSession:
    """A TorchSession whose evicted positions (below the supply's length) are restored from `supply`."""
    restorer = SupplyRestorer(supply, model.geometry.sliding_window)
    return TorchSession(model, policy, max_block, prefill_chunk, restorer=restorer)


# --- f_theta -----------------------------------------------------------------------------------------


class FTheta(nn.Module):
    """Low-rank maps from a drafter's K/V features at a position (`Trace.features`) to each verifier
    layer's pre-RoPE K and V there: a shared encoder to `rank` (one for K, one for V) and a decoder per
    verifier layer."""

    def __init__(self, d_in: int, rank: int, kv_heads: int, head_dim: int, layers: int) -> None:
        super().__init__()
        self.kv_heads, self.head_dim = kv_heads, head_dim
        out = kv_heads * head_dim
        self.enc_k, self.enc_v = nn.Linear(d_in, rank), nn.Linear(d_in, rank)
        self.dec_k = nn.ModuleList(nn.Linear(rank, out) for _ in range(layers))
        self.dec_v = nn.ModuleList(nn.Linear(rank, out) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """x [T, d_in] -> per layer k, v [kv_heads, T, d]."""
        t = x.shape[0]

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(t, self.kv_heads, self.head_dim).transpose(0, 1)

        hk, hv = self.enc_k(x), self.enc_v(x)
        return [heads(d(hk)) for d in self.dec_k], [heads(d(hv)) for d in self.dec_v]

    @torch.no_grad()
    def supply(self, drafter: Trace, tables: Trace) -> Supply:
        """The restored K/V of a prompt: f_theta over the drafter's trace, rotated with the verifier's
        RoPE tables (`tables`: a trace of the verifier, or anything with its cos / sin per layer)."""
        k, v = self(drafter.features())
        return supply_from(k, v, tables)

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())


def attention_output(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, queries: torch.Tensor, spec: LayerSpec, scaling: float
) -> torch.Tensor:
    """Attention of the post-RoPE queries q [heads, len(queries), d] at positions `queries` over post-RoPE
    k, v [kv_heads, T, d] (positions 0..T-1) under `spec`'s rule (GQA: kv heads repeated)."""
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    allowed = torch.from_numpy(visible_mask(spec, queries.numpy(), np.arange(k.shape[1])))
    scores = (q @ k.transpose(1, 2)) * scaling
    return scores.masked_fill(~allowed[None], float("-inf")).softmax(-1) @ v


class TrainResult(BaseModel):
    """How f_theta's training went: steps, rows of `row_tokens` positions, and the first and last step's
    loss and relative MSE of the K/V and of the attention output (the restoration workload reports it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    steps: int
    rows: int
    row_tokens: int
    first_loss: float
    last_loss: float
    first_kv_rel_mse: float
    last_kv_rel_mse: float
    first_attn_rel_mse: float
    last_attn_rel_mse: float


def train_ftheta(
    f: FTheta,
    pairs: Sequence[tuple[Trace, Trace]],
    layer_types: Sequence[str],
    native_window: int | None,
    scaling: float,
    steps: int,
    lr: float = 3e-3,
    attn_weight: float = 1.0,
    queries: int = 32,
    seed: int = 0,
) -> TrainResult:
    """Fit f on (drafter trace, verifier trace) pairs: relative K/V MSE (pre-RoPE; RoPE keeps norms) plus
    relative attention-output MSE of each layer's last `queries` positions (true queries, post-RoPE K/V
    restored vs true, the layer's native mask), Adam, one pair per step in turn. Deterministic per seed."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(f.parameters(), lr=lr)
    specs = [LayerSpec(0, native_window) if t == SLIDING_ATTENTION else LayerSpec() for t in layer_types]
    data = []
    for drafter, verifier in pairs:
        t = verifier.length
        pos = torch.arange(max(0, t - queries), t)
        rot_q = [
            rope(q[:, pos], c[pos], s[pos])
            for q, c, s in zip(verifier.q, verifier.cos, verifier.sin, strict=True)
        ]
        rot_k = [rope(k, c, s) for k, c, s in zip(verifier.k, verifier.cos, verifier.sin, strict=True)]
        outs = [
            attention_output(q, k, v, pos, sp, scaling)
            for q, k, v, sp in zip(rot_q, rot_k, verifier.v, specs, strict=True)
        ]
        data.append((drafter.features(), verifier, pos, rot_q, outs))
    history: list[tuple[float, float, float]] = []
    for step in range(steps):
        x, verifier, pos, rot_q, outs = data[step % len(data)]
        k_hat, v_hat = f(x)
        kv = sum(
            ((kh - k) ** 2).sum() / (k**2).sum() + ((vh - v) ** 2).sum() / (v**2).sum()
            for kh, vh, k, v in zip(k_hat, v_hat, verifier.k, verifier.v, strict=True)
        ) / (2 * len(k_hat))
        attn = sum(
            ((attention_output(q, rope(kh, c, s), vh, pos, sp, scaling) - o) ** 2).sum() / (o**2).sum()
            for q, kh, vh, c, s, sp, o in zip(
                rot_q, k_hat, v_hat, verifier.cos, verifier.sin, specs, outs, strict=True
            )
        ) / len(k_hat)
        loss = kv + attn_weight * attn
        opt.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        opt.step()
        history.append((float(loss.detach()), float(kv.detach()), float(attn.detach())))  # type: ignore[union-attr]
    if not history:
        raise ValueError("train_ftheta needs steps >= 1")
    ends = {  # first_loss, last_loss, first_kv_rel_mse, ...: the first and the last step's (loss, kv, attn)
        f"{end}_{name}": value
        for end, step in (("first", history[0]), ("last", history[-1]))
        for name, value in zip(("loss", "kv_rel_mse", "attn_rel_mse"), step, strict=True)
    }
    return TrainResult(steps=steps, rows=len(pairs), row_tokens=pairs[0][1].length, **ends)
