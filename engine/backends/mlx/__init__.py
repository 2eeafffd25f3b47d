"""The MLX backend, one concern a module (nothing here imports torch):

device.py      devices and dtypes (pick_device, pick_dtype)
kv.py          one attention layer's K/V and mlx-lm cache object (`KV`), its group's arrays and mask
quant.py       `QuantizedKV` (mx.quantize's format)
linear.py      one linear-attention layer's state (`DeltaNetState`)
mamba.py       Mamba-2 hybrids: `Mamba2State`, Falcon-H1's `ParallelState`, `mixer_states`
compat.py      what mlx-lm needs and lacks: config shims, which model types it decodes (MLA, Mamba-2),
               hidden-state recording, layer checks
session.py     `MLXModel`, `MLXSession`, `load_mlx`
"""
