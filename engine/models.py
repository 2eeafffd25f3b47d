"""Model references and loading: the one resolver of `zoo:<name>`, a Hugging Face model directory, or
a name under $KAKEYA_MODELS, and the `Model` protocol that `load` returns on every backend. Backends
are imported lazily, so resolving a name needs neither torch nor mlx."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

from engine.decode import Session
from engine.geometry import Geometry, read_geometry
from engine.policy import Policy

ZOO_DIR = Path(__file__).resolve().parent / "zoo" / "models"
Backend = Literal["torch", "mlx"]


class ModelNotFoundError(FileNotFoundError):
    pass


class Model(Protocol):
    """What `load` returns on every backend: a tokenizer, the model's geometry, and sessions."""

    backend: Backend
    geometry: Geometry
    eos_ids: frozenset[int]

    @property
    def layer_types(self) -> list[str]: ...

    @property
    def sliding_window(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    @property
    def device_name(self) -> str:
        """The device the weights are on, e.g. `cuda:0 (NVIDIA H200)` or `cpu (x86_64)`."""
        ...

    @property
    def dtype_name(self) -> str: ...

    def peak_memory_bytes(self) -> int | None:
        """Peak accelerator memory of this process on the model's backend (None on a plain CPU)."""
        ...

    def session(self, policy: Policy, max_block: int = 1, prefill_chunk: int = 512, rows: int = 1) -> Session:
        """A fresh session (engine.decode.Session) holding K/V under `policy`; `max_block` is the largest
        block fed at once and the largest rollback, `prefill_chunk` the prefill's forward size, `rows`
        the batch rows it decodes at once (engine.decode.generate_batch)."""
        ...


# (device, dtype, peak memory) of what this process loaded, for the reports' environment (engine.report);
# no reference to the models themselves, which stay collectable.
_LOADED: list[tuple[str, str, Callable[[], int | None]]] = []


def runtime() -> dict[str, object]:
    """Device, dtype and peak accelerator memory of the models loaded in this process ({} if none)."""
    if not _LOADED:
        return {}
    peaks = [p for _, _, peak in _LOADED if (p := peak()) is not None]
    return {
        "device": ", ".join(dict.fromkeys(d for d, _, _ in _LOADED)),
        "dtype": ", ".join(dict.fromkeys(t for _, t, _ in _LOADED)),
        "peak_memory_bytes": max(peaks) if peaks else None,
    }


def check_device(backend: Backend, device: str) -> str:
    """The device `device` names on `backend` (`auto` resolved); fails naming the devices there are."""
    if backend == "torch":
        try:
            from engine.backends.torch.device import pick_device
        except ImportError as exc:
            raise ValueError(f"the torch backend is not available here: {exc}") from exc
        return str(pick_device(device))
    if backend == "mlx":
        try:
            from engine.backends.mlx.device import pick_device as pick_mlx  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ValueError(f"the mlx backend is not available here: {exc}") from exc
        return str(pick_mlx(device))
    raise ValueError(f"unknown backend {backend!r}: use torch or mlx")


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
    zoo = ", ".join(f"zoo:{m}" for m in zoo_models()) or (
        f"none in {ZOO_DIR}: the zoo comes with a checkout of the repository (pip install -e '.[torch]'), "
        "not with a client install"
    )
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


def load(
    name: str,
    backend: Backend = "torch",
    dtype: str = "auto",
    device: str = "auto",
    compile: bool | str = False,
) -> Model:
    """Load a model and its tokenizer on `backend` (imported here: neither backend is required) onto
    `device` (torch: auto|cpu|cuda|cuda:N|mps; mlx: auto|gpu|cpu), checked before the weights load.
    dtype `auto`: bfloat16 on cuda, float16 on mps / the Metal GPU, float32 on a cpu. `compile`: a
    compiled forward (torch.compile: True or a torch.compile backend name; refused on mlx)."""
    path = resolve(name)
    check_device(backend, device)
    read_geometry(path)  # a layer kind the engine does not handle: UnsupportedModelError, no weights loaded
    model: Model
    if backend == "torch":
        from engine.backends.torch.session import load_torch

        model = load_torch(path, dtype, device, compile)
    else:
        from engine.backends.mlx.session import load_mlx  # type: ignore[import-not-found]

        model = load_mlx(path, dtype, device, compile)
    _LOADED.append((model.device_name, model.dtype_name, model.peak_memory_bytes))
    return model
