"""The benchmark harness lives beside the library, not in it: the core never imports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pbr_core import cli


def test_importing_the_library_does_not_import_the_harness() -> None:
    code = (
        "import sys, pbr_core, pbr_core.cli\n"
        "assert not [m for m in sys.modules if m.startswith('pbr_bench')], 'pbr_bench imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pbr_bench_forwards_to_the_harness(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    assert "python -m pbr_bench" in capsys.readouterr().out


class _NoHarness:
    """A meta-path finder that hides ``pbr_bench``, as when only the wheel is installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pbr_bench" or name.startswith("pbr_bench."):
            raise ModuleNotFoundError(f"No module named {name!r}", name="pbr_bench")


def test_pbr_bench_without_the_harness_says_how_to_run_it(monkeypatch, tmp_path) -> None:
    for name in [m for m in sys.modules if m == "pbr_bench" or m.startswith("pbr_bench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoHarness(), *sys.meta_path])
    monkeypatch.chdir(tmp_path)  # not a source checkout
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "run"])
    assert "benchmark harness is not installed" in str(exc.value.code)
    assert "python -m pbr_bench" in str(exc.value.code)
