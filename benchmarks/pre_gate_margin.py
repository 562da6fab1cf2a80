"""A second pre-generation signal: does the user's closest item *stand out*? (issue #24).

SmolLM2's feedback is significantly below the no-LLM hybrid on PrefEval N = 50 (docs/hybrid.md):
the preference message answering the question shares few words with it and is not very close
in absolute terms (cosine below ``pre_gate``), so the pre-gate lets the LLM in, and 135M-parameter
feedback moves the query away from it. What such a query has, before any LLM call, is an item
that stands out from the rest of the user's history, which in query-performance-prediction terms
is a *clear* query. This script measures two such signals over the user's item vectors (the
scores ``related`` history already computes):

- ``z``: the closest item's z-score, ``(top1 - mean) / std`` over all of the user's items;
- ``gap``: ``top1 - top2``, the closest item's lead over the second.

A candidate gate skips the LLM (plain query, as the pre-gate does) when the signal is at or above
its threshold, on top of the default pipeline. Rows come only from the committed generation
caches (``hybrid_llm.py`` scores the same questions).

Protocol, fixed before any number of this script was read:
- tuning split: ``pbr_bench.splits.is_tuning_question`` (the adaptive-fusion study's split);
- choice rule: the candidate (or "none", today's default) with the highest mean, over the
  (data set, LLM) cells of the tuning split, of the mean ΔR@5 against the no-LLM hybrid; ties by
  fewer LLM calls. The test split is then reported for every candidate, and nothing is picked
  from it.

    python benchmarks/pre_gate_margin.py    # minutes; writes results/hybrid/pre_gate_margin.*

Outcome (docs/hybrid.md, "A second pre-generation signal"): the rule picked ``z >= 2.0``, which
holds for nearly every question (i.e. "never call the LLM") and loses PersonaBench's gains; not
shipped. The rule should have required PersonaBench's calls (issue #25: >= 1.8 per question).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, cast

import numpy as np

from pbr_bench.cached import answered_by_each_llm
from pbr_bench.compare import sign_summary
from pbr_bench.histories import DATASETS, build, encoders, item_ids
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import bar_png
from pbr_bench.splits import is_tuning_question
from pbr_core import PBRConfig
from pbr_core.hybrid import lexical_query, lexical_terms, rank

OUT = RESULTS_DIR / "hybrid"
K, CUT = 10, 5  # rank the top 10, score R@5 (as hybrid_llm.py)
GRIDS: dict[str, list[float]] = {
    "z": [2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0],
    "gap": [0.02, 0.04, 0.06, 0.08, 0.10, 0.15],
}


def signals(scores: np.ndarray) -> dict[str, float]:
    """The candidate signals from the query's cosine with each of the user's items."""
    if scores.size < 2:
        return {"z": 0.0, "gap": 0.0}
    ordered = np.sort(scores)[::-1]
    std = float(scores.std())
    return {
        "z": float((ordered[0] - scores.mean()) / std) if std > 0 else 0.0,
        "gap": float(ordered[0] - ordered[1]),
    }


def collect() -> list[dict[str, Any]]:
    """One row per (data set, LLM, cached question): signals, calls, R@5 of both pipelines."""
    counter, emb_cache, window = encoders()
    config = PBRConfig()
    rows: list[dict[str, Any]] = []
    for name in DATASETS:
        built = build(name, emb_cache, counter, window)
        for llm, personalizer, answered in answered_by_each_llm(built, emb_cache):
            for q in answered:
                hw = built.windowed.get(q.user_id)
                v, terms = built.qvec[q.id], lexical_query(q.text)
                pq = personalizer.personalize(q.user_id, q.text)
                gated = lexical_terms(pq.explanation, config.lexical_feedback_weight)
                base = best_over_combinations(item_ids(hw, rank(hw, v, terms, K)), q.gold, CUT)
                ours = best_over_combinations(
                    item_ids(hw, rank(hw, pq.vector, gated, K, own_terms=terms)), q.gold, CUT
                )
                calls = pq.explanation.llm_calls + pq.explanation.llm_cached
                rows.append(
                    {
                        "dataset": name,
                        "llm": llm,
                        "question": q.id,
                        "tuning": is_tuning_question(name, q.user_id, q.id),
                        "calls": calls,
                        "base": base[0],
                        "pbr": ours[0],
                        **signals(hw.vectors @ np.asarray(v, dtype=np.float32)),
                    }
                )
            print(f"{name} {llm}: {sum(r['dataset'] == name and r['llm'] == llm for r in rows)}")
    return rows


def evaluate(rows: list[dict[str, Any]], signal: str | None, t: float) -> list[dict[str, Any]]:
    """Per (data set, LLM) cell: the gated pipeline against the no-LLM hybrid."""
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["dataset"], r["llm"]), []).append(r)
    out = []
    for (name, llm), group in cells.items():
        skip = np.array([signal is not None and r[signal] >= t for r in group])
        pbr = np.array([r["pbr"] for r in group])
        base = np.array([r["base"] for r in group])
        gated = np.where(skip, base, pbr)
        wins, losses, mean_delta, p = sign_summary(gated - base)
        out.append(
            {
                "dataset": name,
                "llm": llm,
                "signal": signal or "none",
                "threshold": t,
                "n": len(group),
                "R@5": float(gated.mean()),
                "hybrid R@5": float(base.mean()),
                "wins": wins,
                "losses": losses,
                "mean_delta": mean_delta,
                "p_sign": p,
                "calls_per_q": float(np.where(skip, 0, [r["calls"] for r in group]).mean()),
            }
        )
    return out


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """LLM calls per question of each signal and threshold, per split."""
    groups: dict[str, dict[str, float]] = {}
    for r in summary:
        bar = f"{r['signal']} ≥ {r['threshold']:g}"
        groups.setdefault(str(r["split"]), {})[bar] = r["calls_per_q"]
    bar_png(path, groups, title="pre_gate_margin: LLM calls per question", ylabel="calls")


def main() -> None:
    rows = collect()
    candidates: list[tuple[str | None, float]] = [(None, 0.0)] + [
        (s, t) for s, grid in GRIDS.items() for t in grid
    ]
    table: list[dict[str, Any]] = []
    summary = []
    for split in ("tune", "test"):
        part = [r for r in rows if r["tuning"] == (split == "tune")]
        for signal, t in candidates:
            cells = evaluate(part, signal, t)
            for c in cells:
                c["split"] = split
            table.extend(cells)
            summary.append(
                {
                    "split": split,
                    "signal": signal or "none",
                    "threshold": t,
                    "mean_delta_over_cells": float(np.mean([c["mean_delta"] for c in cells])),
                    "calls_per_q": float(np.mean([c["calls_per_q"] for c in cells])),
                    "significantly_worse": [
                        f"{c['dataset']}/{c['llm']}"
                        for c in cells
                        if c["mean_delta"] < 0 and c["p_sign"] < 0.05
                    ],
                }
            )
    tune = [s for s in summary if s["split"] == "tune"]
    chosen = max(
        tune,
        key=lambda s: (
            round(cast(float, s["mean_delta_over_cells"]), 12),
            -cast(float, s["calls_per_q"]),
        ),
    )
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "pre_gate_margin.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    (OUT / "pre_gate_margin.json").write_text(
        json.dumps({"summary": summary, "chosen_on_tuning_split": chosen}, indent=1)
    )
    plot(summary, OUT / "pre_gate_margin.png")
    for s in summary:
        print(
            f"{s['split']:5s} {s['signal']:5s} {s['threshold']:5.2f} "
            f"mean Δ {s['mean_delta_over_cells']:+.4f} calls/q {s['calls_per_q']:.2f} "
            f"worse {s['significantly_worse']}"
        )
    print("chosen on the tuning split:", chosen)


if __name__ == "__main__":
    main()
