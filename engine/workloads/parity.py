"""`python -m engine.workloads.parity --model zoo:tiny-hybrid --out FILE`: PyTorch vs MLX (kind `parity`, v1).

For each dtype and prompt, both backends decode greedily with the engine under the same cache policy;
the report gives, per prompt, the index of the first token where they differ (null: identical), the
prefix agreement (common prefix / tokens generated) and the max absolute logit difference at each
step. The logit difference is teacher-forced: both models, cache-free (the model's own attention,
native sliding windows included), read the prompt plus the PyTorch tokens, so every step compares the
two backends on the same input. `agreement` of a dtype is the common-prefix tokens over all tokens
generated; in float32 the two backends must agree exactly (the preset gates on 1.0).

Prompts come from the zoo corpus (code-like text and needle haystacks, plain words any tokenizer reads).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import engine
from engine.progress import report_progress
from engine.report import write_report
from engine.workloads import cli
from engine.workloads.cli import first_divergence
from engine.zoo import corpus

DTYPES = ("float32", "bfloat16", "float16")


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    policy: cli.PolicyField
    device: Literal["auto", "cpu"] = "auto"
    dtypes: list[str] = Field(min_length=1)
    prompts: int = Field(ge=1)
    prompt_tokens: int = Field(ge=8)
    new_tokens: int = Field(ge=1)
    seed: int


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_tokens: int
    torch_tokens: int
    mlx_tokens: int
    first_divergence: int | None  # index into the generated tokens; None when identical
    prefix_agreement: float
    max_abs_logit_diff: list[float]  # per step, teacher-forced on the PyTorch tokens
    torch_decode_tok_s: float
    mlx_decode_tok_s: float


class Run(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dtype: str
    agreement: float
    exact_prompts: int
    min_first_divergence: int | None
    mean_prefix_agreement: float
    max_abs_logit_diff: float
    samples: list[Sample]


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    float32_agreement: float | None
    float32_max_abs_logit_diff: float | None
    min_agreement: float
    all_exact: bool


def prompts(n: int, n_tokens: int, seed: int) -> list[str]:
    """Alternating code-like prompts and needle haystacks from the zoo corpus."""

    code = corpus.code_prompts(n=(n + 1) // 2, seed=seed, n_tokens=n_tokens)
    hay = [corpus.haystack(n_tokens, depth=(i + 1) / (n + 1), seed=seed + i).prompt for i in range(n // 2)]
    out = []
    for i in range(n):
        out.append(code[i // 2] if i % 2 == 0 else hay[i // 2])
    return out


def _torch_logits(tm: Any, seq: list[int], keep: int) -> Any:
    import torch

    with torch.inference_mode():
        out = tm.model(input_ids=torch.tensor([seq]), logits_to_keep=keep, use_cache=False)
    return out.logits[0].float().numpy()


def _mlx_logits(mm: Any, seq: list[int], keep: int) -> Any:
    import mlx.core as mx

    out = mm.logits(mx.array([seq]), None, keep)[0].astype(mx.float32)
    return np.array(out)


def run_dtype(config: Config, dtype: str, texts: list[str]) -> Run:

    policy = config.policy
    tm = engine.load(config.model, "torch", dtype, config.device)
    mm = engine.load(config.model, "mlx", dtype, config.device)
    samples = []
    for text in texts:
        ids = tm.encode(text)
        if ids != mm.encode(text):
            raise ValueError("the two backends tokenize the prompt differently")
        stop = engine.Stop(config.new_tokens, tm.eos_ids)
        gt = engine.generate(tm.session(policy), ids, stop)
        gm = engine.generate(mm.session(policy), ids, stop)
        first = first_divergence(gt.tokens, gm.tokens)
        longest = max(len(gt.tokens), len(gm.tokens))
        common = longest if first is None else first
        seq = ids + gt.tokens[:-1]
        keep = len(gt.tokens)
        diff = np.abs(_torch_logits(tm, seq, keep) - _mlx_logits(mm, seq, keep)).max(axis=-1)
        samples.append(
            Sample(
                prompt_tokens=len(ids),
                torch_tokens=len(gt.tokens),
                mlx_tokens=len(gm.tokens),
                first_divergence=first,
                prefix_agreement=common / longest,
                max_abs_logit_diff=[float(d) for d in diff],
                torch_decode_tok_s=gt.decode_tok_s,
                mlx_decode_tok_s=gm.decode_tok_s,
            )
        )
    longest = [max(s.torch_tokens, s.mlx_tokens) for s in samples]
    agreed = sum(
        n if s.first_divergence is None else s.first_divergence for s, n in zip(samples, longest, strict=True)
    )
    firsts = [s.first_divergence for s in samples if s.first_divergence is not None]
    return Run(
        dtype=dtype,
        agreement=agreed / sum(longest),
        exact_prompts=sum(s.first_divergence is None for s in samples),
        min_first_divergence=min(firsts) if firsts else None,
        mean_prefix_agreement=sum(s.prefix_agreement for s in samples) / len(samples),
        max_abs_logit_diff=max(max(s.max_abs_logit_diff) for s in samples),
        samples=samples,
    )


def parity(config: Config) -> dict[str, Any]:
    texts = prompts(config.prompts, config.prompt_tokens, config.seed)
    runs = []
    for i, dtype in enumerate(config.dtypes):
        report_progress(i, len(config.dtypes), f"parity: dtype {dtype} ({i + 1} of {len(config.dtypes)})")
        runs.append(run_dtype(config, dtype, texts))
    f32 = next((r for r in runs if r.dtype == "float32"), None)
    summary = Summary(
        float32_agreement=f32.agreement if f32 else None,
        float32_max_abs_logit_diff=f32.max_abs_logit_diff if f32 else None,
        min_agreement=min(r.agreement for r in runs),
        all_exact=all(r.exact_prompts == len(r.samples) for r in runs),
    )
    return {
        "config": config.model_dump(),
        "runs": [r.model_dump() for r in runs],
        "summary": summary.model_dump(),
    }


def _dtypes(text: str) -> list[str]:
    out = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in out if d not in DTYPES]
    if bad or not out or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(
            f"--dtypes takes distinct names from {', '.join(DTYPES)} (got {text!r})"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="zoo:tiny-hybrid", help="zoo:NAME or a Hugging Face model directory"
    )
    parser.add_argument(
        "--policy", default="full", help="full | sink_window:SINK:WINDOW | hybrid:SINK:WINDOW"
    )
    parser.add_argument(
        "--dtypes", type=_dtypes, default=list(DTYPES), help="comma-separated, e.g. float32,bfloat16"
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device",
        choices=("auto", "cpu"),
        default="auto",
        help="auto: each backend's accelerator; cpu: both on the cpu",
    )
    parser.add_argument("--out", required=True, help="where to write the report (JSON)")
    args = parser.parse_args(argv)

    config = cli.make_config(parser, Config, args)
    report = write_report(args.out, "parity", 1, parity(config))
    for r in report["runs"]:
        print(
            f"parity {r['dtype']}: agreement {r['agreement']:.4f}, exact {r['exact_prompts']}/{len(r['samples'])}, "
            f"first divergence {r['min_first_divergence']}, max |logit diff| {r['max_abs_logit_diff']:.3g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
