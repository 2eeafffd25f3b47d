"""Speculative sampling against plain sampling at a temperature, with the block drafter on the zoo code
workload (issue 31's target: >= 1.5x plain sampling decode tok/s at B=1, temperature 0.7). Writes JSON.

    python -m benchmarks.speculative_sampling --out benchmarks/results/speculative_sampling-cpu.json

Per backend (torch, mlx) and draft length k, every prompt and seed, interleaved so a busy spell of this
shared machine hits every method alike: plain sampling (`generate` with a `Sampling`), speculative
sampling with the block drafter handing its q to the rule (`propose_sampled`: the whole block fed, its
first k rows drawn), the same with the adaptive draft length (`speculative_generate(adapt=True)`:
engine/draft_length.py `DraftLength`, down to plain sampling where drafting does not pay; issue 44), the
same with one `DraftLength` carried over every call of the backend and k (`spec_carried`: `adapt=length`,
as a process sampling many requests runs; its first call pays the probes and counts), the same
from a block of k mask slots (k < block size), the same drafter counted as one-hot (its argmax drafts: the
rule accepts a draft with the verifier's own probability of it), and, once per prompt, greedy and greedy
speculative decoding (acceptance at temperature 0, for comparison). Decode tok/s are over all runs of a
method (tokens after the first / time after prefill), on the wall clock and on the CPU time of the process
in the decode phase (read at the engine's own clock reads, as benchmarks/batched_speculative.py does:
other processes' load does not inflate it; threads = 1), and the median over runs of each run's speedup
against the plain run of the same prompt and seed (`median_paired_speedup`: steadier where identical
runs' times swing, as MLX's do on this CPU). Then one instrumented pass measures the host
sampler per block: time in `Sampling.probs`, the rule (`verify`) and the drafter's draws, against the
whole block. The load average at the start and the end goes into the report. Not a test: nothing is
asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import engine
import engine.decode as decode
import engine.drafters.block.base as block_base
import engine.speculative as speculative
from benchmarks import harness
from benchmarks.harness import Clocks
from engine.draft_length import DraftLength
from engine.drafters import load_drafter, parse_drafter
from engine.sampling import Sampling, draw
from engine.workloads import cli
from engine.workloads.throughput import position_acceptance
from engine.zoo import corpus


class OneHot:
    """A drafter proposing as under greedy decoding (no `propose_sampled`): the rule counts it one-hot."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        self.layers = drafter.layers

    def begin(self, prompt: list[int]) -> None:
        self.drafter.begin(prompt)

    def propose(self, last: int, k: int) -> list[int]:
        return self.drafter.propose(last, k)

    def accept(self, n: int, committed: list[int]) -> None:
        self.drafter.accept(n, committed)

    def observe(self, hidden: dict[int, Any], rows: int) -> None:
        self.drafter.observe(hidden, rows)


class KSlots(OneHot):
    """The block drafter sampling its drafts from a block of k mask slots, not the whole block."""

    def propose_sampled(
        self, last: int, k: int, sampling: Sampling, rng: np.random.Generator
    ) -> tuple[list[int], np.ndarray]:
        k = min(k, self.drafter.config.block_size)
        if k == 0:
            return [], np.zeros((0, self.drafter.config.vocab_size))
        q = sampling.probs(self.drafter._logits(last, k))
        return [int(t) for t in draw(q, rng)], q


@contextmanager
def host_timer(acc: list[float]) -> Iterator[None]:
    """Add the seconds spent in the host sampler (probabilities, the rule, the drafter's draws) to acc[0]."""

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            acc[0] += time.perf_counter() - t
            return out

        return run

    saved = (Sampling.probs, speculative.verify, block_base.draw)
    Sampling.probs = timed(Sampling.probs)  # type: ignore[method-assign]
    speculative.verify = timed(speculative.verify)
    block_base.draw = timed(block_base.draw)
    try:
        yield
    finally:
        Sampling.probs, speculative.verify, block_base.draw = saved  # type: ignore[method-assign]


def timed(fn: Callable[[], engine.Generation]) -> engine.Generation:
    """Run one generation, recording the CPU time of its decode phase as `decode_cpu_s`."""
    clocks = Clocks()
    decode.time, speculative.time = clocks, clocks  # type: ignore[assignment]
    try:
        gen = fn()
    finally:
        decode.time, speculative.time = time, time  # type: ignore[assignment]
    gen.decode_cpu_s = clocks.cpu_since(clocks.log[-1][0] - gen.decode_s)  # type: ignore[attr-defined]
    return gen


