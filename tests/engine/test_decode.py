"""Greedy decoding under every policy: invariant (a) against transformers `generate`, an independent
teacher-forced oracle for windows that wrap, stop conditions, and model loading."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine
from engine.policy import Policy, full, hybrid, sink_window
from tests.engine import tiny_models
from tests.engine.backends import BACKENDS, on

COVERING = [full(), sink_window(4, 4096), hybrid(4, 4096)]


MODELS = {
    "gemma": tiny_models.gemma,
    "gemma-eager": lambda: tiny_models.gemma(attn="eager"),  # additive float masks
    "qwen": tiny_models.qwen,
    "mistral": tiny_models.mistral,  # no layer_types: every layer slides
}
MLX_MARKS = BACKENDS[1].marks


@pytest.mark.parametrize("policy", COVERING, ids=str)
@pytest.mark.parametrize(
    ("model", "prompt_len", "chunk", "backend"),
    [
        ("gemma", 5, 512, "torch"),
        ("gemma", 70, 16, "torch"),
        ("gemma-eager", 40, 16, "torch"),
        ("qwen", 33, 7, "torch"),
        ("mistral", 30, 8, "torch"),
        pytest.param("gemma", 70, 16, "mlx", marks=MLX_MARKS),
        pytest.param("qwen", 33, 7, "mlx", marks=MLX_MARKS),
    ],
)
def test_covering_window_equals_transformers_generate(
    policy: Policy, model: str, prompt_len: int, chunk: int, backend: str
) -> None:
    tm = MODELS[model]()
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    ref = tiny_models.hf_greedy(tm, ids, 60)
    assert len(set(ref)) > 10, "the test model must give varied output"
    got = engine.generate(on(backend, tm).session(policy, prefill_chunk=chunk), ids, engine.Stop(60))
    assert got.tokens == ref
    assert got.stop_reason == "max_new_tokens" and got.forwards == 59


def _policy_masks(tm, policy: Policy, n: int) -> dict[str, torch.Tensor]:
    """Per-layer-type [1, 1, n, n] masks from the reference rule `LayerSpec.visible`."""
    specs = engine.policy.layer_specs(policy, tm.layer_types, tm.sliding_window)
    masks = {}
    for spec, t in zip(specs, tm.layer_types, strict=True):
        masks[t] = torch.tensor([[spec.visible(q, j) for j in range(n)] for q in range(n)])[None, None]
    return masks


ORACLE_POLICIES = [sink_window(4, 8), sink_window(0, 6), hybrid(2, 5), full()]


@pytest.mark.parametrize(
    ("policy", "model", "backend"),
    [
        *((p, m, "torch") for p in ORACLE_POLICIES for m in ("gemma", "qwen", "mistral")),
        *(
            pytest.param(p, m, "mlx", marks=MLX_MARKS)
            for p, m in [(sink_window(4, 8), "gemma"), (hybrid(2, 5), "gemma"), (sink_window(0, 6), "qwen")]
        ),
    ],
)
def test_bounded_greedy_equals_a_teacher_forced_masked_forward(
    policy: Policy, model: str, backend: str
) -> None:
    """An oracle that shares nothing with the cache: one cache-free transformers forward over prompt +
    output with the rule's dense masks must predict every generated token (windows of 5-8 wrap ~15
    times)."""
    tm = MODELS[model]()
    ids = tiny_models.prompt(30, seed=1)
    gen = engine.generate(on(backend, tm).session(policy, prefill_chunk=11), ids, engine.Stop(90))
    seq = ids + gen.tokens
    masks = _policy_masks(tm, policy, len(seq) - 1)
    mask = masks if len(masks) > 1 else next(iter(masks.values()))
    with torch.inference_mode():
        logits = tm.model(
            input_ids=torch.tensor([seq[:-1]]),
            position_ids=torch.arange(len(seq) - 1)[None],
            attention_mask=mask,
            use_cache=False,
        ).logits[0]
    assert logits[len(ids) - 1 :].argmax(-1).tolist() == gen.tokens
    if policy.kind == "sink_window" or (policy.kind == "hybrid" and "sliding_attention" in tm.layer_types):
        assert gen.tokens != tiny_models.hf_greedy(tm, ids, 90), "the window must change the output"


def test_stop_conditions() -> None:
    tm = tiny_models.qwen()
    ids = tiny_models.prompt(20, seed=2)
    ref = engine.generate(tm.session(full()), ids, engine.Stop(40)).tokens
    eos = ref[17]
    first = ref.index(eos)
    got = engine.generate(tm.session(full()), ids, engine.Stop(40, eos_ids=frozenset({eos})))
    assert got.tokens == ref[: first + 1] and got.stop_reason == "eos"

    def detok(toks: list[int]) -> str:
        return "".join(chr(0x100 + t) for t in toks)

    stop = detok(ref[25:27])
    got = engine.generate(tm.session(full()), ids, engine.Stop(40, stop_strings=(stop,), detokenize=detok))
    assert got.stop_reason == "stop_string" and detok(got.tokens).endswith(stop)
    assert stop not in detok(got.tokens[:-1]) and got.tokens == ref[: len(got.tokens)]
    got = engine.generate(tm.session(full()), ids, engine.Stop(7, stop_strings=("never",), detokenize=detok))
    assert got.tokens == ref[:7] and got.stop_reason == "max_new_tokens"
    with pytest.raises(ValueError, match="detokenize"):
        engine.Stop(5, stop_strings=("x",))
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.Stop(0)


def test_forward_larger_than_the_slack_or_rollback_beyond_it_is_refused_or_exact(backend: str) -> None:
    tm = on(backend, tiny_models.gemma())
    ids = tiny_models.prompt(60, seed=4)
    seq = tm.session(sink_window(4, 8), max_block=3)
    seq.prefill(ids[:40])
    with pytest.raises(ValueError, match="slack of 3"):
        seq.trim(4)
    # A block larger than max_block is attended as old buffer + block: still exact.
    step = tm.session(sink_window(4, 8), max_block=3)
    step.prefill(ids[:40])
    assert seq.forward(ids[40:50]).tokens == [step.forward([t]).tokens[0] for t in ids[40:50]]


def test_load_resolves_zoo_paths_and_reports_bad_names(tmp_path, monkeypatch) -> None:
    with pytest.raises(engine.ModelNotFoundError, match="zoo models"):
        engine.load("zoo:no-such-model")
    with pytest.raises(engine.ModelNotFoundError, match="Hugging Face model directory"):
        engine.load(str(tmp_path / "missing"))
    tm = tiny_models.qwen()
    tm.model.save_pretrained(tmp_path / "m")
    _tokenizer().save_pretrained(tmp_path / "m")
    loaded = engine.load(str(tmp_path / "m"))
    with pytest.raises(ValueError, match="backend"):
        engine.load(str(tmp_path / "m"), backend="tpu")  # type: ignore[arg-type]
    ids = loaded.encode("helloworld")
    assert (
        ids == [10, 7, 14, 14, 17, 25, 17, 20, 14, 6] and loaded.decode(ids).replace(" ", "") == "helloworld"
    )
    monkeypatch.setenv("KAKEYA_MODELS", str(tmp_path))
    assert engine.resolve("m") == tmp_path / "m"
    home = tmp_path / "home"
    (home / "kakeya-models").mkdir(parents=True)
    (tmp_path / "m").rename(home / "kakeya-models" / "m")
    monkeypatch.setenv("HOME", str(home))
    assert engine.resolve("m") == home / "kakeya-models" / "m"  # then ~/kakeya-models
    with pytest.raises(engine.ModelNotFoundError) as err:
        engine.resolve("gone")
    assert f"looked in {tmp_path / 'gone'} or {home / 'kakeya-models' / 'gone'}" in str(err.value)
    same = engine.generate(loaded.session(full()), ids, engine.Stop(10)).tokens
    assert same == engine.generate(tm.session(full()), ids, engine.Stop(10)).tokens


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(ord("a") + i): i + 3 for i in range(26)} | {"[UNK]": 0}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_zoo_model_loads_and_equals_generate() -> None:
    tm = engine.load("zoo:tiny-hybrid")
    assert "sliding_attention" in tm.layer_types and "full_attention" in tm.layer_types
    ids = tm.encode("def add(a, b):\n    return")
    ref = tiny_models.hf_greedy(tm, ids, 40)
    for policy in COVERING:
        assert engine.generate(tm.session(policy), ids, engine.Stop(40)).tokens == ref


@pytest.mark.parametrize("policy", [full(), hybrid(4, 64), sink_window(4, 64)], ids=str)
def test_step_logits_and_hidden_states_equal_a_full_cache_reference_forward(
    backend: str, policy: Policy
) -> None:
    """With a window covering the sequence, a session's logits and hidden states (prefill: the last
    position; forward: every fed position) equal one cache-free transformers forward of the whole
    sequence at the same positions, on both backends; the tokens are the argmax of those logits."""
    tm = tiny_models.gemma(sliding_window=64)
    ids = tiny_models.prompt(40, seed=9)
    with torch.inference_mode():
        ref = tm.model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    layers = tuple(range(len(tm.layer_types) + 1))  # 0: embeddings ... n: after the final norm
    seq = on(backend, tm).session(policy, max_block=4, prefill_chunk=16)

    def close(got: object, want: torch.Tensor) -> None:
        got_t = torch.from_numpy(np.array(got)) if backend == "mlx" else got
        assert isinstance(got_t, torch.Tensor) and got_t.shape == want.shape
        assert torch.allclose(got_t, want, atol=1e-4, rtol=1e-4), (got_t - want).abs().max()

    first = seq.prefill(ids[:30], logits=True, hidden=layers)
    close(first.logits, ref.logits[0, 29:30])
    for i in layers:
        close(first.hidden[i], ref.hidden_states[i][0, 29:30])
    assert first.tokens == ref.logits[0, 29:30].argmax(-1).tolist()
    step = seq.forward(ids[30:34], logits=True, hidden=(0, 2))
    close(step.logits, ref.logits[0, 30:34])
    assert sorted(step.hidden) == [0, 2]
    for i in (0, 2):
        close(step.hidden[i], ref.hidden_states[i][0, 30:34])
    assert step.tokens == ref.logits[0, 30:34].argmax(-1).tolist()
    plain = seq.forward(ids[34:36])
    assert plain.logits is None and plain.hidden == {} and len(plain.tokens) == 2
    with pytest.raises(ValueError, match="no hidden state"):
        seq.forward(ids[36:37], hidden=(len(layers),))
