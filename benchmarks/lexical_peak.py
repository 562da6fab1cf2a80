"""A lexical leg whose say grows with how much its best match stands out (issue #42), no LLM.

Why: every #42 candidate strong enough in the lexical leg for LoCoMo's goals lost PrefEval at 300
fillers (``benchmarks/hybrid_frontier.py``): the fillers share the question's everyday words,
and the weight ``1.5 · c`` (``c``: how much of the question's ``Σ idf`` the best item covers)
reads the best match alone. A question whose words a filler happens to share may still see many
items score about alike, while a question about one conversation's names and places sees one
item stand out. So the weight here also reads the spread of the lexical scores:

    s_1 ≥ s_2 ≥ ...     the user's items' BM25 for the question's own words
    peak    = 1 − s_5 / s_1                                  (0 where nothing matches)
    weight  = a · c^e · peak^q

over two analyzers: the shipped one (``k1 = .5``, ``b = .25``, no stemming; ``e = 1``, so
``a = 1.5``, ``peak^0`` is the shipped rule) and the strong stemmed one of the tuning round
(English stems, ``k1 = .25``, ``b = .25``; ``e = .5``, as its ``3 √c``). Grid: analyzer ×
``a`` in {1.5, 3} × ``q`` in {1, 2}: eight candidates, in that order.

Designed after the frontier and ``benchmarks/pairs_share.py`` had been read; another look at
the same tuning split, its grid and protocol fixed before a number of this script was read:
:mod:`pbr_bench.lead`'s (admissible: no significant loss against the shipped rule, dense, BM25
or RRF on any data set's R@5 or N@5, and no more cells below the best of them than the shipped
rule; the choice: the highest mean of the four LoCoMo goal numbers, ties by the order above;
read once on the test split). No LLM; vectors from the on-disk embedding cache, per-question
metrics kept in ``$PBR_CACHE_DIR/lexical_peak-<code>/``; deterministic. ``python
benchmarks/lexical_peak.py`` prints the tables and writes
``benchmarks/results/hybrid/lexical_peak.{csv,json,png}``.
"""

from __future__ import annotations

import itertools

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import run
from pbr_bench.lexical_spread import SPREAD_RANK, fifth_to_best, stemmed
from pbr_bench.one_set import CUT
from pbr_core.hybrid import fuse
from pbr_core.snapshot import UserHistory, top_k

#: analyzer -> (its exponent e on c)
ANALYZERS = {"plain": 1.0, "stem k1=0.25 b=0.25": 0.5}
GRID = list(itertools.product(ANALYZERS, (1.5, 3.0), (1.0, 2.0)))
CANDIDATES = [f"peak {name} a={a:g} q={q:g}" for name, a, q in GRID]


def peak(scores: np.ndarray) -> float:
    """``1 − s_5 / s_1`` of the items' scores (0 where nothing matches; 1 with fewer than 5
    items matching)."""
    if np.size(scores) == 0 or float(np.max(scores)) <= 0.0:
        return 0.0
    return 1.0 - fifth_to_best(scores)


def ranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every candidate's ranking of one question (module docstring)."""
    dense = hist.dense_scores(v)
    legs = {}
    for name, index in (("plain", hist.lexical(None)), (GRID[-1][0], stemmed(hist))):
        scores = index.scores(own).astype(np.float64)
        ceiling = index.ceiling(own)
        c = min(1.0, float(scores.max()) / ceiling) if scores.size and ceiling > 0 else 0.0
        legs[name] = (scores, c, peak(scores))
    out = {}
    for (name, a, qq), label in zip(GRID, CANDIDATES, strict=True):
        scores, c, p = legs[name]
        weight = a * c ** ANALYZERS[name] * p**qq
        out[label] = top_k(fuse(dense, scores, weight), CUT).tolist()
    return out


def main() -> None:
    run(
        "lexical_peak",
        CANDIDATES,
        ranked,
        {
            "grid": [dict(analyzer=n, a=a, q=q) for n, a, q in GRID],
            "peak_rank": SPREAD_RANK,
        },
    )


if __name__ == "__main__":
    main()
