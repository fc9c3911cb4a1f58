"""docs/api.md runs as a notebook: its python blocks become cells, executed in order by a real Jupyter
kernel (nbclient + ipykernel), from the repository root. The cell holding only ``rep`` must display
the report as HTML: the answer, the step ledger bar whose parts sum to the ledger's step, the findings."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat/nbclient/ipykernel are in the [test] extra")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _notebook(tmp: Path) -> object:
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    cells = [nbformat.v4.new_code_cell(b.replace("OUT/", f"{tmp}/").rstrip("\n")) for b in blocks]
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "language": "python",
                                                                              "display_name": "Python 3"}})


def test_docs_api_page_runs_as_a_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("TRACEREAD_CACHE_DIR", str(tmp_path / "cache"))
    nb = _notebook(tmp_path)
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    client = nbclient.NotebookClient(nb, timeout=600, kernel_name=NATIVE_KERNEL_NAME,
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()  # raises CellExecutionError, naming the cell, when a block fails
    shown = [c for c in nb.cells if c.source.strip() == "rep"]
    assert len(shown) == 1, "docs/api.md has one cell showing the report"
    html = "".join(o.get("data", {}).get("text/html", "") for o in shown[0].outputs)
    assert 'id="answer"' in html and "Rank 5 is a straggler" in html
    assert 'data-finding="straggler"' in html
    widths = [float(w) for w in re.findall(r'data-category="[a-z_]+" style="width: ([0-9.]+)%', html)]
    assert widths and abs(sum(widths) - 100.0) < 0.05  # the ledger's parts sum to its step
    assert not re.search(r'(?:src|href)="(?:https?:)?//', html), "a cell output loads nothing from outside"
    assert sys.executable  # the kernel is this interpreter's (NATIVE_KERNEL_NAME)
