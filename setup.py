"""The packages: engine, bridge, gates and `kakeya_presets` (presets/, see pyproject.toml)."""

from setuptools import find_packages, setup

# gates/schemas (JSON files only) is a package of its own, so that setuptools builds without a warning
setup(packages=[*find_packages(include=["engine*", "bridge*", "gates*"]), "gates.schemas", "kakeya_presets"])
