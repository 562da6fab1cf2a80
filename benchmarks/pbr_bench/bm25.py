"""BM25 baseline over one user's corpus (``bm25s``, spec §4.4).

Lexical retrieval needs no encoder and no LLM: it is the floor every dense method should beat
(on LoCoMo it often does not). Tokenisation is bm25s' default (lower-case, ``\\w\\w+`` tokens,
English stop words), without stemming so the baseline has no optional dependency.

Use:
    .. code-block:: python

        from pbr_bench.bm25 import BM25Index

        index = BM25Index(corpus.ids, corpus.texts)
        index.search(["Where did I go to school?"], k=5)   # [["000000000100", ...]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["BM25Index", "bm25_rank"]


class BM25Index:
    """A BM25 index of one corpus.

    Args:
        ids: document ids, in corpus order.
        texts: document texts, aligned with ``ids``.
        k1, b: the BM25 parameters (Lucene variant, bm25s defaults).
        stopwords: a bm25s stop-word setting (``"en"``, a list, or ``None``).
    """

    def __init__(
        self,
        ids: Sequence[str],
        texts: Sequence[str],
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | list[str] | None = "en",
    ) -> None:
        import bm25s

        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids but {len(texts)} texts")
        if not ids:
            raise ValueError("cannot index an empty corpus")
        self.ids = list(ids)
        self._stopwords = stopwords
        self._retriever = bm25s.BM25(k1=k1, b=b)
        tokens = bm25s.tokenize(list(texts), stopwords=stopwords, show_progress=False)
        self._retriever.index(tokens, show_progress=False)

    def scores(self, queries: Sequence[str]) -> np.ndarray:
        """``(len(queries), len(ids))`` BM25 scores (a query with no known term scores 0)."""
        import bm25s

        out = np.zeros((len(queries), len(self.ids)), dtype=np.float32)
        tokenized = bm25s.tokenize(
            list(queries), stopwords=self._stopwords, return_ids=False, show_progress=False
        )
        for row, toks in enumerate(tokenized):
            known = [t for t in toks if t in self._retriever.vocab_dict]
            if known:
                out[row] = self._retriever.get_scores(known)
        return out

    def search(self, queries: Sequence[str], k: int) -> list[list[str]]:
        """Top-``k`` doc ids per query, best first (ties: corpus order)."""
        s = self.scores(queries)
        order = np.argsort(-s, axis=1, kind="stable")[:, : min(k, len(self.ids))]
        return [[self.ids[i] for i in row] for row in order]


def bm25_rank(
    ids: Sequence[str], texts: Sequence[str], queries: Sequence[str], k: int
) -> list[list[str]]:
    """One-shot helper: index ``texts`` and return the top-``k`` ids for each query."""
    return BM25Index(ids, texts).search(queries, k)
