"""The masked-diffusion drafter (kind `diffusion`): config.py (config.json and the spec's options, no torch
or mlx), drafter.py (the backend-free `DiffusionDrafter` over a `DiffusionModel`), torch.py and mlx.py (the
zoo's TinyDLM on each backend), gemma.py (a transformers DiffusionGemma, PyTorch only). engine.drafters.load
picks the model."""
