"""The pre-generation gate (``PBRConfig.pre_gate``): skip both P-PRF LLM calls when the query's
cosine with the user's closest history item is at or above a threshold ("Pay for the LLM only
when it helps").

Per cell (data set, LLM source, questions) it runs, through :class:`pbr_core.Personalizer` and
the cached generations only (a question whose answers are not cached is dropped, as in
``safe_report.py``): the plain query and ``"safe"`` fusion calling the LLM on every question,
keeping per question the closest history cosine and R@5 / N@5. The gated pipeline's ranking is
the plain one where the gate fires and the always-call one elsewhere, so every threshold of the
grid is scored from these per-question data; the chosen threshold is then also *run* through the
gated pipeline and must reproduce the simulation exactly (``verified``).

The threshold is chosen on the tuning split :data:`TUNE_SPLIT` only (named before any other
cell was looked at): the lowest grid value at which every tuning cell keeps R@5 and N@5 within
:data:`TOLERANCE` of always-call. Every cell is then reported at that threshold: LLM calls per
question, R@5 / N@5 of always-call and gated safe fusion, per-question R@5 wins / losses of gated
against always-call and an exact sign test (``scipy.stats.binomtest``).

    python benchmarks/pre_gate.py

Writes ``benchmarks/results/pre_gate.{csv,json,png}`` (and ``pre_gate_sweep.{csv,json}``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_sweep import cached_bench, local_ids  # noqa: E402

from pbr_bench.compare import sign_test  # noqa: E402
from pbr_bench.datasets import load_named  # noqa: E402
from pbr_bench.metrics import best_over_combinations  # noqa: E402
from pbr_bench.report import write_rows  # noqa: E402
from pbr_bench.runner import Bench  # noqa: E402

OUT = ROOT / "benchmarks" / "results"
#: Named before any other cell was scored: LoCoMo turn level, the 30-question seed-0 subset
#: (the cell the history gate was designed on), and the first half (115) of PersonaBench 0.0's
#: scored questions (the data set the safe ramp was tuned on), with every cached LLM source.
TUNE_SPLIT = "tune = locomo-turn n30 seed 0 + personabench-0.0 questions 1-115"
PB_TUNE = 115
TOLERANCE = 0.005
GRID = [round(0.30 + 0.025 * i, 3) for i in range(27)] + [None]  # 0.30 … 0.95, off


@dataclass
class Cell:
    """One data set × LLM source × question set, with per-question results."""

    dataset: str
    llm: str
    split: str  # "tune", "test" or "all"
    ids: list[str]
    best: np.ndarray  # cos(q, closest history item)
    plain: np.ndarray  # (n, 2): R@5, N@5 of the plain query
    safe: np.ndarray  # (n, 2): R@5, N@5 of safe fusion calling the LLM on every question
    calls: np.ndarray  # LLM calls the always-call pipeline needs per question (0 or 2)
    bench: Bench

    def subset(self, split: str, keep: slice) -> Cell:
        return Cell(
            self.dataset,
            self.llm,
            split,
            self.ids[keep],
            self.best[keep],
            self.plain[keep],
            self.safe[keep],
            self.calls[keep],
            self.bench,
        )


def per_question(bench: Bench, fusion: str, pre_gate: float | None = None) -> dict[str, Any]:
    """R@5, N@5, closest history cosine and LLM calls per question of one fusion mode."""
    cfg = bench.config.with_(fusion=fusion, pre_gate=pre_gate)
    out: dict[str, Any] = {"metric": [], "best": [], "calls": []}
    for q in bench.queries:
        pq = bench.personalizer.personalize(
            q.user_id, q.text, config=cfg, feedback=bench._feedback(q)
        )
        ranking = bench._search(q.user_id, pq.vector)
        out["metric"].append(best_over_combinations(ranking, q.gold, 5))
        e = pq.explanation
        out["best"].append(e.related[0].score if e.related else -1.0)
        if bench.llm_name == "authors":  # given feedback: count the calls it stands for
            out["calls"].append(
                0
                if (pre_gate is not None and "pre-generation" in e.skipped.get("utterances", ""))
                or not e.related
                else 2
            )
        else:
            out["calls"].append(e.llm_calls + e.llm_cached)
    return {k: np.asarray(v) for k, v in out.items()}


def collect(bench: Bench, dataset: str, llm: str, split: str) -> Cell:
    plain = per_question(bench, "plain")
    safe = per_question(bench, "safe")
    return Cell(
        dataset,
        llm,
        split,
        [q.id for q in bench.queries],
        safe["best"],
        plain["metric"],
        safe["metric"],
        safe["calls"],
        bench,
    )


def gated(cell: Cell, t: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Simulated gated metrics and calls per question at threshold ``t``."""
    fire = np.zeros(len(cell.ids), bool) if t is None else cell.best >= t
    metric = np.where(fire[:, None], cell.plain, cell.safe)
    return metric, np.where(fire, 0, cell.calls)


