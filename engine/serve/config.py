"""What a server is made of (`ServeConfig`, checked once from the flags) and `build`: the model, its
drafter, the scheduler and the app. `python -m engine.serve`, the tests and the serve-bench workload all
build a server this way."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from engine.policy import Policy, parse_policy


@dataclass(frozen=True)
class ServeConfig:
    model: str = "zoo:tiny-hybrid"
    served_model_name: str | None = None
    backend: str = "torch"
    dtype: str = "auto"
    device: str = "auto"
    policy: Policy = parse_policy("sink_window:4:256")
    drafter: str = "none"
    k: int = 4
    adapt: bool = True
    kv_budget: int = 1 << 30
    max_batch: int = 64
    max_queue: int = 256
    prefill_chunk: int = 256
    max_tokens: int = 256
    max_tokens_limit: int = 65536
    threads: int = 0

    def __post_init__(self) -> None:
        for name, low in (
            ("k", 1),
            ("kv_budget", 1),
            ("max_batch", 1),
            ("max_queue", 0),
            ("prefill_chunk", 1),
            ("max_tokens", 1),
            ("max_tokens_limit", 1),
            ("threads", 0),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low} (got {getattr(self, name)})")
        if self.backend not in ("torch", "mlx"):
            raise ValueError(f"--backend: unknown backend {self.backend!r}: use torch or mlx")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        return cls(
            model=args.model,
            served_model_name=args.served_model_name,
            backend=args.backend,
            dtype=args.dtype,
            device=args.device,
            policy=parse_policy(args.policy),
            drafter=args.drafter,
            k=args.k,
            adapt=not args.no_adapt,
            kv_budget=args.kv_budget,
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            prefill_chunk=args.prefill_chunk,
            max_tokens=args.max_tokens,
            max_tokens_limit=args.max_tokens_limit,
            threads=args.threads,
        )

    def build(self) -> tuple[Any, Any]:
        """Load the model (and drafter) and make (the FastAPI app, its Scheduler, not started yet)."""
        from engine.drafters.load import load_drafter
        from engine.drafters.spec import parse_drafter
        from engine.models import load, resolve
        from engine.policy import drafter_policy
        from engine.serve.app import Server, create_app
        from engine.serve.metrics import Metrics
        from engine.serve.scheduler import Engine, Scheduler
        from engine.workloads.cli import set_threads

        set_threads(self.threads)
        model = load(self.model, self.backend, self.dtype, self.device)  # type: ignore[arg-type]
        factory = None
        if self.drafter not in ("", "none"):
            spec = parse_drafter(self.drafter)
            if spec.kind == "gemma4-assistant":
                raise ValueError(
                    "--drafter: gemma4-assistant reads its verifier's session and cannot serve batches yet"
                )
            factory = load_drafter(
                spec,
                model,
                k=self.k,
                policy=drafter_policy(self.policy),
                dtype=self.dtype,
                device=self.device,
            )
        engine = Engine(
            model,
            self.policy,
            factory,
            self.k,
            self.adapt,
            self.prefill_chunk,
            context_length(resolve(self.model)),
        )
        metrics = Metrics(self.kv_budget)
        scheduler = Scheduler(engine, self.kv_budget, self.max_batch, self.max_queue, metrics)
        server = Server(
            scheduler, self.served_model_name or self.model, self.max_tokens, self.max_tokens_limit, metrics
        )
        return create_app(server), scheduler


def context_length(path: Any) -> int | None:
    """The model's context (max_position_embeddings of its text config), None when it names none."""
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config") or config
    value = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return int(value) if value else None
