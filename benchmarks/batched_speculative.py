"""Batched speculative decoding against batched greedy, side by side, per batch size and backend. Writes JSON.

    python -m benchmarks.batched_speculative --out benchmarks/results/batched_speculative-cpu.json

The zoo code workload (presets/throughput-code.yaml's defaults: zoo:tiny-hybrid, the block drafter
zoo:tiny-block-drafter, hybrid:4:64, k = 4, 4 zoo code prompts of 96 tokens cycled over the rows, 96 new
tokens): for each backend and batch size B, batched greedy (`generate_batch`), batched speculative
decoding with k fixed, with the adaptive draft length of each call alone (`adaptive`:
`speculative_generate_batch(adapt=True)`, engine/draft_length.py `DraftLength`: every call pays its own
probes) and with one `DraftLength` carried over every call of the backend (`carried`: `adapt=length`, as a
process decoding many batches runs; only its first call at a batch size pays the probes). Each method runs once per repeat, interleaved, so a busy spell of a
shared machine hits all of them alike; the fastest run of each counts (on each clock). Reported per
method: decode tok/s over all rows (wall time; and CPU time of the process in the decode phase, read at
the engine's own clock reads, which other processes' load does not inflate; threads = 1), the
speedup over batched greedy on both clocks (and the median over repeats of each repeat's CPU-time
speedup against the greedy run next to it, steadier than the fastest runs on a busy machine), acceptance length (tokens per row per verify forward),
per-position acceptance, the draft lengths the adaptive runs chose, and whether every row equals greedy
decoding of its prompt (checked: a row that is not exact is an error). The load average before and after
and the exact command go into the report. Not a test: figures are reported, not asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import engine
import engine.decode as decode
import engine.speculative as spec
from benchmarks import harness
from benchmarks.harness import Clocks
from engine.draft_length import DraftLength
from engine.drafters import load_drafter, parse_drafter
from engine.zoo import corpus

METHODS = ("greedy", "fixed", "adaptive", "carried")


def _run(
    model: Any, method: str, rows: list[list[int]], args: argparse.Namespace, make: Any, carried: Any = None
) -> dict[str, Any]:
    """One batched run; its decode time on both clocks, its tokens and acceptance."""
    b, stop, k = len(rows), engine.Stop(args.new_tokens, model.eos_ids), args.k
    chosen: list[int] = []
    clocks = Clocks()
    choose = DraftLength.choose

    def record(self: DraftLength, n: int = 1) -> int:
        chosen.append(choose(self, n))
        return chosen[-1]

    DraftLength.choose = record  # type: ignore[method-assign]
    decode.time, spec.time = clocks, clocks  # type: ignore[assignment]
    try:
        if method == "greedy":
            gens = engine.generate_batch(model.session(engine.parse_policy(args.policy), rows=b), rows, stop)
        else:
            session = model.session(engine.parse_policy(args.policy), k + 1, rows=b)
            drafter = make(session)
            drafters = drafter if hasattr(drafter, "propose_rows") else [drafter]
            adapt = carried if method == "carried" else method == "adaptive"
            gens = engine.speculative_generate_batch(session, drafters, rows, k, stop, adapt=adapt)
    finally:
        DraftLength.choose = choose  # type: ignore[method-assign]
        decode.time, spec.time = time, time  # type: ignore[assignment]
    decode_wall = gens[0].decode_s
    new = sum(len(g.tokens) for g in gens) - b  # the first token of each row comes from prefill
    forwards = sum(g.forwards for g in gens)
    n = max((len(g.position_drafted) for g in gens), default=0)
    drafted = [sum(g.position_drafted[i] for g in gens if i < len(g.position_drafted)) for i in range(n)]
    accepted = [sum(g.position_accepted[i] for g in gens if i < len(g.position_accepted)) for i in range(n)]
    return {
        "tokens": [g.tokens for g in gens],
        "decode_s": decode_wall,
        "decode_cpu_s": clocks.cpu_since(clocks.log[-1][0] - decode_wall),
        "new_tokens": new,
        "acceptance_length": new / forwards if forwards and method != "greedy" else 1.0,
        "position_acceptance": [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)],
        "chosen_k": chosen,
    }


def bench(backend: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    model = engine.load(args.model, backend)  # type: ignore[arg-type]
    prompts = [model.encode(t) for t in corpus.code_prompts(args.prompts, args.seed, args.prompt_tokens)]
    make = load_drafter(parse_drafter(args.drafter), model, k=args.k)
    stop = engine.Stop(args.new_tokens, model.eos_ids)
    alone = [
        engine.generate(model.session(engine.parse_policy(args.policy)), p, stop).tokens for p in prompts
    ]
    out = []
    carried = DraftLength.for_loops(args.k)  # one for the whole backend: its costs carry over between calls
    for b in args.batches:
        rows = [prompts[r % len(prompts)] for r in range(b)]
        _run(model, "fixed", rows[:1], args, make)  # warm the shapes of this batch size
        best: dict[str, dict[str, Any]] = {}
        ratios: dict[str, list[float]] = {m: [] for m in METHODS}  # per repeat: CPU time of greedy / method
        for _ in range(args.repeats):
            cpu: dict[str, float] = {}
            for method in METHODS:
                run = _run(model, method, rows, args, make, carried)
                cpu[method] = run["decode_cpu_s"] / run["new_tokens"]
                if run["tokens"] != [alone[r % len(alone)] for r in range(b)]:
                    raise RuntimeError(f"{backend} B={b} {method}: a row differs from greedy decoding alone")
                if method not in best or run["decode_s"] < best[method]["decode_s"]:
                    best[method] = {
                        **run,
                        "decode_cpu_s": min(run["decode_cpu_s"], best.get(method, run)["decode_cpu_s"]),
                    }
            for method in METHODS:
                ratios[method].append(cpu["greedy"] / cpu[method])
        greedy = best["greedy"]
        row: dict[str, Any] = {"backend": backend, "batch": b}
        for method in METHODS:
            r = best[method]
            tok_s, cpu_tok_s = r["new_tokens"] / r["decode_s"], r["new_tokens"] / r["decode_cpu_s"]
            row[method] = {
                "decode_tok_s": tok_s,
                "cpu_tok_s": cpu_tok_s,
                "speedup": tok_s / (greedy["new_tokens"] / greedy["decode_s"]),
                "cpu_speedup": cpu_tok_s / (greedy["new_tokens"] / greedy["decode_cpu_s"]),
                "cpu_speedup_median": statistics.median(ratios[method]),
                "acceptance_length": r["acceptance_length"],
                "position_acceptance": r["position_acceptance"],
                "chosen_k": "".join(map(str, r["chosen_k"])) if method in ("adaptive", "carried") else None,
                "exact": True,
            }
        out.append(row)
        print(
            f"{backend} B={b}: "
            + ", ".join(
                f"{m} {row[m]['decode_tok_s']:.0f} tok/s ({row[m]['speedup']:.2f}x, cpu {row[m]['cpu_speedup']:.2f}x, "
                f"median {row[m]['cpu_speedup_median']:.2f}x)"
                for m in METHODS
            ),
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/batched_speculative-cpu.json"))
    ap.add_argument("--backends", default="torch,mlx")
    ap.add_argument("--model", default="zoo:tiny-hybrid")
    ap.add_argument("--drafter", default="block:zoo:tiny-block-drafter")
    ap.add_argument("--policy", default="hybrid:4:64")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    import torch

    torch.set_num_threads(1)
    load_before = harness.load_average()
    t0 = time.perf_counter()
    results = [row for backend in args.backends.split(",") for row in bench(backend, args)]
    config = {k: v for k, v in vars(args).items() if k != "out"}
    harness.write_report(
        args.out,
        "bench-batched-speculative",
        1,
        {
            "command": harness.command("batched_speculative", argv),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "wall_s": round(time.perf_counter() - t0, 1),
            "config": config,
            "results": results,
        },
        load_before,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
