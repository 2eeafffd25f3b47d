"""Gemma 4's assistant (kind `gemma4-assistant`): config.py (what it is and which verifier layers it reads,
no torch), torch.py (the drafter on a PyTorch Gemma 4 verifier's hidden state and K/V). No MLX twin yet."""
