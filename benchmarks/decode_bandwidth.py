"""Greedy decode tok/s and the fraction of the device's memory bandwidth it reaches. Writes JSON.

    python -m benchmarks.decode_bandwidth --device cuda --out benchmarks/results/decode_bandwidth-cuda.json

Decoding one token reads every weight once and the K/V the cache holds: bytes per token = weight bytes +
the mean K/V bytes held over the run (engine `kv_bytes`, sampled after every step). Achieved bandwidth =
bytes per token x decode tok/s (batch 1). It is set against the device's peak where this file knows it
(`PEAK_BYTES_S`, by device name) and always against the bandwidth measured here (the best of a few large
device-to-device copies: read + write bytes / time); on a cpu the measured figure stands in for the peak.
Not a test: it measures, it asserts nothing (tests/engine/test_gpu_acceptance.py runs it on the cpu).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

import engine
from benchmarks import harness
from engine.backends.torch.device import pick_device

# Peak memory bandwidth by a substring of the device name (vendor data sheets), bytes/s.
PEAK_BYTES_S = {
    "H200": 4.8e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100": 1.555e12,
    "L40S": 8.64e11,
    "A10G": 6.0e11,
    "RTX 4090": 1.008e12,
}


def peak_bytes_s(name: str) -> float | None:
    return next((v for k, v in PEAK_BYTES_S.items() if k in name), None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measured_bytes_s(device: torch.device, mib: int = 256, repeats: int = 5) -> float:
    """Copy bandwidth: the best of `repeats` copies of a `mib` MiB buffer (bytes read + written / time)."""
    src = torch.empty(mib * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best


def measure(
    model_ref: str, device: str, dtype: str, policy: str, prompt_tokens: int, new_tokens: int
) -> dict[str, Any]:
    model = engine.load(model_ref, "torch", dtype, device)
    dev = pick_device(device)
    weights = sum(p.numel() * p.element_size() for p in model.model.parameters())  # type: ignore[attr-defined]
    ids = (model.encode("def f(x):\n    return x\n") * prompt_tokens)[:prompt_tokens]
    pol = engine.parse_policy(policy)
    engine.generate(model.session(pol), ids, engine.Stop(4))  # warm-up: one-off costs out of the figure
    session = model.session(pol)
    out = session.prefill(ids).tokens
    kv: list[int] = []
    _sync(dev)
    t = time.perf_counter()
    for _ in range(new_tokens - 1):
        out += session.forward(out[-1:]).tokens
        kv.append(sum(session.kv_bytes()))
    _sync(dev)
    seconds = time.perf_counter() - t
    tok_s = (new_tokens - 1) / seconds
    per_token = weights + sum(kv) / len(kv)
    achieved = per_token * tok_s
    measured = measured_bytes_s(dev)
    name = model.device_name
    peak = peak_bytes_s(name) if dev.type == "cuda" else None
    return {
        "device": name,
        "model": model_ref,
        "dtype": dtype,
        "policy": policy,
        "prompt_tokens": len(ids),
        "new_tokens": new_tokens,
        "decode_tok_s": tok_s,
        "weight_bytes": weights,
        "mean_kv_bytes": sum(kv) / len(kv),
        "bytes_per_token": per_token,
        "achieved_bytes_s": achieved,
        "measured_bytes_s": measured,
        "peak_bytes_s": peak,
        "fraction_of_measured": achieved / measured,
        "fraction_of_peak": achieved / peak if peak else None,
        "reference": "peak" if peak else "measured",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:tiny-hybrid")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--policy", default="hybrid:4:64")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--out", type=Path, help="JSON path (default: benchmarks/results/decode_bandwidth-<device>.json)"
    )
    args = parser.parse_args(argv)
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2")
    load_before = harness.load_average()
    result = measure(args.model, args.device, args.dtype, args.policy, args.prompt_tokens, args.new_tokens)
    out = args.out or harness.RESULTS / f"decode_bandwidth-{pick_device(args.device).type}.json"
    result["command"] = harness.command("decode_bandwidth", argv)
    result["environment"] = harness.environment(load_before)
    harness.write_json(out, result)
    ref = result["fraction_of_peak"] if result["peak_bytes_s"] else result["fraction_of_measured"]
    print(
        f"decode_bandwidth: {result['device']}: {result['decode_tok_s']:.1f} tok/s, "
        f"{result['bytes_per_token'] / 1e6:.2f} MB/token, {result['achieved_bytes_s'] / 1e9:.2f} GB/s = "
        f"{100 * ref:.1f}% of the {result['reference']} {(result['peak_bytes_s'] or result['measured_bytes_s']) / 1e9:.1f} GB/s; {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
