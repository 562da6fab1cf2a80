"""``python -m pbr_bench reproduce``: every committed harness run can be rerun and compared."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pbr_bench.cli import build_parser, main
from pbr_bench.datasets import resolve_data_dir
from pbr_bench.reproduce import RESULTS, cells, dataset_argv, read_summary, reproduce


def test_every_committed_summary_is_a_cell_the_cli_accepts() -> None:
    found = cells()
    assert {c.name for c in found} == {
        str(p.relative_to(RESULTS)) for p in RESULTS.glob("**/summary__*.csv")
    }
    for cell in found:
        args = build_parser().parse_args([*cell.argv, "--methods", ",".join(cell.methods)])
        assert args.command == "run" and cell.methods


def test_a_subset_cell_carries_its_limit_and_seed() -> None:
    cell = next(c for c in cells() if c.name == "locomo-turn/n200-seed2/summary__local-n200.csv")
    assert cell.argv == (
        "run", "--dataset", "locomo", "--level", "turn", "--llm", "local",
        "--limit", "200", "--seed", "2",
    )  # fmt: skip


def test_a_folder_the_harness_did_not_write_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a data set folder"):
        dataset_argv("personabench")
    (tmp_path / "prefeval-explicit-n10" / "n30-seed1").mkdir(parents=True)
    shutil.copy(
        RESULTS / "prefeval-explicit-n10" / "summary__none.csv",
        tmp_path / "prefeval-explicit-n10" / "n30-seed1" / "summary__none-n20.csv",
    )
    with pytest.raises(ValueError, match="disagree"):
        cells(tmp_path)


@pytest.fixture
def _data() -> None:
    try:
        resolve_data_dir()
    except (FileNotFoundError, OSError) as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"benchmark data not available: {exc}")


@pytest.mark.slow
@pytest.mark.usefixtures("_data")
def test_a_committed_cell_reproduces_and_a_changed_one_is_caught(tmp_path: Path) -> None:
    committed = tmp_path / "committed"
    (committed / "prefeval-explicit-n10").mkdir(parents=True)
    source = RESULTS / "prefeval-explicit-n10" / "summary__none.csv"
    shutil.copy(source, committed / "prefeval-explicit-n10" / "summary__none.csv")
    [cell] = cells(committed)
    row = reproduce(cell, tmp_path / "rerun")
    assert row["reproduces"] is True and row["max_delta"] == 0.0
    assert read_summary(tmp_path / "rerun" / cell.name) == read_summary(source)

    text = source.read_text().replace("0.544", "0.545")  # BM25's R@5, one question off
    (committed / cell.name).write_text(text)
    row = reproduce(cells(committed)[0], tmp_path / "rerun2")
    assert row["reproduces"] is False and row["worst"] == "bm25__none"


@pytest.mark.slow
@pytest.mark.usefixtures("_data")
def test_cached_only_never_generates_and_a_miss_writes_nothing(tmp_path: Path, capsys) -> None:
    argv = ["run", "--dataset", "prefeval", "--n-filler", "300", "--llm", "local", "--limit", "2"]
    code = main([*argv, "--methods", "pbr", "--cached-only", "--out", str(tmp_path)])
    assert code == 3
    assert "had no cached answer" in capsys.readouterr().out
    assert not any(tmp_path.rglob("*.json"))
