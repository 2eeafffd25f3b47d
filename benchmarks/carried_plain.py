"""A carried draft length that settled on plain decoding against plain decoding itself, in pairs. Writes JSON.

    python -m benchmarks.carried_plain --out benchmarks/results/carried_plain-cpu.json

Issue 44's promise, measured on its own: where drafting does not pay (MLX on the CPU: the block drafter's
blocks cost more than they commit, sampled or batched), a `DraftLength` carried over calls
(`speculative_generate(adapt=length)`, engine/draft_length.py) makes every later call plain decoding from the
prompt, no slower than `generate`. The length's costs are planted (k = 1 at 5 plain steps: drafting cannot
pay), so what is timed is the call itself, never a probe's choice. For each backend, draft length k and
pair i (zoo code prompts cycled, seed i, temperature 0.7 and greedy): a speculative run that drafts (so
whatever a drafting run leaves behind, MLX's background work included, precedes both alike), then
`generate`, then another drafting run, then the carried call, then `generate` on a session sized for blocks (max_block k + 1), then
`generate` on such a session with a drafter made for it (what the carried call runs on); every pair's
tokens are checked equal. Reported: median seconds per token of each, and the median over pairs of
generate's time per token over the carried call's (above 1: the carried call faster). Interleaved pairs, medians: MLX's CPU timings swing 20% between
identical runs on this machine. Not a test: figures are reported, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import engine
from benchmarks import harness
from engine.draft_length import DraftLength
from engine.drafters import load_drafter, parse_drafter
from engine.sampling import Sampling
from engine.workloads import cli
from engine.zoo import corpus


def planted(k: int) -> DraftLength:
    """A loops' `DraftLength` whose costs at batch 1 say plain: a k = 1 block costs 5 plain steps."""
    length = DraftLength.for_loops(k)
    for block_k, seconds in ((0, 1.0), (1, 5.0), (0, 1.0)):
        length.choose(1)
        length.record(block_k, seconds, 1, [1] * block_k, [0] * block_k, float(block_k > 0))
    return length


def measure(backend: str, k: int, temperature: float, args: argparse.Namespace) -> dict[str, Any]:
    model = engine.load(args.model, backend)  # type: ignore[arg-type]
    make = load_drafter(parse_drafter(args.drafter), model, k=k)
    policy = engine.parse_policy(args.policy)
    prompts = [model.encode(t) for t in corpus.code_prompts(args.prompts, args.seed, args.prompt_tokens)]
    stop = engine.Stop(args.new_tokens, model.eos_ids)
    length = planted(k)

    def speculative(ids: list[int], sampling: Sampling | None, adapt: Any = False) -> engine.Generation:
        session = model.session(policy, k + 1)
        return engine.speculative_generate(session, make(session), ids, k, stop, sampling, adapt)

    plain, carried, sized, bound = [], [], [], []
    for i in range(args.pairs):
        ids, sampling = prompts[i % len(prompts)], Sampling(temperature, seed=args.seed + i)
        speculative(ids, sampling)
        want = engine.generate(model.session(policy), ids, stop, sampling)
        speculative(ids, sampling)
        got = speculative(ids, sampling, length)
        session = model.session(policy, k + 1)
        in_sized = engine.generate(session, ids, stop, sampling)
        session = model.session(policy, k + 1)
        drafter = make(session)  # made for the session, not used: what a carried plain call holds
        in_bound = engine.generate(session, ids, stop, sampling)
        del drafter
        if got.drafted or any(g.tokens != want.tokens for g in (got, in_sized, in_bound)):
            raise RuntimeError(f"{backend} k={k} pair {i}: a run drafted or decoded other tokens")
        for times, gen in ((plain, want), (carried, got), (sized, in_sized), (bound, in_bound)):
            times.append(gen.decode_s / (len(gen.tokens) - 1))
    out = {
        "backend": backend,
        "k": k,
        "temperature": temperature,
        "pairs": args.pairs,
        "generate_ms_per_token": 1e3 * statistics.median(plain),
        "carried_ms_per_token": 1e3 * statistics.median(carried),
        "generate_sized_ms_per_token": 1e3 * statistics.median(sized),
        "generate_sized_with_drafter_ms_per_token": 1e3 * statistics.median(bound),
        "median_paired_speedup": statistics.median(p / c for p, c in zip(plain, carried, strict=True)),
        "plain_blocks": length.steps[0],
    }
    print(
        f"{backend:5s} k={k} t={temperature}: generate {out['generate_ms_per_token']:.3f} ms/token, carried "
        f"{out['carried_ms_per_token']:.3f}, median paired {out['median_paired_speedup']:.3f}x; generate on "
        f"max_block {k + 1}: {out['generate_sized_ms_per_token']:.3f}, with a drafter made for it "
        f"{out['generate_sized_with_drafter_ms_per_token']:.3f}",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/carried_plain-cpu.json"))
    ap.add_argument("--model", default="zoo:tiny-hybrid")
    ap.add_argument("--drafter", default="block:zoo:tiny-block-drafter")
    ap.add_argument("--policy", default="hybrid:4:64")
    ap.add_argument("--backends", type=lambda s: s.split(","), default=["torch", "mlx"])
    ap.add_argument("--ks", type=cli.int_list, default=[4, 8], help="draft lengths")
    ap.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.7, 0.0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    cli.set_threads(args.threads)
    load_start = harness.load_average()
    results = [measure(b, k, t, args) for b in args.backends for k in args.ks for t in args.temperatures]
    config = {**vars(args), "out": str(args.out), "command": harness.command("carried_plain", argv)}
    harness.write_report(
        args.out, "bench-carried-plain", 1, {"config": config, "results": results}, load_start
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
