"""Benchmark the MLX backend against mlx-lm on the same model, prompts and machine; writes JSON.

    python -m benchmarks.engine_mlx --model zoo:tiny-hybrid --drafter zoo:tiny-drafter \\
        --out benchmarks/results/engine_mlx.json
    python -m benchmarks.engine_mlx --k 8 --batches '' --out benchmarks/results/block_drafter_mlx.json

Methods (all greedy, `--new-tokens` tokens, no EOS stop so every method decodes the same length):
  ours_greedy         engine.generate on the MLX backend (policy --policy, default full)
  ours_spec_model     engine.speculative_generate, the --drafter model proposing k tokens
  ours_spec_lookup    engine.speculative_generate, prompt-lookup drafting (no drafter model)
  ours_spec_block     engine.speculative_generate, the --block-drafter (engine/drafters/block/mlx.py) reading
                      the verifier's hidden states, proposing k tokens in one forward ('' skips)
  mlxlm_greedy        mlx_lm.stream_generate (what mlx_lm.generate runs), the model's own caches
  mlxlm_spec          mlx_lm.stream_generate(draft_model=..., num_draft_tokens=k)
  ours_batch_B        engine.generate_batch of B prompts at once (--batches), each row checked against
                      ours_greedy of its prompt; tok/s over all rows
`--shape` (benchmarks/shapes.py): a random-weight model built from a real config (reduced width on a
cpu); no drafter model then (the speculative rows use prompt lookup) and mlx-lm greedy runs through
`generate_step` (no tokenizer). `--device` auto|gpu|cpu (auto: MLX's default, the Metal GPU on a Mac).
Each method's tokens are compared with ours_greedy (token-exact or not, and where they first differ).
Times are the fastest of --repeats runs after one warm-up (the methods interleaved: each repeat runs
every method on the prompt, so a busy spell of a shared machine hits them alike): total wall time
(prefill + decode), tok/s over it, and decode tok/s (tokens after the first / time after the first
token; speculative methods prefill the drafter too). The summary also gives each method's tok/s over ours_greedy's and over
mlxlm_spec's. Not a test: nothing is asserted, the figures are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step, stream_generate
from mlx_lm.tokenizer_utils import TokenizerWrapper

import engine
from benchmarks import harness, shapes
from engine.backends.mlx.session import MLXModel
from engine.drafters.load import load_block_drafter
from engine.workloads.cli import first_divergence
from engine.zoo import corpus

Run = tuple[list[int], float, float, dict[str, float]]  # tokens, total seconds, decode seconds, extra


def ours(
    seq_factory: Callable[[], Any], drafter: Callable[[], Any] | None, ids: list[int], n: int, k: int
) -> Run:
    t0 = time.perf_counter()
    if drafter is None:
        gen = engine.generate(seq_factory(), ids, engine.Stop(n))
    else:
        gen = engine.speculative_generate(seq_factory(), drafter(), ids, k, engine.Stop(n))
    total = time.perf_counter() - t0
    extra = {"acceptance_length": gen.acceptance_length, "drafted": gen.drafted, "accepted": gen.accepted}
    return gen.tokens, total, gen.decode_s, extra


def mlxlm(model: Any, tok: TokenizerWrapper, draft: Any | None, ids: list[int], n: int, k: int) -> Run:
    kwargs: dict[str, Any] = {} if draft is None else {"draft_model": draft, "num_draft_tokens": k}
    tokens: list[int] = []
    from_draft = 0
    t0 = time.perf_counter()
    t1 = t0
    for r in stream_generate(model, tok, mx.array(ids), max_tokens=n, **kwargs):
        if not tokens:
            t1 = time.perf_counter()
        tokens.append(int(r.token))
        from_draft += bool(r.from_draft)
    t2 = time.perf_counter()
    return tokens, t2 - t0, t2 - t1, {"from_draft": from_draft}


def mlxlm_steps(model: Any, ids: list[int], n: int) -> Run:
    """mlx-lm's greedy `generate_step` (what stream_generate runs), for models without a tokenizer."""
    tokens: list[int] = []
    t0 = time.perf_counter()
    t1 = t0
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=n):
        if not tokens:
            t1 = time.perf_counter()
        tokens.append(int(tok))
    t2 = time.perf_counter()
    return tokens, t2 - t0, t2 - t1, {}


