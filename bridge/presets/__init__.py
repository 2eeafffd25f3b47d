"""Presets: the allowlist of what a runner may execute (presets/*.yaml -> typed models, preset)."""
