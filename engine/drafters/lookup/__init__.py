"""Prompt lookup (kind `lookup`): drafter.py, no model and no backend."""
