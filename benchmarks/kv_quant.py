"""Quantized K/V study: needle recall, logit drift and K/V bytes vs storage bits, and decode tok/s of q8
vs the model dtype. Writes JSON (+ a PNG and a markdown table next to it).

    python -m benchmarks.kv_quant --out benchmarks/results/kv_quant.json

For each context length x precision (16 = the model dtype, q8, k8v4, q4) of one cache policy
(`--policy`, default hybrid:4:64), on the same `engine.workloads.niah` haystacks (needles outside the
window, depths 0..1): recall = exact match of the greedy answer (the oracle is `full` in the model
dtype); logit drift = max |logits - logits of the same policy in the model dtype| at the last prompt
position, relative to the max |logit|, and the fraction of haystacks whose greedy answer equals the
unquantized policy's; K/V bytes measured from the cache after decoding.

Throughput: greedy decode tok/s of `--policy` and `full`, each in the model dtype and q8 (and q4), on
--prompt-tokens of haystack, `--new` tokens, best of --repeats (prefill excluded; the sessions decode in
turns of 16 steps each, so that the speed changes of a shared machine hit them alike), on the zoo model and
on each of `--shapes` (benchmarks/shapes.py: random weights in a real model's layer pattern, at reduced
width on a cpu unless --full-size, full size elsewhere; random prompt ids). Not a test: the target (q8 >= 0.8x the model
dtype) is reported per model, not asserted.

    python -m benchmarks.kv_quant --shapes qwen3-1.7b,gemma3-hybrid --out benchmarks/results/kv_quant.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import engine
from benchmarks import harness, shapes
from engine.policy import Policy, parse_policy, with_precision
from engine.workloads import niah, plots
from engine.zoo import corpus

PRECISIONS = ["", "q8", "k8v4", "q4"]
TURN = 16  # decode steps per policy per turn (throughput)
LABEL = {"": "16", "q8": "8", "k8v4": "k8v4", "q4": "4"}


def _logits(step: Any) -> np.ndarray:
    rows = step.logits
    return np.array(rows.float().numpy() if hasattr(rows, "float") else rows, dtype=np.float64)[-1]


def study(model: engine.Model, policy: Policy, contexts: list[int], samples: int) -> list[dict[str, Any]]:
    scale = niah.tokens_per_word(model)
    out = []
    for context in contexts:
        stats = {p: {"hits": 0, "agree": 0, "drift": 0.0, "kv": 0} for p in ["oracle", *PRECISIONS]}
        n = 0
        for depth in niah.DEPTHS:
            for s in range(samples):
                placed = niah.place(model, context, depth, s, policy.sink, policy.window or 0, scale)
                max_new = max(2, len(model.encode("? " + placed.answer)) - len(model.encode("?")) + 1)
                want = placed.answer.split()
                n += 1
                base_logits, base_tokens = None, None
                for prec in ["oracle", *PRECISIONS]:
                    p = engine.full() if prec == "oracle" else with_precision(policy, prec)
                    seq = model.session(p)
                    first = seq.prefill(placed.ids, logits=True)
                    row = _logits(first)
                    tokens = [first.tokens[-1]]
                    while len(tokens) < max_new:
                        tokens.append(seq.forward([tokens[-1]]).tokens[-1])
                    st = stats[prec]
                    st["hits"] += model.decode(tokens).replace(corpus.EOS, " ").split()[: len(want)] == want
                    st["kv"] = max(st["kv"], sum(seq.kv_bytes()))
                    if prec == "":
                        base_logits, base_tokens = row, tokens
                    if prec != "oracle" and base_logits is not None:
                        drift = float(np.abs(row - base_logits).max() / np.abs(base_logits).max())
                        st["drift"] = max(st["drift"], drift)
                        st["agree"] += tokens == base_tokens
        for prec in ["oracle", *PRECISIONS]:
            st = stats[prec]
            out.append(
                {
                    "context": context,
                    "policy": "full" if prec == "oracle" else str(with_precision(policy, prec)),
                    "bits": "oracle" if prec == "oracle" else LABEL[prec],
                    "haystacks": n,
                    "recall": st["hits"] / n,
                    "max_rel_logit_drift": None if prec == "oracle" else st["drift"],
                    "answer_agreement": None if prec == "oracle" else st["agree"] / n,
                    "kv_bytes": st["kv"],
                }
            )
            print(f"ctx {context:5d} {out[-1]['policy']:24s} recall {out[-1]['recall']:.2f}", flush=True)
    return out


def throughput(
    name: str, model: engine.Model, policies: list[Policy], ids: list[int], new: int, repeats: int
) -> list[dict[str, Any]]:
    best: dict[str, float] = {}
    tokens: dict[str, list[int]] = {}
    for _ in range(repeats):
        seqs = {str(p): model.session(p) for p in policies}
        out = {key: [seq.prefill(ids).tokens[-1]] for key, seq in seqs.items()}
        secs = dict.fromkeys(seqs, 0.0)
        for start in range(0, new - 1, TURN):  # turns of TURN steps per policy: a busy moment of a
            for key, seq in seqs.items():  # shared machine (they last seconds) hits every policy alike
                toks = out[key]
                t0 = time.perf_counter()
                for _ in range(min(TURN, new - 1 - start)):
                    toks.append(seq.forward([toks[-1]]).tokens[-1])
                secs[key] += time.perf_counter() - t0
        for key in seqs:
            best[key] = min(best.get(key, secs[key]), secs[key])
        tokens = out
    rows = []
    for p in policies:
        base = str(with_precision(p, ""))
        rows.append(
            {
                "model": name,
                "policy": str(p),
                "prompt_tokens": len(ids),
                "new_tokens": new,
                "decode_tok_s": (new - 1) / best[str(p)],
                "vs_model_dtype": best[base] / best[str(p)],
                "same_tokens_as_model_dtype": tokens[str(p)] == tokens[base],
            }
        )
        print(
            f"decode {name} {p!s:24s} {rows[-1]['decode_tok_s']:8.1f} tok/s x{rows[-1]['vs_model_dtype']:.2f}"
        )
    return rows


def _kernels(backend: str) -> str:
    """Which quantize / dequantize the torch backend ran (C kernels or torch ops, and why)."""
    if backend != "torch":
        return "mlx: mx.quantize; q8/q4 attend through mx.quantized_matmul, k8v4 dequantizes"
    from engine.backends.torch import kv_kernels

    return kv_kernels.status()


def draw(body: dict[str, Any], path: Path) -> None:
    plt = plots.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    contexts = sorted({r["context"] for r in body["study"]})
    for bits in ["oracle", *(LABEL[p] for p in PRECISIONS)]:
        rows = [r for r in body["study"] if r["bits"] == bits]
        ax.plot(contexts, [r["recall"] for r in rows], "-o", label=rows[0]["policy"])
        if bits != "oracle":
            bx.plot(contexts, [r["max_rel_logit_drift"] for r in rows], "-o", label=rows[0]["policy"])
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("needle recall")
    bx.set_yscale("log")
    bx.set_ylabel("max |logit drift| / max |logit|")
    for axis in (ax, bx):
        axis.set_xscale("log", base=2)
        axis.set_xticks(contexts, [str(c) for c in contexts])
        axis.minorticks_off()
        axis.set_xlabel("context (tokens)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(f"quantized K/V: {body['config']['model']} ({body['config']['backend']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(body: dict[str, Any]) -> str:
    lines = [
        "| context | policy | bits | recall | max rel. logit drift | answers = 16-bit | K/V bytes | vs 16-bit |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    base = {r["context"]: r["kv_bytes"] for r in body["study"] if r["bits"] == "16"}
    for r in body["study"]:
        drift = "" if r["max_rel_logit_drift"] is None else f"{r['max_rel_logit_drift']:.4f}"
        agree = "" if r["answer_agreement"] is None else f"{r['answer_agreement']:.2f}"
        lines.append(
            f"| {r['context']} | {r['policy']} | {r['bits']} | {r['recall']:.2f} | {drift} | {agree} | "
            f"{r['kv_bytes']:,} | {r['kv_bytes'] / base[r['context']]:.3f} |"
        )
    lines += [
        "",
        f"Quantized K/V kernels: {body['kv_kernels']}",
        "",
        "| model | policy | decode tok/s | vs model dtype | same tokens |",
        "|---|---|---:|---:|---|",
    ]
    for r in body["throughput"]:
        lines.append(
            f"| {r['model']} | {r['policy']} | {r['decode_tok_s']:.1f} | {r['vs_model_dtype']:.2f}x | {r['same_tokens_as_model_dtype']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:tiny-hybrid")
    parser.add_argument("--backend", choices=("torch", "mlx"), default="torch")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--policy", default="hybrid:4:64")
    parser.add_argument("--contexts", type=lambda t: [int(x) for x in t.split(",")], default=[256, 512, 1024])
    parser.add_argument("--samples", type=int, default=2, help="haystacks per depth (5 depths)")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--shapes",
        type=lambda t: [x for x in t.split(",") if x],
        default=[],
        help=f"also measure decode tok/s on these random-weight shapes: {', '.join(shapes.SHAPES)}",
    )
    parser.add_argument(
        "--full-size", action="store_true", help="the shapes at their real size on a cpu too (not reduced)"
    )
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    load_before = harness.load_average()
    try:
        policy = with_precision(parse_policy(args.policy), "")
        for shape in args.shapes:
            shapes.config(shape, reduced=True)
    except ValueError as exc:
        parser.error(str(exc))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model = engine.load(args.model, args.backend, args.dtype)
    rows = study(model, policy, args.contexts, args.samples)
    tp = [p for b in (policy, engine.full()) for p in (b, with_precision(b, "q8"), with_precision(b, "q4"))]
    ids = niah.place(model, args.prompt_tokens, 0.5, 0, 0, 1, niah.tokens_per_word(model)).ids
    speed = throughput(args.model, model, tp, ids, args.new, args.repeats)
    for shape in args.shapes:
        reduced = model.device_name.startswith("cpu") and not args.full_size  # full size on an accelerator
        shaped = engine.load(str(shapes.build(shape, reduced)), args.backend, args.dtype)
        vocab = shaped.geometry.vocab_size
        rand = np.random.default_rng(0).integers(3, vocab, args.prompt_tokens).tolist()
        speed += throughput(f"shape:{shape}", shaped, tp, rand, args.new, args.repeats)
    body: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "kv_kernels": _kernels(args.backend),
        "study": rows,
        "throughput": speed,
    }
    q8: dict[str, list[float]] = {r["model"]: [] for r in speed}
    for r in speed:
        if r["policy"].endswith(":q8"):
            q8[r["model"]].append(r["vs_model_dtype"])
    body["targets"] = {
        "q8_tok_s_ge_0_8x": {name: min(v) >= 0.8 for name, v in q8.items()},
        "q8_keeps_oracle_recall": all(
            r["recall"] >= o["recall"]
            for r in rows
            if r["bits"] == "8"
            for o in rows
            if o["bits"] == "oracle" and o["context"] == r["context"]
        ),
    }
    out = Path(args.out)
    harness.write_report(out, "bench-kv-quant", 1, body, load_before)
    draw(body, out.with_suffix(".png"))
    out.with_suffix(".md").write_text(markdown(body) + "\n")
    print(markdown(body))
    print(f"targets: {body['targets']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
