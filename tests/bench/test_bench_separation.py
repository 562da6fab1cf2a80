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
    # the license the metadata declares travels with the code
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]


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


LIBRARY = ("pbr_core", "langchain_pbr", "llamaindex_pbr")
#: The one place outside the harness allowed to name it: ``pbr bench``'s lookup, inside a
#: function and guarded (a missing harness is a SystemExit saying how to install it).
GUARDED_LOOKUP = ("pbr_core/cli.py", "_bench_main")


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """``(module, enclosing function or "", line)`` for every import statement of ``path``, at any
    depth (lazy imports in functions and ``TYPE_CHECKING`` blocks count too)."""
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, function, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, function, child.lineno))
            visit(child, function)

    visit(ast.parse(path.read_text()), "")
    return found


def _harness_imports(files: list[Path]) -> list[str]:
    return [
        f"{rel}:{line} imports {module}"
        for path in files
        for module, function, line in _imports(path)
        if module.split(".")[0] == "pbr_bench"
        and (rel := path.relative_to(REPO).as_posix(), function) != GUARDED_LOOKUP
    ]


def test_the_library_and_its_tests_never_import_the_harness() -> None:
    """The library's modules, its examples and every test outside ``tests/bench/`` work without
    the harness installed: none imports ``pbr_bench``, not even lazily (``pbr bench``'s guarded
    lookup in ``pbr_core/cli.py`` aside)."""
    library = [p for package in LIBRARY for p in sorted((REPO / package).rglob("*.py"))]
    tests = [p for p in sorted((REPO / "tests").rglob("*.py")) if "bench" not in p.parts]
    examples = sorted((REPO / "examples").rglob("*.py"))
    assert library and tests
    assert not _harness_imports([*library, *tests, *examples])


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


def _statements(path: Path) -> dict[str, str]:
    """Top-level statements of a module by name (``ast.dump``), docstring and ``__all__`` aside."""
    out: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = ast.dump(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names and names != ["__all__"]:
                out[names[0]] = ast.dump(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out[f"import {ast.dump(node)}"] = ast.dump(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            out[f"call {ast.dump(node)}"] = ast.dump(node)  # atexit.register(...)
    return out


def test_the_tests_and_the_benchmarks_start_chroma_with_the_same_code() -> None:
    """The tests' Chroma server (``tests/chroma_server.py``) and the benchmarks'
    (``pbr_bench.chroma_server``) are two copies, so that the tests need no harness: every
    statement of the benchmarks' copy is in the tests' one, unchanged."""
    bench = _statements(REPO / "benchmarks" / "pbr_bench" / "chroma_server.py")
    tests = _statements(REPO / "tests" / "chroma_server.py")
    assert "ChromaServer" in bench
    assert {name: code for name, code in bench.items() if tests.get(name) != code} == {}


def test_the_tests_and_the_benchmarks_start_postgres_with_the_same_code() -> None:
    """As for Chroma: ``tests/postgres_server.py`` and ``pbr_bench.postgres_server`` are two
    copies, every statement of the benchmarks' one unchanged in the tests' one."""
    bench = _statements(REPO / "benchmarks" / "pbr_bench" / "postgres_server.py")
    tests = _statements(REPO / "tests" / "postgres_server.py")
    assert "PostgresServer" in bench and "find_binaries" in bench
    assert {name: code for name, code in bench.items() if tests.get(name) != code} == {}
