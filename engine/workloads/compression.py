"""`python -m engine.workloads.compression --out FILE`: net K/V bytes per token and compression ratio vs
a full cache over batch x sequence length (kind `compression`, v1).

Computed, not measured, from the model's config and the cache policy with the engine's own formulas
(`engine.policy.layer_specs` / `expected_kv_bytes`), for B sequences of S tokens each:

    full      = B x K/V bytes the `full` policy holds after S tokens (plain greedy decoding)
    net       = B x (the policy's K/V bytes + the drafter's K/V bytes, after S tokens of speculative
                decoding with k drafted tokens: a slack of k positions per bounded layer)
                + the drafter's weights, held once and amortised over all B x S tokens
    net bytes per token = net / (B x S);   compression ratio = full / net

as the seeds' table does. `--drafter SPEC` is one drafter spec (engine.drafters.spec), or `none` (no
drafter; with `--k 0`, plain decoding). What it holds: `model:REF` its weights and its K/V, under
sink_window(sink, window) of the policy (full when the policy is full); `diffusion:REF` and
`gemma4-assistant:REF` their weights only (they hold no K/V between blocks); `lookup` and `none` nothing.
The weights are the model's parameter count (read from its safetensors headers) times the table's dtype
size, or `--drafter-weights BYTES` (the seeds' diffusion drafter, whose files are not here: `--drafter none
--drafter-weights BYTES`). A block drafter's context K/V is not counted yet: `block:REF` is refused.
The cross-check loads the models and prefills `--check-lens` tokens (batch 1) under each policy, and
compares the K/V bytes the caches hold with the formula.

Linear-attention layers (Qwen3.5, Qwen3-Next) hold a constant-size state per sequence whatever the
policy: each row shows it apart (`state_bytes`, B x the verifier's state; `kv_bytes` is attention K/V only)
and counts it in `net_bytes`. `--reference NAME` computes the table for a published architecture
(`REFERENCE_CONFIGS`, no weights needed) instead of `--model`'s; the cross-check then checks the same
formulas on `--model`'s real caches (pick one with the same layer kinds to check the state's bytes too).

Quantized columns: `kv_bytes_q8` / `_q4` / `_k8v4` and their compression ratios are the same policy with
its K/V stored affine-quantized (codes plus a scale and a bias per group of 64, in the table's dtype;
`engine.policy.policy_slot_bytes`), the drafter unchanged. A policy listed with a precision suffix
(`hybrid:4:64:q8`) is itself counted, and cross-checked, at that precision.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from math import prod
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import engine
from engine.drafters import DrafterKind, DrafterSpec, parse_drafter
from engine.geometry import ITEMSIZE, Geometry, read_geometry
from engine.policy import drafter_policy, expected_kv_bytes, layer_slot_bytes, layer_specs, with_precision
from engine.report import geometry_block, write_report
from engine.workloads import cli
from engine.zoo import corpus

BATCHES = [1, 8, 64]
QUANTIZED = ("q8", "q4", "k8v4")  # the table's quantized columns
SEQ_LENS = [8192, 32768, 131072, 262144, 1048576]
NO_DRAFTER = "none"  # --drafter none: no drafter at all
# what a drafter of each kind holds, in the table: weights, and K/V (a model drafter's own cache); a kind
# not listed is refused (block: its context K/V is not counted yet)
HOLDS: dict[DrafterKind, tuple[bool, bool]] = {
    "lookup": (False, False),
    "model": (True, True),
    "diffusion": (True, False),
    "gemma4-assistant": (True, False),
}


class Config(cli.ModelConfig):
    reference: str | None  # a REFERENCE_CONFIGS name: the table's verifier architecture (None: the model's)
    policies: list[cli.PolicyField] = Field(min_length=1)
    drafter: cli.Drafter | Literal["none"]  # whose weights and K/V count (HOLDS), or none
    drafter_weights: int | None = Field(ge=0)
    k: int = Field(ge=0)
    batches: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    seq_lens: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    check_lens: list[Annotated[int, Field(ge=1)]]


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str
    batch: int
    seq_len: int
    full_bytes: int
    kv_bytes: int  # attention K/V
    state_bytes: int  # linear-attention layers' state (constant per sequence)
    drafter_kv_bytes: int
    drafter_weight_bytes: int
    net_bytes: int
    full_bytes_per_token: float
    net_bytes_per_token: float
    compression_ratio: float
    kv_bytes_q8: int
    kv_bytes_q4: int
    kv_bytes_k8v4: int
    compression_ratio_q8: float
    compression_ratio_q4: float
    compression_ratio_k8v4: float


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str  # verifier | drafter
    policy: str
    seq_len: int
    predicted_bytes: int
    measured_bytes: int
    allocated_bytes: int
    match: bool


class PolicySummary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str
    max_compression_ratio: float
    at_batch: int
    at_seq_len: int
    net_bytes_per_token: float
    state_bytes_per_token: float  # the linear-attention state's share of net_bytes_per_token


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    full_bytes_per_token: float  # at the longest sequence
    policies: dict[str, PolicySummary]
    checks: int
    check_passed: bool | None  # None: no cross-check was asked for


def safetensors_params(path: Path) -> int:
    """Parameters stored in a model directory's *.safetensors files (read from their headers only)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} has no .safetensors files to count the drafter's weights from")
    total = 0
    for f in files:
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        total += sum(prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def per_sequence(geo: Geometry, policy: engine.Policy, n: int, max_block: int, dtype: str) -> int:
    """Cache bytes one sequence holds after n tokens: K/V (engine.policy.expected_kv_bytes, summed over
    layers) plus the constant-size state of linear-attention layers (Geometry.state_bytes; 0 without),
    which every policy keeps whole."""

    specs = layer_specs(policy, geo.layer_types, geo.sliding_window)
    return sum(expected_kv_bytes(specs, n, max_block, layer_slot_bytes(policy, geo, dtype))) + sum(
        geo.state_bytes(dtype)
    )


# Published architectures for the table without downloading weights (config.json keys). Qwen3.5: the
# `qwen3_5_text` defaults of transformers 5.23 (linear_attention x3 + full_attention, repeated); the
# seeds' verifier Qwen3-1.7B for comparison.
REFERENCE_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3.5-text-defaults": {
        "num_hidden_layers": 32,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8,
        "hidden_size": 4096,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "vocab_size": 248320,
        "dtype": "bfloat16",
    },
    "qwen3-1.7b": {
        "num_hidden_layers": 28,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "dtype": "bfloat16",
    },
}


