"""A seeded property sweep over the attention geometry transformers can generate with (issue 44).

Issue 32's matrix (tests/engine/model_matrix.py) builds every family once, at one shape. Here each family
draws its geometry fields as a user's config would vary them: head_dim against hidden / heads, K/V head
counts (GQA ratios), partial rotary factors, MLA's latent ranks and nope / rope / v head sizes (v above,
equal to and below qk_head_dim), sliding windows and layer-type patterns, tied embeddings. Each draw is
built as a tiny random-weight transformers model (torch backend, float32) and is

    skipped   transformers itself cannot build it or `generate` with it (outside what the engine promises)
    exact     engine greedy under `full` == transformers `generate`, and speculative decoding (k = 3, a
              drafter whose blocks start with a correct prefix of every length, so blocks are partly
              rejected and rolled back) == greedy under a bounded policy after its window wrapped
    refused   the engine refused it at load (before any forward) in one line (a ValueError raised by the
              engine) that names a config field
    broken    anything else: a crash, a difference, a refusal of more than one line or naming no field

Draws are a function of (family, seed, index) alone (`random.Random`), so a draw is reproduced by its id.

    python -m tests.engine.geometry_sweep deepseek_v3 --budget 20     # print each draw's outcome
    python -m benchmarks.geometry_sweep                               # the larger budget, JSON figures

tests/engine/test_geometry_sweep.py runs a small fixed budget of every family in `make test`.
"""

from __future__ import annotations

import argparse
import random
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import engine
from engine.backends.torch.session import TorchModel
from engine.geometry import UnsupportedModelError
from engine.policy import Policy, hybrid, sink_window
from tests.engine.tiny_models import VOCAB, _randomize_norms, prompt

PROMPT, NEW, K = 12, 12, 3
# Every draw: the tiny models' vocabulary, no EOS (generate must not stop early), pad below the vocabulary.
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    intermediate_size=64,
    max_position_embeddings=256,
    initializer_range=0.2,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)
# Small routed experts for the mixture-of-experts families.
EXPERTS: dict[str, Any] = dict(
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1
)
ATTN = {"gemma2": "eager", "gpt_oss": "eager"}  # softcapping / attention sinks: no sdpa


def _heads(r: random.Random, hidden: int, head_dim: bool) -> dict[str, Any]:
    """Query and K/V heads (every GQA ratio that divides) and, where the family takes one, a head_dim that
    may differ from hidden / heads."""
    heads = r.choice([h for h in (1, 2, 4, 8) if hidden % h == 0])
    out = {
        "num_attention_heads": heads,
        "num_key_value_heads": r.choice([d for d in (1, 2, 4, 8) if heads % d == 0]),
    }
    if head_dim:
        out["head_dim"] = r.choice([hidden // heads, 8, 16, 32])
    return out


def _common(r: random.Random) -> dict[str, Any]:
    return {
        **BASE,
        "hidden_size": r.choice([32, 64]),
        "num_hidden_layers": r.choice([2, 3, 4]),
        "tie_word_embeddings": r.random() < 0.5,
    }


def _layer_types(r: random.Random, n: int) -> list[str]:
    """A sliding / full pattern: every layer drawn, or a period with the global layer last (Gemma's)."""
    if r.random() < 0.5:
        return [r.choice(["sliding_attention", "full_attention"]) for _ in range(n)]
    period = r.choice([2, 3, 6])
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n)]


def _dense(head_dim: bool) -> Callable[[random.Random], dict[str, Any]]:
    def draw(r: random.Random) -> dict[str, Any]:
        c = _common(r)
        return {**c, **_heads(r, c["hidden_size"], head_dim)}

    return draw


def _sliding(head_dim: bool, **extra: Any) -> Callable[[random.Random], dict[str, Any]]:
    """Every layer sliding when a sliding_window is drawn (Mistral-style configs without layer_types)."""

    def draw(r: random.Random) -> dict[str, Any]:
        c = _common(r)
        window = r.choice([None, 3, 6, 16, 64])
        return {**c, **_heads(r, c["hidden_size"], head_dim), "sliding_window": window, **extra}

    return draw


