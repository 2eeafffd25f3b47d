"""The fast lane (`make test-fast`, `-m "not integration"`) leaves out exactly the files tests/conftest.py
lists as INTEGRATION: each listed file must exist, or a rename would quietly move it into the fast lane."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import INTEGRATION

TESTS = Path(__file__).resolve().parent


def test_every_integration_file_exists() -> None:
    missing = sorted(name for name in INTEGRATION if not (TESTS / name).is_file())
    assert missing == [], f"tests/conftest.py INTEGRATION names files that do not exist (renamed?): {missing}"


def test_the_marker_is_registered_and_make_has_the_fast_lane() -> None:
    root = TESTS.parent
    assert '"integration:' in (root / "pyproject.toml").read_text()
    assert '-m "not integration"' in (root / "Makefile").read_text()
