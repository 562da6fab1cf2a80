"""Plain vs the paper's fusion vs ``"safe"`` fusion, per LLM source and data set (issue #9).

Uses the library's defaults (the ramp chosen by ``benchmarks/safe_sweep.py`` on PersonaBench)
unchanged on every data set, and LLM answers from the generation cache only (a question whose
answers are not cached is left out and counted). Per cell: R@5, N@5, and per-question R@5 wins /
losses against the plain query with an exact sign test.

    python benchmarks/safe_report.py

Writes ``benchmarks/results/safe_report.{csv,json,png}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pbr_bench.report import write_rows
from pbr_bench.safe import FIELDS, MODES, OUT, benches, cells


def main() -> int:
    rows: list[dict[str, Any]] = []
    for ds, bench, llm, seed in benches():
        rows += cells(ds, bench, llm, seed)
    write_rows(rows, OUT / "safe_report", fields=FIELDS)
    for r in rows:
        print("  ".join(f"{k}={r.get(k, '')}" for k in FIELDS))
    plot(rows, OUT / "safe_report.png")
    return 0


def _seed_label(seed: int | str) -> str:
    return f" {seed}" if isinstance(seed, str) else f" s{seed}" if seed else ""


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = list(dict.fromkeys((r["dataset"], r["llm"], r["seed"]) for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    x = np.arange(len(groups))
    for i, fusion in enumerate(MODES):
        r5 = {(r["dataset"], r["llm"], r["seed"]): r["R@5"] for r in rows if r["fusion"] == fusion}
        vals = [r5.get(g, 0.0) for g in groups]
        ax.bar(x + (i - 1.5) * 0.2, vals, 0.2, label=fusion)
    ax.set_xticks(x, [f"{d}\n{llm}" + _seed_label(s) for d, llm, s in groups], fontsize=6)
    ax.set_ylabel("R@5")
    ax.set_title("plain vs paper fusion vs safe fusion, by LLM source")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
