"""``python -m pbr_bench experiments``: every benchmark script is registered by being there."""

from __future__ import annotations

from pathlib import Path

import pytest

from pbr_bench.experiments import SCRIPTS, experiments, run


def test_every_script_of_benchmarks_is_an_experiment_that_says_what_it_measures() -> None:
    known = experiments()
    assert set(known) == {p.stem for p in SCRIPTS.glob("*.py")}
    assert {"output_budget", "gemma_latency", "hybrid"} <= set(known)
    assert all(e.summary.strip() for e in known.values())


def test_an_experiment_runs_as_main_with_its_arguments_and_exit_status(tmp_path: Path) -> None:
    out = tmp_path / "argv.txt"
    (tmp_path / "echo.py").write_text(
        '"""Writes its arguments."""\nimport sys\n'
        f"if __name__ == '__main__':\n    open({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "    sys.exit(3)\n"
    )
    assert run("echo", ["--queries", "4"], folder=tmp_path) == 3
    assert out.read_text() == "--queries 4"
    with pytest.raises(SystemExit, match="no experiment 'ecko'"):
        run("ecko", [], folder=tmp_path)


def test_a_script_without_a_docstring_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mute.py").write_text("print('hi')\n")
    with pytest.raises(ValueError, match="no docstring"):
        experiments(tmp_path)
