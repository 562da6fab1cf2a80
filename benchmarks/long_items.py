"""A lexical leg that weighs more where the user's items are longer than the embedder reads
(issue #42), no LLM.

Why: LoCoMo's session-level goals (R@5 ≥ .88, recall_any@5 ≥ .94) stay out of reach under one
parameter set: every rule with a lexical leg strong enough for sessions (the tuning round's
stemmed ``w = 3 √c``) lets PrefEval's fillers into the top 5. The two kinds of data differ in
one thing a rule can read without labels: the length of the items. A LoCoMo session is
thousands of word pieces; the dense leg sees it through its best window of 256
(:mod:`pbr_core.windows`), while BM25 reads every word of it. PrefEval's and PersonaBench's
messages and LoCoMo's turns mostly fit in one window, where the dense leg reads all of an item.
So the lexical leg's say may grow with the share of the user's items the dense leg reads only in
part:

    f = (items with windows) / (items)                    (0..1, per user)
    w = 1.5 · c · (1 + λ · f)                             (the shipped weight at f = 0)

and, for the stemmed candidates, the lexical leg (scores and ceiling) is the stemmed index
where ``f ≥ 1/2`` (the unstemmed one elsewhere). Grid ``λ`` in {.5, 1, 2} × {words, stems where
long}, then ``λ = 0`` with stems where long: seven candidates, in that order.

Protocol: :mod:`pbr_bench.lead`'s (the tuning split; admissible: no significant loss against
the shipped rule, dense, BM25 or RRF on any data set's R@5 or N@5, and no more cells below the
best of them than the shipped rule; the choice: the highest mean of the four LoCoMo goal
numbers, ties by the order above; read once on the test split). Fixed before a number of this
script was read. Only a data set whose users hold long items can move: the script prints ``f``
per data set, so a reader sees which.

No LLM. Embeddings come from the on-disk cache (``$PBR_CACHE_DIR``); per-question metrics are
cached in ``$PBR_CACHE_DIR/long_items-<code>/<data set>.pkl``. Deterministic.

Run (from the repository root)::

    python benchmarks/long_items.py

Writes ``benchmarks/results/hybrid/long_items.{csv,json,png}`` and prints the tables.
"""

from __future__ import annotations

import itertools
import json
import time

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import Candidates, collect, report
from pbr_bench.one_set import CUT, load_all, views
from pbr_bench.paths import RESULTS_DIR, scratch_dir
from pbr_core.hybrid import LEXICAL_SCALE, fuse, lexical_weight
from pbr_core.snapshot import UserHistory, top_k

GRID = [*itertools.product((0.5, 1.0, 2.0), ("words", "stems")), (0.0, "stems")]
CANDIDATES = [f"long lambda={lam:g} {analyzer}" for lam, analyzer in GRID]
#: Share of long items from which a "stems" candidate reads the stemmed index.
STEMS_FROM = 0.5


def long_share(history: UserHistory) -> float:
    """The share of the user's items the dense leg reads through windows (0..1)."""
    return len(history.windows) / len(history) if len(history) else 0.0


def ranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every grid point's ranking of one question (module docstring)."""
    f = long_share(hist)
    dense = hist.dense_scores(v)
    out: dict[str, list[int]] = {}
    for (lam, analyzer), label in zip(GRID, CANDIDATES):
        index = hist.lexical("english" if analyzer == "stems" and f >= STEMS_FROM else None)
        lexical = index.scores(own)
        # lexical_weight's 1.5 · c, scaled: (1 + λ f) · 1.5 · min(1, max / ceiling)
        weight = (1.0 + lam * f) * lexical_weight(lexical, index.ceiling(own))
        assert weight <= (1.0 + lam) * LEXICAL_SCALE + 1e-9
        out[label] = top_k(fuse(dense, lexical, weight), CUT).tolist()
    return out


def _noting_shares(name: str, into: dict[str, list[float]], rows_cached: bool) -> Candidates:
    """``ranked``, noting each question's ``f`` under ``name`` (anew where its rows are not
    cached: they are computed again)."""
    if not rows_cached:
        into[name] = []

    def candidates(
        q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
    ) -> dict[str, list[int]]:
        into.setdefault(name, []).append(long_share(hist))
        return ranked(q, hist, own, v)

    return candidates


def main() -> None:
    """:func:`pbr_bench.lead.run`, with each data set's long-item shares (per question: its
    user's ``f``) kept beside the cached rows and written into the results."""
    t0 = time.perf_counter()
    cache = scratch_dir("long_items", __file__)
    shares_file = cache / "shares.json"
    shares: dict[str, list[float]] = (
        json.loads(shares_file.read_text()) if shares_file.exists() else {}
    )
    sets = views(
        load_all(
            lambda name: collect(
                name, cache, _noting_shares(name, shares, (cache / f"{name}.pkl").exists())
            )
        )
    )
    shares_file.write_text(json.dumps(shares))
    summary = {
        name: {"mean": float(np.mean(f)), "min": float(np.min(f)), "max": float(np.max(f))}
        for name, f in sorted(shares.items())
    }
    for name, s in summary.items():
        print(f"{name:24} long-item share f: mean {s['mean']:.3f} ({s['min']:.3f}-{s['max']:.3f})")
    extra = {
        "grid": [dict(lam=lam, analyzer=a) for lam, a in GRID],
        "stems_from": STEMS_FROM,
        "long-item share per data set (per question, its user's f)": summary,
    }
    report(sets, CANDIDATES, RESULTS_DIR / "hybrid" / "long_items", extra)
    print(f"({time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
    main()
