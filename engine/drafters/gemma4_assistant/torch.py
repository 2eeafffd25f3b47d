"""Gemma 4's assistant (transformers' `Gemma4AssistantForCausalLM`, model_type gemma4_assistant) as an
engine.speculative `FeatureDrafter` for Gemma 4 verifiers on the PyTorch backend.

The assistant is a small Gemma 4 whose layers all reuse K/V: it has no cache of its own and attends,
through cross-attention, to the verifier's post-RoPE K/V of its last full-attention layer and its last
sliding-attention layer (those whose `kv_sharing_modes` is "store"; on a verifier without shared layers,
the last layer of each kind). Its input at each step is the verifier's input embedding of the newest
token concatenated with a hidden state of the verifier's size; its position id stays that of the newest
committed token for the whole block, as transformers' `SinglePositionMultiTokenCandidateGenerator` runs it.

One block, after the committed token `last` at position p (the verifier has fed positions [0, p)):
  1. h = the verifier's last hidden state (after the final norm) at position p - 1, from the very forward
     that fed it (`observe`: no extra forward);
  2. K/V = for each of the two layers, the K/V that the verifier's query at p - 1 attended in that layer,
     gathered from the cache's slots into position order (see below);
  3. k steps: logits, h' = assistant([embed(t), h], position p, K/V); t = argmax; h = h'.
The k drafted ids stay on the device until one host copy at the end of the block.

What K/V the assistant sees. Exactly the positions the verifier's newest fed position (p - 1) attended
in that layer under the session's cache policy, in position order, i.e. the context from which h was
computed:
  - full: the full layer every position [0, p); the sliding layer its native window, the last
    `sliding_window` positions. This is transformers' own assisted generation for the first block.
  - sink_window(sink, W): on both layers the sinks and the last W positions (on the sliding layer
    intersected with its native window), as the verifier attends them.
  - hybrid(sink, W): the full layer every position (exact K/V kept); the sliding layer its sinks + window
    intersected with its native window.
A ring buffer holds its slots out of position order once the window wraps (engine/cache.py), while the
assistant's sliding mask (built by flipping the K/V axis) assumes position order: hence the gather, by
the group's slot -> position table (the selection is what matters: the raw ring holds the slack's
stale and trimmed slots too, and in slot order the flip would keep the wrong ones). The gathered
sliding set never exceeds the verifier's native window; an assistant with a narrower window keeps its
most recent positions, as intended. Whatever the assistant proposes, the verifier decides: the output
is exactly greedy under every policy.

Later blocks differ from transformers' candidate generator on purpose: after a verify forward it slices
the target's K/V to the new sequence length, which keeps the K/V of the first rejected draft at the
position of the verifier's correction token (and, on a sliding layer past its window, every rejected
draft); here the assistant sees only committed positions, through the cache's own bookkeeping.

Not supported: quantized K/V policies (`...:q8`) and batched sessions (rows > 1), refused on creation.

transformers 5.23's `Gemma4TextConfig.kv_sharing_modes` rejects a config whose layers are all shared
(the assistant's own), so constructing or loading an assistant raises; `assistant_model` /
`load_assistant_model` build it with that one property answering "reuse" for every layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Gemma4AssistantForCausalLM, Gemma4TextConfig

from engine.backends.torch.session import TorchSession
from engine.drafters.gemma4_assistant.config import MODEL_TYPE, shared_layers
from engine.sampling import Sampling, draw


@contextlib.contextmanager
def all_shared_kv() -> Iterator[None]:
    """While it is active, a Gemma 4 text config whose layers are all KV-shared reports every layer as
    "reuse" (transformers 5.23 raises instead, so no assistant can be built); other configs unchanged."""
    original = Gemma4TextConfig.__dict__["kv_sharing_modes"]

    def modes(self: Any) -> list[str | None]:
        if self.num_kv_shared_layers == self.num_hidden_layers:
            return ["reuse"] * self.num_hidden_layers
        return original.fget(self)

    Gemma4TextConfig.kv_sharing_modes = property(modes)  # type: ignore[assignment]
    try:
        yield
    finally:
        Gemma4TextConfig.kv_sharing_modes = original  # type: ignore[assignment]


def assistant_model(config: Any) -> Any:
    """A random-weight `Gemma4AssistantForCausalLM` from its config (tests)."""
    with all_shared_kv():
        return Gemma4AssistantForCausalLM(config).eval()


def load_assistant_model(path: Path, device: torch.device, dtype: torch.dtype) -> Any:
    with all_shared_kv():
        model = Gemma4AssistantForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


class Gemma4AssistantDrafter:
    """The engine.speculative `FeatureDrafter` over a Gemma 4 assistant and the verifier's session (whose
    K/V it reads). Make a new one (or call `begin`) for each generation, with that generation's session."""

    def __init__(self, assistant: Any, verifier: TorchSession) -> None:
        text = verifier.owner.text_config
        if getattr(text, "model_type", "") != "gemma4_text":
            raise ValueError(
                f"Gemma 4's assistant drafts for Gemma 4 verifiers (this one is {text.model_type})"
            )
        if assistant.config.model_type != MODEL_TYPE:
            raise ValueError(f"not a Gemma 4 assistant (model_type {assistant.config.model_type!r})")
        if assistant.config.backbone_hidden_size != text.hidden_size:
            raise ValueError(
                f"the assistant was made for a verifier of hidden size {assistant.config.backbone_hidden_size}, "
                f"this verifier's is {text.hidden_size}"
            )
        if verifier.rows != 1:
            raise ValueError("Gemma 4's assistant drafts for an unbatched session (rows=1)")
        if verifier.policy.bits:
            raise ValueError(
                f"Gemma 4's assistant reads the verifier's K/V as stored in the model dtype; this session "
                f"stores them quantized ({verifier.policy}: use a policy without :qN)"
            )
        self.assistant = assistant.eval()
        self.verifier = verifier
        self.embed = verifier.owner.input_embeddings()
        self.by_kind = shared_layers(text)
        self.layers = (len(verifier.specs),)  # the last hidden state, after the final norm
        self.device = verifier.device
        self.hidden: torch.Tensor | None = None  # [1, 1, hidden]: the newest fed position's

    def begin(self, prompt: Sequence[int]) -> None:
        self.hidden = None

    def observe(self, hidden: dict[int, Any], rows: int) -> None:
        if rows:
            self.hidden = hidden[self.layers[0]][rows - 1 : rows][None]

    def context(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per layer kind, the K/V [1, kv_heads, n, head_dim] of the positions the verifier's newest fed
        position attended in that layer, in position order (module docstring; `TorchSession.attended_kv`)."""
        return {kind: self.verifier.attended_kv(layer) for kind, layer in self.by_kind.items()}

    @torch.inference_mode()
    def propose(self, last: int, k: int) -> list[int]:
        if k == 0:
            return []
        if self.hidden is None:
            raise RuntimeError("the assistant drafts after the verifier's features were observed")
        kv = self.context()
        position = torch.tensor([[self.verifier.position]], device=self.device)
        token = torch.tensor([[last]], device=self.device)
        hidden = self.hidden.to(self.embed.weight.dtype)
        drafts = []
        for _ in range(k):
            x = torch.cat((self.embed(token), hidden), -1)
            out = self.assistant(inputs_embeds=x, position_ids=position, shared_kv_states=kv, use_cache=False)
            token = out.logits[:, -1:].argmax(-1)
            hidden = out.last_hidden_state
            drafts.append(token)
        return torch.cat(drafts, -1)[0].tolist()

    @torch.inference_mode()
    def propose_sampled(
        self, last: int, k: int, sampling: Sampling, rng: np.random.Generator
    ) -> tuple[list[int], np.ndarray]:
        """Speculative sampling (engine.speculative's `SamplingDrafter`): as `propose`, each draft drawn
        from the assistant's distribution under `sampling` after the drafts before it (autoregressive), so
        q_j is what draft j was drawn from given them, as the rejection rule needs."""
        if k == 0:
            return [], np.zeros((0, self.embed.weight.shape[0]))
        if self.hidden is None:
            raise RuntimeError("the assistant drafts after the verifier's features were observed")
        kv = self.context()
        position = torch.tensor([[self.verifier.position]], device=self.device)
        token = torch.tensor([[last]], device=self.device)
        hidden = self.hidden.to(self.embed.weight.dtype)
        drafts: list[int] = []
        qs = []
        for _ in range(k):
            x = torch.cat((self.embed(token), hidden), -1)
            out = self.assistant(inputs_embeds=x, position_ids=position, shared_kv_states=kv, use_cache=False)
            q = sampling.probs(out.logits[0, -1:])
            drafts.append(int(draw(q, rng)[0]))
            qs.append(q[0])
            token = torch.tensor([[drafts[-1]]], device=self.device)
            hidden = out.last_hidden_state
        return drafts, np.stack(qs)

    def accept(self, n: int, committed: Sequence[int]) -> None:
        """Nothing to roll back: the assistant keeps no state between blocks but the observed features."""
