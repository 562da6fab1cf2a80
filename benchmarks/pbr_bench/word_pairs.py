"""Word pairs as a second lexical field, for the #42 leads ``benchmarks/lexical_bigrams.py`` and
``benchmarks/lexical_pairs_weight.py``: each text's adjacent index terms as one more BM25 index
(the shipped ``k1``, ``b``, no stemming), and one question's legs with it."""

from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple

import numpy as np

from pbr_core.hybrid import LEXICAL_SCALE, lexical_query, lexical_weight
from pbr_core.lexical import LexicalIndex, tokenize
from pbr_core.snapshot import UserHistory

from .datasets import Query
from .lead import per_history

__all__ = ["Legs", "legs", "pair_index", "pairs"]


def pairs(text: str) -> str:
    """``text``'s adjacent index terms, each pair written as one word ("support group" ->
    "supportgroup"): a text the tokenizer reads back as exactly those pairs."""
    words = tokenize(text)
    return " ".join(a + b for a, b in pairwise(words))


def _pair_index(history: UserHistory) -> LexicalIndex:
    return LexicalIndex.build([pairs(item.text) for item in history.items], stemmer=None)


#: A user's pairs index, built once per snapshot.
pair_index = per_history(_pair_index)


class Legs(NamedTuple):
    """One question's shipped legs and weight, and its word pairs' BM25 (zeros: no pair)."""

    dense: np.ndarray
    words: np.ndarray
    weight: float
    paired: np.ndarray
    pair_coverage: float  # min(1, the pairs' best BM25 / their ceiling); 0 where none match


def legs(q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray) -> Legs:
    words = hist.lexical().scores(own).astype(np.float64)
    question_pairs = lexical_query(pairs(q.text))
    paired, coverage = np.zeros_like(words), 0.0
    if question_pairs:
        index = pair_index(hist)
        paired = index.scores(question_pairs).astype(np.float64)
        coverage = lexical_weight(paired, index.ceiling(question_pairs)) / LEXICAL_SCALE
    weight = lexical_weight(words, hist.lexical().ceiling(own))
    return Legs(hist.dense_scores(v), words, weight, paired, coverage)
