"""The MLX backend, one concern a module (nothing here imports torch):

device.py      devices and dtypes (pick_device, pick_dtype)
kv.py          one attention layer's K/V and mlx-lm cache object (`KV`), its group's arrays and mask
quant.py       `QuantizedKV` (mx.quantize's format)
linear.py      one linear-attention layer's state (`DeltaNetState`)
compat.py      what mlx-lm needs and lacks: config shims, hidden-state recording, layer checks
session.py     `MLXModel`, `MLXSession`, `load_mlx`
"""
