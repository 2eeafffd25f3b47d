"""Random-weight drafters for the engine tests (float32, cached per process): a block drafter built to a
verifier's features (its hidden size, the layers it reads) and a masked-diffusion drafter over the tiny
models' vocabulary, each also saved to a temporary directory so both backends load the same weights.
Exactness never needs good drafts: their mostly-wrong blocks exercise the verifier's rollback."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import engine
from engine.drafters.block.config import BlockConfig
from engine.drafters.block.torch import BlockDrafterModel
from engine.drafters.diffusion.config import DiffusionConfig
from engine.drafters.diffusion.drafter import DiffusionDrafter
from engine.drafters.diffusion.torch import TinyDLM, save_model
from engine.drafters.load import block_drafters, diffusion_model
from engine.policy import Policy
from tests.engine.tiny_models import VOCAB

_TMP = Path(tempfile.mkdtemp(prefix="kakeya-drafters-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
KINDS = ["block", "diffusion"]


@functools.cache
def block_model(
    window: int = 64,
    seed: int = 0,
    target_layers: tuple[int, ...] = (1, 4),
    target_hidden_size: int = 64,
    vocab: int = VOCAB,
) -> BlockDrafterModel:
    """A random-weight block drafter reading `target_layers` of a verifier of `target_hidden_size` (default:
    the tiny Gemma's features, hidden 64, 4 layers)."""
    torch.manual_seed(seed)
    config = BlockConfig(
        verifier="tests",
        vocab_size=vocab,
        target_layers=list(target_layers),
        target_hidden_size=target_hidden_size,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=2,
        head_dim=16,
        block_size=8,
        window=window,
    )
    return BlockDrafterModel(config).eval()


@functools.cache
def block_dir(target_layers: tuple[int, ...], target_hidden_size: int, vocab: int = VOCAB) -> Path:
    """`block_model(...)`'s weights saved as a drafter directory (engine.drafters.load reads it)."""
    path = _TMP / f"block-{'-'.join(map(str, target_layers))}-{target_hidden_size}-{vocab}"
    block_model(target_layers=target_layers, target_hidden_size=target_hidden_size, vocab=vocab).save(path)
    return path


@functools.cache
def dlm_dir(vocab: int = VOCAB) -> Path:
    """A random-weight diffusion drafter model over the tiny models' vocabulary, saved so both backends load it."""
    torch.manual_seed(3)
    cfg = DiffusionConfig(
        vocab_size=vocab,
        hidden=32,
        layers=1,
        heads=2,
        intermediate=64,
        max_positions=24,
        context=12,
    )
    path = _TMP / f"random-dlm-{vocab}"
    save_model(TinyDLM(cfg), path)
    return path


def drafter(kind: str, verifier: Any) -> Any:
    """A fresh random drafter of `kind` ("block", "diffusion") for the engine model `verifier`, on its backend:
    the block drafter reads the verifier's first layer's output and its final hidden state."""
    if kind == "block":
        geo = verifier.geometry
        return block_drafters(block_dir((1, geo.n_layers), geo.hidden_size), verifier.backend)()
    if kind == "diffusion":
        return DiffusionDrafter(diffusion_model(dlm_dir(), verifier.backend), steps=3)
    raise ValueError(f"unknown drafter kind {kind!r}")


class Prefixed:
    """A drafter whose proposals start with a correct prefix: the first j tokens of each block are the known
    continuation `want` (the greedy output), the rest the wrapped drafter's own (mostly wrong) tokens, with
    j cycling 0, 1, ..., k over the blocks: blocks are partly rejected at every length while the wrapped
    drafter runs its whole path (proposing, observing the verifier's features, accepting)."""

    def __init__(self, inner: Any, want: Sequence[int]) -> None:
        self.inner = inner
        self.want = list(want)
        self.done = self.blocks = 0

    def __getattr__(self, name: str) -> Any:  # layers, observe, position, ...: the wrapped drafter's
        return getattr(self.inner, name)

    def begin(self, prompt: Sequence[int]) -> None:
        self.inner.begin(prompt)
        self.done, self.blocks = 1, 0  # the prefill commits the first token

    def propose(self, last: int, k: int) -> list[int]:
        own = self.inner.propose(last, k)
        j = self.blocks % (k + 1)
        self.blocks += 1
        return [*self.want[self.done : self.done + j], *own[j:]][: len(own)]

    def accept(self, n: int, committed: Sequence[int]) -> None:
        self.inner.accept(n, committed)
        self.done += len(committed)


def prefixed_generate(
    kind: str, verifier: Any, policy: Policy, prompt: list[int], want: Sequence[int]
) -> Any:
    """Speculative decoding of len(want) tokens (k = 4) on `verifier` under `policy` with a random drafter of
    `kind` whose blocks start with a correct prefix of every length (`Prefixed`): the engine.Generation. A
    block drafter must have read the verifier's features of every fed position but the last block's."""
    session = verifier.session(policy, max_block=5, prefill_chunk=8)
    prefixed = Prefixed(drafter(kind, verifier), want)
    gen = engine.speculative_generate(session, prefixed, prompt, 4, engine.Stop(len(want)))
    if kind == "block":
        assert session.position - 5 <= prefixed.position < session.position == len(prompt) + len(want) - 1
    return gen
