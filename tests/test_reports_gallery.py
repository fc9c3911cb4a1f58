"""reports/ is current: every scenario's JSON rebuilt from its input equals the stored one, every
scenario has its screenshot, and the index lists each (``make reports`` regenerates them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
sys.path.insert(0, str(REPO / "scripts"))
import make_reports  # noqa: E402


def test_gallery_is_current(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "make_reports.py"), "--json-only", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-2000:]
    index = (REPO / "reports" / "README.md").read_text()
    stale = []
    for s in make_reports.SCENARIOS:
        fresh = (tmp_path / f"{s.name}.json").read_text()
        stored = REPO / "reports" / f"{s.name}.json"
        if not stored.is_file() or stored.read_text() != fresh:
            stale.append(s.name)
        assert (REPO / "reports" / f"{s.name}.png").stat().st_size > 10_000, f"{s.name}: no screenshot"
        assert f"({s.name}.json)" in index and f"({s.name}.png)" in index
    assert not stale, f"reports/ is stale for {stale}: run `make reports` and commit reports/"


def test_gallery_stays_small() -> None:
    total = sum(p.stat().st_size for p in (REPO / "reports").iterdir())
    assert total < 5 * 1024 * 1024, f"reports/ holds {total / 2**20:.1f} MiB"
