"""The masked-diffusion drafter against greedy, the AR zoo drafter and prompt lookup. Writes JSON.

    python -m benchmarks.diffusion --out benchmarks/results/diffusion-cpu.json

On the zoo verifier and code-like prompts (engine.zoo.corpus.code_prompts): for every policy, greedy
decoding and speculative decoding with each drafter at each k: decode tok/s (prefill excluded),
mean acceptance length (tokens committed per verifier decode forward), accepted/drafted, and
exactness against greedy under the same policy (checked, and a failure to be exact is an error).
Drafters: the AR zoo drafter (its own bounded cache, the same policy), prompt lookup, and the
diffusion drafter (zoo:tiny-dlm, no K/V) at each --dlm-steps denoising budget. Every method runs
on every prompt once per repeat, interleaved; the best time per (method, prompt) counts. The
report's `environment` names the machine. Not a test: figures are reported, not asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import engine
from benchmarks import harness
from engine.drafters.diffusion.drafter import DiffusionDrafter
from engine.drafters.load import load_diffusion_model
from engine.policy import parse_policy


class Config(BaseModel):
    backend: str
    model: str
    drafter: str
    dlm: str
    dlm_steps: list[int]
    policies: list[str]
    ks: list[int]
    new_tokens: int
    prompts: int
    prompt_tokens: int
    repeats: int
    threads: int


class Row(BaseModel):
    policy: str
    drafter: str  # none (greedy) | ar:<model> | prompt-lookup | diffusion:<model>:steps<S>
    k: int | None
    tokens: int  # new tokens, summed over prompts
    decode_s: float
    decode_tok_s: float
    speedup_vs_greedy: float
    acceptance_length: float  # tokens committed per verifier decode forward (1.0 for greedy)
    accepted_per_drafted: float | None
    drafter_kv_bytes: int | None  # K/V the drafter holds at the end of a generation
    exact: bool


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/diffusion-cpu.json"))
    ap.add_argument("--backend", default="torch", choices=["torch", "mlx"])
    ap.add_argument("--model", default="zoo:tiny-hybrid")
    ap.add_argument("--drafter", default="zoo:tiny-drafter")
    ap.add_argument("--dlm", default="zoo:tiny-dlm")
    ap.add_argument("--dlm-steps", default="2,4", help="denoising-step budgets of the diffusion drafter")
    ap.add_argument("--policies", default="full,hybrid:4:64,sink_window:4:64")
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = ap.parse_args(argv)
    load_before = harness.load_average()

    if args.backend == "torch":
        import torch

        torch.set_num_threads(args.threads)
    from engine.zoo import corpus

    verifier = engine.load(args.model, backend=args.backend)
    ar = engine.load(args.drafter, backend=args.backend)
    dlm = load_diffusion_model(args.dlm, backend=args.backend)
    texts = corpus.code_prompts(args.prompts, seed=0, n_tokens=args.prompt_tokens)
    prompts = [verifier.encode(t) for t in texts]
    stop = engine.Stop(args.new_tokens)
    ks = [int(k) for k in args.ks.split(",")]
    policies = [parse_policy(p) for p in args.policies.split(",")]

    # (policy, drafter name, k, make drafter or None for greedy)
    methods: list[tuple[Any, str, int | None, Callable[[], Any] | None]] = []
    for p in policies:
        methods.append((p, "none", None, None))
        for k in ks:
            methods.append(
                (
                    p,
                    f"ar:{args.drafter}",
                    k,
                    lambda p=p, k=k: engine.ModelDrafter(ar.session(p, max_block=k + 1)),
                )
            )
            methods.append((p, "prompt-lookup", k, engine.PromptLookupDrafter))
            for s in (int(x) for x in args.dlm_steps.split(",")):
                methods.append(
                    (p, f"diffusion:{args.dlm}:steps{s}", k, lambda s=s: DiffusionDrafter(dlm, steps=s))
                )

    def run(m: tuple[Any, str, int | None, Callable[[], Any] | None], ids: list[int]) -> tuple[Any, Any]:
        policy, _, k, make = m
        if make is None:
            return engine.generate(verifier.session(policy), ids, stop), None
        drafter = make()
        return engine.speculative_generate(
            verifier.session(policy, max_block=k + 1), drafter, ids, k, stop
        ), drafter

    for m in methods:
        run(m, prompts[0])  # warm-up
    best: list[list[Any]] = [[None] * len(prompts) for _ in methods]
    for rep in range(args.repeats):
        for i, ids in enumerate(prompts):
            for j, m in enumerate(methods):
                gen, drafter = run(m, ids)
                if best[j][i] is None or gen.decode_s < best[j][i][0].decode_s:
                    best[j][i] = (gen, drafter)
        print(f"repeat {rep + 1}/{args.repeats} done", flush=True)

    greedy = {str(m[0]): best[j] for j, m in enumerate(methods) if m[3] is None}
    rows: list[Row] = []
    for j, (policy, name, k, make) in enumerate(methods):
        gens = [b[0] for b in best[j]]
        ref = [b[0] for b in greedy[str(policy)]]
        n = sum(len(g.tokens) - 1 for g in gens)
        secs = sum(g.decode_s for g in gens)
        ref_tok_s = sum(len(g.tokens) - 1 for g in ref) / sum(g.decode_s for g in ref)
        drafted = sum(g.drafted for g in gens)
        last = best[j][-1][1]
        row = Row(
            policy=str(policy),
            drafter=name,
            k=k,
            tokens=n + len(gens),
            decode_s=round(secs, 4),
            decode_tok_s=round(n / secs, 1),
            speedup_vs_greedy=round(n / secs / ref_tok_s, 3),
            acceptance_length=round(n / max(1, sum(g.forwards for g in gens)), 3),
            accepted_per_drafted=round(sum(g.accepted for g in gens) / drafted, 3) if make else None,
            drafter_kv_bytes=(
                last.kv_bytes()
                if isinstance(last, DiffusionDrafter)
                else (sum(last.session.kv_bytes()) if isinstance(last, engine.ModelDrafter) else 0)
            )
            if make
            else None,
            exact=all(g.tokens == r.tokens for g, r in zip(gens, ref, strict=True)),
        )
        rows.append(row)
        print(
            f"{row.policy:18s} {name:32s} k={k or '-'} {row.decode_tok_s:8.1f} tok/s "
            f"x{row.speedup_vs_greedy:.2f}  accept {row.acceptance_length:.2f}"
            f"{'' if row.exact else '  NOT EXACT'}",
            flush=True,
        )
    config = Config(
        backend=args.backend,
        model=args.model,
        drafter=args.drafter,
        dlm=args.dlm,
        dlm_steps=[int(x) for x in args.dlm_steps.split(",")],
        policies=[str(p) for p in policies],
        ks=ks,
        new_tokens=args.new_tokens,
        prompts=args.prompts,
        prompt_tokens=args.prompt_tokens,
        repeats=args.repeats,
        threads=args.threads,
    )
    body = {"config": config.model_dump(), "rows": [r.model_dump() for r in rows]}
    harness.write_report(args.out, "bench-diffusion", 1, body, load_before)
    if not all(r.exact for r in rows):
        print("error: a speculative run was not exactly greedy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
