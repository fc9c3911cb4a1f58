"""Shared fixtures, and the suite's one rule on skipping.

A test skips only when an optional input it names is missing: ``../shared`` (real traces and logs
that are not redistributed; the ``shared_dir``/``shared_traces`` fixtures skip, naming it, and mark
the test ``shared``). Everything ``make test`` installs is required: chromium, torch, ray, s3fs,
moto, HTA. When one is missing its tests fail with one line naming it (see ``tests/needs.py``);
leave them out on purpose with ``-m "not browser"`` and the like (deselected, not skipped).
Files tracked in this repository (``sample_traces/``, ``tests/data/``) are never optional.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SAMPLES = REPO / "sample_traces"
SHARED_FIXTURES = {"shared_dir", "shared_traces"}


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that take ../shared through its fixtures carry the ``shared`` mark (``-m "not shared"``)."""
    for item in items:
        if SHARED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.shared)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The order's seed last, where a failure is read (``-q`` hides pytest-randomly's own header line):
    the one argument that repeats this order, in random order since order dependence is a bug."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("randomly"):
        return
    seed = config.getoption("randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"random test order: --randomly-seed={seed} repeats it, -p no:randomly turns it off")
