"""Can a matched word pair be told from a filler's? The check behind #42's last named lead,
on the tuning split only, no LLM.

Why: ``benchmarks/lexical_pairs_weight.py`` let a matched pair raise the lexical weight. Its
choice (``γ = .25``, ``δ = 1``) gained on LoCoMo and, read on the test split, lost PrefEval at
300 fillers (N@5 0 / 11 against the shipped rule): some filler holds one of the question's
pairs. docs/hybrid.md named the next rule to try: give a pair say only where the item matches a
share of the question's pairs, or only for pairs rare in the user's items. Before building it
(a third look at the same tuning split), this script asks whether such a gate separates the
questions the choice won from those it lost: per question whose N@5 the choice moved against
the shipped rule, the item with the best pairs score (the one whose match raised the weight),
the share of the question's distinct pairs it holds, and the document frequency, in the user's
items, of the rarest pair it matches. For each gate (share ≥ s; rarest pair in at most ``d``
items) it counts the won and lost questions the gate would keep.

Tuning split (:func:`pbr_bench.splits.is_tuning_question`) only: the test split is not read.
Deterministic (cached MiniLM vectors, no randomness). ``python benchmarks/pairs_share.py``
prints the tables and writes ``benchmarks/results/hybrid/pairs_share.{csv,json,png}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.lead import metrics_of, per_history
from pbr_bench.one_set import CUT, built_with_main
from pbr_bench.paths import RESULTS_DIR, in_repo
from pbr_bench.report import write_csv
from pbr_bench.splits import is_tuning_question
from pbr_bench.word_pairs import legs, pairs
from pbr_core.hybrid import LEXICAL_SCALE, fuse, lexical_query, rank
from pbr_core.snapshot import UserHistory, top_k

#: ``lexical_pairs_weight.py``'s choice: lexical = words + γ · pairs, weight + 1.5 · δ · c_p.
GAMMA, DELTA = 0.25, 1.0
DATA_SETS = (
    "locomo-turn-all",
    "locomo-session-all",
    "prefeval-explicit-n10",
    "prefeval-explicit-n50",
    "prefeval-explicit-n100",
    "prefeval-explicit-n300",
)
SHARES = (0.0, 0.25, 1 / 3, 0.5, 1.0)
RAREST = (1, 2, 5)


def _item_pairs(history: UserHistory) -> list[set[str]]:
    return [set(pairs(item.text).split()) for item in history.items]


item_pairs = per_history(_item_pairs)


def moved(name: str) -> list[dict[str, Any]]:
    """The tuning questions of ``name`` whose N@5 the choice moved, with the best pair item's
    share and rarest-pair document frequency."""
    built, _ = built_with_main(name)
    out = []
    for q in built.queries:
        if not is_tuning_question(name, q.user_id, q.id):
            continue
        hist = built.windowed.get(q.user_id)
        ids = [it.id for it in hist.items]
        vector, own = built.qvec[q.id], lexical_query(q.text)
        x = legs(q, hist, own, vector)
        shipped = metrics_of(ids, [r.position for r in rank(hist, vector, own, CUT)], q.gold)
        lexical = x.words + GAMMA * x.paired
        weight = x.weight + LEXICAL_SCALE * DELTA * x.pair_coverage
        chosen = metrics_of(ids, top_k(fuse(x.dense, lexical, weight), CUT).tolist(), q.gold)
        if chosen[1] == shipped[1]:
            continue
        best = int(np.argmax(x.paired))
        asked = set(lexical_query(pairs(q.text)))
        held = item_pairs(hist)
        matched = asked & held[best]
        out.append(
            {
                "data set": name,
                "question": q.id,
                "outcome": "won" if chosen[1] > shipped[1] else "lost",
                "question pairs": len(asked),
                "share": len(matched) / len(asked),
                "rarest df": min(sum(p in h for h in held) for p in matched),
                "pair coverage": round(x.pair_coverage, 4),
            }
        )
    return out


def gates(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per gate, the won and lost questions (LoCoMo; PrefEval) it would keep."""
    out = []
    for kind, values in (("share ≥", SHARES), ("rarest df ≤", RAREST)):
        for v in values:
            if kind == "share ≥":
                keep = [r for r in rows if r["share"] >= v - 1e-9]
            else:
                keep = [r for r in rows if r["rarest df"] <= v]
            count = {
                (fam, outcome): sum(
                    r["outcome"] == outcome and r["data set"].startswith(fam) for r in keep
                )
                for fam in ("locomo", "prefeval")
                for outcome in ("won", "lost")
            }
            out.append(
                {
                    "gate": f"{kind} {v:.2g}",
                    "LoCoMo won": count["locomo", "won"],
                    "LoCoMo lost": count["locomo", "lost"],
                    "PrefEval won": count["prefeval", "won"],
                    "PrefEval lost": count["prefeval", "lost"],
                }
            )
    return out


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles: dict[tuple[str, str], dict[str, Any]] = {
        ("locomo", "won"): dict(marker="o", color="tab:blue"),
        ("locomo", "lost"): dict(marker="x", color="tab:blue"),
        ("prefeval", "won"): dict(marker="o", color="tab:red"),
        ("prefeval", "lost"): dict(marker="x", color="tab:red"),
    }
    rng = np.random.default_rng(0)  # jitter only, so equal points stay visible
    for (fam, outcome), style in styles.items():
        sel = [r for r in rows if r["data set"].startswith(fam) and r["outcome"] == outcome]
        if not sel:
            continue
        xs = np.array([r["share"] for r in sel]) + rng.uniform(-0.01, 0.01, len(sel))
        ys = np.array([r["rarest df"] for r in sel]) + rng.uniform(-0.1, 0.1, len(sel))
        ax.scatter(xs, ys, label=f"{fam} {outcome} ({len(sel)})", s=24, **style)
    ax.set_xlabel("share of the question's pairs held by the best pair item")
    ax.set_ylabel("its rarest matched pair: items holding it")
    ax.set_yscale("symlog")
    ax.set_title("pairs as weight (γ .25, δ 1) vs the shipped rule, N@5 moved (tuning split)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    rows = [r for name in DATA_SETS for r in moved(name)]
    table = gates(rows)
    print("== tuning split, N@5 moved by the pairs-as-weight choice: what each gate keeps ==")
    print(f"{'gate':16}{'LoCoMo won':>12}{'lost':>6}{'PrefEval won':>14}{'lost':>6}")
    for g in table:
        print(
            f"{g['gate']:16}{g['LoCoMo won']:12d}{g['LoCoMo lost']:6d}"
            f"{g['PrefEval won']:14d}{g['PrefEval lost']:6d}"
        )
    print("\n== the moved questions ==")
    for r in rows:
        print(
            f"{r['data set']:24}{r['outcome']:>6}  pairs {r['question pairs']:2d}"
            f"  share {r['share']:.2f}  rarest df {r['rarest df']:3d}"
        )
    out = RESULTS_DIR / "hybrid" / "pairs_share"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(out.with_suffix(".csv"), rows)
    data = {"gamma": GAMMA, "delta": DELTA, "split": "tune", "gates": table, "questions": rows}
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(rows, out.with_suffix(".png"))
    print(f"\nwrote {in_repo(out.with_suffix('.json'))}")


if __name__ == "__main__":
    main()
