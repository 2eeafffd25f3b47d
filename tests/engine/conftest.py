"""Engine test fixtures: `backend` runs a test once per backend (torch, mlx; mlx skipped where absent)."""

from __future__ import annotations

import pytest

from tests.engine.backends import BACKENDS


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)
