"""Run the engine tests on every backend: `on(backend, tm)` is the same tiny model on that backend.

The tiny models are built as transformers models (tests/engine/tiny_models.py), which stay the
oracles (`generate`, teacher-forced forwards); the MLX twin is that model saved to a temporary
Hugging Face directory and loaded by the MLX backend, so both backends run identical float32 weights.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

HAVE_MLX = importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None
BACKENDS = [
    "torch",
    pytest.param("mlx", marks=pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")),
]

_TMP = Path(tempfile.mkdtemp(prefix="kakeya-mlx-twins-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


@functools.cache
def mlx_twin(tm: Any) -> Any:
    from engine.backends.mlx.session import load_mlx

    path = _TMP / f"m{len(list(_TMP.iterdir()))}"
    tm.model.save_pretrained(path)
    if tm.tokenizer is not None:
        tm.tokenizer.save_pretrained(path)
    twin = load_mlx(path)
    twin.eos_ids = tm.eos_ids
    return twin


def on(backend: str, tm: Any) -> Any:
    """`tm` (a TorchModel) itself for torch, its MLX twin for mlx."""
    if backend == "torch":
        return tm
    if backend == "mlx":
        return mlx_twin(tm)
    raise ValueError(f"unknown backend {backend!r}")
