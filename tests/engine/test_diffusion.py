"""The masked-diffusion drafter (engine/drafters/diffusion/, zoo:tiny-dlm): speculative decoding with
it is exactly greedy under every policy after the window has wrapped, on torch and MLX; it holds no
K/V; its LM head sees the masked positions only; its trainer is deterministic; both backends agree."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import engine
from engine.drafters.diffusion.config import DiffusionConfig
from engine.drafters.diffusion.drafter import DiffusionDrafter
from engine.drafters.diffusion.torch import TinyDLM, TorchDiffusionModel, save_model
from engine.drafters.load import load_diffusion_model
from engine.policy import Policy, full, hybrid, sink_window
from engine.zoo import corpus
from tests.engine import tiny_models
from tests.engine.backends import BACKENDS, HAVE_MLX, on

MLX_MARKS = BACKENDS[1].marks
ZOO_POLICIES = [full(), sink_window(4, 16), hybrid(4, 16)]


def _both(cases: list[tuple]) -> list:
    return [pytest.param(*c, "torch", id=f"torch-{c}") for c in cases] + [
        pytest.param(*c, "mlx", marks=MLX_MARKS, id=f"mlx-{c}") for c in cases
    ]


@functools.cache
def _random_dlm_dir(vocab: int = tiny_models.VOCAB) -> Path:
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
    path = Path(tempfile.mkdtemp(prefix="kakeya-dlm-")) / "random-dlm"
    save_model(TinyDLM(cfg), path)
    return path


@functools.cache
def _zoo_greedy(backend: str, policy: Policy) -> tuple[int, ...]:
    verifier = engine.load("zoo:tiny-hybrid", backend=backend)  # type: ignore[arg-type]
    return tuple(engine.generate(verifier.session(policy), _zoo_ids(), engine.Stop(150)).tokens)


def _zoo_ids() -> list[int]:
    return engine.load("zoo:tiny-hybrid").encode(corpus.code_prompts(1, seed=5, n_tokens=80)[0])


@pytest.mark.parametrize(
    ("policy", "k", "backend"),
    _both([(p, 8) for p in ZOO_POLICIES])
    + [pytest.param(sink_window(4, 16), 3, "torch", id="torch-sink-k3")],
)
def test_zoo_pair_is_exactly_greedy_after_the_wrap(policy: Policy, k: int, backend: str) -> None:
    # an 80-token prompt and 150 new tokens: windows of 16 have wrapped long before the end
    verifier = engine.load("zoo:tiny-hybrid", backend=backend)  # type: ignore[arg-type]
    drafter = DiffusionDrafter(load_diffusion_model("zoo:tiny-dlm", backend=backend), steps=4)  # type: ignore[arg-type]
    got = engine.speculative_generate(
        verifier.session(policy, max_block=k + 1), drafter, _zoo_ids(), k, engine.Stop(150)
    )
    assert tuple(got.tokens) == _zoo_greedy(backend, policy)
    assert got.accepted > 0 and got.acceptance_length > 1.0
    assert drafter.forwards <= got.forwards * min(4, k)  # bounded denoising steps per block


@pytest.mark.parametrize(
    ("policy", "k", "backend"),
    _both([(sink_window(4, 8), 8), (hybrid(2, 6), 4)])
    + [pytest.param(p, k, "torch", id=f"torch-{p}-{k}") for p in (full(), sink_window(0, 5)) for k in (1, 8)],
)
def test_random_diffusion_drafter_is_exactly_greedy(policy: Policy, k: int, backend: str) -> None:
    tm = on(backend, tiny_models.gemma())
    ids = tiny_models.prompt(40, seed=40)
    want = engine.generate(tm.session(policy), ids, engine.Stop(100))
    dlm = load_diffusion_model(str(_random_dlm_dir()), backend=backend)  # type: ignore[arg-type]
    got = engine.speculative_generate(
        tm.session(policy, max_block=k + 1), DiffusionDrafter(dlm, steps=3), ids, k, engine.Stop(100)
    )
    assert got.tokens == want.tokens and got.drafted > 0


def test_holds_no_kv_and_runs_the_head_on_masked_positions_only() -> None:
    dlm = load_diffusion_model("zoo:tiny-dlm")
    assert isinstance(dlm, TorchDiffusionModel)
    before = {k: v.clone() for k, v in dlm.model.state_dict().items()}
    seen: dict[str, list[tuple[int, ...]]] = {"head": [], "trunk": []}
    hooks = [
        dlm.model.head.register_forward_hook(lambda m, a, o: seen["head"].append(tuple(a[0].shape))),
        dlm.model.blocks[0].register_forward_hook(lambda m, a, o: seen["trunk"].append(tuple(a[0].shape))),
    ]
    try:
        drafter = DiffusionDrafter(dlm, context=48, steps=4)
        ids = _zoo_ids()
        drafter.begin(ids[:-1])
        drafts = drafter.propose(ids[-1], 8)
        drafter.accept(2, [*drafts[:2], 5])
        assert len(drafter.propose(5, 3)) == 3
    finally:
        for h in hooks:
            h.remove()
    hidden = dlm.config.hidden
    # k=8 in 4 steps unmasks 2 per step: the head sees 8, 6, 4, 2 rows; then k=3 in 3 steps: 3, 2, 1
    assert seen["head"] == [(n, hidden) for n in (8, 6, 4, 2, 3, 2, 1)]
    assert seen["trunk"] == [(1, 48 + 8, hidden)] * 4 + [(1, 48 + 3, hidden)] * 3
    assert len(drafts) == 8 and all(0 <= t < dlm.config.vocab_size for t in drafts)
    # between blocks: nothing but the committed tail (token ids), and unchanged weights
    assert drafter.kv_bytes() == 0
    assert set(vars(drafter)) == {"model", "steps", "context_len", "max_k", "committed", "forwards"}
    assert len(drafter.committed) == 48 and all(type(t) is int for t in drafter.committed)
    after = dlm.model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_proposal_length_is_bounded_by_the_model() -> None:
    dlm = load_diffusion_model(str(_random_dlm_dir()))
    drafter = DiffusionDrafter(dlm)  # context 12 of 24 positions: at most 12 mask slots
    drafter.begin([5, 6, 7])
    assert len(drafter.propose(8, 20)) == 12 and drafter.propose(9, 0) == []
    with pytest.raises(ValueError, match="context must be in"):
        DiffusionDrafter(dlm, context=24)
    with pytest.raises(
        ValueError, match="is a model drafter .* not a diffusion drafter: use model:zoo:tiny-hybrid"
    ):
        load_diffusion_model("zoo:tiny-hybrid")


def test_trainer_smoke_is_deterministic(tmp_path: Path) -> None:
    from engine.zoo import dlm as trainer

    for name in ("a", "b"):
        assert trainer.main(["--smoke", "--out", str(tmp_path / name)]) == 0
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert {p.name for p in a.iterdir()} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "train_record.json",
    }
    drafter = DiffusionDrafter(load_diffusion_model(str(a)))
    drafter.begin([2, 10, 11])
    assert len(drafter.propose(12, 4)) == 4


@pytest.mark.skipif(not HAVE_MLX, reason="mlx not installed")
def test_committed_tiny_dlm_agrees_on_torch_and_mlx() -> None:
    backends = {b: load_diffusion_model("zoo:tiny-dlm", backend=b) for b in ("torch", "mlx")}  # type: ignore[arg-type]
    for i, text in enumerate(corpus.code_prompts(6, seed=77, n_tokens=60)):
        ids = engine.load("zoo:tiny-hybrid").encode(text)
        block = [backends["torch"].config.mask_id] * 8
        (tt, pt), (tm, pm) = (backends[b].predict(ids[:-8], block, range(8)) for b in ("torch", "mlx"))
        assert tt == tm and pt == pytest.approx(pm, abs=1e-4)
        proposals = []
        for dlm in backends.values():
            d = DiffusionDrafter(dlm, steps=1 + i % 4)
            d.begin(ids[:-1])
            proposals.append(d.propose(ids[-1], 8))
        assert proposals[0] == proposals[1]


@functools.cache
def _tiny_diffusion_gemma() -> Any:
    """A random DiffusionGemma (MoE text encoder/decoder, a minimal vision tower) over the tiny vocab."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    text = dict(
        vocab_size=tiny_models.VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        num_experts=2,
        top_k_experts=1,
        moe_intermediate_size=32,
        initializer_range=0.2,
    )
    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=16,
        position_embedding_size=64,
    )
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=8)
    return DiffusionGemmaForBlockDiffusion(config)


@pytest.mark.parametrize("policy", [full(), sink_window(4, 8), hybrid(2, 6)], ids=str)
def test_diffusion_gemma_drafter_is_exactly_greedy(policy: Policy) -> None:
    from engine.drafters.diffusion.gemma import DiffusionGemmaModel

    model = _tiny_diffusion_gemma()
    rows: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda m, a, o: rows.append(a[0].shape[0]))
    try:
        tm = tiny_models.gemma()
        ids = tiny_models.prompt(40, seed=40)
        drafter = DiffusionDrafter(DiffusionGemmaModel(model, context=24), steps=2)
        got = engine.speculative_generate(tm.session(policy, max_block=9), drafter, ids, 8, engine.Stop(60))
    finally:
        hook.remove()
    assert got.tokens == engine.generate(tm.session(policy), ids, engine.Stop(60)).tokens
    # a full block of 8 in 2 steps: the head runs on 8 then 4 slots, never on the context
    assert rows[:2] == [8, 4] and max(rows) == 8 and drafter.kv_bytes() == 0
