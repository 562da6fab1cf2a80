"""``python -m pbr_bench experiments`` / ``experiment NAME``: every benchmark script, by name.

The scripts in ``benchmarks/`` are the experiments: one measurement each, each writing its
results under ``benchmarks/results/``. This registry finds them (every ``benchmarks/*.py``),
lists them with the first line of their docstring, and runs one by name, so there is one entry
point and a new script is registered by being there; no script imports another.

    python -m pbr_bench experiments                      # the list
    python -m pbr_bench experiment output_budget         # run one (arguments follow its name)
    python -m pbr_bench experiment gemma_latency --queries 4
"""

from __future__ import annotations

import ast
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

from .paths import BENCHMARKS_DIR

SCRIPTS = BENCHMARKS_DIR


@dataclass(frozen=True)
class Experiment:
    name: str  # the script's file name without ``.py``
    path: Path
    summary: str  # the first line of its docstring


def experiments(folder: Path = SCRIPTS) -> dict[str, Experiment]:
    """Every benchmark script in ``folder``, by name; a script without a docstring is an error
    (it must say what it measures)."""
    found = {}
    for path in sorted(folder.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if not doc:
            raise ValueError(f"{path} has no docstring saying what it measures")
        found[path.stem] = Experiment(path.stem, path, doc.splitlines()[0])
    return found


def run(name: str, argv: list[str], folder: Path = SCRIPTS) -> int:
    """Run the script ``name`` as ``__main__`` with ``argv`` (its exit status)."""
    known = experiments(folder)
    if name not in known:
        raise SystemExit(f"no experiment {name!r}; `python -m pbr_bench experiments` lists them")
    saved = sys.argv
    sys.argv = [str(known[name].path), *argv]
    try:
        runpy.run_path(str(known[name].path), run_name="__main__")
    except SystemExit as exc:  # a script's own exit status
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def list_experiments() -> int:
    known = experiments()
    width = max(len(n) for n in known)
    for exp in known.values():
        print(f"{exp.name:<{width}}  {exp.summary}")
    return 0
