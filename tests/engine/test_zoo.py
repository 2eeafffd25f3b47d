"""The model zoo: corpus generator, tokenizer, trainer (a few steps) and the committed models."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.models import ZOO_DIR as ZOO_MODELS
from engine.zoo import corpus, tokenizer
from engine.zoo.evaluate import acceptance, needle_recall
from engine.zoo.train import main as train_main

ROOT = Path(__file__).resolve().parents[2]
HYBRID = ZOO_MODELS / "tiny-hybrid"
DRAFTER = ZOO_MODELS / "tiny-drafter"


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    return tokenizer.build()


# --- corpus ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_tokens", [40, 300, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_haystack_has_exact_length_and_needle_where_it_says(tok, n_tokens, depth):
    nd = corpus.haystack(n_tokens, depth, seed=5)
    ids = tok(nd.prompt).input_ids
    assert len(ids) == nd.n_tokens == n_tokens
    assert tokenizer.TOKEN_IDS[corpus.UNK] not in ids
    words = tok.convert_ids_to_tokens(ids)
    assert words[nd.needle_pos : nd.needle_end] == [nd.key, ":", *nd.answer.split(), "."]
    assert words[-corpus.QUERY_TOKENS :] == ["?", nd.key, ":"]
    assert words.count(nd.key) == 2  # the needle and the query, nowhere else
    n_filler = n_tokens - 1 - (nd.needle_end - nd.needle_pos) - corpus.QUERY_TOKENS
    # the needle sits on the sentence boundary nearest to the requested depth
    assert abs((nd.needle_pos - 1) - depth * n_filler) <= 16
    if depth == 0.0:
        assert nd.needle_pos == 1
    if depth == 1.0:
        assert nd.needle_end == n_tokens - corpus.QUERY_TOKENS
    assert tok.decode(ids, skip_special_tokens=True) == nd.prompt


def test_haystack_is_deterministic_and_seeded():
    a = corpus.haystack(512, 0.5, seed=1)
    assert a == corpus.haystack(512, 0.5, seed=1)
    others = {corpus.haystack(512, 0.5, seed=s).prompt for s in range(2, 8)}
    assert a.prompt not in others and len(others) == 6
    assert a.matches(a.answer + " <eos> ? k3") and not a.matches("0 0 0")


def test_haystack_distractors_and_bad_arguments(tok):
    nd = corpus.haystack(400, 0.3, seed=2, n_distractors=3)
    words = tok.convert_ids_to_tokens(tok(nd.prompt).input_ids)
    assert len(words) == 400
    assert sum(w in corpus.KEYS for w in words) == 4 + 1  # four needles and the query
    assert words[nd.needle_pos : nd.needle_end] == [nd.key, ":", *nd.answer.split(), "."]
    with pytest.raises(ValueError, match="too short"):
        corpus.haystack(10, 0.5, seed=0)
    with pytest.raises(ValueError, match="depth"):
        corpus.haystack(100, 1.5, seed=0)


def test_code_prompts_are_exact_regular_and_deterministic(tok):
    prompts = corpus.code_prompts(6, seed=3, n_tokens=96)
    assert prompts == corpus.code_prompts(6, seed=3, n_tokens=96)
    assert len(set(prompts)) == 6
    for p in prompts:
        ids = tok(p).input_ids
        assert len(ids) == 96 and tokenizer.TOKEN_IDS[corpus.UNK] not in ids
        assert "\n" in p.split(" ")
    assert tok.decode(tok(prompts[0]).input_ids, skip_special_tokens=True) == prompts[0]


def test_training_haystack_masks_answers_after_the_haystack_query():
    rng = random.Random(0)
    for n in (64, 200, 900):
        words, mask = corpus.training_haystack(n, rng)
        assert len(words) == len(mask) == n and words[0] == corpus.BOS
        first_q = words.index("?")
        assert all(not m for m in mask[:first_q])
        answers = [w for w, m in zip(words, mask, strict=True) if m]
        assert len(answers) % (corpus.NEEDLE_DIGITS + 1) == 0 and answers[-1] == corpus.EOS
        key = words[first_q + 1]
        at = words.index(key)  # the needle comes before its query, with the same digits
        assert words[at + 2 : at + 6] == words[first_q + 3 : first_q + 7]


# --- trainer -----------------------------------------------------------------------------------


def _run(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_trainer_smoke_writes_loadable_verifier_and_drafter(tmp_path):
    v, v2, d = tmp_path / "v", tmp_path / "v2", tmp_path / "d"
    _run("engine.zoo.train", "--model", "tiny-hybrid", "--smoke", "--threads", "1", "--out", str(v))
    # seeded: a second run gives the same weights, another seed does not
    train_main(["--model", "tiny-hybrid", "--smoke", "--threads", "1", "--out", str(v2)])
    assert (v / "model.safetensors").read_bytes() == (v2 / "model.safetensors").read_bytes()
    train_main(["--model", "tiny-hybrid", "--smoke", "--threads", "1", "--out", str(v2), "--seed", "1"])
    assert (v / "model.safetensors").read_bytes() != (v2 / "model.safetensors").read_bytes()
    _run(
        "engine.zoo.train",
        "--model",
        "tiny-drafter",
        "--smoke",
        "--threads",
        "1",
        "--out",
        str(d),
        "--verifier",
        str(v),
    )
    for path, layers in ((v, 2), (d, 1)):
        cfg = json.loads((path / "config.json").read_text())
        assert cfg["num_hidden_layers"] == layers and "sliding_window_pattern" in cfg
        record = json.loads((path / "train_record.json").read_text())
        assert record["steps"] >= 2 and record["final"]["loss"] > 0
        model = AutoModelForCausalLM.from_pretrained(path)
        tk = AutoTokenizer.from_pretrained(path)
        ids = tk("the river crosses the old bridge .", return_tensors="pt").input_ids
        assert model(ids).logits.shape == (1, 8, len(corpus.VOCAB))
    assert json.loads((v / "config.json").read_text())["layer_types"] == [
        "sliding_attention",
        "full_attention",
    ]
    # evaluate --write renders cards from the records
    _run(
        "engine.zoo.evaluate",
        "--model",
        str(v),
        "--drafter",
        str(d),
        "--contexts",
        "64",
        "--samples",
        "1",
        "--prompts",
        "2",
        "--new-tokens",
        "8",
        "--threads",
        "1",
        "--write",
    )
    card = (v / "README.md").read_text()
    assert "| 64 |" in card and "--smoke" in card
    assert "tokens per verifier forward" in (d / "README.md").read_text()


# --- committed models --------------------------------------------------------------------------


def test_committed_models_are_hf_dirs_with_the_zoo_tokenizer(tok):
    text = corpus.haystack(200, 0.5, seed=0).prompt + " " + corpus.code_prompts(1, seed=0)[0]
    for path in (HYBRID, DRAFTER):
        for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "train_record.json"):
            assert (path / name).is_file(), f"{path.name}/{name} missing"
        assert AutoTokenizer.from_pretrained(path)(text).input_ids == tok(text).input_ids
    h = json.loads((HYBRID / "config.json").read_text())
    d = json.loads((DRAFTER / "config.json").read_text())
    assert h["layer_types"] == ["sliding_attention", "full_attention"] * (h["num_hidden_layers"] // 2)
    assert h["sliding_window_pattern"] == 2 and h["num_hidden_layers"] >= 6
    assert h["sliding_window"] > 64 + 4  # larger than the cache policies' sink + window
    assert d["num_hidden_layers"] == 1 and d["vocab_size"] == h["vocab_size"]
    size = sum(f.stat().st_size for p in (HYBRID, DRAFTER) for f in p.iterdir())
    assert size < 12 * 2**20


def test_committed_hybrid_retrieves_needles():
    model = AutoModelForCausalLM.from_pretrained(HYBRID).eval()
    cells = needle_recall(model, [384], [0.0, 0.25, 0.5, 0.75, 1.0], samples=2, seed=123)
    correct = sum(c.correct for c in cells)
    assert correct >= 9, [c.model_dump() for c in cells]


def test_committed_drafter_agrees_with_the_hybrid_on_code():
    verifier = AutoModelForCausalLM.from_pretrained(HYBRID).eval()
    drafter = AutoModelForCausalLM.from_pretrained(DRAFTER).eval()
    rate, per_verify, _ = acceptance(verifier, drafter, prompts=4, prompt_tokens=64, new_tokens=48, seed=7)
    assert rate >= 0.6 and per_verify[4] > 2.0


def test_committed_models_load_in_mlx_lm_and_match_transformers():
    mlx_lm = pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import numpy as np

    ids = tokenizer.encode_words([corpus.BOS, *corpus.haystack(300, 0.2, seed=9).prompt.split(" ")])
    for path in (HYBRID, DRAFTER):
        model, _ = mlx_lm.load(str(path))
        got = np.array(model(mx.array([ids]))[0])
        with torch.no_grad():
            want = AutoModelForCausalLM.from_pretrained(path)(torch.tensor([ids])).logits[0].numpy()
        assert np.abs(got - want).max() < 1e-3
        assert (got.argmax(-1) == want.argmax(-1)).all()
