"""Dense pseudo-relevance feedback (Rocchio on the query vector) under the shipped hybrid rule
(issue #42), no LLM.

Why: ``benchmarks/lexical_prf.py`` fed the top items' *words* back into the lexical leg and lost
PrefEval (the fillers' words came in) and LoCoMo sessions (a session's words flatten the order
below the first hit). The dense leg was never fed back. Rocchio's rule moves the query vector
towards what the first ranking found, which may bring in the other gold turns of a question
that has several (27% of LoCoMo's turn questions; R@5 asks for all of them) and the sessions
that talk about the same thing in other words:

    fb = mean of the top m items' vectors under the shipped rule (a long item: its window
         nearest the query, the one its dense score is read from)
    q' = (q + β · fb) / |q + β · fb|
    rank again: the shipped rule with the dense leg read for q', the lexical leg and its
    weight unchanged (they read the user's own words)

Grid ``m`` in {1, 3, 5} × ``β`` in {.25, .5, 1}: nine candidates, in that order.

Protocol, fixed before a number of this script was read: :mod:`pbr_bench.lead`'s, the choice
ties broken by the order above. No LLM; vectors from the on-disk embedding cache, each data
set's per-question metrics kept in ``$PBR_CACHE_DIR/dense_prf-<code>/``; deterministic.
``python benchmarks/dense_prf.py`` prints the tables and writes
``benchmarks/results/hybrid/dense_prf.{csv,json,png}``.
"""

from __future__ import annotations

import itertools

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import run
from pbr_bench.one_set import CUT
from pbr_core.hybrid import fuse, lexical_weight
from pbr_core.snapshot import UserHistory, top_k

GRID = list(itertools.product((1, 3, 5), (0.25, 0.5, 1.0)))
CANDIDATES = [f"dense prf m={m} beta={beta:g}" for m, beta in GRID]


def read_vector(history: UserHistory, position: int, vector: np.ndarray) -> np.ndarray:
    """The unit vector an item's dense score for ``vector`` is read from: the item's own, or,
    for a long item, its window nearest ``vector`` where that is nearer."""
    own = np.asarray(history.vectors[position], dtype=np.float32)
    windows = history.windows.get(history.items[position].id)
    if windows is None or not len(windows):
        return own
    rows = np.asarray(windows, dtype=np.float32)
    best = int(np.argmax(rows @ vector))
    return rows[best] if float(rows[best] @ vector) > float(own @ vector) else own


def ranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every grid point's ranking of one question (module docstring)."""
    vector = np.asarray(v, dtype=np.float32)
    lexical = hist.lexical().scores(own).astype(np.float64)
    weight = lexical_weight(lexical, hist.lexical().ceiling(own))
    first = top_k(fuse(hist.dense_scores(vector), lexical, weight), max(m for m, _ in GRID))
    out: dict[str, list[int]] = {}
    for (m, beta), label in zip(GRID, CANDIDATES):
        feedback = np.mean([read_vector(hist, int(p), vector) for p in first[:m]], axis=0)
        moved = vector + beta * feedback
        moved /= np.linalg.norm(moved)
        out[label] = top_k(fuse(hist.dense_scores(moved), lexical, weight), CUT).tolist()
    return out


def main() -> None:
    run("dense_prf", CANDIDATES, ranked, {"grid": [dict(m=m, beta=b) for m, b in GRID]})


if __name__ == "__main__":
    main()
