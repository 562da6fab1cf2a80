"""A lexical leg with more say where many items match about as well as the best (issue #42), no
LLM.

Why: ``benchmarks/lexical_peak.py`` weighed the lexical leg by how much its best match stands
out, and found the opposite of its hope: on LoCoMo many turns match about as well as the best
(the 5th best scores near the first), and the weight fell where the goals need it to rise, while
PrefEval at 300 fillers barely moved (its best lexical match mostly stands alone). So here the
weight rises with that ratio instead, on top of the shipped one:

    flat    = s_5 / s_1        (the user's items' BM25 for the question's own words; 0 where
                                fewer than 5 items match)
    weight  = 1.5 · c · (1 + λ · flat)

over the shipped analyzer and the tuning round's stemmed one (English stems, ``k1 = .25``,
``b = .25``, with ``c`` read from it). Grid: analyzer × ``λ`` in {1, 2, 4}: six candidates, in
that order.

Designed after ``lexical_peak.py``'s tables (its test split too) had been read: another look at
the same tuning split, its grid and protocol fixed before a number of this script was read:
:mod:`pbr_bench.lead`'s (admissible: no significant loss against the shipped rule, dense, BM25
or RRF on any data set's R@5 or N@5, and no more cells below the best of them than the shipped
rule; the choice: the highest mean of the four LoCoMo goal numbers, ties by the order above;
read once on the test split). No LLM; vectors from the on-disk embedding cache, per-question
metrics kept in ``$PBR_CACHE_DIR/lexical_flat-<code>/``; deterministic. ``python
benchmarks/lexical_flat.py`` prints the tables and writes
``benchmarks/results/hybrid/lexical_flat.{csv,json,png}``.
"""

from __future__ import annotations

import itertools

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import run
from pbr_bench.lexical_spread import SPREAD_RANK, fifth_to_best, stemmed
from pbr_bench.one_set import CUT
from pbr_core.hybrid import fuse, lexical_weight
from pbr_core.snapshot import UserHistory, top_k

ANALYZERS = ("plain", "stem k1=0.25 b=0.25")
GRID = list(itertools.product(ANALYZERS, (1.0, 2.0, 4.0)))
CANDIDATES = [f"flat {name} lambda={lam:g}" for name, lam in GRID]


def ranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every candidate's ranking of one question (module docstring)."""
    dense = hist.dense_scores(v)
    legs = {}
    for name, index in zip(ANALYZERS, (hist.lexical(None), stemmed(hist)), strict=True):
        scores = index.scores(own).astype(np.float64)
        legs[name] = (scores, lexical_weight(scores, index.ceiling(own)), fifth_to_best(scores))
    out = {}
    for (name, lam), label in zip(GRID, CANDIDATES, strict=True):
        scores, weight, flat = legs[name]
        out[label] = top_k(fuse(dense, scores, weight * (1.0 + lam * flat)), CUT).tolist()
    return out


def main() -> None:
    run(
        "lexical_flat",
        CANDIDATES,
        ranked,
        {"grid": [dict(analyzer=n, lam=lam) for n, lam in GRID], "spread_rank": SPREAD_RANK},
    )


if __name__ == "__main__":
    main()
