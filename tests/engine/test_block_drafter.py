"""The block drafter (engine/drafters/block.py): speculative decoding with it emits exactly the tokens
of greedy decoding under every policy (long after the window wrapped, prompts longer than a prefill
chunk); its cached context is exactly the projection of the verifier's features of the committed
positions; the committed zoo drafter accepts long blocks on code; its trainer runs (--smoke)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

import engine
from engine.drafters.block.config import BlockConfig
from engine.drafters.block.torch import BlockDrafter, BlockDrafterModel
from engine.drafters.load import load_block_drafter
from engine.policy import Policy, full, hybrid, sink_window
from engine.zoo import block as zoo_block
from engine.zoo import corpus
from tests.engine import tiny_models

NEW = 100
POLICIES = [full(), sink_window(4, 8), sink_window(0, 5), hybrid(2, 6)]


@functools.cache
def _random_drafter(window: int = 64, seed: int = 0, vocab: int = tiny_models.VOCAB) -> BlockDrafterModel:
    """A random-weight block drafter on the tiny Gemma's features (hidden 64, 4 layers)."""
    torch.manual_seed(seed)
    config = BlockConfig(
        verifier="tests",
        vocab_size=vocab,
        target_layers=[1, 4],
        target_hidden_size=64,
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
def _greedy(policy: Policy, prompt_len: int) -> tuple[int, ...]:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    session = tiny_models.gemma().session(policy, prefill_chunk=16)
    return tuple(engine.generate(session, ids, engine.Stop(NEW)).tokens)


class Oracle(BlockDrafter):
    """A block drafter that knows the greedy output (and errs at every 7th position): it exercises
    partial acceptance of every length through the same feature path as the real one."""

    def __init__(self, model: BlockDrafterModel, prompt: list[int], want: tuple[int, ...]) -> None:
        super().__init__(model)
        self.text = [*prompt, *want]

    def propose(self, last: int, k: int) -> list[int]:
        real = super().propose(last, k)  # the model's forward still runs on the observed context
        assert len(real) == min(k, 8)
        at = self.position + 1
        return [
            t if (at + i) % 7 else (t + 1) % tiny_models.VOCAB for i, t in enumerate(self.text[at : at + k])
        ]


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("policy", POLICIES, ids=str)
@pytest.mark.parametrize("kind", ["random", "oracle"])
def test_block_speculative_equals_greedy(policy: Policy, k: int, kind: str) -> None:
    prompt_len = [3, 40, 17][k % 3]
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    want = _greedy(policy, prompt_len)
    model = _random_drafter()
    drafter = BlockDrafter(model) if kind == "random" else Oracle(model, ids, want[:-1])
    verifier = tiny_models.gemma().session(policy, max_block=k + 1, prefill_chunk=16)
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == want
    # every fed position but the final block's is observed (no block follows it)
    assert verifier.position - k - 1 <= drafter.position < verifier.position == len(ids) + NEW - 1
    assert sum(gen.position_accepted) == gen.accepted and sum(gen.position_drafted) == gen.drafted
    if kind == "oracle" and k > 1:
        assert 0 < gen.accepted < gen.drafted


def test_block_context_is_the_projection_of_the_committed_positions_features() -> None:
    """After a generation with rejections, the cached context K/V (window 16, compacted several times)
    equals each drafter layer's K/V of the full-cache verifier's hidden states of the fed tokens."""
    tm = tiny_models.gemma()
    model = _random_drafter(window=16)
    ids = tiny_models.prompt(40, seed=40)
    drafter = BlockDrafter(model)
    gen = engine.speculative_generate(tm.session(full(), max_block=5), drafter, ids, 4, engine.Stop(NEW))
    assert 0 < gen.forwards < NEW and drafter.position > len(ids) + NEW - 6
    fed = torch.tensor([[*ids, *gen.tokens][: drafter.position]])
    with torch.inference_mode():
        hs = tm.model(input_ids=fed, output_hidden_states=True, use_cache=False).hidden_states
        ctx = model.context(torch.cat([hs[i][0] for i in model.config.target_layers], -1))
        pos = torch.arange(fed.shape[1])
        assert drafter.length <= 2 * (16 + 5)  # compacted: bounded by the window, not the sequence
        for layer, (kb, vb) in zip(model.layers, drafter.kv, strict=True):
            k, v = layer.kv(ctx, pos)
            torch.testing.assert_close(kb[:, drafter.length - 16 : drafter.length], k[:, -16:])
            torch.testing.assert_close(vb[:, drafter.length - 16 : drafter.length], v[:, -16:])


@pytest.mark.parametrize("policy", [full(), hybrid(4, 64), hybrid(4, 16), sink_window(4, 16)], ids=str)
def test_zoo_block_drafter_is_exact_and_accepts_long_blocks(policy: Policy) -> None:
    verifier = engine.load("zoo:tiny-hybrid")
    drafter = load_block_drafter("zoo:tiny-block-drafter")
    for seed in (5, 6):
        ids = verifier.encode(corpus.code_prompts(1, seed=seed, n_tokens=80)[0])
        want = engine.generate(verifier.session(policy), ids, engine.Stop(150))
        got = engine.speculative_generate(
            verifier.session(policy, max_block=9), drafter, ids, 8, engine.Stop(150)
        )
        assert got.tokens == want.tokens
        assert got.accepted > 0
        if policy == full():  # the policy it was trained and carded under (card: 6.67 on code at k = 8)
            assert got.acceptance_length >= 4.0, got.position_acceptance
            assert got.position_acceptance[0] > 0.75


def test_block_drafter_loader_refuses_another_model() -> None:
    with pytest.raises(
        ValueError, match="zoo:tiny-drafter is a model drafter .* not a block drafter: use model:"
    ):
        load_block_drafter("zoo:tiny-drafter")


def test_block_trainer_smoke(tmp_path: Path) -> None:
    out = tmp_path / "drafter"
    assert zoo_block.main(["--out", str(out), "--smoke", "--threads", "1"]) == 0
    record = json.loads((out / "train_record.json").read_text())
    assert record["recipe"]["steps"] == 4 and record["final_loss"] > 0
    assert [e["text"] for e in record["eval"]] == ["code", "haystack"]
    for e in record["eval"]:
        assert e["acceptance_length"] >= 1.0 and len(e["position_acceptance"]) == 8
    assert "python -m engine.zoo.block --out" in (out / "README.md").read_text()
    # the written drafter loads and drafts for its verifier
    drafter = load_block_drafter(str(out))
    verifier = engine.load("zoo:tiny-hybrid")
    ids = verifier.encode(corpus.code_prompts(1, seed=1, n_tokens=40)[0])
    want = engine.generate(verifier.session(full()), ids, engine.Stop(30))
    assert (
        engine.speculative_generate(
            verifier.session(full(), max_block=9), drafter, ids, 8, engine.Stop(30)
        ).tokens
        == want.tokens
    )
    # the throughput workload picks it by its directory and reports acceptance per draft position
    from engine.workloads import throughput

    report = tmp_path / "throughput.json"
    argv = ["--model", "zoo:tiny-hybrid", "--drafter", str(out), "--k", "8", "--prompts", "1"]
    argv += ["--new-tokens", "24", "--repeats", "1", "--threads", "1", "--out", str(report), "--plot", "none"]
    assert throughput.main(argv) == 0
    summary = json.loads(report.read_text())["summary"]
    assert summary["all_exact"] and len(summary["position_acceptance"]) == 8