def _patterned(head_dim: bool = True, **extra: Any) -> Callable[[random.Random], dict[str, Any]]:
    def draw(r: random.Random) -> dict[str, Any]:
        c = _common(r)
        return {
            **c,
            **_heads(r, c["hidden_size"], head_dim),
            "sliding_window": r.choice([3, 5, 8, 16]),
            "layer_types": _layer_types(r, c["num_hidden_layers"]),
            **extra,
        }

    return draw


def _smollm3(r: random.Random) -> dict[str, Any]:
    """SmolLM3: layers without RoPE (`no_rope_layers`, 1 = RoPE) beside sliding / full ones."""
    c = _patterned(False, use_sliding_window=True)(r)
    return {**c, "no_rope_layers": [r.choice([0, 1]) for _ in range(c["num_hidden_layers"])]}


def _gemma4(r: random.Random) -> dict[str, Any]:
    """Gemma 4: full layers with their own head size (global_head_dim), K = V on full layers
    (attention_k_eq_v), the last layers reusing earlier layers' K/V (num_kv_shared_layers)."""
    c = _patterned()(r)
    n = c["num_hidden_layers"] = r.choice([3, 4, 6])
    c["layer_types"] = _layer_types(r, n)
    c["layer_types"][-1] = "full_attention"  # transformers requires the last layer full
    head = c["head_dim"]
    shared = r.choice([0, 0, 1, 2][: n - 1])
    own, reused = c["layer_types"][: n - shared], set(c["layer_types"][n - shared :])
    for i, kind in enumerate(sorted(reused - set(own))):  # a shared layer reuses a layer of its kind
        own[i] = kind
    c["layer_types"] = own + c["layer_types"][n - shared :]
    return {
        **c,
        "global_head_dim": r.choice([head, 2 * head, max(4, head // 2)]),
        "attention_k_eq_v": r.random() < 0.3,
        "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": VOCAB,
    }


def _qwen35(r: random.Random) -> dict[str, Any]:
    """Qwen3.5: gated delta-net layers beside full attention, in drawn patterns, with a partial rotary."""
    c = _common(r)
    n = c["num_hidden_layers"]
    types = [r.choice(["linear_attention", "full_attention"]) for _ in range(n)]
    return {
        **c,
        **_heads(r, c["hidden_size"], True),
        "layer_types": types,
        "partial_rotary_factor": r.choice([0.25, 0.5, 1.0]),
        "linear_num_key_heads": (kh := r.choice([1, 2])),
        "linear_num_value_heads": kh * r.choice([1, 2]),
        "linear_key_head_dim": r.choice([8, 16]),
        "linear_value_head_dim": r.choice([8, 16]),
        "linear_conv_kernel_dim": r.choice([2, 4]),
    }


def _qwen2(r: random.Random) -> dict[str, Any]:
    """Qwen2 derives its layer types from use_sliding_window and max_window_layers."""
    c = _common(r)
    return {
        **c,
        **_heads(r, c["hidden_size"], False),
        "use_sliding_window": r.random() < 0.7,
        "sliding_window": r.choice([3, 6, 16]),
        "max_window_layers": r.randrange(0, c["num_hidden_layers"] + 1),
    }


def _partial(head_dim: bool) -> Callable[[random.Random], dict[str, Any]]:
    def draw(r: random.Random) -> dict[str, Any]:
        c = _common(r)
        return {
            **c,
            **_heads(r, c["hidden_size"], head_dim),
            "partial_rotary_factor": r.choice([0.25, 0.5, 0.75, 1.0]),
        }

    return draw


def _mla(r: random.Random) -> dict[str, Any]:
    """Multi-head latent attention: latent ranks, nope / rope head sizes and a v head below, equal to or
    above qk_head_dim (nope + rope)."""
    c = _common(r)
    nope, rope = r.choice([4, 8, 16]), r.choice([2, 4, 8])
    qk = nope + rope
    heads = r.choice([1, 2, 4, 8])
    groups = r.choice([d for d in (1, 2, 4, 8) if heads % d == 0])
    return {
        **c,
        **EXPERTS,
        "num_attention_heads": heads,
        "num_key_value_heads": heads if r.random() < 0.5 else groups,  # released MLA models: heads
        "kv_lora_rank": r.choice([4, 8, 16, 32]),
        "q_lora_rank": r.choice([None, 8, 32]),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": r.choice([max(2, qk - 4), qk, qk + 4, 2 * qk]),
        "first_k_dense_replace": r.choice([0, 1]),
    }


FAMILIES: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "llama": _dense(True),
    "cohere": _dense(False),
    "qwen2": _qwen2,
    "qwen3": _patterned(use_sliding_window=True),
    "mistral": _sliding(True),
    "starcoder2": _sliding(False),
    "mixtral": _sliding(True, num_local_experts=4, num_experts_per_tok=2),
    "gemma2": _patterned(),
    "gemma3_text": _patterned(),
    "gemma4_text": _gemma4,
    "olmo3": _patterned(False),
    "smollm3": _smollm3,
    "gpt_oss": _patterned(num_local_experts=4, num_experts_per_tok=2),
    "stablelm": _partial(False),
    "phi": _partial(False),
    "phi3": _partial(False),
    "glm": _partial(True),
    "qwen3_5_text": _qwen35,
    "deepseek_v2": _mla,
    "deepseek_v3": _mla,
}


def draw(family: str, seed: int, index: int) -> dict[str, Any]:
    """The config keys of draw `index` of `family` under `seed` (a function of the three alone)."""
    return FAMILIES[family](random.Random(f"{family}/{seed}/{index}"))


@dataclass
class Outcome:
    family: str
    index: int
    fields: dict[str, Any]
    status: str  # skipped | exact | refused | broken
    detail: str = ""
    run: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.family}/{self.index}"

    def fields_text(self) -> str:
        """The drawn geometry (the keys every draw shares left out)."""
        skip = set(BASE) | set(EXPERTS)
        return " ".join(f"{k}={v}" for k, v in self.fields.items() if k not in skip)


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"


def build(family: str, fields: dict[str, Any]) -> Any:
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    config = CONFIG_MAPPING[family](**fields)
    torch.manual_seed(0)
    module = AutoModelForCausalLM.from_config(config, attn_implementation=ATTN.get(family, "sdpa"))
    module.generation_config.eos_token_id = None
    if family.startswith("gemma"):  # Gemma's RMSNorm scales by (1 + w), w = 0: random w varies the output
        _randomize_norms(module)
    return module.float().eval()


def _generate(module: Any, ids: list[int]) -> list[int]:
    with torch.inference_mode():
        out = module.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


class _Prefixed:
    """Blocks of k tokens starting with a correct prefix of `want` of length 0, 1, ..., k in turn, then wrong
    tokens: every block is partly rejected at some length, so rollback runs at every depth."""

    def __init__(self, want: Sequence[int]) -> None:
        self.want, self.done, self.blocks = list(want), 0, 0

    def begin(self, prompt: Sequence[int]) -> None:
        self.done, self.blocks = 1, 0

    def propose(self, last: int, k: int) -> list[int]:
        j = self.blocks % (k + 1)
        self.blocks += 1
        right = self.want[self.done : self.done + k]
        return [*right[:j], *((t + 1) % VOCAB for t in right[j:])]

    def accept(self, n: int, committed: Sequence[int]) -> None:
        self.done += len(committed)


def refusal(exc: BaseException, fields: dict[str, Any]) -> str | None:
    """The refusal's text when `exc` is one the engine raised itself (a ValueError from engine/) in one line
    naming a config field; None otherwise (broken)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    text = str(exc)
    ours = isinstance(exc, UnsupportedModelError) or (
        tb is not None and "/engine/" in tb.tb_frame.f_code.co_filename
    )
    # a field drawn, or (UnsupportedModelError) the model type and what of it is not supported
    named = isinstance(exc, UnsupportedModelError) or any(f in text for f in fields)
    if isinstance(exc, ValueError) and ours and "\n" not in text and named:
        return text
    return None


@dataclass(frozen=True)
class Run:
    """How a draw is decoded (drawn too): prompt length, prefill chunk, and a bounded policy whose window
    wraps within prompt + NEW tokens."""

    prompt_len: int
    chunk: int
    policy: Policy

    @classmethod
    def draw(cls, r: random.Random) -> Run:
        policy = r.choice([sink_window(2, 6), sink_window(1, 8), hybrid(2, 6)])
        return cls(r.choice([1, 2, 7, PROMPT]), r.choice([1, 4, 64]), policy)


def _decode(model: Any, ids: list[int], want: list[int], run: Run) -> str:
    """'' when `model` (either backend) decodes `ids` as `want` (generate's) under `full` and speculatively
    as its own greedy under the run's bounded policy; else what went wrong, in one line."""
    chunk, policy = run.chunk, run.policy
    try:
        got = engine.generate(model.session(engine.full(), prefill_chunk=chunk), ids, engine.Stop(NEW)).tokens
    except Exception as exc:  # noqa: BLE001
        return f"greedy: {one_line(exc)}"
    if got != want:
        at = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        return f"greedy differs from generate at token {at}"
    try:
        greedy = engine.generate(model.session(policy, prefill_chunk=chunk), ids, engine.Stop(NEW)).tokens
        verifier = model.session(policy, max_block=K + 1, prefill_chunk=chunk)
        gen = engine.speculative_generate(verifier, _Prefixed(greedy), ids, K, engine.Stop(NEW))
    except Exception as exc:  # noqa: BLE001
        return f"speculative under {policy}: {one_line(exc)}"
    if gen.tokens != greedy:
        return f"speculative differs from greedy under {policy}"
    return ""


def check(family: str, seed: int, index: int, mlx: bool = False) -> Outcome:
    """Draw `index` of `family` on torch, and with `mlx` also on MLX (the same weights, saved and loaded by
    the mlx backend: `Outcome.extra["mlx"]` is exact, refused: ..., or broken: ...)."""
    fields = draw(family, seed, index)
    run = Run.draw(random.Random(f"{family}/{seed}/{index}/run"))
    out = Outcome(
        family, index, fields, "broken", run=f"prompt {run.prompt_len}, chunk {run.chunk}, {run.policy}"
    )
    ids = prompt(run.prompt_len, seed=index)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            module = build(family, fields)
            want = _generate(module, ids)  # before the engine loads it
        except Exception as exc:  # noqa: BLE001 - transformers itself cannot: outside the promise
            out.status, out.detail = "skipped", f"transformers: {one_line(exc)}"
            return out
        try:
            tm = TorchModel(module)
        except Exception as exc:  # noqa: BLE001
            text = refusal(exc, fields)
            out.status, out.detail = ("refused", text) if text else ("broken", f"at load: {one_line(exc)}")
            return out
        out.detail = _decode(tm, ids, want, run)
        if out.detail:
            return out
        out.status = "exact"
        if mlx:
            out.extra["mlx"] = _on_mlx(tm, fields, ids, want, run)
    return out


def _on_mlx(tm: TorchModel, fields: dict[str, Any], ids: list[int], want: list[int], run: Run) -> str:
    from tests.engine.backends import mlx_twin

    try:
        twin = mlx_twin(tm)
    except Exception as exc:  # noqa: BLE001
        text = refusal(exc, fields)
        return f"refused: {text}" if text else f"broken: at load: {one_line(exc)}"
    detail = _decode(twin, ids, want, run)
    return f"broken: {detail}" if detail else "exact"


def sweep(
    families: Sequence[str], budget: int, seed: int = 0, log: Any = None, mlx: bool = False
) -> list[Outcome]:
    torch.set_num_threads(1)
    outcomes = []
    for family in families:
        for index in range(budget):
            o = check(family, seed, index, mlx)
            outcomes.append(o)
            if log is not None:
                print(
                    f"{o.id:18s} {o.status:8s} {o.detail[:150]}  [{o.run}] {o.fields_text()} {o.extra}",
                    file=log,
                    flush=True,
                )
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help=f"default: all ({', '.join(FAMILIES)})")
    parser.add_argument("--budget", type=int, default=8, help="draws per family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mlx", action="store_true", help="also decode each exact draw on the mlx backend")
    args = parser.parse_args(argv)
    outcomes = sweep(args.families or list(FAMILIES), args.budget, args.seed, log=sys.stdout, mlx=args.mlx)
    return 1 if any(o.status == "broken" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
