"""Pieces the niah, throughput and compression workloads share: common flags, the K/V geometry of a
model from its config, progress bars and plots. No torch or mlx at import time."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from engine.policy import Policy, config_layer_types, full, kv_bytes_per_slot, parse_policy, sink_window
from engine.report import write_report

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


class ModelConfig(BaseModel):
    """The report's `config` fields for the flags `add_model_args` adds; each workload extends it."""

    model_config = ConfigDict(extra="forbid")
    model: str
    backend: str
    dtype: str


def add_model_args(parser: argparse.ArgumentParser, *, backend: bool = True) -> None:
    parser.add_argument(
        "--model",
        default="zoo:tiny-hybrid",
        help="zoo:NAME, a Hugging Face model directory, or a NAME under $KAKEYA_MODELS",
    )
    if backend:
        parser.add_argument("--backend", choices=("torch", "mlx"), default="torch")
    parser.add_argument("--dtype", choices=tuple(ITEMSIZE), default="float32")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch/OpenMP threads (0: leave the library default)"
    )
    parser.add_argument("--out", required=True, help="where to write the report (JSON)")


def set_threads(threads: int) -> None:
    if threads < 0:
        raise ValueError("--threads must be >= 0")
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(threads)


def policies(text: str, *, allow_full: bool = True) -> list[Policy]:
    """A comma-separated list of policies (`hybrid:4:64,sink_window:4:64`); one per kind at most."""
    out = [parse_policy(p) for p in text.split(",") if p.strip()]
    if not out:
        raise ValueError("give at least one cache policy")
    kinds = [p.kind for p in out]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"one policy per kind (got {text!r}): the report keys policies by kind")
    if not allow_full and "full" in kinds:
        raise ValueError("the full policy is the oracle here; list only the policies under test")
    return out


def drafter_policy(policy: Policy) -> Policy:
    """A model drafter's cache under `policy`: sink_window with its sink and window (full for full);
    a drafter only needs recent context."""
    return full() if policy.kind == "full" else sink_window(policy.sink, policy.window or 1)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def int_list(text: str) -> list[int]:
    return _numbers(text, int, "integer")


def float_list(text: str) -> list[float]:
    return _numbers(text, float, "number")


_N = TypeVar("_N", int, float)


def _numbers(text: str, convert: Callable[[str], _N], noun: str) -> list[_N]:
    try:
        out = [convert(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {noun}s, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"expected at least one {noun}")
    return out


@dataclass(frozen=True)
class Geometry:
    """What K/V bytes depend on: layer types, native window, K/V heads and head size (batch 1)."""

    layer_types: list[str]
    sliding_window: int | None
    kv_heads: int
    head_dim: int
    dtype: str  # the config's weights dtype (float32 when it names none)

    def slot_bytes(self, dtype: str) -> list[int]:
        """K and V bytes of one position, per layer (engine.policy.kv_bytes_per_slot)."""
        return [kv_bytes_per_slot(self.kv_heads, self.head_dim, ITEMSIZE[dtype])] * len(self.layer_types)


def geometry(path: Path) -> Geometry:
    """Read from the model's config the way the PyTorch backend does (transformers' AutoConfig, no weights)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    types = config_layer_types(getattr(text, "layer_types", None), window, text.num_hidden_layers)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    dtype = dtype.removeprefix("torch.")
    return Geometry(types, window, int(kv_heads), int(head_dim), dtype if dtype in ITEMSIZE else "float32")


def oldest_visible(specs: Sequence[Any], q: int) -> int:
    """The farthest-back key position a query at q still reaches in some layer, sinks aside: the start
    of the contiguous span [j, q] a layer attends to (0 when some layer sees the whole prefix)."""
    best = q
    for s in specs:
        lo = max(
            0,
            q - s.window + 1 if s.window is not None else 0,
            q - s.native_window + 1 if s.native_window is not None else 0,
        )
        if lo <= s.sink:  # the window reaches the sinks: the span runs on down through them
            lo = max(0, q - s.native_window + 1) if s.native_window is not None else 0
        assert s.visible(q, lo) and (lo == 0 or lo - 1 < s.sink or not s.visible(q, lo - 1))
        best = min(best, lo)
    return best


def progress(total: int, desc: str, unit: str = "it") -> Any:
    """A tqdm bar on stderr (refreshed rarely when stderr is a log file, not a terminal)."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        mininterval=0.2 if tty else 10.0,
        ascii=not tty,
        dynamic_ncols=tty,
    )


def plot_path(out: str, suffix: str, given: str | None) -> Path | None:
    """Where a workload's PNG goes: --plot PATH, 'none' for no plot, default `<report stem>-SUFFIX.png`
    next to the report (the run dir when a runner runs it, so summary.md embeds it)."""
    if given == "none":
        return None
    if given:
        return Path(given)
    report = Path(out)
    return report.with_name(f"{report.stem}-{suffix}.png")


def write_plotted(
    out: str,
    kind: str,
    body: dict[str, Any],
    draw: Callable[[dict[str, Any], Path], None],
    suffix: str,
    given: str | None,
) -> tuple[dict[str, Any], Path | None]:
    """Draw the body's plot where `plot_path` says (naming it in the body as `plot`), then write the
    report (schema version 1); returns the report and the PNG path (None: no plot)."""
    png = plot_path(out, suffix, given)
    if png is not None:
        draw(body, png)
        body["plot"] = png.name
    return write_report(out, kind, 1, body), png


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
