"""Backends: base.py (what every backend shares, no torch or mlx), torch/ and mlx/ (packages split by concern)."""
