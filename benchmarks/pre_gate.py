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

The threshold is chosen on the tuning split :data:`TUNE_SPLIT` only: the first half (115) of
PersonaBench 0.0's questions with every cached LLM source (the tuning half since the first
choice) and 200 new LoCoMo turn-level questions (seed 4) with the embedded Gemma, generated for
this purpose and named before any of their results were seen (the first choice, 0.60, had a
30-question LoCoMo cell, too coarse for the tolerance: one question moved R@5 by .033). The rule
is unchanged: the lowest grid value, i.e. the fewest LLM calls, at which every tuning cell keeps
R@5 and N@5 within :data:`TOLERANCE` of always-call. The LoCoMo tuning cell must be complete (all
200 questions' answers cached), else the script stops.

That rule picked 0.38, which fails PersonaBench's held-out half; the default is instead
:data:`CHOSEN` (why: see there), fixed before :data:`HELD_OUT` was generated. Every cell is
reported at the default: PersonaBench's held-out half (``test``) and whole (``all``), the older
LoCoMo cells (``other``: in view when 0.60 was chosen) and the held-out cell, with LLM calls per
question, R@5 / N@5 of always-call and gated safe fusion, per-question R@5 wins / losses of gated
against always-call and an exact sign test (``scipy.stats.binomtest``).

    python -m pbr_bench run --dataset locomo --level turn --llm local --limit 200 --seed 4 \
        --methods plain,bm25,pbr,pbr-safe,pbr-no-anchor,pbr-no-prf   # the tuning cell's answers
    python -m pbr_bench run ... --seed 5 ...                         # the held-out cell's
    python benchmarks/pre_gate.py

Writes ``benchmarks/results/pre_gate.{csv,json,png}`` (and ``pre_gate_sweep.{csv,json}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.cached import cached_questions, local_ids
from pbr_bench.compare import sign_summary
from pbr_bench.datasets import load_named
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_bench.runner import Bench

OUT = RESULTS_DIR
#: Named before the LoCoMo cell's generations existed: PersonaBench 0.0 questions 1-115 (every
#: cached LLM source) and LoCoMo turn level, 200 new seeded questions (seed 4; seeds 0-3 were
#: all seen when 0.60 was chosen), with the embedded Gemma 3 270M.
TUNE_SPLIT = "tune = personabench-0.0 questions 1-115 + locomo-turn n200 seed 4 (gemma-270m)"
PB_TUNE = 115
TUNE = ("locomo-turn", 200, 4, "gemma-270m")  # data set, questions, seed, LLM source
#: The other LoCoMo turn-level cells, (questions, seed), each with both local LLMs.
LOCOMO_OTHER = ((30, 0), (200, 2), (200, 3))
#: The rule on the tuning split picked 0.38, the edge of PersonaBench's tuning half: on its
#: held-out half the authors' feedback then loses 8 questions to none (p .008, R@5 -.027) and
#: PersonaBench gets 1.6 LLM calls per question (the issue asks >= 1.8), so it is not adopted.
#: Over the sweep of every cell (all seen by then), every goal holds for thresholds 0.49-0.56
#: (PersonaBench within .005 of always-call from 0.49, LoCoMo <= 0.5 calls up to 0.56); the
#: default is that band's middle, rounded down to the grid, fixed before the held-out cell below
#: was generated.
CHOSEN = 0.52
#: Generated after CHOSEN was fixed (embedded Gemma, 200 new LoCoMo turn-level questions):
#: the one cell no parameter of the gate has seen.
HELD_OUT = ("locomo-turn", 200, 5, "gemma-270m")
TOLERANCE = 0.005
GRID = [round(0.30 + 0.01 * i, 2) for i in range(66)] + [None]  # 0.30 … 0.95, off


@dataclass
class Cell:
    """One data set × LLM source × question set, with per-question results."""

    dataset: str
    llm: str
    split: str  # "tune", "test", "all", "other" or "held-out"
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
    wins, losses, mean_delta, p = sign_summary(d)
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
        "dR@5": round(mean_delta, 4),
        "dN@5": round(float(dn.mean()), 4),
        "wins": wins,
        "losses": losses,
        "sign_p": float(f"{p:.2g}"),
        "N@5_wins": int((dn > 0).sum()),
        "N@5_losses": int((dn < 0).sum()),
    }


def choose(tune: list[Cell]) -> float | None:
    """The lowest threshold (the fewest calls) at which every tuning cell stays within TOLERANCE
    of always-call on R@5 and N@5 (``None``, off, always does)."""
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
    name, limit, seed, llm = TUNE
    ds = load_named(name)
    bench, total = cached_questions(ds, llm, ids[llm], limit=limit, seed=seed)
    if bench is None or len(bench.queries) < total:
        raise SystemExit(
            f"the tuning cell {TUNE_SPLIT!r} is incomplete; generate it first: python -m pbr_bench "
            f"run --dataset locomo --level turn --llm local --limit {limit} --seed {seed} "
            "--methods plain,bm25,pbr,pbr-safe,pbr-no-anchor,pbr-no-prf"
        )
    out.append(collect(bench, f"{ds.name} n{limit} s{seed}", llm, "tune"))
    pb = load_named("personabench-0.0")
    sources: list[tuple[str, Bench | None]] = [("authors", Bench(pb, llm_name="authors"))]
    sources += [(n, cached_questions(pb, n, m, limit=None)[0]) for n, m in ids.items()]
    for llm, bench in sources:
        if bench is not None:
            full = collect(bench, pb.name, llm, "all")
            out += [
                full,
                full.subset("tune", slice(0, PB_TUNE)),
                # step 2's held-out half; seen by the time CHOSEN was fixed (docs say so)
                full.subset("test", slice(PB_TUNE, None)),
            ]
    for limit, seed in LOCOMO_OTHER:
        for llm, model_id in ids.items():
            bench = cached_questions(ds, llm, model_id, limit=limit, seed=seed)[0]
            if bench is not None:
                out.append(collect(bench, f"{ds.name} n{limit} s{seed}", llm, "other"))
    _, limit, seed, llm = HELD_OUT
    bench, total = cached_questions(ds, llm, ids[llm], limit=limit, seed=seed)
    if bench is not None and len(bench.queries) == total:
        out.append(collect(bench, f"{ds.name} n{limit} s{seed}", llm, "held-out"))
    else:
        print(f"the held-out cell {HELD_OUT} is not generated yet: reported without it")
    return out


def main() -> int:
    all_cells = cells()
    tune = [c for c in all_cells if c.split == "tune"]
    picked = choose(tune)
    print(f"{TUNE_SPLIT}: the tuning rule picks pre_gate = {picked} (tolerance {TOLERANCE})")
    t = CHOSEN
    print(f"reported at the default pre_gate = {t} (see CHOSEN)")
    sweep = [row(c, g) for c in all_cells for g in GRID]
    write_rows(sweep, OUT / "pre_gate_sweep")
    rows = []
    for c in all_cells:
        r = row(c, t)
        r["verified"] = verify(c, t) if c.split == "all" or "locomo" in c.dataset else ""
        rows.append(r)
    payload = {
        "tune_split": TUNE_SPLIT,
        "tuning_rule_pick": picked,
        "pre_gate": t,
        "tolerance": TOLERANCE,
        "rows": rows,
    }
    write_rows(rows, OUT / "pre_gate", payload=payload)
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
    # The goals (#25): <= 0.5 calls on LoCoMo turn, >= 1.8 on PersonaBench 0.0.
    for r in rows:
        calls = r["calls_gated"]
        if "locomo" in r["dataset"]:
            print(f"goal {r['dataset']} {r['llm']}: calls {calls} <= 0.5: {calls <= 0.5}")
        elif r["split"] == "all":
            print(f"goal {r['dataset']} {r['llm']}: calls {calls} >= 1.8: {calls >= 1.8}")
    plot(sweep, OUT / "pre_gate.png", t)
    return 0


def plot(sweep: list[dict[str, Any]], path: Path, chosen: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    groups = dict.fromkeys((r["dataset"], r["llm"], r["split"]) for r in sweep)
    for ds, llm, split in groups:
        rs = [r for r in sweep if (r["dataset"], r["llm"], r["split"]) == (ds, llm, split)]
        rs = [r for r in rs if r["pre_gate"] is not None]
        x = [r["pre_gate"] for r in rs]
        style = {"lw": 2.5, "color": "k"} if split == "tune" else {"lw": 1}
        label = f"{ds} {llm}" + (" (tune)" if split == "tune" else "")
        a1.plot(x, [r["calls_gated"] for r in rs], label=label, **style)
        a2.plot(x, [r["dR@5"] for r in rs], label=label, **style)
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
