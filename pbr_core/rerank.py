"""The optional re-rank stage: ranked results re-ordered by salience (``PBRConfig(rerank=...)``).

Opt-in because it costs an LM pass per candidate: ``rerank_candidates + 1`` sequences per query
(the items and the empty memory slot) under the salience scorer, seconds per query on CPU with
the embedded Gemma 3 270M. What it buys was measured on LoCoMo and PersonaBench over the hybrid
candidates (``benchmarks/salience_rerank.py``, ``docs/hybrid.md``, "Re-ranking").

The rule is the salience package's (:func:`pbr_core.salience.rerank`, ``method="salience"``: the
order of ``log p(q | item) − log p(q)``, nats). What each result returns keeps the meaning of
the ranking's score (hybrid: the relevance of :func:`pbr_core.hybrid.relevance`), capped by the
results above it in the new order, so the scores stay non-increasing down the list and a
threshold still cuts it; both legs and the salience are in ``hit.legs`` (``salience`` in nats,
``rank_before_rerank`` 1-based).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .corpus import ScoredRecord
    from .salience.protocol import LogProbScorer

__all__ = ["rerank_by_salience"]


def rerank_by_salience(
    query: str, results: list[ScoredRecord], scorer: LogProbScorer | None = None
) -> list[ScoredRecord]:
    """``results`` (best first) re-ordered by salience for ``query``.

    Args:
        query: the user's question (the text whose likelihood each item is scored on).
        results: the ranked candidates.
        scorer: any :class:`~pbr_core.salience.LogProbScorer`; None loads the embedded one
            (:func:`pbr_core.salience.default_scorer`, once per process).

    Returns:
        The same records, most salient first (ties keep the ranked order), each hit's score
        capped by those above it, its legs plus ``salience`` and ``rank_before_rerank``.
    """
    if not results:
        return []
    from .salience import default_scorer, rerank, salience  # torch only when asked for

    scores = salience(
        scorer if scorer is not None else default_scorer(), query, [r.hit.text for r in results]
    )
    order = rerank(list(range(len(results))), scores, "salience").order
    out: list[ScoredRecord] = []
    cap = math.inf
    for pos in (int(i) for i in order):
        record = results[pos]
        cap = min(cap, record.hit.score)
        legs = {
            **(record.hit.legs or {}),
            "salience": round(float(scores.sum[pos]), 6),
            "rank_before_rerank": pos + 1,
        }
        out.append(replace(record, hit=replace(record.hit, score=cap, legs=legs)))
    return out
