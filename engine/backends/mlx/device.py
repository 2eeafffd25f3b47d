"""The MLX devices and dtypes: picking one by name."""

from __future__ import annotations

import mlx.core as mx

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def pick_device(device: str = "auto") -> mx.Device:
    """`auto` (MLX's default device: the Metal GPU on Apple Silicon), `gpu` or `cpu`; one that is not
    here fails naming those that are."""
    have = {"cpu": mx.cpu} | ({"gpu": mx.gpu} if mx.is_available(mx.gpu) else {})
    if device == "auto":
        return mx.default_device()
    if device not in have:
        raise ValueError(f"device {device!r} is not available here; mlx devices here: {', '.join(have)}")
    return mx.Device(have[device])


def pick_dtype(dtype: str, device: mx.Device) -> mx.Dtype:
    """`auto`: float16 on the Metal GPU, float32 on the cpu; else one of DTYPES."""
    if dtype == "auto":
        return mx.float16 if device.type == mx.gpu else mx.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use auto or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]
