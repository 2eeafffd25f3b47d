"""kakeya serve against its peers on one model directory, one load, one run. Writes JSON.

    python -m benchmarks.serve --out benchmarks/results/serve.json

Servers (each a subprocess on a free 127.0.0.1 port, started, measured and stopped in turn, so they never
share the CPU): `python -m engine.serve` plain and with the block drafter (`--drafter
block:zoo:tiny-block-drafter`), `transformers serve --continuous-batching` (torch, paged attention: the
strongest setting it has) and `python -m mlx_lm.server` (MLX). The model: the zoo's hybrid model directory
(zoo:tiny-hybrid). The load (engine/serve/load.py): `--concurrency` closed-loop clients (a comma list, 1,8,32: each level in turn against the same server) streaming greedy
/v1/completions over zoo code prompts (the zoo tokenizer has no chat template, so no chat), `--rounds`
requests each, after one warm-up request. Reported per server: output tok/s, requests/s, TTFT and
inter-token latency p50/p99, failed requests, and how many responses equal greedy decoding of the prompt
alone, compared up to whitespace (kakeya's own policy here is sink_window with a window covering every sequence, so its greedy is the
full-cache greedy the peers compute). Then kakeya's ratios to each peer against the issue's targets (2x
transformers' tok/s, 1.5x mlx-lm's, TTFT p50 no worse), each stated met or missed. A server that fails to
start is reported with its error, not skipped in silence. Not a test: figures are reported, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import engine
from benchmarks import harness
from engine.models import resolve
from engine.serve.load import Job, drive, summarize
from engine.zoo import corpus

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def servers(model_dir: Path, port: int, policy: str, threads: int) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, the model name requests carry)."""
    py = sys.executable
    kakeya = [
        py,
        "-m",
        "engine.serve",
        "--model",
        str(model_dir),
        "--policy",
        policy,
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--dtype",
        "float32",
    ]
    return {
        "kakeya": (kakeya, str(model_dir)),
        "kakeya+block": ([*kakeya, "--drafter", "block:zoo:tiny-block-drafter"], str(model_dir)),
        "transformers-cb": (
            [
                str(Path(py).parent / "transformers"),
                "serve",
                str(model_dir),
                "--continuous-batching",
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            str(model_dir),
        ),
        "mlx_lm": (
            [
                py,
                "-m",
                "mlx_lm.server",
                "--model",
                str(model_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            str(model_dir),
        ),
    }


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"not up after {timeout:.0f} s")


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the server process has used (Linux /proc; 0 elsewhere): tokens per CPU
    second compare servers fairly on a machine other work shares, where tok/s moves with the load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decode_steps(url: str) -> dict[str, float]:
    """kakeya's rows stepped so far by draft length k (`kakeya_decode_row_steps_total{k}`); {} for a peer."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("kakeya_decode_row_steps_total{"):
            out[line.split('k="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def measure(
    name: str,
    argv: list[str],
    model_name: str,
    prompts: list[str],
    want: list[str],
    args: Any,
    port: int,
    tok: Any,
) -> list[dict[str, Any]]:
    """One server started once and driven at each of args.levels in turn (one row per level)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    log = args.logs / f"serve-{name}.log"
    url = f"http://127.0.0.1:{port}"
    runs: list[tuple[int, list[Any], float, dict[str, float], float]] = []
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        try:
            wait_up(url, proc, args.start_timeout)
            jobs = [
                Job(
                    False,
                    {
                        "model": model_name,
                        "prompt": prompts[i % len(prompts)],
                        "max_tokens": args.new_tokens,
                        "temperature": 0,
                    },
                    i % len(prompts),
                )
                for i in range(max(args.levels) * args.rounds)
            ]
            asyncio.run(drive(url, jobs[:1], 1))  # warm-up
            steps = decode_steps(url)
            for c in args.levels:
                cpu = cpu_seconds(proc.pid)
                results, wall = asyncio.run(drive(url, jobs[: c * args.rounds], c))
                now = decode_steps(url)
                delta = {k: v - steps.get(k, 0) for k, v in now.items() if v > steps.get(k, 0)}
                runs.append((c, results, wall, delta, cpu_seconds(proc.pid) - cpu))
                steps = now
        except Exception as exc:  # noqa: BLE001 - a peer that does not run is a reported result
            tail = log.read_bytes()[-1500:].decode(errors="replace")
            return [{"server": name, "argv": shlex.join(argv), "error": f"{exc}", "log_tail": tail}]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    out = []
    for c, results, wall, steps, cpu in runs:
        stats = summarize(results, wall, lambda t: len(tok.encode(t, add_special_tokens=False)))
        # the same text up to whitespace: mlx-lm's streaming detokenizer drops the zoo tokenizer's space after "\n"
        exact = sum(r.status == 200 and r.text.split() == want[r.job.key].split() for r in results)
        errors = sorted({r.error[:200] for r in results if r.error})[:3]
        out.append(
            {
                "server": name,
                "concurrency": c,
                "argv": shlex.join(argv),
                **stats,
                "exact_requests": exact,
                "errors": errors,
                "server_cpu_s": cpu,
                "output_tokens_per_cpu_s": stats["output_tokens"] / cpu if cpu > 0 else None,
                **({"row_steps_by_k": steps} if steps else {}),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:tiny-hybrid")
    ap.add_argument("--servers", default="kakeya,kakeya+block,transformers-cb,mlx_lm")
    ap.add_argument(
        "--concurrency", default="8", help="closed-loop clients; a comma list (1,8,32) for levels"
    )
    ap.add_argument("--rounds", type=int, default=4, help="requests per client")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument(
        "--text",
        choices=("code", "mixed"),
        default="code",
        help="code: zoo code prompts; mixed: every other one zoo sentences, where the block drafter accepts less",
    )
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--start-timeout", type=float, default=180)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/serve.json"))
    args = ap.parse_args()
    args.levels = [int(c) for c in str(args.concurrency).split(",")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.logs = Path(tempfile.mkdtemp(prefix="kakeya-serve-bench-"))  # each server's output, for its errors
    model_dir = resolve(args.model).resolve()
    model = engine.load(str(model_dir))
    window = args.prompt_tokens + args.new_tokens + 8  # covers every sequence: kakeya's greedy = full greedy
    policy = f"sink_window:4:{window}"
    if args.text == "code":
        prompts = corpus.code_prompts(args.prompts, 0, args.prompt_tokens)
    else:  # the serving workload's set: zoo code, and every other prompt zoo sentences (sent as completions)
        from engine.workloads.serving import prompt_set

        prompts = [text for _, text in prompt_set(model, args.prompts, args.prompt_tokens)]
    want = []
    for p in prompts:
        gen = engine.generate(
            model.session(engine.full()), model.encode(p), engine.Stop(args.new_tokens, model.eos_ids)
        )
        want.append(str(model.tokenizer.decode(gen.tokens, skip_special_tokens=True)))
    load_before = harness.load_average()
    rows = []
    for name in args.servers.split(","):
        port = free_port()
        argv, model_name = servers(model_dir, port, policy, args.threads)[name]
        print(f"{name}: {shlex.join(argv)}", file=sys.stderr, flush=True)
        rows += measure(name, argv, model_name, prompts, want, args, port, model.tokenizer)
        print(json.dumps(rows[-1])[:400], file=sys.stderr, flush=True)
    by = {(r["server"], r["concurrency"]): r for r in rows if "error" not in r}
    targets = []
    for (ours, c), mine in by.items():
        if ours not in ("kakeya", "kakeya+block"):
            continue
        for peer, factor in (("transformers-cb", 2.0), ("mlx_lm", 1.5), ("kakeya", 1.0)):
            theirs = by.get((peer, c))
            if peer != ours and theirs and theirs["output_tok_s"] > 0:
                ratio = mine["output_tok_s"] / theirs["output_tok_s"]
                ttft = mine["ttft_p50_s"] <= theirs["ttft_p50_s"]
                targets.append(
                    {
                        "ours": ours,
                        "peer": peer,
                        "concurrency": c,
                        "tok_per_cpu_s_ratio": (
                            mine["output_tokens_per_cpu_s"] / theirs["output_tokens_per_cpu_s"]
                            if mine.get("output_tokens_per_cpu_s") and theirs.get("output_tokens_per_cpu_s")
                            else None
                        ),
                        "tok_s_ratio": ratio,
                        "target": factor,
                        "tok_s_met": ratio >= factor,
                        "ttft_p50_no_worse": ttft,
                    }
                )
    harness.write_report(
        args.out,
        "bench-serve",
        1,
        {
            "benchmark": "serve",
            "command": harness.command("serve"),
            "model": str(args.model),
            "kakeya_policy": policy,
            "load": {
                "concurrency": args.levels,
                "requests": [c * args.rounds for c in args.levels],
                "prompt_tokens": args.prompt_tokens,
                "text": args.text,
                "new_tokens": args.new_tokens,
                "threads": args.threads,
            },
            "results": rows,
            "targets": targets,
        },
        load_before,
    )
    for r in rows:
        if "error" in r:
            print(f"{r['server']:>16}: FAILED {r['error']}")
        else:
            print(
                f"{r['server']:>16} c={r['concurrency']:<3}: {r['output_tok_s']:7.1f} tok/s  {r['requests_per_s']:5.2f} req/s  TTFT p50 "
                f"{r['ttft_p50_s'] * 1e3:7.1f} ms p99 {r['ttft_p99_s'] * 1e3:7.1f} ms  ITL p50 "
                f"{r['itl_p50_s'] * 1e3:6.1f} ms p99 {r['itl_p99_s'] * 1e3:6.1f} ms  "
                f"{r['output_tokens_per_cpu_s'] or 0:6.1f} tok/cpu-s  exact {r['exact_requests']}/"
                f"{r['requests']}  failed {r['failed']}"
            )
    for t in targets:
        print(
            f"{t['ours']} / {t['peer']} c={t['concurrency']}: {t['tok_s_ratio']:.2f}x tok/s (target {t['target']}x: "
            f"{'met' if t['tok_s_met'] else 'MISSED'}), TTFT p50 {'no worse' if t['ttft_p50_no_worse'] else 'WORSE'}"
            + (f", {t['tok_per_cpu_s_ratio']:.2f}x tokens per CPU second" if t["tok_per_cpu_s_ratio"] else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
