"""The autoregressive model drafter (kind `model`): drafter.py, over any backend's `Session`."""