def row(cell: Cell, t: float | None) -> dict[str, Any]:
    metric, calls = gated(cell, t)
    d = metric[:, 0] - cell.safe[:, 0]
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    dn = metric[:, 1] - cell.safe[:, 1]
    return {
        "dataset": cell.dataset,
        "llm": cell.llm,
        "split": cell.split,
        "questions": len(cell.ids),
        "pre_gate": t,
        "median_best_cos": round(float(np.median(cell.best)), 3),
        "calls_always": round(float(cell.calls.mean()), 3),
        "calls_gated": round(float(calls.mean()), 3),
        "R@5_plain": round(float(cell.plain[:, 0].mean()), 4),
        "R@5_always": round(float(cell.safe[:, 0].mean()), 4),
        "R@5_gated": round(float(metric[:, 0].mean()), 4),
        "N@5_always": round(float(cell.safe[:, 1].mean()), 4),
        "N@5_gated": round(float(metric[:, 1].mean()), 4),
        "dR@5": round(float(d.mean()), 4),
        "dN@5": round(float(dn.mean()), 4),
        "wins": wins,
        "losses": losses,
        "sign_p": float(f"{sign_test(wins, losses):.2g}"),
        "N@5_wins": int((dn > 0).sum()),
        "N@5_losses": int((dn < 0).sum()),
    }


def choose(tune: list[Cell]) -> float | None:
    """The lowest threshold at which every tuning cell stays within TOLERANCE on R@5 and N@5."""
    for t in GRID:
        rows = [row(c, t) for c in tune]
        if all(r["dR@5"] >= -TOLERANCE and r["dN@5"] >= -TOLERANCE for r in rows):
            return t
    return None


def verify(cell: Cell, t: float | None) -> bool:
    """Run the gated pipeline itself and compare with the simulation, question by question."""
    run = per_question(cell.bench, "safe", pre_gate=t)
    ids = {q.id: i for i, q in enumerate(cell.bench.queries)}
    idx = [ids[i] for i in cell.ids]
    metric, calls = gated(cell, t)
    return bool(
        np.array_equal(run["metric"][idx], metric) and np.array_equal(run["calls"][idx], calls)
    )


def cells() -> list[Cell]:
    ids = local_ids()
    out: list[Cell] = []
    ds = load_named("personabench-0.0")
    sources: list[tuple[str, Bench | None]] = [("authors", Bench(ds, llm_name="authors"))]
    sources += [(n, cached_bench(ds, n, m, limit=None)) for n, m in ids.items()]
    for llm, bench in sources:
        if bench is None:
            continue
        full = collect(bench, ds.name, llm, "all")
        out += [
            full,
            full.subset("tune", slice(0, PB_TUNE)),
            full.subset("test", slice(PB_TUNE, None)),
        ]
    ds = load_named("locomo-turn")
    for limit, seed, split in ((30, 0, "tune"), (200, 2, "test"), (200, 3, "test")):
        for llm, model_id in ids.items():
            bench = cached_bench(ds, llm, model_id, limit=limit, seed=seed)
            if bench is not None:
                out.append(collect(bench, f"{ds.name} n{limit} s{seed}", llm, split))
    return out


def main() -> int:
    all_cells = cells()
    tune = [c for c in all_cells if c.split == "tune"]
    t = choose(tune)
    print(f"{TUNE_SPLIT}: chosen pre_gate = {t}")
    sweep = [row(c, g) for c in all_cells for g in GRID]
    write_rows(sweep, OUT / "pre_gate_sweep")
    rows = []
    for c in all_cells:
        r = row(c, t)
        r["verified"] = verify(c, t) if c.split == "all" or "locomo" in c.dataset else ""
        rows.append(r)
    write_rows(
        rows,
        OUT / "pre_gate",
        payload={"tune_split": TUNE_SPLIT, "pre_gate": t, "tolerance": TOLERANCE, "rows": rows},
    )
    cols = [
        "dataset",
        "llm",
        "split",
        "questions",
        "calls_always",
        "calls_gated",
        "R@5_always",
        "R@5_gated",
        "N@5_always",
        "N@5_gated",
        "wins",
        "losses",
        "sign_p",
        "verified",
    ]
    print("  ".join(cols))
    for r in rows:
        print("  ".join(str(r[k]) for k in cols))
    plot(sweep, OUT / "pre_gate.png", t)
    return 0


def plot(sweep: list[dict[str, Any]], path: Path, chosen: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    groups = dict.fromkeys((r["dataset"], r["llm"]) for r in sweep if r["split"] != "tune")
    for ds, llm in groups:
        rs = [r for r in sweep if (r["dataset"], r["llm"]) == (ds, llm) and r["split"] != "tune"]
        rs = [r for r in rs if r["pre_gate"] is not None]
        x = [r["pre_gate"] for r in rs]
        a1.plot(x, [r["calls_gated"] for r in rs], label=f"{ds} {llm}")
        a2.plot(x, [r["dR@5"] for r in rs], label=f"{ds} {llm}")
    for a in (a1, a2):
        if chosen is not None:
            a.axvline(chosen, color="k", ls=":")
        a.set_xlabel("pre_gate (cos with closest history item)")
    a1.set_ylabel("LLM calls per question")
    a2.set_ylabel("R@5 gated − always-call")
    a2.axhline(-TOLERANCE, color="r", ls=":")
    a1.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