def _rate(gens: list[engine.Generation], cpu: bool = False) -> float:
    seconds = sum(g.decode_cpu_s if cpu else g.decode_s for g in gens)  # type: ignore[attr-defined]
    return sum(len(g.tokens) - 1 for g in gens) / seconds if seconds else 0.0


def _acceptance(gens: list[engine.Generation]) -> dict[str, Any]:
    forwards = sum(g.forwards for g in gens)
    return {
        "acceptance_length": sum(len(g.tokens) - 1 for g in gens) / forwards if forwards else 1.0,
        "position_acceptance": [round(x, 4) for x in position_acceptance(gens)],
    }


def measure(backend: str, k: int, args: argparse.Namespace) -> dict[str, Any]:
    model = engine.load(args.model, backend, "float32", "cpu" if backend == "torch" else "auto")  # type: ignore[arg-type]
    make = load_drafter(parse_drafter(args.drafter), model, k=k)
    policy = engine.parse_policy(args.policy)
    prompts = [model.encode(t) for t in corpus.code_prompts(args.prompts, args.seed, args.prompt_tokens)]
    stop = engine.Stop(args.new_tokens, model.eos_ids)

    def spec(
        ids: list[int], sampling: Sampling | None, wrap: Any = None, adapt: bool | DraftLength = False
    ) -> engine.Generation:
        session = model.session(policy, k + 1)
        drafter = wrap(make(session)) if wrap else make(session)
        return timed(lambda: engine.speculative_generate(session, drafter, ids, k, stop, sampling, adapt))

    def plain(ids: list[int], sampling: Sampling | None) -> engine.Generation:
        session = model.session(policy)
        return timed(lambda: engine.generate(session, ids, stop, sampling))

    warm = Sampling(args.temperature, seed=10**6)
    for fn in (
        lambda: plain(prompts[0], warm),
        lambda: spec(prompts[0], warm),
        lambda: spec(prompts[0], warm, adapt=True),
        lambda: spec(prompts[0], None),
    ):
        fn()  # one-off costs out of the figures
    k_slots = k < make(model.session(policy, k + 1)).config.block_size  # else the same as spec
    carried = DraftLength.for_loops(k)  # its costs carry over between calls (its first call counts too)
    methods = (
        "plain",
        "spec",
        "spec_adaptive",
        "spec_carried",
        *(["spec_k_slots"] if k_slots else []),
        "one_hot",
        "greedy",
        "greedy_spec",
    )
    runs: dict[str, list[engine.Generation]] = {m: [] for m in methods}
    for ids in prompts:
        runs["greedy"].append(plain(ids, None))
        runs["greedy_spec"].append(spec(ids, None))
        for seed in range(args.seed, args.seed + args.seeds):
            s = Sampling(args.temperature, seed=seed)
            runs["plain"].append(plain(ids, s))
            runs["spec"].append(spec(ids, s))
            runs["spec_adaptive"].append(spec(ids, s, adapt=True))
            runs["spec_carried"].append(spec(ids, s, adapt=carried))
            if k_slots:
                runs["spec_k_slots"].append(spec(ids, s, KSlots))
            runs["one_hot"].append(spec(ids, s, OneHot))
    per_seed = []
    for i, seed in enumerate(range(args.seed, args.seed + args.seeds)):
        pick = [p * args.seeds + i for p in range(len(prompts))]
        plain_s, spec_s = _rate([runs["plain"][j] for j in pick]), _rate([runs["spec"][j] for j in pick])
        adaptive_s = _rate([runs["spec_adaptive"][j] for j in pick])
        carried_s = _rate([runs["spec_carried"][j] for j in pick])
        cpu = {
            m: _rate([runs[m][j] for j in pick], cpu=True)
            for m in ("plain", "spec", "spec_adaptive", "spec_carried")
        }
        per_seed.append(
            {
                "seed": seed,
                "plain_tok_s": plain_s,
                "spec_tok_s": spec_s,
                "speedup": spec_s / plain_s,
                "spec_adaptive_tok_s": adaptive_s,
                "speedup_adaptive": adaptive_s / plain_s,
                "cpu_speedup": cpu["spec"] / cpu["plain"],
                "cpu_speedup_adaptive": cpu["spec_adaptive"] / cpu["plain"],
                "spec_carried_tok_s": carried_s,
                "speedup_carried": carried_s / plain_s,
                "cpu_speedup_carried": cpu["spec_carried"] / cpu["plain"],
            }
        )
    host, sampled_blocks = [0.0], []
    with host_timer(host):
        for ids in prompts:
            sampled_blocks.append(spec(ids, Sampling(args.temperature, seed=args.seed)))
    blocks = sum(g.forwards for g in sampled_blocks)
    block_s = sum(g.decode_s for g in sampled_blocks) / blocks
    rates = {m: _rate(g) for m, g in runs.items()}
    # each run against the plain run of the same prompt and seed next to it (steadier than totals when a
    # busy spell hits some runs: MLX's CPU timings swing 20% between identical runs here)
    paired = {
        m: statistics.median(_rate([g]) / _rate([p]) for p, g in zip(runs["plain"], runs[m], strict=True))
        for m in ("spec", "spec_adaptive", "spec_carried")
    }
    cpu_rates = {m: _rate(g, cpu=True) for m, g in runs.items()}
    out = {
        "backend": backend,
        "k": k,
        "decode_tok_s": rates,
        "cpu_tok_s": cpu_rates,
        "speedup_sampled": rates["spec"] / rates["plain"],
        "speedup_sampled_adaptive": rates["spec_adaptive"] / rates["plain"],
        "cpu_speedup_sampled": cpu_rates["spec"] / cpu_rates["plain"],
        "cpu_speedup_sampled_adaptive": cpu_rates["spec_adaptive"] / cpu_rates["plain"],
        "speedup_sampled_carried": rates["spec_carried"] / rates["plain"],
        "cpu_speedup_sampled_carried": cpu_rates["spec_carried"] / cpu_rates["plain"],
        "carried": carried.summary(),
        "cpu_speedup_greedy": cpu_rates["greedy_spec"] / cpu_rates["greedy"],
        "speedup_sampled_one_hot": rates["one_hot"] / rates["plain"],
        "speedup_greedy": rates["greedy_spec"] / rates["greedy"],
        "per_seed": per_seed,
        "median_paired_speedup": paired,
        "acceptance": {m: _acceptance(runs[m]) for m in methods if m not in ("plain", "greedy")},
        "host_sampler_ms_per_block": 1000 * host[0] / blocks,
        "block_ms": 1000 * block_s,
        "host_sampler_fraction": host[0] / blocks / block_s,
    }
    print(
        f"{backend:5s} k={k}: plain sampling {rates['plain']:.1f} tok/s, speculative sampling {rates['spec']:.1f} "
        f"({out['speedup_sampled']:.2f}x, cpu {out['cpu_speedup_sampled']:.2f}x; adaptive "
        f"{out['speedup_sampled_adaptive']:.2f}x, cpu {out['cpu_speedup_sampled_adaptive']:.2f}x; carried {out['speedup_sampled_carried']:.2f}x, cpu "
        f"{out['cpu_speedup_sampled_carried']:.2f}x; median paired: speculative {paired['spec']:.2f}x, adaptive "
        f"{paired['spec_adaptive']:.2f}x, carried {paired['spec_carried']:.2f}x; one-hot drafts {out['speedup_sampled_one_hot']:.2f}x; k mask slots "
        f"{rates.get('spec_k_slots', rates['spec']) / rates['plain']:.2f}x), greedy "
        f"{rates['greedy']:.1f} -> {rates['greedy_spec']:.1f} ({out['speedup_greedy']:.2f}x); acceptance length "
        f"sampled {out['acceptance']['spec']['acceptance_length']:.2f} (k mask slots "
        f"{out['acceptance'].get('spec_k_slots', out['acceptance']['spec'])['acceptance_length']:.2f}), one-hot "
        f"{out['acceptance']['one_hot']['acceptance_length']:.2f}, greedy "
        f"{out['acceptance']['greedy_spec']['acceptance_length']:.2f}; host sampler "
        f"{out['host_sampler_ms_per_block']:.2f} ms of a {out['block_ms']:.2f} ms block",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/speculative_sampling-cpu.json"))
    ap.add_argument("--model", default="zoo:tiny-hybrid")
    ap.add_argument("--drafter", default="block:zoo:tiny-block-drafter")
    ap.add_argument("--policy", default="hybrid:4:64")
    ap.add_argument("--backends", type=lambda s: s.split(","), default=["torch", "mlx"])
    ap.add_argument("--ks", type=cli.int_list, default=[4, 8], help="draft lengths")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--seeds", type=int, default=3, help="seeds per prompt (seed, seed + 1, ...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    cli.set_threads(args.threads)
    load_start = harness.load_average()
    results = [measure(b, k, args) for b in args.backends for k in args.ks]
    config = {**vars(args), "out": str(args.out), "command": harness.command("speculative_sampling", argv)}
    harness.write_report(
        args.out, "bench-speculative-sampling", 1, {"config": config, "results": results}, load_start
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
