"""Where the harness reads and writes, computed once: every module and script imports it from here.

The harness runs from a source checkout (it is not in the library's wheel), so its folders are
found from this file, not from the current directory: ``python -m pbr_bench`` and the scripts of
``benchmarks/`` work from any folder.

- :data:`REPO_ROOT`: the checkout (the folder holding ``pbr_core/`` and ``benchmarks/``).
- :data:`BENCHMARKS_DIR`: ``benchmarks/``, the scripts (``python -m pbr_bench experiments``).
- :data:`RESULTS_DIR`: ``benchmarks/results/``, the committed results every script writes.
- :data:`GENERATION_CACHE_DIR`: ``benchmarks/cache/``, the committed LLM generations.
- :func:`cache_dir`: the scratch cache (embeddings, pickles), git-ignored, ``$PBR_CACHE_DIR`` or
  ``<repo>/.pbr-cache``; read per call, so a test or a caller may set the variable first.
- :func:`scratch_dir`: a script's own folder in it, named for the code and data that wrote it.

The benchmark data sets are not under the checkout: see :func:`pbr_bench.datasets.resolve_data_dir`
(``$PBR_DATA_DIR`` or ``--data-dir``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "BENCHMARKS_DIR",
    "GENERATION_CACHE_DIR",
    "REPO_ROOT",
    "RESULTS_DIR",
    "cache_dir",
    "in_repo",
    "scratch_dir",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_DIR = REPO_ROOT / "benchmarks"
RESULTS_DIR = BENCHMARKS_DIR / "results"
GENERATION_CACHE_DIR = BENCHMARKS_DIR / "cache"


def cache_dir() -> Path:
    """``$PBR_CACHE_DIR`` if set, else ``<repo>/.pbr-cache`` (git-ignored): scratch, never
    committed (embeddings, a script's intermediate pickles)."""
    env = os.environ.get("PBR_CACHE_DIR")
    return Path(env).expanduser() if env else REPO_ROOT / ".pbr-cache"


def in_repo(path: str | os.PathLike[str]) -> str:
    """``path`` as a committed result file should record it: relative to the checkout when it is
    inside it (``benchmarks/results``), so a result names no folder of the machine that wrote it;
    as given otherwise."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


def scratch_dir(name: str, script: str | os.PathLike[str]) -> Path:
    """``name``'s folder of intermediate results in :func:`cache_dir`, with a fingerprint of
    what wrote them in its name: the library and harness sources, ``script``'s, and the data
    sets' files (names, sizes and modification times). A script reads back only what the same
    code on the same data wrote; any change starts a new folder, so a changed default or grid is
    never served old rows (the old folders can be deleted at will)."""
    from .datasets import resolve_data_dir  # datasets imports this module

    digest = hashlib.sha256()
    sources = sorted(
        [*(REPO_ROOT / "pbr_core").rglob("*.py"), *(BENCHMARKS_DIR / "pbr_bench").rglob("*.py")]
    )
    for path in [*sources, Path(script).resolve()]:
        digest.update(in_repo(path).encode() + b"\0")
        digest.update(path.read_bytes())
    try:
        data = resolve_data_dir(None)
    except FileNotFoundError:  # no data set configured: what runs reads none
        data = None
    if data is not None:
        for path in sorted(p for p in data.rglob("*") if p.is_file()):
            stat = path.stat()
            rel = path.relative_to(data).as_posix()
            digest.update(f"{rel}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return cache_dir() / f"{name}-{digest.hexdigest()[:12]}"
