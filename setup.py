"""The packages: engine, bridge, gates and `kakeya_presets` (presets/, see pyproject.toml)."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["engine*", "bridge*", "gates*"]), "kakeya_presets"])
