"""Command-line pieces the workloads share: the model flags and their report `config` model, the typed
config fields (`PolicyField`, `Drafter`: parsed once, written to reports as their strings), `make_config`
(a workload's Config from its flags, a validation error as a usage error: bounds live in `Field` only),
threads, policy and number lists, token-list comparison and progress bars. No torch or mlx at import time."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, ValidationError, WithJsonSchema
from tqdm import tqdm

from engine.drafters.spec import DrafterSpec
from engine.geometry import ITEMSIZE, UnsupportedModelError, read_geometry
from engine.models import ModelNotFoundError, resolve
from engine.models import check_device as check
from engine.policy import Policy, parse_policy
from engine.progress import report_progress


def _drafter(value: Any) -> DrafterSpec:
    return value if isinstance(value, DrafterSpec) else DrafterSpec.parse(str(value))


# A config field holding a parsed drafter spec, written to reports as its string (`diffusion:zoo:tiny-dlm:steps=4`).
Drafter = Annotated[
    DrafterSpec,
    PlainValidator(_drafter),
    PlainSerializer(str, return_type=str),
    WithJsonSchema({"type": "string"}),
]


def _policy(value: Any) -> Policy:
    return value if isinstance(value, Policy) else parse_policy(str(value))


# A config field holding a parsed cache policy, written to reports as its string (`hybrid:4:64:q8`).
PolicyField = Annotated[
    Policy, PlainValidator(_policy), PlainSerializer(str, return_type=str), WithJsonSchema({"type": "string"})
]

_C = TypeVar("_C", bound=BaseModel)


def make_config(
    parser: argparse.ArgumentParser, config: type[_C], args: argparse.Namespace, **values: Any
) -> _C:
    """`config` from the parsed flags named like its fields, and `values` (what the workload parsed or
    derived itself); a value out of its `Field` bounds (or one that does not parse) exits 2 with one
    usage line naming the flag (`--k: Input should be greater than or equal to 1`)."""
    given = {k: v for k, v in vars(args).items() if k in config.model_fields}
    try:
        made = config(**{**given, **values})
    except ValidationError as exc:
        usage_error(parser, exc)
    if isinstance(model := getattr(made, "model", None), str):
        check_model(parser, model)
    return made


def check_model(parser: argparse.ArgumentParser, name: str) -> None:
    """A model whose layer kinds the engine does not handle exits 2 here in one line (model type, layer
    kind, what is supported), before any weights load; a model that is not found is left to the workload."""
    try:
        path = resolve(name)
    except ModelNotFoundError:
        return
    try:
        read_geometry(path)
    except UnsupportedModelError as exc:
        parser.error(str(exc))


def usage_error(parser: argparse.ArgumentParser, exc: ValidationError) -> NoReturn:
    err = exc.errors()[0]
    message = str(err.get("ctx", {}).get("error") or err["msg"])
    if not err["loc"]:  # a rule across fields
        parser.error(message)
    flag = "--" + str(err["loc"][0]).replace("_", "-") + "".join(f"[{p}]" for p in err["loc"][1:])
    parser.error(f"{flag}: {message}")


class ModelConfig(BaseModel):
    """The report's `config` fields for the flags `add_model_args` adds; each workload extends it."""

    model_config = ConfigDict(extra="forbid")
    model: str
    backend: str
    dtype: str
    device: str = "auto"


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
        "--device",
        default="auto",
        help="torch: auto|cpu|cuda|cuda:N|mps; mlx: auto|gpu|cpu (auto: the accelerator)",
    )
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
            import torch  # optional: an mlx-only host has none
        except ImportError:
            return
        torch.set_num_threads(threads)


def check_device(backend: str, device: str) -> None:
    """A device that is not there fails here, before any weights load (the workloads exit 2 on it)."""
    check(backend, device)  # type: ignore[arg-type]


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


class _Bar(tqdm):
    """tqdm that also tells a runner how far it got (engine/progress.py: KAKEYA_PROGRESS), at most once a second."""

    _told = 0.0

    def update(self, n: float | None = 1) -> bool | None:
        shown = super().update(n)
        now = time.monotonic()
        if now - self._told >= 1.0 or self.n >= (self.total or 0):
            self._told = now
            what = f"{self.desc} {self.unit} {self.n} of {self.total}" + (
                f" ({self.postfix})" if self.postfix else ""
            )
            report_progress(int(self.n), int(self.total or 0) or 1, what)
        return shown


def progress(total: int, desc: str, unit: str = "it") -> Any:
    """A tqdm bar on stderr (refreshed rarely when stderr is a log file, not a terminal); a runner sees it too."""
    tty = sys.stderr.isatty()
    return _Bar(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        mininterval=0.2 if tty else 10.0,
        ascii=not tty,
        dynamic_ncols=tty,
    )
