"""Lexical pseudo-relevance feedback (RM3-style, no LLM) on top of the shipped hybrid rule
(issue #42).

What: for each question, rank the user's items with the shipped hybrid rule
(:func:`pbr_core.hybrid.rank`, BM25 ``k1 = .5``, ``b = .25``, ``w = 1.5 · coverage``); take the
top ``m`` items; score their words by ``Σ tf · idf`` (term frequency in each of the ``m`` items,
idf over the user's items, BM25's idf; the question's own words and stop words excluded, ties
by the word); add the ``t`` best to the lexical query at weight ``beta`` each; rank again with
``rank(history, vector, expanded, 5, mode="hybrid", own_terms=own)`` (the user's own words
still set the lexical leg's weight). Grid: ``m`` in {3, 5}, ``t`` in {5, 10}, ``beta`` in
{.1, .25, .5}.

Protocol: :mod:`pbr_bench.lead`'s, ``benchmarks/hybrid_tuning.py``'s (the tuning split; admissible:
no significant loss against the shipped rule, dense, BM25 or RRF on any data set's R@5 or N@5,
and no more cells below the best of them than the shipped rule; the choice: the highest mean of
the four LoCoMo goal numbers, ties by the grid order; read once on the test split). This
script was first run with a weaker admissibility test (losses against the shipped rule only);
none was admissible under either rule; the candidate read for reference changed
(docs/hybrid.md).

No LLM. Embeddings come from the on-disk cache (``$PBR_CACHE_DIR``); per-question metrics are
cached in ``$PBR_CACHE_DIR/lexical_prf-<code>/<data set>.pkl``. Deterministic: no randomness, fixed
order.

Run (from the repository root)::

    python benchmarks/lexical_prf.py

Writes ``benchmarks/results/hybrid/lexical_prf.{csv,json,png}`` (every candidate on the tuning
split, the choice's paired test-split and all-question results) and prints the tables.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import run
from pbr_bench.one_set import CUT
from pbr_core.hybrid import rank
from pbr_core.lexical import LexicalIndex, tokenize
from pbr_core.snapshot import UserHistory

GRID = list(itertools.product((3, 5), (5, 10), (0.1, 0.25, 0.5)))
CANDIDATES = [f"prf m={m} t={t} beta={b:g}" for m, t, b in GRID]


def feedback_terms(index: LexicalIndex, texts: list[str], own: set[str], t: int) -> list[str]:
    """The ``t`` best words of ``texts`` (the top-ranked items) by ``Σ tf · idf`` (BM25's idf
    over the user's items), the question's own words and stop words excluded; ties by word."""
    n = len(index)
    indptr = index._tf.indptr
    weight: dict[str, float] = {}
    for text in texts:
        for term, tf in Counter(tokenize(text)).items():
            if term in own:
                continue
            col = index._vocab.get(term)
            df = 0 if col is None else int(indptr[col + 1] - indptr[col])
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            weight[term] = weight.get(term, 0.0) + tf * idf
    return [w for w, _ in sorted(weight.items(), key=lambda x: (-x[1], x[0]))[:t]]


def reranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every grid point's ranking of one question (module docstring)."""
    texts = [it.text for it in hist.items]
    index = hist.lexical()
    top = [r.position for r in rank(hist, v, own, CUT, mode="hybrid")]
    out = {}
    for (m, t, beta), label in zip(GRID, CANDIDATES):
        added = feedback_terms(index, [texts[i] for i in top[:m]], set(own), t)
        terms = dict(own)
        for w in added:
            terms[w] = terms.get(w, 0.0) + beta
        again = rank(hist, v, terms, CUT, mode="hybrid", own_terms=own)
        out[label] = [r.position for r in again]
    return out


def main() -> None:
    run("lexical_prf", CANDIDATES, reranked, {"grid": [dict(m=m, t=t, beta=b) for m, t, b in GRID]})


if __name__ == "__main__":
    main()
