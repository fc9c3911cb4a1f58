"""Test requirements that ``make test`` installs: missing, a test fails with one line saying which and how.

A missing requirement is never a skip (a skip reads as "passed" at a glance). Leave a group out on
purpose with its mark instead: ``-m "not browser"`` (deselected, and the summary says so).
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest

#: The pip extra of pyproject.toml that installs a top-level package the tests import (else ``test``).
EXTRA = {"torch": "collect", "ray": "ray", "s3fs": "remote", "fsspec": "remote", "aiohttp": "remote"}


def module(name: str) -> ModuleType:
    """``import name``, or fail the test (or the module's collection) with one line naming the extra."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        why = str(exc)  # failed outside the handler: one line, no chained traceback
    extra = EXTRA.get(name.split(".")[0], "test")
    pytest.fail(f"{name} is not installed ({why}); `make test` installs it: pip install -e '.[{extra}]'", pytrace=False)


def root(why: str) -> None:
    """Fault-injection tests that mount file systems: root is required (CI runs ``make test`` as root);
    as another user the test fails with one line (``-m "not root"`` leaves them out on purpose)."""
    if os.geteuid() != 0:
        pytest.fail(f"needs root to {why}; run as root (CI does) or leave these tests out with -m 'not root'",
                    pytrace=False)


def chromium() -> str:
    """The headless browser the HTML report is tested in, or a one-line failure saying how to get it."""
    for name in ("chromium", "chromium-browser", "/usr/bin/chromium"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("chromium is not installed: the HTML report is tested in a real browser; `make test` installs it "
                "(scripts/ensure-chromium.sh, as root); leave these tests out on purpose with -m 'not browser'",
                pytrace=False)
    raise AssertionError  # unreachable