def ours_batch(mm: MLXModel, policy: engine.Policy, prompts: list[list[int]], n: int) -> Run:
    t0 = time.perf_counter()
    gens = engine.generate_batch(mm.session(policy, rows=len(prompts)), prompts, engine.Stop(n))
    total = time.perf_counter() - t0
    return [t for g in gens for t in g.tokens], total, gens[0].decode_s, {"rows": len(prompts)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="zoo:tiny-hybrid")
    p.add_argument("--drafter", default="zoo:tiny-drafter")
    p.add_argument("--block-drafter", default="zoo:tiny-block-drafter", help="'' skips ours_spec_block")
    p.add_argument("--policy", default="full")
    p.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto|gpu|cpu")
    p.add_argument("--shape", choices=sorted(shapes.SHAPES), help="a random-weight model of this shape")
    p.add_argument("--batches", default="8", help="batch sizes of ours_batch_B ('' for none)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4, help="drafted tokens per block")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/engine_mlx.json")
    args = p.parse_args(argv)
    load_start = harness.load_average()  # (1, 5, 15 min): how busy the (shared) machine was

    policy = engine.parse_policy(args.policy)
    device = engine.models.check_device("mlx", args.device)
    mx.set_default_device(mx.gpu if "gpu" in device else mx.cpu)  # mlx-lm runs on the default device
    n, k = args.new_tokens, args.k
    if args.shape:
        args.model, args.drafter, args.block_drafter = f"shape:{args.shape}", "none", ""
        path = shapes.build(args.shape, reduced="gpu" not in device, seed=args.seed)
        mm: MLXModel = engine.load(str(path), "mlx", args.dtype, args.device)  # type: ignore[assignment]
        rng = np.random.default_rng(args.seed)
        vocab = mm.geometry.vocab_size
        prompts = [rng.integers(3, vocab, args.prompt_tokens).tolist() for _ in range(args.prompts)]
    else:
        mm = engine.load(args.model, "mlx", args.dtype, args.device)  # type: ignore[assignment]
        dm: MLXModel = engine.load(args.drafter, "mlx", args.dtype, args.device)  # type: ignore[assignment]
        tok = TokenizerWrapper(mm.tokenizer)
        tok.eos_token_ids = set()  # decode exactly --new-tokens tokens, as ours does with Stop(n)
        texts = corpus.code_prompts(n=args.prompts, seed=args.seed, n_tokens=args.prompt_tokens)
        prompts = [mm.encode(t) for t in texts]

    if args.block_drafter:
        blocks = load_block_drafter(args.block_drafter, "mlx")
        block = lambda: type(blocks)(blocks.model)  # type: ignore[attr-defined]  # noqa: E731
    methods: dict[str, Callable[[list[int]], Run]] = {
        "ours_greedy": lambda ids: ours(lambda: mm.session(policy), None, ids, n, k),
        "ours_spec_model": lambda ids: ours(
            lambda: mm.session(policy, k + 1),
            lambda: engine.ModelDrafter(dm.session(policy, k + 1)),
            ids,
            n,
            k,
        ),
        "ours_spec_lookup": lambda ids: ours(
            lambda: mm.session(policy, k + 1), engine.PromptLookupDrafter, ids, n, k
        ),
        "ours_spec_block": lambda ids: ours(lambda: mm.session(policy, k + 1), block, ids, n, k),
        "mlxlm_greedy": lambda ids: mlxlm(mm.model, tok, None, ids, n, k),
        "mlxlm_spec": lambda ids: mlxlm(mm.model, tok, dm.model, ids, n, k),
    }
    if not args.block_drafter:
        del methods["ours_spec_block"]
    if args.shape:
        del methods["ours_spec_model"], methods["mlxlm_spec"]
        methods["mlxlm_greedy"] = lambda ids: mlxlm_steps(mm.model, ids, n)
    batches = [int(b) for b in args.batches.split(",") if b]
    for b in batches:
        # row 0 is this prompt, the others the other prompts cycled: its tokens must equal ours_greedy's
        methods[f"ours_batch_{b}"] = lambda ids, b=b: ours_batch(
            mm, policy, [ids, *[prompts[r % len(prompts)] for r in range(1, b)]], n
        )
    rows: list[dict[str, Any]] = []
    for i, ids in enumerate(prompts):
        for fn in methods.values():
            fn(ids)  # warm-up
        # Every method runs once per repeat, interleaved, so that a busy spell of a shared machine does not
        # land on one method only; the fastest run per method counts.
        done: dict[str, list[Run]] = {name: [] for name in methods}
        for _ in range(args.repeats):
            for name, fn in methods.items():
                done[name].append(fn(ids))
        ref: list[int] | None = None
        for name, runs in done.items():
            tokens, _, _, extra = runs[0]
            if any(r[0] != tokens for r in runs):
                raise RuntimeError(f"{name} is not deterministic on prompt {i}")
            ref = tokens if name == "ours_greedy" else ref
            assert ref is not None
            b = int(extra.get("rows", 1))
            if b > 1:  # all rows' tokens; row 0 is this prompt: compare it, count every row's tokens
                alone = [
                    ours(lambda: mm.session(policy), None, prompts[r % len(prompts)], n, k)[0]
                    for r in range(1, b)
                ]
                exact_rows = tokens == ref + [t for a in alone for t in a]
                tokens = tokens[:n] if exact_rows else tokens
            _, total, decode, _ = min(runs, key=lambda r: r[1])
            rows.append(
                {
                    "prompt": i,
                    "method": name,
                    "prompt_tokens": len(ids),
                    "new_tokens": len(tokens),
                    "exact_vs_ours_greedy": tokens == ref,
                    "first_difference": first_divergence(tokens, ref),
                    "total_s": total,
                    "prefill_s": total - decode,
                    "tok_s": b * len(tokens) / total,
                    "decode_tok_s": b * (len(tokens) - 1) / decode if decode > 0 else 0.0,
                    **extra,
                }
            )
            print(
                f"prompt {i} {name:17s} exact={tokens == ref!s:5s} first_diff={first_divergence(tokens, ref)} "
                f"tok/s={rows[-1]['tok_s']:8.1f} decode tok/s={rows[-1]['decode_tok_s']:8.1f}",
                flush=True,
            )

    summary: dict[str, Any] = {}
    for name in methods:
        mine = [r for r in rows if r["method"] == name]
        summary[name] = {
            "exact_prompts": sum(r["exact_vs_ours_greedy"] for r in mine),
            "prompts": len(mine),
            "tok_s": sum(r["new_tokens"] * r.get("rows", 1) for r in mine) / sum(r["total_s"] for r in mine),
            "decode_tok_s_mean": statistics.mean(r["decode_tok_s"] for r in mine),
            "first_differences": [r["first_difference"] for r in mine],
        }
        if "acceptance_length" in mine[0]:
            summary[name]["acceptance_length_mean"] = statistics.mean(r["acceptance_length"] for r in mine)
    base = summary["mlxlm_greedy"]["tok_s"]
    for s in summary.values():
        s["speedup_vs_mlxlm_greedy"] = s["tok_s"] / base
        s["speedup_vs_ours_greedy"] = s["tok_s"] / summary["ours_greedy"]["tok_s"]
        if "mlxlm_spec" in summary:
            s["speedup_vs_mlxlm_spec"] = s["tok_s"] / summary["mlxlm_spec"]["tok_s"]
    result = {
        "benchmark": "engine_mlx",
        "command": harness.command("engine_mlx", argv),
        "environment": harness.environment(load_start),
        "mlx_device": str(mx.default_device()),
        "device": mm.device_name,
        "dtype": mm.dtype_name,
        "peak_memory_bytes": mm.peak_memory_bytes(),
        "config": {k_: v for k_, v in vars(args).items() if k_ != "out"},
        "summary": summary,
        "rows": rows,
    }
    harness.write_json(args.out, result)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
