"""Word pairs in the lexical leg (issue #42), no LLM.

Why: the leads so far made the lexical leg stronger by matching more (stems, feedback words,
windows) and lost PrefEval, whose filler conversations share the question's everyday words. A
pair of adjacent words ("support group", "pottery class") is rarer in a filler than either word:
matching pairs might sharpen the lexical leg's order where it is right (LoCoMo's entities and
events) without letting more fillers in. Each text's pairs are its consecutive index terms
(:func:`pbr_core.lexical.tokenize`: stop words removed first, so "went to the park" gives
"went park"), indexed as one more BM25 index (the shipped ``k1``, ``b``, no stemming); the
question's pairs query it:

    lexical = bm25_words + γ · bm25_pairs
    weight  = the shipped 1.5 · c, c read from the words alone (the pairs only reorder within
              the lexical leg, never give it more say)

Grid ``γ`` in {.25, .5, 1, 2}: four candidates, in that order.

Protocol, fixed before a number of this script was read: :mod:`pbr_bench.lead`'s, the choice
ties broken by the order above. No LLM; vectors from the on-disk embedding cache, each data
set's per-question metrics kept in ``$PBR_CACHE_DIR/lexical_bigrams-<code>/``; deterministic.
``python benchmarks/lexical_bigrams.py`` prints the tables and writes
``benchmarks/results/hybrid/lexical_bigrams.{csv,json,png}``.
"""

from __future__ import annotations

import numpy as np

from pbr_bench.datasets import Query
from pbr_bench.lead import run
from pbr_bench.one_set import CUT
from pbr_bench.word_pairs import legs
from pbr_core.hybrid import fuse
from pbr_core.snapshot import UserHistory, top_k

GAMMAS = (0.25, 0.5, 1.0, 2.0)
CANDIDATES = [f"word pairs gamma={g:g}" for g in GAMMAS]


def ranked(
    q: Query, hist: UserHistory, own: dict[str, float], v: np.ndarray
) -> dict[str, list[int]]:
    """Every candidate's ranking of one question (module docstring)."""
    x = legs(q, hist, own, v)
    return {
        label: top_k(fuse(x.dense, x.words + gamma * x.paired, x.weight), CUT).tolist()
        for gamma, label in zip(GAMMAS, CANDIDATES)
    }


def main() -> None:
    run("lexical_bigrams", CANDIDATES, ranked, {"gammas": list(GAMMAS)})


if __name__ == "__main__":
    main()
