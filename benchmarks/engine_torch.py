"""Decode throughput of the PyTorch engine vs transformers, and K/V bytes per policy. Writes JSON.

    python -m benchmarks.engine_torch --out benchmarks/results/engine_torch.json

Measures on the same model and code-like prompts (engine.zoo.corpus.code_prompts, or --prompts):
- greedy decode tok/s: transformers `generate` (full cache) vs ours (full and each --policies entry);
- speculative decode tok/s, speedup over our greedy under the same policy, mean acceptance length
  and exactness, for the zoo drafter, the prompt-lookup drafter and the block drafter (--block-drafter,
  reading the verifier's hidden states) at each k in --ks, and for
  transformers assisted generation (`assistant_model`, with assistant_confidence_threshold=0,
  num_assistant_tokens=k and a constant schedule set in the assistant's generation config, where
  transformers reads them);
- K/V bytes held per policy after several sequence lengths;
- batched greedy (engine.generate_batch) vs transformers `generate` on the same B prompts at each B in
  --batches (decode tok/s over all rows; every row checked against greedy decoding of its prompt alone).

    python -m benchmarks.engine_torch --shape qwen3-1.7b --device cpu --out benchmarks/results/engine_torch-qwen3-1.7b-cpu.json

`--shape` (benchmarks/shapes.py) decodes a random-weight model built from a real config instead of a zoo
model: at full size on an accelerator, at a reduced width with the real layer pattern on a cpu; its
speculative rows use prompt lookup (there is no trained drafter for random weights, so acceptance is
low: the speculative target is for the zoo pair). `--device` as engine.load (auto: the accelerator).

Decode tok/s = (new tokens - 1) / (time after the first new token), i.e. prefill excluded; for
`generate` the prefill time is a `max_new_tokens=1` run of the same prompt. Each figure is the best
of --repeats runs per prompt (the machine may be shared), summed over prompts. Acceptance length =
tokens committed per verifier decode forward (for assisted generation: per verifier forward,
its first forward, which also prefills, included). Not a test: targets are reported, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

import engine
from benchmarks import harness, shapes
from engine.backends.torch.session import TorchModel
from engine.drafters.block.torch import BlockDrafter, BlockDrafterModel
from engine.policy import Policy, parse_policy
from engine.zoo import corpus


class Config(BaseModel):
    model: str
    shape: str | None
    device: str
    dtype: str
    batches: list[int]
    drafter: str
    policies: list[str]
    ks: list[int]
    new_tokens: int
    prompts: int
    prompt_tokens: list[int]
    repeats: int
    threads: int
    load_average: list[float]  # os.getloadavg() at the start (1, 5, 15 min): a shared machine's load
    load_average_end: list[float]


class Row(BaseModel):
    method: str  # generate | greedy | speculative | assisted
    policy: str  # ours: the cache policy; transformers: "full"
    drafter: str | None = None  # zoo drafter name | prompt-lookup | None
    k: int | None = None
    tokens: int  # new tokens, summed over prompts
    decode_s: float
    decode_tok_s: float
    speedup_vs_greedy: float | None = None  # vs our greedy under the same policy
    speedup_vs_generate: float | None = None
    acceptance_length: float | None = None
    exact: bool  # tokens equal the reference: generate (greedy full, assisted) / our greedy (others)


class KvRow(BaseModel):
    policy: str
    length: int
    total_bytes: int
    per_layer: list[int]


class BatchRow(BaseModel):
    batch: int
    policy: str
    ours_decode_tok_s: float  # over all rows
    generate_decode_tok_s: float  # transformers generate on the same [batch, prompt] input
    speedup_vs_generate: float
    exact: bool  # every row of ours equals our greedy decoding of its prompt alone, and generate's row


class Targets(BaseModel):
    greedy_full_ge_generate: bool
    greedy_ge_generate_at_every_batch: bool
    best_speculative_speedup: float
    speculative_ge_1_5x_exact: bool


class Body(BaseModel):
    config: Config
    throughput: list[Row]
    batched: list[BatchRow]
    kv_bytes: list[KvRow]
    targets: Targets


def hf_generate(tm: TorchModel, ids: list[int], new: int, **kw: Any) -> tuple[list[int], float, int]:
    """(new tokens, seconds, verifier forwards) of one transformers `generate` call."""
    toks, dt, calls = hf_generate_rows(tm, [ids], new, **kw)
    return toks[0], dt, calls


def hf_generate_rows(
    tm: TorchModel, rows: list[list[int]], new: int, **kw: Any
) -> tuple[list[list[int]], float, int]:
    """`hf_generate` of same-length prompts as one batch (no padding needed)."""
    calls = [0]
    hook = tm.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        with torch.inference_mode():
            t = time.perf_counter()
            x = torch.tensor(rows, device=tm.device)
            out = tm.model.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kw)
            if tm.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
    finally:
        hook.remove()
    return out[:, len(rows[0]) :].tolist(), dt, calls[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_torch.json"))
    ap.add_argument("--model", default="zoo:tiny-hybrid")
    ap.add_argument("--drafter", default="zoo:tiny-drafter")
    ap.add_argument(
        "--policies", default="hybrid:4:64,sink_window:4:64", help="comma-separated, besides full"
    )
    ap.add_argument(
        "--block-drafter",
        default="zoo:tiny-block-drafter",
        help="block drafter (engine/drafters/block.py); '' skips",
    )
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4, help="number of code-like prompts")
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--prompts-file", type=Path, help="JSON list of prompt strings instead of the zoo corpus")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-lengths", default="256,1024,4096")
    ap.add_argument("--shape", choices=sorted(shapes.SHAPES), help="a random-weight model of this shape")
    ap.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 on cuda, float16 on mps, float32 on cpu")
    ap.add_argument("--batches", default="1,8", help="batch sizes: batched greedy vs transformers generate")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    load_start = harness.load_average()
    policies = [engine.full(), *(parse_policy(p) for p in args.policies.split(",") if p)]
    ks = [int(k) for k in args.ks.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    device = engine.models.check_device("torch", args.device)
    if args.shape:
        args.model, args.drafter = f"shape:{args.shape}", "none"
        path = shapes.build(args.shape, reduced=device == "cpu")
        verifier: TorchModel = engine.load(str(path), "torch", args.dtype, device)  # type: ignore[assignment]
        drafter = None
        args.block_drafter = ""  # a block drafter reads the zoo verifier's features only
        g = torch.Generator().manual_seed(0)
        vocab = verifier.geometry.vocab_size
        prompts = [
            torch.randint(3, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)
        ]
    else:
        verifier = engine.load(args.model, "torch", args.dtype, device)  # type: ignore[assignment]
        drafter = engine.load(args.drafter, "torch", args.dtype, device)  # type: ignore[assignment]
        if args.prompts_file:
            texts = json.loads(args.prompts_file.read_text())[: args.prompts]
        else:
            texts = corpus.code_prompts(args.prompts, seed=0, n_tokens=args.prompt_tokens)
        prompts = [verifier.encode(t) for t in texts]
    block = BlockDrafterModel.load(engine.resolve(args.block_drafter)) if args.block_drafter else None
    for tm in (verifier, drafter):
        if tm is not None:
            tm.model.generation_config.eos_token_id = None  # decode exactly new_tokens everywhere
            tm.model.generation_config.pad_token_id = 0
    new, reps = args.new_tokens, args.repeats
    stop = engine.Stop(new)
    rows: list[Row] = []

    def ours(
        seq_of: Callable[[], Any], drafter_of: Callable[[], Any] | None, k: int
    ) -> Callable[[list[int]], Any]:
        def run(ids: list[int]) -> tuple[list[int], float, float]:
            if drafter_of is None:
                g = engine.generate(seq_of(), ids, stop)
            else:
                g = engine.speculative_generate(seq_of(), drafter_of(), ids, k, stop)
            return g.tokens, g.decode_s, g.acceptance_length

        return run

    # Every method runs on every prompt once per repeat, interleaved, so that a busy spell of a
    # shared machine does not land on one method only; the best run per (method, prompt) counts.
    methods: list[dict[str, Any]] = []

    def add(
        method: str,
        policy: str,
        run: Callable[[list[int]], Any],
        ref: str | None,
        drafter_name: str | None = None,
        k: int | None = None,
    ) -> dict[str, Any]:
        m = {
            "method": method,
            "policy": policy,
            "run": run,
            "ref": ref,
            "drafter": drafter_name,
            "k": k,
            "best": [None] * len(prompts),
        }
        methods.append(m)
        return m

    # transformers generate: decode time = time(new tokens) - time(1 token)
    def hf_run(ids: list[int], **kw: Any) -> tuple[list[int], float, float]:
        toks, dt, calls = hf_generate(verifier, ids, new, **kw)
        _, dt1, _ = hf_generate(verifier, ids, 1)
        return toks, dt - dt1, new / max(calls, 1)

    add("generate", "full", hf_run, None)
    for policy in policies:

        def seq_of(policy: Policy = policy) -> Any:
            return verifier.session(policy)

        add("greedy", str(policy), ours(seq_of, None, 0), "generate" if policy.kind == "full" else None)
        for k in ks:
            drafters: list[tuple[str, Any]] = [("prompt-lookup", engine.PromptLookupDrafter)]
            if block is not None:
                drafters.append((args.block_drafter, lambda: BlockDrafter(block)))
            if drafter is not None:
                drafters.insert(
                    0,
                    (
                        args.drafter,
                        lambda p=policy, k=k, d=drafter: engine.ModelDrafter(d.session(p, max_block=k + 1)),
                    ),
                )
            for name, make in drafters:
                add(
                    "speculative",
                    str(policy),
                    ours(lambda p=policy, k=k: verifier.session(p, max_block=k + 1), make, k),
                    f"greedy {policy}",
                    name,
                    k,
                )
    for k in ks if drafter is not None else []:

        def assisted(ids: list[int], k: int = k) -> tuple[list[int], float, float]:
            # transformers reads these from the assistant's own generation config, not from kwargs.
            assert drafter is not None
            gc = drafter.model.generation_config
            gc.assistant_confidence_threshold, gc.num_assistant_tokens = 0.0, k
            gc.num_assistant_tokens_schedule = "constant"
            return hf_run(ids, assistant_model=drafter.model)

        add("assisted", "full", assisted, "generate", args.drafter, k)

    for m in methods:
        m["run"](prompts[0])  # warm-up
    for rep in range(reps):
        for i, ids in enumerate(prompts):
            for m in methods:
                got = m["run"](ids)
                best = m["best"][i]
                if best is not None and got[0] != best[0]:
                    raise RuntimeError(f"{m['method']} gave different tokens on two runs of prompt {i}")
                if best is None or got[1] < best[1]:
                    m["best"][i] = got
        print(f"repeat {rep + 1}/{reps} done", flush=True)

    def key(m: dict[str, Any]) -> str:
        return m["method"] if m["method"] == "generate" else f"{m['method']} {m['policy']}"

    by_key = {key(m): m for m in methods if m["method"] in ("generate", "greedy")}
    for m in methods:
        toks = [b[0] for b in m["best"]]
        secs = sum(b[1] for b in m["best"])
        n = sum(len(t) - 1 for t in toks)
        ref = by_key[m["ref"]] if m["ref"] else None
        row = Row(
            method=m["method"],
            policy=m["policy"],
            drafter=m["drafter"],
            k=m["k"],
            tokens=n + len(toks),
            decode_s=secs,
            decode_tok_s=n / secs,
            acceptance_length=sum(b[2] for b in m["best"]) / len(toks) if m["drafter"] else None,
            exact=ref is None or toks == [b[0] for b in ref["best"]],
        )
        m["row"] = row
        rows.append(row)
    gen_tok_s = by_key["generate"]["row"].decode_tok_s
    for row in rows:
        greedy = by_key.get(f"greedy {row.policy}")
        if row.method != "generate":
            row.speedup_vs_generate = row.decode_tok_s / gen_tok_s
        if row.method in ("speculative", "assisted") and greedy:
            row.speedup_vs_greedy = row.decode_tok_s / greedy["row"].decode_tok_s
        print(
            f"{row.method:12s} {row.policy:20s} {row.drafter or '':18s} k={row.k or '-'} {row.decode_tok_s:8.1f} tok/s"
            f"{'' if row.acceptance_length is None else f'  accept {row.acceptance_length:.2f}'}"
            f"{'' if row.speedup_vs_greedy is None else f'  x{row.speedup_vs_greedy:.2f} vs greedy'}"
            f"{'' if row.exact else '  NOT EXACT'}",
            flush=True,
        )
    greedy_tok_s = {r.policy: r.decode_tok_s for r in rows if r.method == "greedy"}
    gen_row = by_key["generate"]["row"]

    kv_rows = []
    filler = [t for ids in prompts for t in ids]
    for policy in policies:
        seq = verifier.session(policy)
        for length in sorted(int(x) for x in args.kv_lengths.split(",")):
            ids = (filler * (length // len(filler) + 1))[: length - seq.position]
            seq.prefill(ids)
            per_layer = seq.kv_bytes()
            kv_rows.append(
                KvRow(policy=str(policy), length=length, total_bytes=sum(per_layer), per_layer=per_layer)
            )
            print(f"kv {policy!s:20s} {length:7d} {sum(per_layer):12d} B", flush=True)

    batched = []
    alone = {str(p): [b[0] for b in by_key[f"greedy {p}"]["best"]] for p in policies}
    for b in batches:
        rows_in = [prompts[r % len(prompts)] for r in range(b)]
        for policy in policies[:1]:  # full: the policy transformers generate runs too
            best_ours, best_hf = float("inf"), float("inf")
            for _ in range(reps):
                gens = engine.generate_batch(verifier.session(policy, rows=b), rows_in, stop)
                best_ours = min(best_ours, gens[0].decode_s)
                hf_toks, dt, _ = hf_generate_rows(verifier, rows_in, new)
                _, dt1, _ = hf_generate_rows(verifier, rows_in, 1)
                best_hf = min(best_hf, dt - dt1)
            want = [alone[str(policy)][r % len(prompts)] for r in range(b)]
            ours_tok_s, hf_tok_s = b * (new - 1) / best_ours, b * (new - 1) / best_hf
            batched.append(
                BatchRow(
                    batch=b,
                    policy=str(policy),
                    ours_decode_tok_s=ours_tok_s,
                    generate_decode_tok_s=hf_tok_s,
                    speedup_vs_generate=ours_tok_s / hf_tok_s,
                    exact=[g.tokens for g in gens] == want and hf_toks == want,
                )
            )
            print(
                f"batch {b:3d} {policy!s:12s} ours {ours_tok_s:9.1f} tok/s  generate {hf_tok_s:9.1f} tok/s"
                f"  x{ours_tok_s / hf_tok_s:.2f}{'' if batched[-1].exact else '  NOT EXACT'}",
                flush=True,
            )

    spec = [r for r in rows if r.method == "speculative"]
    best = max((r.speedup_vs_greedy or 0.0) for r in spec) if spec else 0.0
    targets = Targets(
        greedy_full_ge_generate=greedy_tok_s["full"] >= gen_row.decode_tok_s,
        greedy_ge_generate_at_every_batch=all(b.speedup_vs_generate >= 1.0 for b in batched),
        best_speculative_speedup=best,
        speculative_ge_1_5x_exact=any((r.speedup_vs_greedy or 0) >= 1.5 and r.exact for r in spec),
    )
    body = Body(
        config=Config(
            model=args.model,
            shape=args.shape,
            device=device,
            dtype=verifier.dtype_name,
            batches=batches,
            drafter=args.drafter,
            policies=[str(p) for p in policies],
            ks=ks,
            new_tokens=new,
            prompts=len(prompts),
            prompt_tokens=[len(p) for p in prompts],
            repeats=reps,
            threads=args.threads,
            load_average=load_start,
            load_average_end=harness.load_average(),
        ),
        throughput=rows,
        batched=batched,
        kv_bytes=kv_rows,
        targets=targets,
    )
    harness.write_report(args.out, "bench-engine-torch", 1, body.model_dump())
    print(json.dumps(targets.model_dump()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
