"""`python -m engine.serve --model zoo:tiny-hybrid [--drafter block:zoo:tiny-block-drafter] --port 8000`:
the engine behind an OpenAI-compatible HTTP API (docs/serving.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.serve.config import ServeConfig


def parse_bytes(text: str) -> int:
    """`1073741824`, `512M`, `2G`, `64K` (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        n = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected bytes such as 1073741824, 512M or 2G, got {text!r}"
        ) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.serve", description=__doc__)
    p.add_argument(
        "--model",
        default="zoo:tiny-hybrid",
        help="zoo:NAME, a model directory, or a NAME under $KAKEYA_MODELS",
    )
    p.add_argument("--served-model-name", default=None, help="the model id clients name (default: --model)")
    p.add_argument("--backend", choices=("torch", "mlx"), default="torch")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto", help="torch: auto|cpu|cuda|cuda:N|mps; mlx: auto|gpu|cpu")
    p.add_argument(
        "--policy", default="sink_window:4:256", help="cache policy (full, sink_window:S:W, hybrid:S:W)"
    )
    p.add_argument(
        "--drafter", default="none", help="none, lookup, model:REF, block:REF, diffusion:REF:steps=N"
    )
    p.add_argument("--k", type=int, default=4, help="the most tokens drafted per block")
    p.add_argument("--no-adapt", action="store_true", help="always draft k (default: k from measured costs)")
    p.add_argument(
        "--kv-budget", type=parse_bytes, default=parse_bytes("1G"), help="K/V bytes all sequences may hold"
    )
    p.add_argument("--max-batch", type=int, default=64, help="the most sequences decoded at once")
    p.add_argument("--max-queue", type=int, default=256, help="requests waiting past this: 429")
    p.add_argument(
        "--prefill-chunk", type=int, default=256, help="prompt tokens prefilled per step, over all"
    )
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens of a request that gives none")
    p.add_argument("--max-tokens-limit", type=int, default=65536, help="the largest max_tokens accepted")
    p.add_argument("--threads", type=int, default=0, help="torch/OpenMP threads (0: the library default)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        config = ServeConfig.from_args(args)
    except ValueError as exc:
        p.error(str(exc).splitlines()[0])
    try:
        app, scheduler = config.build()
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"kakeya serve: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    summary: dict[str, Any] = {
        "model": config.model,
        "policy": str(config.policy),
        "drafter": config.drafter,
        "kv_budget": config.kv_budget,
        "join": scheduler.engine.why_no_join or "rows join the running batch",
    }
    print(
        f"kakeya serve: http://{args.host}:{args.port}/v1 {json.dumps(summary)}", file=sys.stderr, flush=True
    )
    scheduler.start()
    try:
        uvicorn.run(
            app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
        )
    finally:
        scheduler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
