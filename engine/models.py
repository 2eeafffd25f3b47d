"""Model references and loading: `zoo:<name>`, a Hugging Face model directory, or a name under
$KAKEYA_MODELS. Backends are imported lazily, so resolving a name needs neither torch nor mlx."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

ZOO_DIR = Path(__file__).resolve().parent / "zoo" / "models"
Backend = Literal["torch", "mlx"]


class ModelNotFoundError(FileNotFoundError):
    pass


class Tokenized:
    """`encode` / `decode` through the model's Hugging Face tokenizer (a base of each backend's model)."""

    tokenizer: Any

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model was loaded without a tokenizer")
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            raise ValueError("this model was loaded without a tokenizer")
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


def models_dirs() -> list[Path]:
    """Where a model NAME is looked for: $KAKEYA_MODELS, then ~/kakeya-models (as runners resolve it)."""
    root = os.environ.get("KAKEYA_MODELS")
    return ([Path(root).expanduser()] if root else []) + [Path.home() / "kakeya-models"]


def zoo_models() -> list[str]:
    if not ZOO_DIR.is_dir():
        return []
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "config.json").is_file())


def resolve(name: str) -> Path:
    """The model directory a reference names; a clear error listing the zoo when there is none."""
    zoo = ", ".join(f"zoo:{m}" for m in zoo_models()) or "none committed yet"
    if name.startswith("zoo:"):
        path = ZOO_DIR / name[4:]
        if name[4:] and "/" not in name[4:] and (path / "config.json").is_file():
            return path
        raise ModelNotFoundError(f"no zoo model {name!r}; zoo models: {zoo}")
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return path
    if not path.is_absolute() and ".." not in path.parts:
        for root in models_dirs():
            if (root / path / "config.json").is_file():
                return root / path
    where = " or ".join(str(root / path) for root in models_dirs())
    raise ModelNotFoundError(
        f"model {name!r} not found: give zoo:<name> (zoo models: {zoo}) or a Hugging Face model "
        f"directory with a config.json; looked in {where}"
    )


def load(name: str, backend: Backend = "torch", dtype: str = "float32") -> Any:
    """Load a model and its tokenizer; returns the backend's model object (TorchModel for torch)."""
    path = resolve(name)
    if backend == "torch":
        from engine.backends.torch import load_torch

        return load_torch(path, dtype)
    if backend == "mlx":
        try:
            from engine.backends.mlx import load_mlx  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ValueError(f"the mlx backend is not available here: {exc}") from exc
        return load_mlx(path, dtype)
    raise ValueError(f"unknown backend {backend!r}: use torch or mlx")
