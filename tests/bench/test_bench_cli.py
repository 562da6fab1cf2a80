"""The benchmark harness end to end on the real data and the real embedder (slow)."""

from __future__ import annotations

import json

import pytest

from pbr_bench.cli import main
from pbr_bench.datasets import resolve_data_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _data() -> None:
    try:
        resolve_data_dir()
    except (FileNotFoundError, OSError) as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"benchmark data not available: {exc}")


def test_plain_query_reproduces_the_papers_personabench_numbers(tmp_path, capsys) -> None:
    assert (
        main(["run", "--dataset", "personabench", "--methods", "plain", "--out", str(tmp_path)])
        == 0
    )
    summary = json.loads((tmp_path / "personabench-0.0" / "summary__none.json").read_text())
    plain = summary[0]
    assert plain["n"] == 230
    assert plain["R@5"] == pytest.approx(0.3783, abs=5e-5)  # the paper's .3783 / .3074
    assert plain["N@5"] == pytest.approx(0.3074, abs=5e-5)


def test_cli_smoke_run_writes_tables_plots_and_rankings(tmp_path, capsys) -> None:
    args = [
        "--dataset",
        "personabench",
        "--llm",
        "authors",
        "--limit",
        "12",
        "--out",
        str(tmp_path),
    ]
    assert main(["run", *args, "--methods", "plain,bm25,pbr,pbr-safe"]) == 0
    folder = tmp_path / "personabench-0.0" / "n12-seed0"  # a subset never overwrites the full run
    assert (folder / "bars__authors-n12.png").stat().st_size > 0
    rows = (folder / "personabench-0.0__pbr__authors.rankings.jsonl").read_text().splitlines()
    assert len(rows) == 12 and len(json.loads(rows[0])["top"]) == 10
    summary = json.loads((folder / "summary__authors-n12.json").read_text())
    assert [r["method"] for r in summary] == ["plain", "bm25", "pbr", "pbr-safe"]
    assert (folder / "summary__authors-n12.csv").read_text().count("\n") == 1 + len(summary)
    assert main(["compare", *args]) == 0
    assert "pbr__authors" in capsys.readouterr().out
    paired = json.loads((folder / "paired_vs_plain__none.json").read_text())
    assert {r["method"] for r in paired} >= {"bm25__none", "pbr__authors"}


def test_compare_without_a_run_says_which_command_writes_the_rankings(tmp_path) -> None:
    with pytest.raises(SystemExit, match="run `python -m pbr_bench run`"):
        main(["compare", "--dataset", "personabench", "--limit", "12", "--out", str(tmp_path)])


def test_a_run_with_other_settings_never_overwrites_the_default_run(tmp_path) -> None:
    """A parameter other than the default (here ``--theta``) goes to a folder of its own, and
    every result records the settings it ran with (before, such a run overwrote the default
    run's files, and nothing said which settings a result had)."""
    base = ["run", "--dataset", "personabench", "--methods", "plain", "--limit", "6"]
    assert main([*base, "--out", str(tmp_path)]) == 0
    assert main([*base, "--theta", "0.4", "--out", str(tmp_path)]) == 0
    default = tmp_path / "personabench-0.0" / "n6-seed0"
    other = tmp_path / "personabench-0.0" / "n6-seed0-theta0.4"
    for folder, theta in ((default, 0.65), (other, 0.4)):
        result = json.loads((folder / "personabench-0.0__plain__none.json").read_text())
        assert result["settings"]["theta"] == theta and result["settings"]["limit"] == 6
