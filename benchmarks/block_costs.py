"""What a speculative block at each draft length costs against a plain batched step, per batch size and
backend. Writes JSON.

    python -m benchmarks.block_costs --out benchmarks/results/block_costs-cpu.json

The numbers engine/draft_length.py's choices rest on: for each backend and batch size B (zoo code prompts
cycled over the rows; zoo:tiny-hybrid, the block drafter, hybrid:4:64), batched greedy decoding's CPU time
per step (`generate_batch`), then batched speculative decoding with the draft length forced to each k in 0..k
every block (a `DraftLength` that always chooses k), every block timed on the loop's own clock (CPU time
of the process on a CPU verifier): the median and least block time, and the block's drafter share
(proposing, observing, accepting). A k = 0 block keeps the drafter's context (its upkeep); a plain step
does not. Runs `repeats` times each, interleaved; every row of every run is checked against greedy. Not a
test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import engine
import engine.decode as decode
from benchmarks import harness
from benchmarks.harness import Clocks
from engine.draft_length import DraftLength
from engine.drafters import load_drafter, parse_drafter
from engine.workloads import cli
from engine.zoo import corpus


class Forced(DraftLength):
    """A draft length that is always `k`, recording each block's seconds and drafter seconds."""

    def __init__(self, k_max: int, k: int) -> None:
        super().__init__(k_max)
        self.k, self.blocks = k, []  # type: ignore[var-annotated]

    def choose(self, rows: int = 1) -> int:
        return self.k

    def record(
        self,
        k: int,
        seconds: float,
        rows: int = 1,
        drafted: Any = (),
        accepted: Any = (),
        drafter: float = 0.0,
    ) -> None:
        self.blocks.append((seconds, drafter))


def measure(backend: str, b: int, args: argparse.Namespace) -> dict[str, Any]:
    model = engine.load(args.model, backend)  # type: ignore[arg-type]
    make = load_drafter(parse_drafter(args.drafter), model, k=args.k)
    policy = engine.parse_policy(args.policy)
    prompts = [model.encode(t) for t in corpus.code_prompts(4, args.seed, args.prompt_tokens)]
    rows = [prompts[r % len(prompts)] for r in range(b)]
    stop = engine.Stop(args.new_tokens, model.eos_ids)
    plain: list[float] = []
    blocks: dict[int, list[tuple[float, float]]] = {k: [] for k in range(args.k + 1)}
    for _ in range(args.repeats):
        clocks = Clocks()
        decode.time = clocks  # type: ignore[assignment]
        try:
            gens = engine.generate_batch(model.session(policy, rows=b), rows, stop)
        finally:
            decode.time = time  # type: ignore[assignment]
        want = [g.tokens for g in gens]
        cpu = clocks.cpu_since(clocks.log[-1][0] - gens[0].decode_s)  # the decode phase's CPU time
        plain.append(cpu / max(g.forwards for g in gens))
        for k in blocks:
            session = model.session(policy, args.k + 1, rows=b)
            drafter = make(session)
            forced = Forced(args.k, k)
            got = engine.speculative_generate_batch(
                session,
                drafter if hasattr(drafter, "propose_rows") else [drafter],
                rows,
                args.k,
                stop,
                adapt=forced,
            )
            if [g.tokens for g in got] != want:
                raise RuntimeError(f"{backend} B={b} k={k}: a row differs from greedy decoding")
            blocks[k] += forced.blocks[1:]  # the first block carries the first forward's one-off costs
    step = statistics.median(plain)
    out = {
        "backend": backend,
        "batch": b,
        "plain_step_ms": 1e3 * step,
        "blocks": {
            str(k): {
                "median_ms": 1e3 * statistics.median(t for t, _ in seen),
                "least_ms": 1e3 * min(t for t, _ in seen),
                "drafter_ms": 1e3 * statistics.median(d for _, d in seen),
                "plain_steps": statistics.median(t for t, _ in seen) / step,
            }
            for k, seen in blocks.items()
        },
    }
    print(
        f"{backend:5s} B={b}: plain step {out['plain_step_ms']:.2f} ms; blocks (median ms, in plain steps, drafter "
        "ms): "
        + ", ".join(
            f"k={k} {v['median_ms']:.2f} ({v['plain_steps']:.2f}x, {v['drafter_ms']:.2f})"
            for k, v in out["blocks"].items()
        ),
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/block_costs-cpu.json"))
    ap.add_argument("--model", default="zoo:tiny-hybrid")
    ap.add_argument("--drafter", default="block:zoo:tiny-block-drafter")
    ap.add_argument("--policy", default="hybrid:4:64")
    ap.add_argument("--backends", type=lambda s: s.split(","), default=["torch", "mlx"])
    ap.add_argument("--batches", type=cli.int_list, default=[1, 8, 32])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    cli.set_threads(args.threads)
    load_start = harness.load_average()
    results = [measure(backend, b, args) for backend in args.backends for b in args.batches]
    config = {**vars(args), "out": str(args.out), "command": harness.command("block_costs", argv)}
    harness.write_report(args.out, "bench-block-costs", 1, {"config": config, "results": results}, load_start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
