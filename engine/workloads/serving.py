"""`serving`: kakeya serve under load (the serve-bench preset).

Starts the server inside this process on 127.0.0.1 (a free port; the same FastAPI app on uvicorn as
`python -m engine.serve`), then drives it with engine/serve/load.py at each concurrency of
`--concurrency` (closed-loop clients, `--rounds` requests per client) over a fixed prompt set: zoo code
prompts on /v1/completions and zoo sentences on /v1/chat/completions, every request greedy and streamed.
Per level: output tok/s, requests/s, TTFT and inter-token latency p50/p99, the most K/V bytes held, and
exactness: every response's text equal to the text of greedy decoding of its prompt alone under the same
policy. Summary: exact, K/V bounded (the policy bounds every layer's K/V and no step held more than the
budget), K/V bytes per sequence (the bound a sequence reserves), the best output tok/s and whether it
reaches `--min-tok-s`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.policy import parse_policy
from engine.workloads import cli


class Config(cli.ModelConfig):
    policy: cli.PolicyField
    drafter: str = "none"
    k: int = Field(default=4, ge=1, le=16)
    kv_budget: int = Field(ge=1)
    concurrency: list[int]
    rounds: int = Field(ge=1, le=64)
    prompts: int = Field(ge=1, le=256)
    prompt_tokens: int = Field(ge=4, le=8192)
    new_tokens: int = Field(ge=1, le=4096)
    min_tok_s: float = Field(ge=0)
    threads: int = Field(default=0, ge=0)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if not value or any(c < 1 or c > 1024 for c in value):
            raise ValueError("concurrency levels are 1 to 1024")
        return value


class Level(BaseModel):
    model_config = ConfigDict(extra="forbid")
    concurrency: int
    requests: int
    failed: int
    wall_s: float
    output_tokens: int
    output_tok_s: float
    requests_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    kv_bytes_held_max: int
    exact_requests: int
    exact: bool


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exact: bool
    kv_bounded: bool
    kv_bytes_per_sequence: int
    kv_bytes_held_max: int
    kv_budget: int
    best_output_tok_s: float
    min_tok_s: float
    tok_s_ok: bool
    join: str  # how joining rows are batched (engine/serve/join.py)


def prompt_set(model: Any, n: int, n_tokens: int, seed: int = 0) -> list[tuple[bool, str]]:
    """(chat?, text): zoo code prompts for completions and, every other one, zoo sentences for chat."""
    from engine.zoo import corpus

    code = corpus.code_prompts(n, seed, n_tokens)
    rng = __import__("random").Random(seed)
    out: list[tuple[bool, str]] = []
    for i in range(n):
        if i % 2:
            words: list[str] = []
            while len(words) < n_tokens:
                words += corpus.sentence(rng)
            out.append((True, " ".join(words[:n_tokens])))
        else:
            out.append((False, code[i]))
    return out


def run(config: Config, out: str) -> dict[str, Any]:
    """Serve, drive every concurrency level, check every response, write the report."""
    import engine
    from engine.report import write_report
    from engine.serve.app import Message, Server
    from engine.serve.config import ServeConfig
    from engine.serve.load import Job, drive, summarize
    from engine.serve.thread import in_thread

    serve = ServeConfig(
        model=config.model,
        backend=config.backend,
        dtype=config.dtype,
        device=config.device,
        policy=config.policy,
        drafter=config.drafter,
        k=config.k,
        kv_budget=config.kv_budget,
        max_batch=max(config.concurrency),
        max_queue=max(config.concurrency) * 2,
        threads=config.threads,
        max_tokens=config.new_tokens,
    )
    app, scheduler = serve.build()
    eng = scheduler.engine
    model, metrics = eng.model, scheduler.metrics
    text_side = Server(scheduler, config.model)
    prompts = prompt_set(model, config.prompts, config.prompt_tokens)
    ids = [
        text_side.chat_prompt([Message(role="user", content=t)]) if chat else model.encode(t)
        for chat, t in prompts
    ]
    want = []
    for p in ids:  # the reference: greedy decoding of each prompt alone under the same policy
        session = model.session(config.policy, max_block=1)
        want.append(
            text_side.text(engine.generate(session, p, engine.Stop(config.new_tokens, model.eos_ids)).tokens)
        )

    def job(i: int) -> Job:
        chat, text = prompts[i % len(prompts)]
        body: dict[str, Any] = {"model": config.model, "max_tokens": config.new_tokens, "temperature": 0}
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return Job(chat, body, i % len(prompts))

    levels: list[Level] = []
    with in_thread(app, scheduler) as url:
        asyncio.run(drive(url, [job(0), job(1)], 2))  # warm-up, not measured
        for c in config.concurrency:
            metrics.kv_held_max.set(0)
            results, wall = asyncio.run(drive(url, [job(i) for i in range(c * config.rounds)], c))
            stats = summarize(results, wall, lambda t: len(model.encode(t)))
            exact = sum(r.status == 200 and r.text == want[r.job.key] for r in results)
            levels.append(
                Level(
                    concurrency=c,
                    **stats,
                    kv_bytes_held_max=int(metrics.kv_held_max._value.get()),
                    exact_requests=exact,
                    exact=exact == len(results),
                )
            )
            time.sleep(0.05)
    held = max(lv.kv_bytes_held_max for lv in levels)
    best = max(lv.output_tok_s for lv in levels)
    summary = Summary(
        exact=all(lv.exact for lv in levels),
        kv_bounded=eng.bounded and held <= config.kv_budget,
        kv_bytes_per_sequence=eng.reserve(max(map(len, ids)) + config.new_tokens),
        kv_bytes_held_max=held,
        kv_budget=config.kv_budget,
        best_output_tok_s=best,
        min_tok_s=config.min_tok_s,
        tok_s_ok=best >= config.min_tok_s,
        join=eng.why_no_join or "rows join the running batch",
    )
    body = {
        "config": config.model_dump(mode="json"),
        "levels": [lv.model_dump() for lv in levels],
        "summary": summary.model_dump(),
    }
    return write_report(out, "serving", 1, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    parser.add_argument("--policy", default="sink_window:4:64")
    parser.add_argument(
        "--drafter", default="none", help="none | lookup | model:REF | block:REF | diffusion:REF"
    )
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--kv-budget", type=int, default=64 << 20, help="K/V bytes the server may hold")
    parser.add_argument("--concurrency", type=cli.int_list, default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2, help="requests per client at each level")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--min-tok-s", type=float, default=0.0, help="summary.tok_s_ok: best output tok/s >= this"
    )
    args = parser.parse_args(argv)
    try:
        policy = parse_policy(args.policy)
        cli.set_threads(args.threads)
        cli.check_device(args.backend, args.device)
        if args.drafter != "none":
            from engine.drafters.spec import parse_drafter

            parse_drafter(args.drafter)
    except ValueError as exc:
        parser.error(str(exc))
    config = cli.make_config(parser, Config, args, policy=policy)
    report = run(config, args.out)
    s = report["summary"]
    print("concurrency  tok/s  req/s  TTFT p50/p99 ms  ITL p50/p99 ms  exact")
    for lv in report["levels"]:
        print(
            f"{lv['concurrency']:>11}  {lv['output_tok_s']:>5.0f}  {lv['requests_per_s']:>5.1f}  "
            f"{lv['ttft_p50_s'] * 1e3:>6.1f}/{lv['ttft_p99_s'] * 1e3:<7.1f}  "
            f"{lv['itl_p50_s'] * 1e3:>6.1f}/{lv['itl_p99_s'] * 1e3:<7.1f}  {lv['exact_requests']}/{lv['requests']}"
        )
    print(
        f"serving: exact {s['exact']}, K/V bounded {s['kv_bounded']} ({s['kv_bytes_per_sequence']} bytes per "
        f"sequence, at most {s['kv_bytes_held_max']} held of {s['kv_budget']}), best {s['best_output_tok_s']:.1f} "
        f"tok/s (min {s['min_tok_s']}: {'ok' if s['tok_s_ok'] else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
