"""A load generator for any OpenAI-compatible server: `concurrency` closed-loop clients stream requests
(httpx, server-sent events) and time each one: time to first token, the gaps between streamed chunks,
the whole request. The serving workload (engine/workloads/serving.py) and benchmarks/serve.py use it on
kakeya serve and its peers alike."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Job:
    chat: bool
    body: dict[str, Any]  # the request body without `stream` (model, prompt or messages, max_tokens, ...)
    key: int = 0  # which prompt it is (for the exactness check)


@dataclass
class Result:
    job: Job
    status: int = 0
    text: str = ""
    completion_tokens: int | None = None  # from `usage`, when the server sends it
    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)  # between streamed chunks with text
    latency_s: float = 0.0
    error: str = ""


async def one(http: Any, job: Job) -> Result:
    out = Result(job)
    body = {**job.body, "stream": True, "stream_options": {"include_usage": True}}
    path = "/v1/chat/completions" if job.chat else "/v1/completions"
    start = last = time.perf_counter()
    try:
        async with http.stream("POST", path, json=body) as r:
            out.status = r.status_code
            if r.status_code != 200:
                out.error = (await r.aread()).decode(errors="replace")[:300]
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    out.completion_tokens = int(chunk["usage"]["completion_tokens"])
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") if job.chat else choice.get("text")
                    if text:
                        now = time.perf_counter()
                        if not out.text:
                            out.ttft_s = now - start
                        else:
                            out.gaps_s.append(now - last)
                        last = now
                        out.text += text
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, counted as such
        out.error = f"{type(exc).__name__}: {exc}"
    out.latency_s = time.perf_counter() - start
    return out


async def drive(
    url: str, jobs: list[Job], concurrency: int, timeout: float = 300
) -> tuple[list[Result], float]:
    """Run `jobs` with `concurrency` clients, each sending its next job when the last one ends; the
    results in job order and the wall time."""
    import httpx

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(jobs)):
        queue.put_nowait(i)
    results: list[Result | None] = [None] * len(jobs)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                results[i] = await one(http, jobs[i])

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return [r for r in results if r is not None], wall


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarize(results: list[Result], wall: float, tokens_of: Any = None) -> dict[str, Any]:
    """Output tok/s, requests/s, TTFT and inter-token latency p50/p99 (seconds) over the finished requests.
    Tokens: the server's `usage` counts, else `tokens_of(text)`."""
    ok = [r for r in results if r.status == 200 and not r.error]
    tokens = sum(r.completion_tokens if r.completion_tokens is not None else tokens_of(r.text) for r in ok)
    ttft = [r.ttft_s for r in ok if r.text]
    # inter-token latency as vLLM's benchmark measures it: the gaps between streamed chunks (a speculative
    # server's chunk may carry several tokens)
    itl = [g for r in ok for g in r.gaps_s]
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "wall_s": wall,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50),
        "itl_p99_s": percentile(itl, 99),
    }
