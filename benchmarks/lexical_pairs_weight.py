"""Word pairs that also give the lexical leg more say (issue #42), no LLM.

Why: in ``benchmarks/lexical_bigrams.py`` PrefEval's fillers matched none of a question's word
pairs: its rankings did not move at all, while LoCoMo gained a little. The lexical weight there
was still read from the words alone (``1.5 · c``), so a matched pair could only reorder the
lexical leg. Every earlier lead that gave the lexical leg more say lost PrefEval, because the
fillers' words matched too; pairs are evidence the fillers lack. So here a matched pair also
raises the weight:

    c_p     = min(1, max BM25 of the pairs / its ceiling)      (0 where no pair matches)
    weight  = 1.5 · (c + δ · c_p)
    lexical = bm25_words + γ · bm25_pairs                      (as in lexical_bigrams.py)

Grid ``γ`` in {.25, .5, 1} × ``δ`` in {.5, 1, 2}: nine candidates, in that order. Designed after
``lexical_bigrams.py``'s tables had been read (its choice, ``γ = .25``, on the test split too),
on the same tuning split; its own grid and protocol fixed before a number of this script was
read: :mod:`pbr_bench.lead`'s, the choice ties broken by the order above. No LLM; vectors from
the on-disk embedding cache, each data set's per-question metrics kept in
``$PBR_CACHE_DIR/lexical_pairs_weight-<code>/``; deterministic. ``python
benchmarks/lexical_pairs_weight.py`` prints the tables and writes
``benchmarks/results/hybrid/lexical_pairs_weight.{csv,json,png}``.
"""

from __future__ import annotations

import itertools

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import run
from pbr_bench.one_set import CUT
from pbr_bench.word_pairs import legs
from pbr_core.hybrid import LEXICAL_SCALE, fuse
from pbr_core.snapshot import UserHistory, top_k

GRID = list(itertools.product((0.25, 0.5, 1.0), (0.5, 1.0, 2.0)))
CANDIDATES = [f"pairs gamma={g:g} delta={d:g}" for g, d in GRID]


def ranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every candidate's ranking of one question (module docstring)."""
    x = legs(q, hist, own, v)
    return {
        label: top_k(
            fuse(
                x.dense,
                x.words + gamma * x.paired,
                x.weight + LEXICAL_SCALE * delta * x.pair_coverage,
            ),
            CUT,
        ).tolist()
        for (gamma, delta), label in zip(GRID, CANDIDATES)
    }


def main() -> None:
    run(
        "lexical_pairs_weight",
        CANDIDATES,
        ranked,
        {"grid": [dict(gamma=g, delta=d) for g, d in GRID]},
    )


if __name__ == "__main__":
    main()
