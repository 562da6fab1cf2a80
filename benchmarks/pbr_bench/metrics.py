"""Ranking metrics for the benchmark harness (spec §4).

All functions take one ranking (doc ids, best first) and the relevant ids;
:func:`best_over_combinations` and :func:`evaluate` apply PersonaBench's rule for answers made of
several elements with alternative supporting documents. Values are fractions in ``[0, 1]``.

Conventions (they match the official PersonaBench scorer, ``personabench/utils/eval.py``):

- Gain is binary (1 for a relevant id), discount ``1 / log2(rank + 1)`` with ranks from 1.
- The ideal DCG is over ``min(|G|, k)`` relevant documents.
- ``G`` is a *set*: a gold combination that names the same document for two answer elements
  (one session supports both) counts it once, so recall is ``|top-k ∩ G| / |set(G)|``.
- A ranking is cut to its first ``k`` entries; a ranking shorter than ``k`` is scored as is.
  Repeated ids in a ranking count once, at their first position (later repeats are
  skipped, not replaced).

Use:
    .. code-block:: python

        from pbr_bench.metrics import best_over_combinations, evaluate

        best_over_combinations(["a", "x", "b"], [["a"], ["b", "c"]], k=5)  # (1.0, 0.919...)
        evaluate({"q1": ["a", "x"]}, {"q1": [["a"]]}, ks=(1, 5))["Overall"]["R@5"]  # 1.0
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "best_over_combinations",
    "dcg_at_k",
    "evaluate",
    "hit_at_k",
    "mrr",
    "ndcg_at_k",
    "recall_any_at_k",
    "recall_at_k",
]


def _top_k(retrieved: Sequence[str], k: int | None) -> list[str | None]:
    """The first ``k`` entries, with repeats blanked out (positions kept, no second gain)."""
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    seen: set[str] = set()
    out: list[str | None] = []
    for d in retrieved[:k] if k is not None else retrieved:
        out.append(None if d in seen else d)
        seen.add(d)
    return out


def recall_at_k(retrieved: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Share of the relevant ids in the top ``k``: ``|top-k ∩ G| / |G|`` (0 for empty ``G``)."""
    gold = set(relevant)
    if not gold:
        return 0.0
    return len(gold.intersection(_top_k(retrieved, k))) / len(gold)


