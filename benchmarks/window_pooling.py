"""How a long item's windows make its dense score: the best window, or a pooling of several
(issue #42), no LLM.

Why: LoCoMo's session-level goals (R@5 ≥ .88, recall_any@5 ≥ .94) stay out of reach after
every lexical lead (stemming, two fields, windows' BM25, feedback). The dense leg scores a long
item by its best window (:mod:`pbr_core.windows`, "MaxP" in passage ranking); a session that
talks about the question's subject in several of its windows scores no higher than one that
touches it once. Pooling several windows' cosines is the other classic choice (soft maximum,
mean of the best few). On data sets whose items fit in one window nothing changes: an item's
one score is its own cosine under every candidate below.

Per item ``d``, ``S(d)`` = the cosines with the query vector of its whole-text vector and of
each of its windows (one element for an item that fits; the shipped score is ``max S(d)``).
Candidates, in this order:

    soft max .02        τ · log Σ_{s ∈ S(d)} exp((s − max S) / τ) + max S,  τ = .02
    soft max .05        the same with τ = .05
    mean of best 2      the mean of the two highest of S(d) (of the one, for an item that fits)
    mean of best 3      the mean of the three highest (of all, where S(d) has fewer)

each clipped to [−1, 1] and used as the dense leg of the shipped fusion
(:func:`pbr_core.hybrid.fuse`, weight ``1.5 · c``, the shipped BM25).

Protocol: :mod:`pbr_bench.lead`'s (the tuning split; admissible: no significant loss against
the shipped rule, dense, BM25 or RRF on any data set's R@5 or N@5, and no more cells below the
best of them than the shipped rule; the choice: the highest mean of the four LoCoMo goal
numbers, ties by the order above; read once on the test split). Fixed before a number of this
script was read.

No LLM. Embeddings come from the on-disk cache (``$PBR_CACHE_DIR``); per-question metrics are
cached in ``$PBR_CACHE_DIR/window_pooling-<code>/<data set>.pkl``. Deterministic.

Run (from the repository root)::

    python benchmarks/window_pooling.py

Writes ``benchmarks/results/hybrid/window_pooling.{csv,json,png}`` and prints the tables.
"""

from __future__ import annotations

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import per_history, run
from pbr_bench.one_set import CUT
from pbr_core.hybrid import fuse, lexical_weight
from pbr_core.snapshot import UserHistory, top_k

CANDIDATES = ["soft max .02", "soft max .05", "mean of best 2", "mean of best 3"]


class WindowScores:
    """One user's item and window vectors as one matrix, and which rows are whose."""

    def __init__(self, history: UserHistory) -> None:
        rows: list[np.ndarray] = [np.asarray(history.vectors, dtype=np.float32)]
        owners: list[np.ndarray] = [np.arange(len(history), dtype=np.int64)]
        for item_id, windows in history.windows.items():
            position = history.position(item_id)
            assert position is not None
            rows.append(np.asarray(windows, dtype=np.float32))
            owners.append(np.full(len(windows), position, dtype=np.int64))
        self.matrix = np.concatenate(rows)
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")  # each item's rows together
        self.matrix, self.owner = self.matrix[order], owner[order]
        self.starts = np.flatnonzero(np.r_[True, self.owner[1:] != self.owner[:-1]])
        self.n = len(history)

    def pooled(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        """Each candidate's dense score per item, and ``max`` (the shipped one)."""
        s = (self.matrix @ np.asarray(vector, dtype=np.float32)).astype(np.float64)
        best = np.maximum.reduceat(s, self.starts)
        out = {"max": best}
        for tau, label in ((0.02, "soft max .02"), (0.05, "soft max .05")):
            mass = np.add.reduceat(np.exp((s - best[self.owner]) / tau), self.starts)
            out[label] = np.clip(best + tau * np.log(mass), -1.0, 1.0)
        for m, label in ((2, "mean of best 2"), (3, "mean of best 3")):
            out[label] = np.array([np.sort(part)[-m:].mean() for part in self._parts(s)])
        return out

    def _parts(self, s: np.ndarray) -> list[np.ndarray]:
        return np.split(s, self.starts[1:])


_of = per_history(WindowScores)


def ranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every candidate's ranking of one question (module docstring)."""
    pooled = _of(hist).pooled(v)
    # the shipped dense leg, to the rounding of one float32 product
    assert np.allclose(pooled["max"], hist.dense_scores(v), atol=1e-5)
    lexical = hist.lexical().scores(own).astype(np.float64)
    weight = lexical_weight(lexical, hist.lexical().ceiling(own))
    return {
        label: top_k(fuse(pooled[label], lexical, weight), CUT).tolist() for label in CANDIDATES
    }


def main() -> None:
    run("window_pooling", CANDIDATES, ranked, {"candidates": CANDIDATES})


if __name__ == "__main__":
    main()
