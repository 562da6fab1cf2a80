"""How well one threshold on the hybrid score tells a good top result from a bad one (issue #42).

What it measures: for every scored question of the six hybrid data sets (PersonaBench 0.0 and 0.7,
LoCoMo turn and session level, PrefEval explicit with 10 and 50 fillers), the library's default
search (``rank(mode="hybrid")`` on the windowed snapshot, the plain query) and the score of its
top result under each candidate definition below:

    min-max (old)        the fused rule's own score, scaled per query (what was returned before)
    cosine               the top result's cosine (0 if negative)
    relevance (mean)     [cos⁺ + w · coverage] / (1 + w), coverage = min(1, bm25 / ceiling)
    relevance (noisy-or) 1 − (1 − cos⁺)(1 − w · coverage)

(``w``: the rule's lexical weight, :func:`pbr_core.hybrid.lexical_weight`). The ranking is the
same for every row (the fused rule's); only the number returned differs.

Two separations, each as an AUC (the chance that a random positive scores above a random
negative; 0.5 = no separation):

- **gold**: questions whose top result is a gold item against those whose top result is not;
- **other user**: each question asked against its own user's history against the same question
  asked against the next user's (users sorted; a history that cannot hold the answer).

And one threshold for all data sets, per separation: the ``τ`` of best balanced accuracy over the
tuning split's questions pooled, applied unchanged to each data set and split.

Protocol, fixed before any number was read: the tuning split (:mod:`pbr_bench.splits`, the users
with ``sha1(user_id) % 3 == 0``; no PersonaBench user) chooses the definition the library
returns: the highest mean gold AUC over the data sets with tuning questions, the brief's
``relevance (mean)`` on a tie. The test split and all questions are reported.

What happened (``docs/hybrid.md``, "Scores"): with LoCoMo alone read, the rule picked
``min-max (old)`` (on LoCoMo the per-query score is below 1 when the two legs disagree about the
top item, which says something about whether it is gold), and a first version of the library
returned ``relevance (mean)``. With every data set in, the rule picks ``relevance (noisy-or)``
(tuning mean AUC gold .697, mean .685, min-max .631), which is what the library returns.
``relevance × min-max (post hoc)`` was added after reading the tuning split and LoCoMo turn's
test split, as a diagnostic on the data sets read after it.

Run (from the repository root)::

    python benchmarks/hybrid_scores.py               # measure every data set, then report
    python benchmarks/hybrid_scores.py --report      # report the data sets measured so far

Each data set's per-question rows are kept in the scratch cache (``hybrid_scores/``), so a run
that is stopped resumes where it was. Writes ``benchmarks/results/hybrid/scores.{csv,json}``.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata

from pbr_bench.histories import DATASETS, Built, build, encoders
from pbr_bench.paths import RESULTS_DIR, scratch_dir
from pbr_bench.report import bar_png
from pbr_bench.splits import is_tuning_user
from pbr_core.hybrid import fuse, lexical_query, lexical_weight, rank, with_context
from pbr_core.snapshot import UserHistory

OUT = RESULTS_DIR / "hybrid"
SPLITS = ("tune", "test", "all")
#: the brief's proposal, the tie-break of the rule
BRIEF_VARIANT = "relevance (mean)"
#: what the library returns (pbr_core.hybrid.relevance): the rule's choice
DEFAULT_VARIANT = "relevance (noisy-or)"
#: Added after the tuning split and LoCoMo turn's test split were read (the pre-registered rule
#: chose min-max on AUC gold, which cannot reject an unrelated question): the relevance
#: discounted by the fused score, which is below 1 when the legs disagree about the top item.
#: Computed from the stored rows; read as a diagnostic on the data sets measured after it.
POST_HOC = "relevance × min-max (post hoc)"
#: measured in this order (the data sets with a tuning split first), reported in table order
ORDER = ["personabench-0.0", "locomo-turn", "locomo-session", *DATASETS]


def _by_user(dataset: str, user_id: str, question_id: str) -> bool:
    """The user split (:func:`pbr_bench.splits.is_tuning_user`), which this study named."""
    return is_tuning_user(user_id)


def _cover(bm25: float, ceiling: float) -> float:
    return min(1.0, bm25 / ceiling) if ceiling > 0 else 0.0


#: name -> (cos, bm25, ceiling, weight, fused) of the top result -> its score
VARIANTS: dict[str, Callable[[float, float, float, float, float], float]] = {
    "min-max (old)": lambda c, b, ce, w, f: f,
    "cosine": lambda c, b, ce, w, f: max(c, 0.0),
    "relevance (mean)": lambda c, b, ce, w, f: (max(c, 0.0) + w * _cover(b, ce)) / (1 + w),
    "relevance (noisy-or)": lambda c, b, ce, w, f: (
        1 - (1 - max(c, 0.0)) * (1 - min(1.0, w) * _cover(b, ce))
    ),
}


ALL_VARIANTS = [*VARIANTS, POST_HOC]


def auc(pos: list[float], neg: list[float]) -> float | None:
    """Mann-Whitney AUC (ties count half); None without both classes."""
    if not pos or not neg:
        return None
    r = rankdata(np.concatenate([pos, neg]))
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def top_evidence(history: UserHistory, vector: np.ndarray, query: str) -> dict[str, Any]:
    """The top result of the default search and every variant's score for it."""
    terms = lexical_query(query)
    top = rank(history, vector, terms, 1, mode="hybrid")[0]
    index = history.lexical()
    dense, lexical = history.dense_scores(vector), index.scores(terms)
    weight = lexical_weight(lexical, index.ceiling(terms))
    fused = float(fuse(dense, with_context(lexical), weight).max())
    args = (top.dense, float(top.lexical or 0.0), index.ceiling(terms), weight, fused)
    scores = {name: f(*args) for name, f in VARIANTS.items()}
    return {"id": history.items[top.position].id, "returned": top.score, "scores": scores}


