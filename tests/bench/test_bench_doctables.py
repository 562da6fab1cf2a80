"""The docs' benchmark tables are generated from the committed results and stay in step."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from pbr_bench.doctables import DOCS, RESULTS, TABLES, cmd_tables, render


def test_every_table_in_the_docs_matches_its_committed_results(capsys) -> None:
    assert cmd_tables(argparse.Namespace(check=True)) == 0, capsys.readouterr().out


def test_every_registered_table_appears_in_a_document() -> None:
    used = {name for doc in DOCS for name in render(doc.read_text(encoding="utf-8"))[1]}
    assert used == set(TABLES)


def test_a_changed_result_changes_the_table_and_nothing_else(tmp_path: Path) -> None:
    for n in (10, 50, 100, 300):
        folder = tmp_path / f"prefeval-explicit-n{n}"
        folder.mkdir()
        for name in ("summary__none.csv", "paired_vs_plain__none.csv"):
            shutil.copy(RESULTS / folder.name / name, folder / name)
    doc = "before\n<!-- table:prefeval-no-llm -->\nstale\n<!-- /table:prefeval-no-llm -->\nafter\n"
    fresh, names = render(doc, tmp_path)
    assert names == ["prefeval-no-llm"] and "stale" not in fresh
    assert fresh.startswith("before\n") and fresh.endswith("after\n")
    assert "| 10 | .9590 / 1.0000 |" in fresh

    summary = tmp_path / "prefeval-explicit-n10" / "summary__none.csv"
    summary.write_text(summary.read_text().replace("0.959,", "0.958,"))
    assert "| 10 | .9580 / 1.0000 |" in render(fresh, tmp_path)[0]
    assert render(render(fresh, tmp_path)[0], tmp_path)[0] == render(fresh, tmp_path)[0]


def test_an_unknown_table_name_is_an_error() -> None:
    with pytest.raises(KeyError, match="no table named 'prefeval-no-lm'"):
        render("<!-- table:prefeval-no-lm -->\n<!-- /table:prefeval-no-lm -->\n")


def test_a_missing_result_row_is_an_error_not_a_blank_cell(tmp_path: Path) -> None:
    for n in (10, 50, 100, 300):
        folder = tmp_path / f"prefeval-explicit-n{n}"
        folder.mkdir()
        rows = (RESULTS / folder.name / "summary__none.csv").read_text().splitlines()
        (folder / "summary__none.csv").write_text("\n".join(r for r in rows if "bm25" not in r))
        shutil.copy(RESULTS / folder.name / "paired_vs_plain__none.csv", folder)
    with pytest.raises(LookupError, match="0 rows match"):
        render("<!-- table:prefeval-no-llm -->\n<!-- /table:prefeval-no-llm -->\n", tmp_path)
