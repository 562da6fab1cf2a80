"""Dense and lexical retrieval over one user's items, fused per query (hybrid search).

Dense search misses the exact words a user's items share with the question (names, places,
dates: on LoCoMo conversations BM25 beats all-MiniLM-L6-v2 by 8 to 37 points of R@5); BM25 misses
paraphrase (on PrefEval it trails dense by 35 to 57 points). Fusing both is what every serious
memory system does. The rule here is score-level and has no tuned parameter:

    score(d) = 0.5 · (cos(d) − min cos) / (max cos − min cos) + 0.5 · bm25(d) / max bm25

over the items being ranked (all of the user's, or a host search's candidates): each leg is
scaled to [0, 1] within the query, then averaged. The rule was chosen among min-max, z-score,
RRF, coverage-scaled and multiplicative fusions, with weights from 0.3 to 0.8, on a tuning split
named before any number was read (a third of the users of each data set, see
``benchmarks/hybrid_explore.py``): equal weights had the best mean there and no data set below
the better of dense and BM25. A query with no lexical match at all ranks by the dense leg alone.
``cos`` is the item's best window when the item is longer than the embedder reads
(:mod:`pbr_core.windows`).

Results and the per-question comparison against dense, BM25 and a LangChain-style RRF ensemble:
``docs/hybrid.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import SEARCH_MODES, SearchMode
from .history import UserHistory, top_k
from .lexical import query_terms
from .protocols import SearchHit

if TYPE_CHECKING:
    from .pipeline import Explanation

__all__ = [
    "SEARCH_MODES",
    "Ranked",
    "SearchMode",
    "fuse",
    "hits",
    "host_candidates",
    "lexical_query",
    "lexical_terms",
    "rank",
]


@dataclass(frozen=True)
class Ranked:
    """One ranked item of a user, with both legs' evidence.

    Attributes:
        position: the item's row in the :class:`~pbr_core.history.UserHistory` snapshot.
        score: what the mode ranks by: the fused score in [0, 1] (hybrid), the cosine (dense) or
            the BM25 score (lexical).
        dense: cosine of the item (its best window) with the search vector.
        lexical: BM25 score of the item for the lexical query (0: no query word in it).
        dense_rank, lexical_rank: 1-based rank of the item in each leg among the ranked items;
            ``lexical_rank`` is None when the item holds no query word.
    """

    position: int
    score: float
    dense: float
    lexical: float
    dense_rank: int
    lexical_rank: int | None

    def legs(self) -> dict[str, Any]:
        """Both legs' evidence, JSON-ready (what a hit's ``legs`` / metadata carry)."""
        return {
            "dense": round(self.dense, 6),
            "dense_rank": self.dense_rank,
            "lexical": round(self.lexical, 6),
            "lexical_rank": self.lexical_rank,
        }


def lexical_query(
    query: str, feedback: Sequence[str] = (), feedback_weight: float = 0.0
) -> dict[str, float]:
    """The lexical query: the user's words at weight 1, LLM feedback texts at ``feedback_weight``
    each (pseudo-relevance feedback, so the user's own words count most)."""
    parts = [(query, 1.0)]
    if feedback_weight > 0:
        parts.extend((text, feedback_weight) for text in feedback if text)
    return query_terms(parts)


def host_candidates(k: int, mode: SearchMode) -> int:
    """How many results to ask a host search for when pbr ranks within them (a view filter it
    cannot evaluate): ``k`` for dense; for hybrid and lexical, more, so that the lexical leg
    has something to re-rank (it sees only what the store's dense search returned)."""
    return k if mode == "dense" else max(4 * k, 40)


def lexical_terms(explanation: Explanation, feedback_weight: float) -> dict[str, float]:
    """The lexical query of a personalized request: its words, plus (at ``feedback_weight``)
    the P-PRF texts that entered ``q*``, so feedback a gate dropped is not searched either."""
    feedback: list[str] = []
    if feedback_weight > 0:
        if "utterances" in explanation.used:
            feedback.extend(explanation.pseudo_utterances)
        if "reasoning" in explanation.used and explanation.reasoning:
            feedback.append(explanation.reasoning)
    return lexical_query(explanation.query, feedback, feedback_weight)


def hits(history: UserHistory, ranked: Sequence[Ranked]) -> list[SearchHit]:
    """The ranked items as search hits (score: the mode's; legs: both legs' evidence)."""
    out = []
    for r in ranked:
        item = history.items[r.position]
        out.append(
            SearchHit(
                id=item.id, score=r.score, text=item.text, metadata=item.metadata, legs=r.legs()
            )
        )
    return out


def _rank_of(scores: np.ndarray, i: int) -> int:
    """1-based rank of item ``i`` in ``scores``, best first, equal scores in item order: O(n),
    so the legs' ranks of the k results cost no full sort."""
    s = scores[i]
    return int(np.count_nonzero(scores > s) + np.count_nonzero(scores[:i] == s)) + 1


def fuse(dense: np.ndarray, lexical: np.ndarray) -> np.ndarray:
    """The hybrid score of each item: the mean of the two legs, each scaled to [0, 1] over the
    items given (a leg that is constant, e.g. no lexical match, contributes 0 to every item)."""
    d = np.asarray(dense, dtype=np.float64)
    lo, hi = (float(d.min()), float(d.max())) if d.size else (0.0, 0.0)
    d_part = (d - lo) / (hi - lo) if hi > lo else np.zeros_like(d)
    lx = np.asarray(lexical, dtype=np.float64)
    top = float(lx.max()) if lx.size else 0.0
    l_part = lx / top if top > 0 else np.zeros_like(lx)
    return 0.5 * d_part + 0.5 * l_part


def rank(
    history: UserHistory,
    vector: np.ndarray,
    terms: Mapping[str, float],
    k: int,
    *,
    mode: SearchMode = "hybrid",
    candidates: Sequence[int] | None = None,
) -> list[Ranked]:
    """The ``k`` best of the user's items (or of ``candidates``, positions from a host search
    that applied filters pbr cannot evaluate), best first.

    Exact: every candidate is scored in both legs (one matrix-vector product and the postings
    of the query's words), so an approximate index cannot make an item unreachable.
    """
    n = len(history)
    if k <= 0 or n == 0:
        return []
    rows = np.arange(n) if candidates is None else np.asarray(list(candidates), dtype=np.int64)
    if rows.size == 0:
        return []
    dense = history.dense_scores(vector)[rows]
    lexical = history.lexical().scores(terms)[rows] if mode != "dense" else np.zeros(rows.size)
    if mode == "dense":
        score = dense.astype(np.float64)
    elif mode == "lexical":
        # ties (e.g. no query word at all) fall back to the dense order
        score = lexical.astype(np.float64) + 1e-9 * (dense.astype(np.float64) + 1.0)
    else:
        score = fuse(dense, lexical)
    return [
        Ranked(
            position=int(rows[i]),
            score=float(lexical[i]) if mode == "lexical" else float(score[i]),
            dense=float(dense[i]),
            lexical=float(lexical[i]),
            dense_rank=_rank_of(dense, int(i)),
            lexical_rank=_rank_of(lexical, int(i)) if lexical[i] > 0 else None,
        )
        for i in top_k(score, k)
    ]
