"""How the lexical scores of one question spread over a user's items, for the #42 leads
``benchmarks/lexical_peak.py`` and ``benchmarks/lexical_flat.py``: the tuning round's strong
stemmed analyzer, built once per snapshot, and the ratio of the 5th best score to the best."""

from __future__ import annotations

import numpy as np

from pbr_core.lexical import LexicalIndex
from pbr_core.snapshot import UserHistory

from .lead import per_history

__all__ = ["SPREAD_RANK", "fifth_to_best", "stemmed"]

#: The rank whose score the best is compared with.
SPREAD_RANK = 5


def _stemmed(history: UserHistory) -> LexicalIndex:
    texts = [item.text for item in history.items]
    return LexicalIndex.build(texts, k1=0.25, b=0.25, stemmer="english")


#: A user's English-stemmed BM25 index with ``k1 = .25``, ``b = .25``, built once per snapshot.
stemmed = per_history(_stemmed)


def fifth_to_best(scores: np.ndarray) -> float:
    """``s_5 / s_1`` of the items' scores, in [0, 1]: near 1 where many items match about as
    well as the best, 0 where fewer than 5 match (or none)."""
    top = np.sort(np.asarray(scores, dtype=np.float64))[::-1]
    if top.size < SPREAD_RANK or top[0] <= 0.0:
        return 0.0
    return float(top[SPREAD_RANK - 1] / top[0])
