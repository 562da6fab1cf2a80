"""The ensemble baseline of the hybrid studies: LangChain's ``EnsembleRetriever`` rule.

Reciprocal rank fusion over ranked id lists, as ``EnsembleRetriever.weighted_reciprocal_rank``
computes it, so the "ensemble RRF" rows of ``benchmarks/hybrid.py`` and
``benchmarks/window_size.py`` are one rule, not two copies.
"""

from __future__ import annotations

from collections.abc import Sequence

#: LangChain ``EnsembleRetriever``'s default constant.
RRF_C = 60


def rrf(rankings: Sequence[Sequence[str]], weights: Sequence[float], c: int = RRF_C) -> list[str]:
    """score(d) = sum_i w_i / (rank_i + c), ranks from 1; equal scores keep first appearance in
    the chained lists (stable sort), as LangChain's does."""
    if len(rankings) != len(weights):
        raise ValueError(f"{len(rankings)} rankings but {len(weights)} weights")
    score: dict[str, float] = {}
    for ranking, w in zip(rankings, weights):
        for r, doc in enumerate(ranking, start=1):
            score[doc] = score.get(doc, 0.0) + w / (r + c)
    return sorted(score, key=lambda d: -score[d])
