"""The block drafter (kind `block`): config.py (its config.json, backend-free), base.py (the context
bookkeeping both backends share), torch.py and mlx.py (the model and its K/V buffers on each backend).
engine.drafters.load picks the backend."""
