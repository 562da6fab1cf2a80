"""``python -m pbr_bench reproduce``: rerun every committed harness cell and compare.

A *cell* is one committed ``summary__<llm>[-n<limit>].csv`` under ``benchmarks/results/<data
set>[/n<limit>-seed<seed>]``: the folder and file name say which ``run`` wrote it, its rows say
which methods. Each cell is rerun from the committed embedding and generation caches
(``--cached-only``: a local LLM is never called, a missing answer fails the cell) into a scratch
folder, and its metrics are compared with the committed ones at the CSV's four decimals.

    python -m pbr_bench reproduce                    # all cells (~minutes each), report only
    python -m pbr_bench reproduce --cell locomo-turn # cells whose path contains the string
    python -m pbr_bench reproduce --write            # rerun into benchmarks/results itself
                                                     # (and its paired_vs_plain files)

A run over every cell writes its report to ``benchmarks/results/reproduce.{csv,json}``.
"""

from __future__ import annotations

import argparse
import csv
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .paths import RESULTS_DIR
from .report import write_rows
from .runs import main

RESULTS = RESULTS_DIR
METRICS = ("R@1", "R@5", "N@5", "R@10", "N@10", "MRR")
_LLMS = {"none", "authors", "local", "smollm2"}
TOLERANCE = 5e-5  # the CSVs hold four decimals


@dataclass(frozen=True)
class Cell:
    """One committed harness run: where its summary is and the ``run`` arguments that wrote it."""

    name: str  # the summary's path under the results folder
    summary: Path
    argv: tuple[str, ...]
    methods: tuple[str, ...]


def dataset_argv(folder: str) -> list[str]:
    """``personabench-0.7`` → ``--dataset personabench --noise 0.7`` (and so on)."""
    if m := re.fullmatch(r"personabench-(\d\.\d)", folder):
        return ["--dataset", "personabench", "--noise", m[1]]
    if m := re.fullmatch(r"locomo-(turn|session)", folder):
        return ["--dataset", "locomo", "--level", m[1]]
    if m := re.fullmatch(r"prefeval-explicit-n(\d+)", folder):
        return ["--dataset", "prefeval", "--n-filler", m[1]]
    raise ValueError(f"{folder!r} is not a data set folder of the harness")


def read_summary(path: Path) -> dict[str, dict[str, float]]:
    """``{"<method>__<llm>": {metric: value}}`` from a summary CSV."""
    with path.open() as f:
        return {
            f"{r['method']}__{r['llm']}": {m: float(r[m]) for m in METRICS}
            for r in csv.DictReader(f)
        }


def cells(root: Path = RESULTS) -> list[Cell]:
    """Every committed summary of a ``run``, with the arguments that reproduce it."""
    found = []
    for summary in sorted(root.glob("*/summary__*.csv")) + sorted(root.glob("*/*/summary__*.csv")):
        rel = summary.relative_to(root).parts
        argv = ["run", *dataset_argv(rel[0])]
        tag = summary.stem[len("summary__") :]
        llm, _, limit = tag.partition("-n")
        if llm not in _LLMS:
            raise ValueError(f"{summary}: unknown LLM tag {llm!r}")
        argv += ["--llm", llm]
        if len(rel) == 3:
            m = re.fullmatch(r"n(\d+)-seed(\d+)", rel[1])
            if m is None or m[1] != limit:
                raise ValueError(f"{summary}: subset folder and file name disagree")
            argv += ["--limit", m[1], "--seed", m[2]]
        methods = tuple(dict.fromkeys(k.split("__")[0] for k in read_summary(summary)))
        found.append(Cell("/".join(rel), summary, tuple(argv), methods))
    return found


def row_deltas(
    old: dict[str, dict[str, float]], new: dict[str, dict[str, float]]
) -> dict[str, float]:
    """Per row of ``old``, its largest metric difference from ``new`` (inf for a missing row)."""
    return {
        k: max(abs(old[k][m] - new[k][m]) for m in METRICS) if k in new else float("inf")
        for k in old
    }


def reproduce(cell: Cell, out: Path, *, paired: bool = False) -> dict[str, object]:
    """Rerun ``cell`` into ``out`` and compare its summary with the committed one."""
    committed = read_summary(cell.summary)
    argv = [*cell.argv, "--methods", ",".join(cell.methods), "--cached-only", "--out", str(out)]
    code = main(argv)
    row: dict[str, object] = {"cell": cell.name, "methods": len(cell.methods), "exit": code}
    if code != 0:
        return {**row, "max_delta": "", "worst": "", "reproduces": False}
    new = read_summary(out / cell.name)
    deltas = row_deltas(committed, new)
    worst = max(deltas, key=deltas.__getitem__)
    delta = max(deltas.values()) if committed.keys() == new.keys() else float("inf")
    if paired and (cell.summary.parent / "paired_vs_plain__none.csv").exists():
        main(["compare", *cell.argv[1:], "--out", str(out)])
    return {
        **row,
        "max_delta": round(delta, 4),
        "worst": worst,
        "reproduces": delta <= TOLERANCE,
    }


def cmd_reproduce(args: argparse.Namespace) -> int:
    chosen = [c for c in cells() if args.cell is None or args.cell in c.name]
    if not chosen:
        raise SystemExit(f"no committed cell matches {args.cell!r}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pbr-reproduce-") as scratch:
        out = RESULTS if args.write else Path(scratch)
        for cell in chosen:
            print(f"== {cell.name}: python -m pbr_bench {' '.join(cell.argv)}", flush=True)
            rows.append(reproduce(cell, out, paired=args.write))
            print(rows[-1], flush=True)
    if args.cell is None:  # the committed report is of every cell, never of a subset
        write_rows(rows, RESULTS / "reproduce")
    failed = [r["cell"] for r in rows if not r["reproduces"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} cells reproduce their committed summary")
    for name in failed:
        print(f"  differs: {name}")
    return 1 if failed and not args.write else 0
