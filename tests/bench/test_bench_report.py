"""Result files: one table, written as CSV and JSON side by side."""

from __future__ import annotations

import csv
import json

import pytest

from pbr_bench.report import write_rows


def _csv(path):
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_rows_become_a_csv_and_a_json_file_next_to_each_other(tmp_path) -> None:
    rows = [{"method": "plain", "R@5": 0.3783}, {"method": "pbr", "R@5": 0.4516}]
    write_rows(rows, tmp_path / "deep" / "summary__authors")
    assert _csv(tmp_path / "deep" / "summary__authors.csv") == [
        {"method": "plain", "R@5": "0.3783"},
        {"method": "pbr", "R@5": "0.4516"},
    ]
    assert json.loads((tmp_path / "deep" / "summary__authors.json").read_text()) == rows


def test_fixed_columns_leave_a_missing_key_empty(tmp_path) -> None:
    rows = [{"fusion": "plain", "R@5": 0.5}, {"fusion": "safe", "R@5": 0.6, "wins": 3}]
    write_rows(rows, tmp_path / "t", fields=["fusion", "R@5", "wins"])
    got = _csv(tmp_path / "t.csv")
    assert [r["wins"] for r in got] == ["", "3"]


def test_a_dotted_stem_keeps_its_name(tmp_path) -> None:
    write_rows([{"a": 1}], tmp_path / "sweep__gemma-0.7")
    assert (tmp_path / "sweep__gemma-0.7.csv").exists()
    assert (tmp_path / "sweep__gemma-0.7.json").exists()


def test_the_json_may_carry_more_than_the_table(tmp_path) -> None:
    rows = [{"method": "hyde", "R@5": 0.9}]
    write_rows(rows, tmp_path / "b", payload={"questions": ["q1"], "rows": rows})
    assert json.loads((tmp_path / "b.json").read_text())["questions"] == ["q1"]
    assert _csv(tmp_path / "b.csv")[0]["method"] == "hyde"


def test_no_rows_is_refused_and_writes_nothing(tmp_path) -> None:
    with pytest.raises(ValueError, match="no rows"):
        write_rows([], tmp_path / "empty")
    assert list(tmp_path.iterdir()) == []


def test_a_timing_records_the_cpu_model_and_the_cores_it_could_use() -> None:
    """Timings were written with the load average at most, so two runs' figures could not be
    told apart by machine (the CPU model differs from machine to machine here)."""
    import json
    import os
    from pathlib import Path

    from pbr_bench.machine import describe

    got = describe()
    json.dumps(got)  # JSON-ready
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next(
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        )
        assert got["cpu"] == model
    assert got["cores_usable"] == len(os.sched_getaffinity(0))
    assert len(got["load_avg"]) == 3


def test_a_tables_figure_is_a_png_with_a_bar_per_method_and_group(tmp_path) -> None:
    from pbr_bench.report import bar_png

    path = tmp_path / "figure.png"
    groups = {"locomo": {"dense": 0.35, "hybrid": 0.55}, "prefeval": {"dense": 0.98}}
    bar_png(path, groups, title="t", ylabel="R@5")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
