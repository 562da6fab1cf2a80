"""The benchmark harness lives beside the library, not in it: the core never imports it."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

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


REPO = Path(__file__).resolve().parents[2]
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]


def test_the_library_wheel_holds_the_library_only(tmp_path) -> None:
    subprocess.run(
        [*PIP_WHEEL, str(REPO), "-w", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("personalize_before_retrieve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    packages = {t for t in tops if not t.endswith(".dist-info")}
    assert packages == {"pbr_core", "langchain_pbr", "llamaindex_pbr"}
    assert not [n for n in names if "bench" in n.split("/")[-1] and n.endswith(".py")]


def test_the_harness_is_installed_and_finds_the_checkout_from_any_folder(tmp_path) -> None:
    code = "import pbr_bench.paths as p; print(p.REPO_ROOT); print(p.GENERATION_CACHE_DIR.is_dir())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, check=True, capture_output=True, text=True
    ).stdout.split()
    assert out == [str(REPO), "True"]


def test_no_benchmark_script_edits_sys_path_or_imports_another_script() -> None:
    scripts = sorted((REPO / "benchmarks").glob("*.py"))
    names = {p.stem for p in scripts}
    assert scripts
    for script in scripts:
        text = script.read_text()
        assert "sys.path" not in text, script.name
        imported = re.findall(r"^(?:from|import) (\w+)", text, flags=re.M)
        assert not names & set(imported), f"{script.name} imports {names & set(imported)}"


def test_every_name_a_benchmark_script_imports_exists() -> None:
    """A script is run by hand, not by the suite: a name removed from the library must not leave
    a script that fails at its first line."""
    missing = []
    for script in sorted((REPO / "benchmarks").glob("*.py")):
        for node in ast.parse(script.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "__future__":
                    continue
                module = importlib.import_module(node.module)
                missing += [
                    f"{script.name}: {node.module}.{a.name}"
                    for a in node.names
                    if not hasattr(module, a.name)
                    and importlib.util.find_spec(f"{node.module}.{a.name}") is None
                ]
            elif isinstance(node, ast.Import):
                for a in node.names:
                    importlib.import_module(a.name)
    assert not missing


def _harness_graph() -> dict[str, set[str]]:
    """Module of ``pbr_bench`` -> the modules of ``pbr_bench`` it imports, lazily or not."""
    package = REPO / "benchmarks" / "pbr_bench"
    names = {p.stem for p in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pbr_bench"):
                parts = (node.module or "").split(".")
                deps |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {
                    a.name.split(".")[1] for a in node.names if a.name.startswith("pbr_bench.")
                }
        graph[path.stem] = (deps & names) - {path.stem}
    return graph


def test_the_harness_modules_import_each_other_without_a_cycle() -> None:
    """Every import counts, lazy and type-only too: a cycle hidden in a function body is still
    two modules that cannot be understood, or moved, one without the other."""
    graph = _harness_graph()
    assert graph["reproduce"] and graph["cli"]
    done: set[str] = set()
    path: list[str] = []

    def walk(name: str) -> None:
        assert name not in path, "import cycle: " + " -> ".join([*path[path.index(name) :], name])
        if name in done:
            return
        path.append(name)
        for dep in sorted(graph[name]):
            walk(dep)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        walk(name)
