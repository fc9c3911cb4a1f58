"""Shared fixtures. Tests that need ../shared skip cleanly when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SAMPLES = REPO / "sample_traces"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout; skips the test when an outside contributor lacks it."""
    if not (SHARED / "traces").is_dir():
        pytest.skip("../shared is absent (reference traces are not redistributed)")
    return SHARED


@pytest.fixture(scope="session")
def shared_traces(shared_dir: Path) -> Path:
    return shared_dir / "traces"


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    return SAMPLES