def measure(built: Built) -> list[dict[str, Any]]:
    """Per question: the split, whether the top result is gold, and the scores (own user and
    the next user)."""
    users = sorted({q.user_id for q in built.queries})
    nxt = {u: users[(i + 1) % len(users)] for i, u in enumerate(users)}
    rows = []
    for q in built.queries:
        own = top_evidence(built.windowed.get(q.user_id), built.qvec[q.id], q.text)
        other = top_evidence(built.windowed.get(nxt[q.user_id]), built.qvec[q.id], q.text)
        gold = {g for alts in q.gold for g in alts}
        rows.append(
            {
                "split": built.split_of[q.id],
                "gold": own["id"] in gold,
                "own": own["scores"],
                "other": other["scores"],
                "returned": own["returned"],
            }
        )
    return rows


def in_split(rows: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return rows if split == "all" else [r for r in rows if r["split"] == split]


def separation(rows: list[dict[str, Any]], variant: str, task: str) -> tuple[np.ndarray, ...]:
    """Positive and negative scores of ``task``: "gold" (top-1 gold or not) or "other" (the
    question on its own user's history or the next user's)."""
    if task == "gold":
        pos = np.array([r["own"][variant] for r in rows if r["gold"]])
        return pos, np.array([r["own"][variant] for r in rows if not r["gold"]])
    return np.array([r["own"][variant] for r in rows]), np.array(
        [r["other"][variant] for r in rows]
    )


def balanced_accuracy(pos: np.ndarray, neg: np.ndarray, tau: float) -> float:
    return 0.5 * (float((pos >= tau).mean()) + float((neg < tau).mean()))


def best_threshold(rows: list[dict[str, Any]], variant: str, task: str) -> tuple[float, float]:
    """The τ of best balanced accuracy of ``task`` over ``rows``, and that accuracy."""
    pos, neg = separation(rows, variant, task)
    best = (0.0, 0.0)
    for tau in np.unique(np.concatenate([pos, neg])):
        acc = balanced_accuracy(pos, neg, float(tau))
        if acc > best[1]:
            best = (float(tau), acc)
    return best


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Test split: how well each score tells a question's gold item from the rest (AUC)."""
    groups: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["split"] == "test":
            groups.setdefault(str(r["dataset"]), {})[str(r["variant"])] = r["AUC gold"]
    bar_png(path, groups, title="hybrid_scores: AUC gold vs not, test split", ylabel="AUC")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--report", action="store_true", help="only the data sets measured so far")
    args = p.parse_args()
    scratch = scratch_dir("hybrid_scores", __file__)
    scratch.mkdir(parents=True, exist_ok=True)
    per: dict[str, list[dict[str, Any]]] = {}
    counter, cache, window = (None, None, None) if args.report else encoders()
    for name in dict.fromkeys(ORDER):
        path = scratch / f"{name}.json"
        if path.exists():
            per[name] = json.loads(path.read_text(encoding="utf-8"))
            continue
        if args.report:
            continue
        assert counter is not None and cache is not None and window is not None
        # the split this study's choice was made on, before #42 tuned on PersonaBench questions
        per[name] = measure(build(name, cache, counter, window, tuning=_by_user))
        path.write_text(json.dumps(per[name]), encoding="utf-8")
        print(f"{name}: {len(per[name])} questions", flush=True)
    per = {name: per[name] for name in DATASETS if name in per}
    for rows in per.values():
        for r in rows:
            for side in ("own", "other"):
                s = r[side]
                s[POST_HOC] = s[BRIEF_VARIANT] * s["min-max (old)"]
    table: list[dict[str, Any]] = []
    for name, rows in per.items():
        for split in SPLITS:
            sel = in_split(rows, split)
            if not sel:
                continue
            for variant in ALL_VARIANTS:
                pos = [r["own"][variant] for r in sel if r["gold"]]
                neg = [r["own"][variant] for r in sel if not r["gold"]]
                own = [r["own"][variant] for r in sel]
                other = [r["other"][variant] for r in sel]
                table.append(
                    {
                        "dataset": name,
                        "split": split,
                        "variant": variant,
                        "questions": len(sel),
                        "top-1 gold": len(pos),
                        "AUC gold": auc(pos, neg),
                        "AUC other user": auc(own, other),
                        "mean score (gold)": float(np.mean(pos)) if pos else None,
                        "mean score (not gold)": float(np.mean(neg)) if neg else None,
                    }
                )
    # the choice, on the tuning split only
    tuned = {}
    for variant in VARIANTS:
        cells = [
            t["AUC gold"]
            for t in table
            if t["split"] == "tune" and t["variant"] == variant and t["AUC gold"] is not None
        ]
        tuned[variant] = float(np.mean(cells)) if cells else 0.0
    top = max(tuned.values())
    chosen = BRIEF_VARIANT if tuned[BRIEF_VARIANT] == top else max(tuned, key=tuned.__getitem__)
    # one threshold for every data set: chosen on the tuning questions pooled
    thresholds: dict[str, dict[str, dict[str, float]]] = {}
    pooled = [r for rows in per.values() for r in in_split(rows, "tune")]
    for variant in ALL_VARIANTS:
        thresholds[variant] = {}
        for task in ("gold", "other"):
            tau, acc = best_threshold(pooled, variant, task)
            thresholds[variant][task] = {"tau": tau, "tuning balanced accuracy": acc}
            for t in table:
                if t["variant"] != variant:
                    continue
                good, bad = separation(in_split(per[t["dataset"]], t["split"]), variant, task)
                if good.size and bad.size:
                    t[f"balanced accuracy at tau ({task})"] = balanced_accuracy(good, bad, tau)
    # the library returns the default variant: check it is what rank() returned
    mismatch = sum(
        abs(r["returned"] - r["own"][DEFAULT_VARIANT]) > 1e-9 for rows in per.values() for r in rows
    )
    out = {
        "datasets": list(per),
        "chosen on the tuning split": chosen,
        "tuning mean AUC gold": tuned,
        "thresholds (tuning, pooled)": thresholds,
        f"questions where rank() returned another score than {DEFAULT_VARIANT}": mismatch,
        "rows": table,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "scores.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    plot(table, OUT / "scores.png")
    with (OUT / "scores.csv").open("w", newline="", encoding="utf-8") as f:
        keys = list(dict.fromkeys(k for t in table for k in t))
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(table)
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=2))
    for t in table:
        if t["split"] == "test" or t["dataset"].startswith("personabench"):
            ag, ao = t["AUC gold"], t["AUC other user"]
            print(
                f"{t['dataset']:22} {t['split']:5} {t['variant']:21} n={t['questions']:5} "
                f"gold {ag if ag is None else round(ag, 3)}  other {round(ao, 3)}"
            )


if __name__ == "__main__":
    main()
