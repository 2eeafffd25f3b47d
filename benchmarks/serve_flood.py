"""1,000 concurrent connections against kakeya serve: every one answered or refused, the server still up,
memory after. Writes JSON.

    python -m benchmarks.serve_flood --out benchmarks/results/serve_flood.json

The server (zoo:tiny-hybrid, sink_window:4:32, `--max-queue` 256) runs in this process on a free 127.0.0.1
port; `--connections` clients each open a connection at once and post one greedy /v1/completions of
`--new-tokens` tokens. Reported: the count of each status (200 served, 429 refused with Retry-After when the
queue is full) and of client errors, the wall time, /health after, and the process's peak RSS. Then
`--waves` more floods, to see whether the RSS stays flat. `--soak N` then serves N more requests,
`--concurrency` at a time, and records the process's resident memory (VmRSS, now, not the peak) after every
tenth of them: flat memory over 10,000 requests is the issue's target. Not a test: figures are reported, not
asserted.

    python -m benchmarks.serve_flood --soak 10000 --out benchmarks/results/serve_flood.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import resource
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import harness
from engine.policy import parse_policy
from engine.serve.config import ServeConfig
from engine.serve.thread import in_thread


async def flood(url: str, n: int, new_tokens: int) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def one() -> str:
            body = {"prompt": "def f1 ( a , b ) :", "max_tokens": new_tokens, "temperature": 0}
            try:
                r = await http.post("/v1/completions", json=body)
            except Exception as exc:  # noqa: BLE001 - counted
                return type(exc).__name__
            if r.status_code == 429 and "retry-after" not in r.headers:
                return "429 without Retry-After"
            return str(r.status_code)

        start = time.perf_counter()
        counts = collections.Counter(await asyncio.gather(*(one() for _ in range(n))))
        wall = time.perf_counter() - start
        health = (await http.get("/health")).json()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"statuses": dict(counts), "wall_s": wall, "health": health, "peak_rss_bytes": rss}


def rss_now() -> int:
    """The process's resident set now (bytes), from /proc (0 where there is none)."""
    try:
        with open("/proc/self/status") as status:
            line = next(ln for ln in status if ln.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return 0


async def soak(url: str, n: int, concurrency: int, new_tokens: int) -> dict[str, Any]:
    """`n` greedy requests, `concurrency` at a time; the RSS after every tenth of them."""
    import httpx

    counts: collections.Counter[str] = collections.Counter()
    samples: list[dict[str, Any]] = []
    done = 0
    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:

        async def worker(share: int) -> None:
            nonlocal done
            for i in range(share):
                body = {"prompt": f"def f{i % 97} ( a , b ) :", "max_tokens": new_tokens, "temperature": 0}
                r = await http.post("/v1/completions", json=body)
                counts[str(r.status_code)] += 1
                done += 1
                if done % max(1, n // 10) == 0:
                    samples.append(
                        {"requests": done, "rss_bytes": rss_now(), "s": time.perf_counter() - start}
                    )

        shares = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
        await asyncio.gather(*(worker(k) for k in shares))
    return {"requests": n, "concurrency": concurrency, "statuses": dict(counts), "rss": samples}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--waves", type=int, default=2, help="floods after the first")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--soak", type=int, default=0, help="then serve this many more requests (RSS sampled)")
    ap.add_argument("--concurrency", type=int, default=16, help="of the soak")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_flood.json"))
    args = ap.parse_args()
    load_before = harness.load_average()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.connections)), hard))
    config = ServeConfig(policy=parse_policy("sink_window:4:32"), max_queue=args.max_queue, threads=1)
    app, scheduler = config.build()
    with in_thread(app, scheduler) as url:
        waves = [asyncio.run(flood(url, args.connections, args.new_tokens)) for _ in range(1 + args.waves)]
        soaked = asyncio.run(soak(url, args.soak, args.concurrency, args.new_tokens)) if args.soak else None
    for i, w in enumerate(waves):
        print(
            f"wave {i}: {w['statuses']} in {w['wall_s']:.1f} s, health {w['health']}, peak RSS "
            f"{w['peak_rss_bytes'] / 2**20:.0f} MiB"
        )
    if soaked:
        mib = [f"{x['requests']}: {x['rss_bytes'] / 2**20:.0f}" for x in soaked["rss"]]
        print(f"soak: {soaked['statuses']}; RSS (MiB) after N requests: {', '.join(mib)}")
    harness.write_report(
        args.out,
        "bench-serve-flood",
        1,
        {
            "command": harness.command("serve_flood"),
            "connections": args.connections,
            "max_queue": args.max_queue,
            "new_tokens": args.new_tokens,
            "waves": waves,
            "soak": soaked,
        },
        load_before,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
