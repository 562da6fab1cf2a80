"""Each test is marked by what it needs (``tests/conftest.py``), so one kind can be run alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def collected(marker: str, *files: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, *files],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return {line.split("::")[0] for line in out.splitlines() if "::" in line}


def test_a_test_using_a_chroma_server_is_marked_chroma_and_integration() -> None:
    files = ("tests/contract/test_ownership_processes.py", "tests/core/test_fusion.py")
    assert collected("chroma", *files) == {"tests/contract/test_ownership_processes.py"}
    assert collected("integration", *files) == {"tests/contract/test_ownership_processes.py"}
    assert collected("not integration", *files) == {"tests/core/test_fusion.py"}


def test_notebooks_are_marked_by_file_and_the_harness_by_folder() -> None:
    files = ("tests/langchain/test_langchain_notebook.py", "tests/bench/test_bench_metrics.py")
    assert collected("notebook", *files) == {"tests/langchain/test_langchain_notebook.py"}
    assert collected("bench", *files) == {"tests/bench/test_bench_metrics.py"}


def test_a_missing_real_component_fails_under_ci_and_is_skipped_elsewhere(monkeypatch) -> None:
    """Skipped under CI, a broken PostgreSQL install passed as a green run with its ~150
    tests skipped."""
    import pytest
    from conftest import unavailable

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no pgvector"):
        unavailable("no pgvector")
    for off in ("", "false", "0"):
        monkeypatch.setenv("CI", off)
        with pytest.raises(pytest.skip.Exception, match="no pgvector"):
            unavailable("no pgvector")