def table(config: Config, geo: Geometry, dgeo: Geometry | None, weights: int) -> list[Row]:

    rows = []
    full = engine.full()
    for policy in config.policies:
        for b in config.batches:
            for s in config.seq_lens:
                full_bytes = b * per_sequence(geo, full, s, 1, config.dtype)
                state = b * sum(geo.state_bytes(config.dtype))
                kv = b * per_sequence(geo, policy, s, config.k + 1, config.dtype) - state
                dkv = (
                    0
                    if dgeo is None
                    else b * per_sequence(dgeo, drafter_policy(policy), s, config.k + 1, config.dtype)
                )
                net = kv + state + dkv + weights
                quantized = {  # attention K/V only, as kv_bytes
                    q: b * per_sequence(geo, with_precision(policy, q), s, config.k + 1, config.dtype) - state
                    for q in QUANTIZED
                }
                rows.append(
                    Row(
                        policy=str(policy),
                        batch=b,
                        seq_len=s,
                        full_bytes=full_bytes,
                        kv_bytes=kv,
                        state_bytes=state,
                        drafter_kv_bytes=dkv,
                        drafter_weight_bytes=weights,
                        net_bytes=net,
                        full_bytes_per_token=full_bytes / (b * s),
                        net_bytes_per_token=net / (b * s),
                        compression_ratio=full_bytes / net,
                        **{f"kv_bytes_{q}": v for q, v in quantized.items()},
                        **{
                            f"compression_ratio_{q}": full_bytes / (v + state + dkv + weights)
                            for q, v in quantized.items()
                        },
                    )
                )
    return rows


