"""Synthetic corpora for the speed benchmarks: Zipf-like text with real stop words.

Sentences of 8-30 words drawn from a vocabulary of 20k pseudo-words (p ∝ 1/rank^1.07) whose 60
most frequent ranks are English stop words, as in real text, so BM25 postings have realistic
lengths. Shared by ``benchmarks/lexical_speed.py`` and ``benchmarks/hybrid_speed.py``.
"""

from __future__ import annotations

import numpy as np

from pbr_core.lexical import ENGLISH_STOP_WORDS

N_QUERIES = 50
VOCAB_SIZE = 20_000
N_STOP = 60
ZIPF_S = 1.07
QUERY_TERMS = 5


def vocabulary(rng: np.random.Generator) -> list[str]:
    """20k distinct lower-case pseudo-words; the first N_STOP ranks are stop words."""
    stop = sorted(w for w in ENGLISH_STOP_WORDS if len(w) >= 2)[:N_STOP]
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: list[str] = list(stop)
    seen = set(words)
    while len(words) < VOCAB_SIZE:
        w = "".join(rng.choice(letters, size=int(rng.integers(3, 11))))
        if w not in seen and w not in ENGLISH_STOP_WORDS:
            seen.add(w)
            words.append(w)
    return words


def zipf_p(n: int) -> np.ndarray:
    """The probabilities of ranks 1..n, p ∝ 1/rank^ZIPF_S."""
    p = 1.0 / np.arange(1, n + 1) ** ZIPF_S
    return p / p.sum()


def corpus(n: int, words: list[str], rng: np.random.Generator) -> list[str]:
    """``n`` sentences of 8-30 Zipf-drawn words."""
    lengths = rng.integers(8, 31, size=n)
    ids = rng.choice(len(words), size=int(lengths.sum()), p=zipf_p(len(words)))
    vocab = np.array(words, dtype=object)[ids]
    out, at = [], 0
    for length in lengths.tolist():
        out.append(" ".join(vocab[at : at + length]).capitalize() + ".")
        at += length
    return out


def queries(
    words: list[str], rng: np.random.Generator, frequent: bool = False, n: int = N_QUERIES
) -> list[str]:
    """``n`` queries of QUERY_TERMS content words: Zipf-drawn, or uniform over the 100 most
    frequent content words (``frequent``: long postings only)."""
    content = words[N_STOP:]
    if frequent:
        ids = rng.integers(0, 100, size=(n, QUERY_TERMS))
    else:
        ids = rng.choice(len(content), size=(n, QUERY_TERMS), p=zipf_p(len(content)))
    return [" ".join(content[i] for i in row) for row in ids]
