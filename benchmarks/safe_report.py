"""Plain vs the paper's fusion vs ``"safe"`` fusion, per LLM source and data set (issue #9).

Uses the library's defaults (the ramp chosen by ``benchmarks/safe_sweep.py`` on PersonaBench)
unchanged on every data set, and LLM answers from the generation cache only (a question whose
answers are not cached is left out and counted). Per cell: R@5, N@5, and per-question R@5 wins /
losses against the plain query with an exact sign test.

    python benchmarks/safe_report.py

Writes ``benchmarks/results/safe_report.{csv,json,png}``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pbr_bench.cached import cached_bench, local_ids  # noqa: E402
from pbr_bench.compare import paired  # noqa: E402
from pbr_bench.datasets import Dataset, load_named, load_personabench  # noqa: E402
from pbr_bench.report import write_rows  # noqa: E402
from pbr_bench.runner import Bench, MethodRun  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
#: label -> (bench method, config changes): safe with and without its history gate.
MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("plain", {}),
    "paper": ("pbr", {}),
    "safe, no gate": ("pbr-safe", {"safe_history_gate": False}),
    "safe": ("pbr-safe", {}),
}
LOCOMO_LIMIT = 30
#: Held-out cells generated after the history gate was designed: (dataset, limit, seed).
HELD_OUT = [
    ("locomo-turn", 30, 1),
    ("locomo-turn", 200, 2),  # generated after the ramp was chosen on all of PersonaBench 0.0
    ("locomo-turn", 200, 3),  # generated after rank-level fusion was tried (safe_variants.py)
    ("prefeval-explicit-n10", 30, 0),
    ("prefeval-explicit-n50", 30, 0),
]

#: Data sets also scored on every question an LLM has answered (the union of the seeded subsets
#: above, each question once): LoCoMo's verdict, as no single subset is large enough alone.
POOLED = ["locomo-turn"]
ALL_ANSWERED = "all"

#: The columns of the result table (the plain row has no wins / losses).
FIELDS = ["dataset", "llm", "fusion", "questions", "seed", "R@5", "N@5", "wins", "losses", "sign_p"]


def benches() -> Iterator[tuple[Dataset, Bench, str, int | str]]:
    """Every cell this report scores, as ``(data set, bench, LLM label, seed)``.

    PersonaBench 0.0 / 0.7 with the authors' and each local LLM's cached generations, LoCoMo turn
    level, then ``HELD_OUT``, then ``POOLED`` (seed ``"all"``); a cell whose generations are not
    cached is skipped.
    """
    ids = local_ids()
    for noise in ("0.0", "0.7"):
        ds = load_personabench(noise)
        yield ds, Bench(ds, llm_name="authors"), "authors (gpt-4o-mini)", 0
        for name, model_id in ids.items():
            # Every scored question: both local LLMs have answered all of PersonaBench 0.0 and
            # 0.7 (cached_bench counts and drops any question whose answers are not cached).
            bench = cached_bench(ds, name, model_id, limit=None)
            if bench is None:
                continue
            yield ds, bench, name, 0
    for name, limit, seed in [("locomo-turn", LOCOMO_LIMIT, 0), *HELD_OUT]:
        ds = load_named(name)
        for llm, model_id in ids.items():
            bench = cached_bench(ds, llm, model_id, limit=limit, seed=seed)
            if bench is not None:
                yield ds, bench, llm, seed
    for name in POOLED:
        ds = load_named(name)
        for llm, model_id in ids.items():
            bench = cached_bench(ds, llm, model_id, limit=None)
            if bench is not None:
                yield ds, bench, llm, ALL_ANSWERED


def score(
    ds: Dataset,
    bench: Bench,
    llm: str,
    seed: int | str,
    fusion: str,
    run: MethodRun,
    plain: MethodRun,
) -> dict[str, Any]:
    """One table row: ``run``'s Overall R@5 / N@5, and its R@5 wins / losses against ``plain``."""
    o = run.metrics["Overall"]
    row: dict[str, Any] = {
        "dataset": ds.name,
        "llm": llm,
        "fusion": fusion,
        "questions": len(bench.queries),
        "seed": seed,
        "R@5": round(o["R@5"], 4),
        "N@5": round(o["N@5"], 4),
    }
    if run is not plain:
        pair = paired(ds, plain.rankings, run.rankings, fusion, k=5)
        row.update(wins=pair.wins, losses=pair.losses, sign_p=float(f"{pair.p_value:.2g}"))
    return row


def cells(ds: Dataset, bench: Bench, llm: str, seed: int | str = 0) -> list[dict[str, Any]]:
    runs = {
        label: bench.run(method, config=bench.config.with_(**changes), progress=False)
        for label, (method, changes) in MODES.items()
    }
    return [score(ds, bench, llm, seed, label, run, runs["plain"]) for label, run in runs.items()]


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
