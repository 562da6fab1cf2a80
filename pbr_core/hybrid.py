"""Dense and lexical retrieval over one user's items, fused per query (hybrid search).

Dense search misses the exact words a user's items share with the question (names, places,
dates: on LoCoMo conversations BM25 beats all-MiniLM-L6-v2 by 8 to 37 points of R@5); BM25 misses
paraphrase (on PrefEval it trails dense by 35 to 57 points). Fusing both is what every serious
memory system does. The rule here is score-level, decided per query from the lexical leg's own
evidence:

    c       = max bm25 / ceiling                  (coverage: how much of the query's words the
                                                   best lexical match holds, 0..1)
    w       = 1.5 · c                             (the lexical leg's weight, 0..1.5)
    ctx(d)  = bm25(d) + γ · [bm25(d−1) + bm25(d+1)] / 2
                                                  (the item's BM25 with its neighbours' context;
                                                   γ = PBRConfig.lexical_context, 0 by default)
    fused(d) = [ (cos(d) − min cos) / (max cos − min cos) + w · ctx(d) / max ctx ] / (1 + w)

over the items being ranked (all of the user's, or a host search's candidates). BM25 is pbr's,
with ``k1 = 0.5`` and ``b = 0.25`` (:data:`pbr_core.lexical.DEFAULT_K1`). ``d−1`` and ``d+1``
are the items added just before and after ``d`` in the user's history (the order of
:class:`~pbr_core.snapshot.UserHistory`: a conversation's turns, a diary's entries), so, where
asked for (γ > 0), a turn that answers a question asked in the turn before it shares that
turn's words; off by default, since only the process that added the items knows their order (a
worker that reads a host store cold gets the store's order). ``ceiling`` is
:meth:`pbr_core.lexical.LexicalIndex.ceiling`, ``Σ idf`` of the query's words, computed for the
*user's own words* (LLM feedback expands the lexical query but does not lower the coverage). A
best lexical match holding the query's rare words (a name, a place) gives BM25 as much say as
the dense leg; one sharing only an everyday word with the question (PrefEval, PersonaBench) gives
it little. A query with no lexical match ranks by the dense leg alone. ``cos`` is the item's best
window when the item is longer than the embedder reads (:mod:`pbr_core.windows`).

The fused score only **ranks**: scaled per query, every query's best item scores about 1, a
question about nothing the user said as much as one about their own words. What a hybrid
result **returns** is its relevance, a score with one meaning across queries and users
(:func:`relevance`, in [0, 1]):

    a(d)     = 1 − (1 − max(cos(d), 0)) · (1 − min(1, w) · min(1, bm25(d) / ceiling))
    score_i  = min(a(d_1), …, a(d_i))             (d_i: the i-th result of the fused order)

the cosine and the item's own lexical coverage (at the rule's weight ``w``) as two pieces of
evidence, either of which raises the score (a noisy-or): never below the cosine, the cosine
itself when no query word matches. Chosen among four definitions on the tuning split
(``benchmarks/hybrid_scores.py``). The running minimum keeps the score non-increasing down the
ranked list, so a threshold on it (pbr's ``score_threshold``, LangChain's, LlamaIndex's
``similarity_cutoff``) always cuts the list: it never drops a higher-ranked result while keeping
a lower one. Measured (``docs/hybrid.md``, "Scores"): one threshold on the top result's score
tells a question's own history from another user's (AUC .99 on LoCoMo, .68-.70 PrefEval,
.55-.57 PersonaBench; the min-max score, ~1 for every query: .47-.62).

The rule was chosen among min-max, z-score, distribution-based, RRF, coverage-scaled, agreement-
and confidence-weighted fusions on a tuning split named before its numbers were read
(``benchmarks/hybrid_adaptive.py``); the earlier equal-weight rule (``w = 1``) lost to plain dense
on PersonaBench and PrefEval. Its weight (``1.5 · c``, until then ``√c``), the neighbour context
and BM25's ``k1``/``b`` were chosen in a second round, one parameter set for every data set
(``benchmarks/hybrid_tuning.py``). Results and the per-question comparison against dense, BM25 and
a LangChain-style RRF ensemble: ``docs/hybrid.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import SEARCH_MODES, SearchMode
from .items import copy_metadata
from .lexical import DEFAULT_STEMMER, StemmerName, query_terms
from .protocols import SearchHit
from .snapshot import UserHistory, items_at, top_k

if TYPE_CHECKING:
    from .results import Explanation

__all__ = [
    "LEXICAL_CONTEXT",
    "LEXICAL_SCALE",
    "SEARCH_MODES",
    "Ranked",
    "SearchMode",
    "fuse",
    "hits",
    "host_candidates",
    "lexical_query",
    "lexical_terms",
    "lexical_weight",
    "rank",
    "relevance",
    "with_context",
]

#: The lexical leg's weight at full coverage (``w = LEXICAL_SCALE · c``): above 1, a query whose
#: best lexical match holds all of its words lets BM25 outweigh the dense leg.
LEXICAL_SCALE = 1.5
#: How much of its neighbours' BM25 an item takes into the fused rule where asked
#: (:func:`with_context`, ``PBRConfig(lexical_context=...)``; off by default): what was measured.
LEXICAL_CONTEXT = 0.5


@dataclass(frozen=True)
class Ranked:
    """One ranked item of a user, with both legs' evidence.

    Attributes:
        position: the item's row in the :class:`~pbr_core.history.UserHistory` snapshot.
        score: the result's score: hybrid, its relevance in [0, 1] (:func:`relevance`, the same
            meaning for every query and user, non-increasing down the ranked list); dense, the
            cosine; lexical, the BM25 score.
        dense: cosine of the item (its best window) with the search vector.
        lexical: BM25 score of the item for the lexical query (0: no query word in it; None in
            dense mode, where the lexical leg is not computed).
        dense_rank, lexical_rank: 1-based rank of the item in each leg among the ranked items
            (equal BM25 scores in the dense order, equal cosines by position); ``lexical_rank``
            is None when the item holds no query word, or in dense mode.
    """

    position: int
    score: float
    dense: float
    lexical: float | None
    dense_rank: int
    lexical_rank: int | None

    def legs(self) -> dict[str, Any]:
        """Both legs' evidence, JSON-ready (what a hit's ``legs`` / metadata carry)."""
        return {
            "dense": round(self.dense, 6),
            "dense_rank": self.dense_rank,
            "lexical": None if self.lexical is None else round(self.lexical, 6),
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


def host_candidates(k: int) -> int:
    """How many results to ask a host search for when pbr ranks within them (a view filter it
    cannot evaluate): more than ``k`` in every mode. The lexical leg sees only what the store's
    search returned, and so does pbr's dense ranking: a store whose distance is not the cosine
    (Chroma's ``ip`` or ``l2`` space over vectors written around pbr, not unit length) ranks its
    own top ``k`` differently from pbr."""
    return max(4 * k, 40)


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
    for r, item in zip(ranked, items_at(history, [r.position for r in ranked])):
        out.append(
            SearchHit(
                id=item.id,
                score=r.score,
                text=item.text,
                metadata=copy_metadata(item.metadata),  # the caller's, not pbr's
                legs=r.legs(),
            )
        )
    return out


def _rank_of(scores: np.ndarray, i: int) -> int:
    """1-based rank of item ``i`` in ``scores``, best first, equal scores in item order: O(n),
    so the legs' ranks of the k results cost no full sort."""
    s = scores[i]
    return int(np.count_nonzero(scores > s) + np.count_nonzero(scores[:i] == s)) + 1


def lexical_weight(lexical: np.ndarray, ceiling: float) -> float:
    """The lexical leg's weight for one query: :data:`LEXICAL_SCALE` ``· min(1, max bm25 /
    ceiling)``, in [0, 1.5] (0 when no item matches or the query has no word with an idf)."""
    top = float(np.max(lexical)) if np.size(lexical) else 0.0
    if top <= 0.0 or ceiling <= 0.0:
        return 0.0
    return LEXICAL_SCALE * min(1.0, top / ceiling)


def with_context(lexical: np.ndarray, context: float = LEXICAL_CONTEXT) -> np.ndarray:
    """Each item's BM25 plus ``context`` times the mean of its two neighbours' (the items before
    and after it in the user's history; a missing neighbour counts 0), float64.

    Items added one after the other (a conversation's turns) share what they are about: the
    answer to "what did you paint?" rarely repeats "paint". 0 returns the scores unchanged.
    """
    x = np.asarray(lexical, dtype=np.float64)
    if context == 0.0 or x.size < 2:
        return x
    around = np.zeros_like(x)
    around[1:] += x[:-1]
    around[:-1] += x[1:]
    return x + (0.5 * context) * around


def fuse(dense: np.ndarray, lexical: np.ndarray, weight: float = 1.0) -> np.ndarray:
    """The hybrid score of each item in [0, 1]: the dense leg scaled to [0, 1] over the items
    given, plus ``weight`` times the lexical leg / its maximum, over ``1 + weight`` (a constant
    dense leg contributes 0 to every item, a constant lexical leg the same ``weight / (1 +
    weight)`` to each, 0 where nothing matches: neither changes the order). ``weight`` is
    :func:`lexical_weight`; ``lexical`` BM25, in :func:`rank` :func:`with_context` of it."""
    d = np.asarray(dense, dtype=np.float64)
    lo, hi = (float(d.min()), float(d.max())) if d.size else (0.0, 0.0)
    d_part = (d - lo) / (hi - lo) if hi > lo else np.zeros_like(d)
    lx = np.asarray(lexical, dtype=np.float64)
    top = float(lx.max()) if lx.size else 0.0
    l_part = lx / top if top > 0 else np.zeros_like(lx)
    return (d_part + weight * l_part) / (1.0 + weight)


def relevance(dense: np.ndarray, lexical: np.ndarray, weight: float, ceiling: float) -> np.ndarray:
    """The relevance of ranked items, in [0, 1], comparable across queries and users.

    Args:
        dense: each item's cosine with the search vector, **in ranked order** (best first).
        lexical: each item's BM25 score for the user's own words (no LLM feedback), in the
            same order.
        weight: the lexical leg's weight (:func:`lexical_weight`), read capped at 1.
        ceiling: :meth:`~pbr_core.lexical.LexicalIndex.ceiling` of those words.

    Returns:
        ``score_i = min_{j <= i} a_j`` with ``a = 1 − (1 − max(cos, 0)) · (1 − min(1, weight) ·
        min(1, bm25 / ceiling))``: the cosine (0 for a negative one) and the share of the
        query's words the item holds, at the fused rule's weight, as a noisy-or (either raises
        it; never below the cosine). The running minimum makes it non-increasing in the given
        order, so a threshold on it cuts the ranked list; an item scores at most its own ``a``.
    """
    d = np.clip(np.asarray(dense, dtype=np.float64), 0.0, 1.0)
    lx = np.asarray(lexical, dtype=np.float64)
    cover = np.clip(lx / ceiling, 0.0, 1.0) if ceiling > 0.0 else np.zeros_like(lx)
    own = 1.0 - (1.0 - d) * (1.0 - min(1.0, weight) * cover)
    return np.minimum.accumulate(own) if own.size else own


def rank(
    history: UserHistory,
    vector: np.ndarray,
    terms: Mapping[str, float],
    k: int,
    *,
    mode: SearchMode = "hybrid",
    candidates: Sequence[int] | None = None,
    own_terms: Mapping[str, float] | None = None,
    stemmer: StemmerName | None = DEFAULT_STEMMER,
    context: float = 0.0,
) -> list[Ranked]:
    """The ``k`` best of the user's items (or of ``candidates``, positions from a host search
    that applied filters pbr cannot evaluate), best first.

    ``terms`` is the lexical query; ``own_terms`` the user's own words in it (None: ``terms``),
    which the lexical leg's weight and each result's coverage are read from (hybrid mode). Both
    are words (:func:`lexical_query`); the lexical leg analyzes them and the items with ``stemmer``
    (:attr:`~pbr_core.config.PBRConfig.lexical_stemmer`; None: no stemming), through the
    snapshot's index for that analyzer (:meth:`UserHistory.lexical`). ``context``: how much
    of its neighbours' BM25 an item takes into the fused rule (hybrid mode, :func:`with_context`;
    the neighbours are the user's, also when ``candidates`` restricts the ranking; 0: none).
    What each result reports and returns is its own BM25.

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
    if mode == "dense":  # the lexical leg is not computed (nor its index built) at all
        return [
            Ranked(
                position=int(rows[i]),
                score=float(dense[i]),
                dense=float(dense[i]),
                lexical=None,
                dense_rank=_rank_of(dense, int(i)),
                lexical_rank=None,
            )
            for i in top_k(dense.astype(np.float64), k)
        ]
    index = history.lexical(stemmer)
    every = index.scores(terms)
    lexical = every[rows]
    # the lexical leg's order: BM25, ties (e.g. no query word at all) in the dense order; what
    # lexical mode ranks by and what every mode's lexical_rank counts
    lexical_order = lexical.astype(np.float64) + 1e-9 * (dense.astype(np.float64) + 1.0)
    if mode == "lexical":
        order = top_k(lexical_order, k)
        returned = lexical[order].astype(np.float64)
    else:
        # the user's words alone need their own pass only when feedback expanded the query
        own = terms if own_terms is None else own_terms
        own_scores = lexical if own == terms else index.scores(own)[rows]
        weight = lexical_weight(own_scores, index.ceiling(own))
        # the fused rule ranks, each item's BM25 with its neighbours' context ...
        order = top_k(fuse(dense, with_context(every, context)[rows], weight), k)
        # ... and each result returns its relevance, one meaning for every query and user: the
        # coverage of the user's own words, which the LLM's feedback (more words, a higher
        # ceiling, how many depending on the answer) must not lower
        returned = relevance(dense[order], own_scores[order], weight, index.ceiling(own))
    return [
        Ranked(
            position=int(rows[i]),
            score=float(s),
            dense=float(dense[i]),
            lexical=float(lexical[i]),
            dense_rank=_rank_of(dense, int(i)),
            lexical_rank=_rank_of(lexical_order, int(i)) if lexical[i] > 0 else None,
        )
        for i, s in zip(order, returned)
    ]
