"""The PyTorch backend, one concern a module:

device.py      devices and dtypes (pick_device, pick_dtype, device_name, peak_memory_bytes)
kv.py          one attention layer's K/V (`KV`) and its group's device mirror of the slot table
quant.py       quantize / dequantize, the C-kernel dispatch (kv_kernels.py, kv_kernels.c), `QuantizedKV`
linear.py      one linear-attention layer's state (`DeltaNetState`)
session.py     the `past_key_values` container, `TorchModel`, `TorchSession`, `load_torch`
"""
