"""Linear-attention hybrid (random-weight Qwen3.5 `qwen3_5_text`, CPU): greedy decode tok/s, ours vs
transformers `generate` and vs mlx-lm, and the cost of rolling back a partly rejected block. Writes JSON.

    python -m benchmarks.engine_linear --out benchmarks/results/engine_linear.json

Rollback (engine/backends/base.py): restore the linear layers' snapshots and feed the kept tokens
again; measured as the wall time of `trim(k - kept)` after a verify forward of k + 1 tokens, next to
that forward's own time. Decode tok/s = (new - 1) / time after prefill, best of --repeats. Not a test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import engine
from benchmarks import harness
from engine.backends.torch.session import TorchModel


def build(path: Path, layers: int, hidden: int) -> TorchModel:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        vocab_size=4096, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=hidden // 4, linear_value_head_dim=hidden // 4,
        initializer_range=0.2, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    model = Qwen3_5ForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    return TorchModel(model)


def best(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ids = torch.randint(3, 4096, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    load_before = harness.load_average()
    out: dict[str, Any] = {"command": harness.command("engine_linear")}
    out["setup"] = vars(args) | {"out": str(args.out), "threads": 1}
    with tempfile.TemporaryDirectory() as tmp:
        tm = build(Path(tmp), args.layers, args.hidden)
        models: dict[str, Any] = {"torch": tm}
        with torch.inference_mode():
            pre = best(lambda: tm.model.generate(torch.tensor([ids]), max_new_tokens=1, do_sample=False), 1)
            gen = best(
                lambda: tm.model.generate(torch.tensor([ids]), max_new_tokens=args.new, do_sample=False),
                args.repeats,
            )
        tok: dict[str, float] = {"transformers_generate": (args.new - 1) / (gen - pre)}
        try:
            import mlx.core as mx
            from mlx_lm.generate import generate_step

            from engine.backends.mlx.session import load_mlx

            models["mlx"] = mlx_model = load_mlx(Path(tmp))

            def mlx_lm() -> float:
                t0, first = time.perf_counter(), None
                for i, _ in zip(range(args.new), generate_step(mx.array(ids), mlx_model.model), strict=False):
                    first = time.perf_counter() if i == 0 else first
                return time.perf_counter() - (first or t0)

            tok["mlx_lm_generate_step"] = (args.new - 1) / min(mlx_lm() for _ in range(args.repeats))
        except ImportError:
            pass
        rollback: dict[str, Any] = {}
        for name, m in models.items():
            for policy in (engine.full(), engine.sink_window(4, 64)):
                decode = min(
                    engine.generate(m.session(policy), ids, engine.Stop(args.new)).decode_s
                    for _ in range(args.repeats)
                )
                tok[f"ours_{name}_{policy}"] = (args.new - 1) / decode
            s = m.session(engine.sink_window(4, 64), max_block=args.k + 1)
            s.prefill(ids)
            fwd, trims = [], []
            for i in range(8):
                block = ids[i * 5 : i * 5 + args.k + 1]
                t0 = time.perf_counter()
                s.forward(block)
                t1 = time.perf_counter()
                s.trim(args.k - 1)  # 2 of k + 1 kept: restore + one forward of 2 tokens
                trims.append(time.perf_counter() - t1)
                fwd.append(t1 - t0)
            rollback[name] = {
                "verify_forward_ms": 1e3 * sorted(fwd)[len(fwd) // 2],
                "rollback_ms": 1e3 * sorted(trims)[len(trims) // 2],
                "kept_of_block": f"2 of {args.k + 1}",
            }
    out["decode_tok_s"] = tok
    out["rollback_per_block"] = rollback
    out["environment"] = harness.environment(load_before)
    harness.write_json(args.out, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