def dcg_at_k(retrieved: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Discounted cumulative gain with binary gain and discount ``1/log2(rank + 1)``."""
    gold = set(relevant)
    return sum(1.0 / math.log2(r + 2) for r, d in enumerate(_top_k(retrieved, k)) if d in gold)


def ndcg_at_k(retrieved: Sequence[str], relevant: Collection[str], k: int) -> float:
    """DCG@k over the ideal DCG of ``min(|G|, k)`` relevant items at the top (0 for empty ``G``)."""
    gold = set(relevant)
    if not gold:
        return 0.0
    ideal = sum(1.0 / math.log2(r + 2) for r in range(min(len(gold), k)))
    return dcg_at_k(retrieved, gold, k) / ideal


def hit_at_k(retrieved: Sequence[str], relevant: Collection[str], k: int) -> float:
    """1.0 when any relevant id is in the top ``k``, else 0.0."""
    gold = set(relevant)
    return float(any(d in gold for d in _top_k(retrieved, k)))


def recall_any_at_k(retrieved: Sequence[str], gold: Sequence[Sequence[str]], k: int) -> float:
    """1.0 when any gold id (of any answer element, any alternative) is in the top ``k``, else 0.0.

    What memory-system benchmarks call recall_any@k (memini on LoCoMo): a question counts as
    found when one of its evidence items is retrieved, however many it has. R@k asks for all of
    them (the best combination's share), so recall_any@k ≥ R@k, equal for one-item gold. The same
    number as :func:`hit_at_k` over the flattened gold.
    """
    return hit_at_k(retrieved, {d for alts in gold for d in alts}, k)


def mrr(retrieved: Sequence[str], relevant: Collection[str], k: int | None = None) -> float:
    """Reciprocal rank of the first relevant id (0.0 if there is none, or none in the top k)."""
    gold = set(relevant)
    for r, d in enumerate(_top_k(retrieved, k)):
        if d in gold:
            return 1.0 / (r + 1)
    return 0.0


def _combinations(gold: Sequence[Sequence[str]]) -> Iterable[tuple[str, ...]]:
    if not gold or any(len(alts) == 0 for alts in gold):
        return ()
    return itertools.product(*gold)


def best_over_combinations(
    retrieved: Sequence[str], gold: Sequence[Sequence[str]], k: int
) -> tuple[float, float]:
    """PersonaBench's rule: best Recall@k and best NDCG@k over all gold combinations.

    Args:
        retrieved: ranked doc ids.
        gold: one list of alternative doc ids per answer element. Each choice of one alternative
            per element is a candidate gold set (duplicates within it collapse, see the module
            docstring).
        k: cut-off.

    Returns:
        ``(recall, ndcg)``, each maximised independently (they may come from different
        combinations, as in the official scorer). ``(0.0, 0.0)`` when ``gold`` is empty.
    """
    best_r = best_n = 0.0
    top = list(retrieved[:k])
    for combo in _combinations(gold):
        best_r = max(best_r, recall_at_k(top, combo, k))
        best_n = max(best_n, ndcg_at_k(top, combo, k))
        if best_r == 1.0 and best_n == 1.0:
            break
    return best_r, best_n


def evaluate(
    rankings: Mapping[str, Sequence[str]],
    gold: Mapping[str, Sequence[Sequence[str]]],
    ks: Iterable[int] = (5,),
    categories: Mapping[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """Micro-averaged metrics per category and ``"Overall"``.

    Args:
        rankings: query id -> ranked doc ids (every id in ``gold`` must have one).
        gold: query id -> answer elements (as in :func:`best_over_combinations`); only these
            queries are scored.
        ks: cut-offs.
        categories: query id -> category name, for per-category rows.

    Returns:
        ``{category: {"n": count, "R@k": .., "N@k": .., "Hit@k": .., "recall_any@k": ..,
        "MRR": ..}}``. ``R@k`` and ``N@k`` follow :func:`best_over_combinations`; ``Hit@k``,
        ``recall_any@k`` (:func:`recall_any_at_k`, the same number under memory-system
        benchmarks' name) and ``MRR`` treat every id of every element as relevant; ``MRR`` is
        over the ranking as given (pass the top 10 and it is MRR@10).
    """
    ks = list(ks)
    missing = [q for q in gold if q not in rankings]
    if missing:
        raise KeyError(f"{len(missing)} gold queries have no ranking, e.g. {missing[:3]}")
    rows: dict[str, list[dict[str, float]]] = {"Overall": []}
    for qid, elements in gold.items():
        ranking = rankings[qid]
        flat = {d for alts in elements for d in alts}
        row: dict[str, float] = {}
        for k in ks:
            r, n = best_over_combinations(ranking, elements, k)
            row[f"R@{k}"], row[f"N@{k}"] = r, n
            row[f"Hit@{k}"] = hit_at_k(ranking, flat, k)
            row[f"recall_any@{k}"] = recall_any_at_k(ranking, elements, k)
        row["MRR"] = mrr(ranking, flat)
        rows["Overall"].append(row)
        if categories is not None:
            rows.setdefault(categories[qid], []).append(row)
    out: dict[str, dict[str, float]] = {}
    for cat, cat_rows in rows.items():
        summary: dict[str, float] = {"n": float(len(cat_rows))}
        if cat_rows:
            for key in cat_rows[0]:
                summary[key] = float(np.mean([r[key] for r in cat_rows]))
        out[cat] = summary
    return out