def _prompt(model: engine.Model, n: int) -> list[int]:

    ids = model.encode(corpus.haystack(max(n, 32), 0.5, 0).prompt)
    return (ids * (n // len(ids) + 1))[:n]


def cross_check(config: Config, geo: Geometry, dgeo: Geometry | None) -> list[Check]:
    """Prefill each check length under each policy (batch 1); measured K/V bytes vs the formula."""

    model = engine.load(config.model, config.backend, config.dtype, config.device)
    dmodel = None
    if dgeo is not None and isinstance(config.drafter, DrafterSpec):
        dmodel = engine.load(str(config.drafter.path()), config.backend, config.dtype, config.device)
    jobs: list[tuple[str, engine.Model, engine.Policy, Geometry, int]] = []
    for policy in [engine.full(), *config.policies]:
        block = 1 if policy == engine.full() else config.k + 1
        jobs.append(("verifier", model, policy, geo, block))
        dpolicy = drafter_policy(policy)
        if (
            dmodel is not None
            and dgeo is not None
            and policy != engine.full()
            and not any(j[0] == "drafter" and j[2] == dpolicy for j in jobs)
        ):
            jobs.append(("drafter", dmodel, dpolicy, dgeo, config.k + 1))
    out = []
    with cli.progress(len(jobs) * len(config.check_lens), "compression check", "prefill") as bar:
        for n in config.check_lens:
            for name, m, policy, g, block in jobs:
                seq = m.session(policy, max_block=block)
                seq.prefill(_prompt(m, n))
                state = sum(seq.state_bytes())  # linear-attention layers' state (0 without)
                measured = sum(seq.kv_bytes()) + state
                allocated = sum(seq.kv_allocated_bytes()) + state
                predicted = per_sequence(g, policy, n, block, config.dtype)
                out.append(
                    Check(
                        model=name,
                        policy=str(policy),
                        seq_len=n,
                        predicted_bytes=predicted,
                        measured_bytes=measured,
                        allocated_bytes=allocated,
                        match=measured == predicted,
                    )
                )
                bar.update(1)
    return out


def compression(config: Config) -> dict[str, Any]:

    checked = read_geometry(engine.resolve(config.model)) if config.check_lens else None
    geo = (
        Geometry.from_config(REFERENCE_CONFIGS[config.reference])
        if config.reference
        else checked or read_geometry(engine.resolve(config.model))
    )
    dgeo, weights, params = None, 0, None
    if isinstance(config.drafter, DrafterSpec):
        has_weights, has_kv = HOLDS[config.drafter.kind]
        dpath = config.drafter.path() if config.drafter.ref else None
        if dpath and has_kv:
            dgeo = read_geometry(dpath)
        if dpath and has_weights:
            params = safetensors_params(dpath)
            weights = params * ITEMSIZE[config.dtype]
    if config.drafter_weights is not None:
        weights = config.drafter_weights
    rows = table(config, geo, dgeo, weights)
    checks = cross_check(config, checked, dgeo) if checked else []
    longest = max(config.seq_lens)
    policies = {}
    for policy in config.policies:
        mine = [r for r in rows if r.policy == str(policy)]
        best = max(mine, key=lambda r: (r.compression_ratio, r.batch * r.seq_len))
        policies[policy.kind] = PolicySummary(
            policy=str(policy),
            max_compression_ratio=best.compression_ratio,
            at_batch=best.batch,
            at_seq_len=best.seq_len,
            net_bytes_per_token=best.net_bytes_per_token,
            state_bytes_per_token=best.state_bytes / (best.batch * best.seq_len),
        )
    summary = Summary(
        full_bytes_per_token=next(r.full_bytes_per_token for r in rows if r.seq_len == longest),
        policies=policies,
        checks=len(checks),
        check_passed=all(c.match for c in checks) if checks else None,
    )
    return {
        "config": config.model_dump(),
        "geometry": geometry_block(
            geo,
            bytes_per_slot=max(geo.slot_bytes(config.dtype)),
            state_bytes_per_sequence=sum(geo.state_bytes(config.dtype)),
        ),
        "drafter": {
            "params": params,
            "weight_bytes": weights,
            "layers": None if dgeo is None else len(dgeo.layer_types),
        },
        "table": [r.model_dump() for r in rows],
        "checks": [c.model_dump() for c in checks],
        "summary": summary.model_dump(),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| policy | batch | seq len | net bytes/token | of which state | full bytes/token | compression "
        "| q8 | q4 | k8v4 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["table"]:
        lines.append(
            f"| {r['policy']} | {r['batch']} | {r['seq_len']:,} | {r['net_bytes_per_token']:,.1f} | "
            f"{r['state_bytes'] / (r['batch'] * r['seq_len']):,.1f} | {r['full_bytes_per_token']:,.1f} | "
            f"{r['compression_ratio']:,.2f}x | "
            + " | ".join(f"{r[f'compression_ratio_{q}']:,.2f}x" for q in QUANTIZED)
            + " |"
        )
    return "\n".join(lines)


def drafter_flag(text: str) -> DrafterSpec | Literal["none"]:
    """`--drafter`: `none`, or a drafter spec of a kind the table counts (HOLDS); ValueError otherwise."""
    if text.strip() == NO_DRAFTER:
        return NO_DRAFTER
    spec = parse_drafter(text)
    if spec.kind not in HOLDS:
        counted = ", ".join([NO_DRAFTER, *HOLDS])
        raise ValueError(
            f"--drafter {spec}: a {spec.kind} drafter's bytes are not counted yet (use {counted})"
        )
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="zoo:tiny-hybrid",
        help="zoo:NAME, a Hugging Face model directory, or a NAME under $KAKEYA_MODELS",
    )
    parser.add_argument(
        "--reference",
        choices=("none", *REFERENCE_CONFIGS),
        default="none",
        help="the table for this published architecture instead of --model's (which the cross-check loads)",
    )
    parser.add_argument("--policy", default="sink_window:4:64,hybrid:4:64", help="policies, comma-separated")
    parser.add_argument(
        "--drafter",
        default="model:zoo:tiny-drafter",
        help="the drafter whose weights and K/V count: lookup | model:REF | diffusion:REF | "
        "gemma4-assistant:REF (a bare REF: the kind its config.json says), or none",
    )
    parser.add_argument(
        "--drafter-weights", type=int, help="drafter weight bytes (overrides the drafter's files)"
    )
    parser.add_argument("--k", type=int, default=4, help="tokens drafted per block (0: plain decoding)")
    parser.add_argument(
        "--dtype",
        choices=("auto", *ITEMSIZE),
        default="auto",
        help="K/V and weights dtype (auto: the model config's)",
    )
    parser.add_argument("--backend", choices=("torch", "mlx"), default="torch", help="for the cross-check")
    parser.add_argument("--batches", type=cli.int_list, default=BATCHES)
    parser.add_argument("--seq-lens", type=cli.int_list, default=SEQ_LENS)
    parser.add_argument(
        "--check-lens",
        type=lambda t: [] if t == "none" else cli.int_list(t),
        default=[64, 256, 1024],
        help="prompt lengths prefilled to cross-check the formula ('none': skip)",
    )
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--device", default="auto", help="torch: auto|cpu|cuda|cuda:N|mps; mlx: auto|gpu|cpu")
    parser.add_argument("--out", required=True, help="where to write the report (JSON)")
    args = parser.parse_args(argv)

    try:
        policies = cli.policies(args.policy)
        cli.set_threads(args.threads)
        cli.check_device(args.backend, args.device)
        reference = None if args.reference == "none" else args.reference
        dtype = (
            args.dtype
            if args.dtype != "auto"
            else Geometry.from_config(REFERENCE_CONFIGS[reference]).dtype
            if reference
            else read_geometry(engine.resolve(args.model)).dtype
        )
        drafter = drafter_flag(args.drafter)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    if args.k == 0 and drafter not in (NO_DRAFTER, DrafterSpec("lookup")):
        parser.error("--k 0 is plain decoding: use --drafter none")
    config = cli.make_config(
        parser, Config, args, reference=reference, dtype=dtype, policies=policies, drafter=drafter
    )
    report = write_report(args.out, "compression", 1, compression(config))
    print(markdown(report))
    s = report["summary"]
    print(
        f"compression: full {s['full_bytes_per_token']:,.1f} bytes/token"
        + (f" ({report['config']['reference']})" if report["config"]["reference"] else "")
        + f", linear-attention state {report['geometry']['state_bytes_per_sequence']:,} bytes/sequence; "
        + ", ".join(
            f"{v['policy']} up to {v['max_compression_ratio']:,.2f}x (B={v['at_batch']}, S={v['at_seq_len']:,})"
            for v in s["policies"].values()
        )
        + f"; cross-check {s['checks']} caches: {'match' if s['check_passed'] else 'MISMATCH' if s['checks'] else 'skipped'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
