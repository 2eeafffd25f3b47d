"""The preset registry: where the presets are (`default_presets_dir`), loading and validating every
presets/*.yaml (`load_registry`: all or nothing), and looking a preset up by name (`get_preset`, with a
did-you-mean).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from bridge.core.errors import InvalidRequest, KakeyaError, problems
from bridge.presets.params import did_you_mean
from bridge.presets.preset import Preset
from bridge.wire import git


def default_presets_dir(cwd: Path | None = None) -> Path:
    """Where the presets are: $KAKEYA_PRESETS; else presets/ at the repository root of the working directory
    (the checkout it runs in); else presets/ of the checkout the bridge package runs from (an editable
    install, a runner's trusted harness); else the copy installed with the package (`kakeya_presets`)."""
    env = os.environ.get("KAKEYA_PRESETS")
    if env:
        return Path(env)
    candidates = [Path(__file__).resolve().parents[2] / "presets"]
    top = git.toplevel(cwd or Path.cwd())
    if top is not None:
        candidates.insert(0, top / "presets")
    spec = importlib.util.find_spec("kakeya_presets")
    if spec is not None:
        candidates += [Path(p) for p in spec.submodule_search_locations or []]
    return next((c for c in candidates if c.is_dir()), candidates[0])


def load_preset_file(path: Path) -> Preset:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidRequest(f"preset file {path}: cannot read YAML: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"preset file {path}: expected a mapping at the top level")
    try:
        preset = Preset.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(f"preset file {path}: {problems(exc, 'preset')}") from None
    if preset.name != path.stem:
        raise InvalidRequest(
            f"preset file {path}: name {preset.name!r} must match the file name {path.stem!r}"
        )
    return preset


def load_registry(directory: Path | None = None) -> dict[str, Preset]:
    """Every presets/*.yaml, validated; one bad file fails the whole registry (an allowlist is all or nothing)."""
    directory = directory or default_presets_dir()
    if not directory.is_dir():
        raise KakeyaError(
            f"presets directory {directory} does not exist (set KAKEYA_PRESETS to a presets/ directory)"
        )
    return {p.stem: load_preset_file(p) for p in sorted(directory.glob("*.yaml"))}


def get_preset(registry: Mapping[str, Preset], name: str) -> Preset:
    if name not in registry:
        raise InvalidRequest(
            f"unknown preset {name!r}{did_you_mean(name, registry)} "
            f"(known: {', '.join(sorted(registry)) or 'none'})",
            code="unknown-preset",
        )
    return registry[name]
