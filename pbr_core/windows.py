"""Long items are never silently truncated: windows the embedder can read whole.

all-MiniLM-L6-v2 reads 256 word pieces; a LoCoMo session is thousands. Embedded whole, a long
item is its first few paragraphs, and a question about its end cannot find it (LoCoMo session
level: dense R@5 .46 truncated, .70 with windows). pbr splits such an item into windows of at
most the embedder's length (of about equal size, cut between words), embeds
each window, and scores the item by its best window (:meth:`UserHistory.dense_scores`). The
item's own vector (what a host store holds, what the anchor and the related history use) stays
the embedder's embedding of the whole text, as the host would compute it.

The window is read from the model, never assumed: an embedder may say it itself
(``window() -> Window | None``), else pbr looks for a sentence-transformers model inside it
(``max_seq_length`` and its tokenizer: LangChain's ``HuggingFaceEmbeddings``, LlamaIndex's
``HuggingFaceEmbedding``, pbr's embedded MiniLM). An embedder whose window cannot be read (an
API model with a long context) gets no windows.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Window", "split", "window_of"]

# Attributes under which wrappers keep the model they wrap (pbr's bridges, LangChain's
# HuggingFaceEmbeddings ``_client``, LlamaIndex's HuggingFaceEmbedding ``_model``, ...).
_INNER = (
    "embed_model",
    "embeddings",
    "embedder",
    "_embedder",
    "_model",
    "model",
    "_client",
    "client",
)


@dataclass(frozen=True)
class Window:
    """How much text an embedder reads.

    Attributes:
        max_tokens: tokens of text per input (the model's limit less its special tokens).
        count: the number of tokens of a text, as the embedder's tokenizer counts them.
    """

    max_tokens: int
    count: Callable[[str], int]

    def fits(self, text: str) -> bool:
        return self.count(text) <= self.max_tokens


def _sentence_transformer_window(model: Any) -> Window | None:
    limit = getattr(model, "max_seq_length", None)
    tokenizer = getattr(model, "tokenizer", None)
    if not isinstance(limit, int) or limit <= 0 or tokenizer is None:
        return None
    if not hasattr(tokenizer, "tokenize"):
        return None
    special = getattr(tokenizer, "num_special_tokens_to_add", None)
    reserved = int(special()) if callable(special) else 2
    return Window(max(1, limit - reserved), lambda text: len(tokenizer.tokenize(text)))


def window_of(embedder: object, _depth: int = 0) -> Window | None:
    """The embedder's window, or None when it cannot be read (then items are not split)."""
    own = getattr(embedder, "window", None)
    if callable(own) and not isinstance(embedder, type):
        found = own()
        if found is None or isinstance(found, Window):
            return found
    window = _sentence_transformer_window(embedder)
    if window is not None or _depth >= 3:
        return window
    for name in _INNER:
        try:
            inner = getattr(embedder, name, None)
        except Exception:  # a lazy property that fails: no window from it
            inner = None
        if inner is not None and inner is not embedder and not isinstance(inner, (str, int)):
            window = window_of(inner, _depth + 1)
            if window is not None:
                return window
    return None


def split(text: str, window: Window) -> list[str]:
    """``text`` as consecutive windows of about equal length that each fit ``window``; a text
    that fits is one window, itself.

    Equal, not greedy: greedy packing leaves a short last window, and a fragment of a few words
    can match a query better than any whole part of the item (max-pooling then rewards length;
    LoCoMo session level, tuning split: R@5 .860 greedy, .867 equal, with hybrid search). Cut
    between words, the text's own whitespace (line breaks) kept inside each window.
    """
    if window.fits(text):
        return [text]
    pieces = re.findall(r"\S+\s*", text)
    first = n = max(2, math.ceil(window.count(text) / window.max_tokens))
    cut_words = False
    while True:
        n = min(n, len(pieces))
        bounds = [round(i * len(pieces) / n) for i in range(n + 1)]  # sizes differ by <= 1
        parts = ["".join(pieces[a:b]).strip() for a, b in itertools.pairwise(bounds)]
        if all(window.fits(p) for p in parts):
            return [p for p in parts if p]
        if n == len(pieces):
            if cut_words:  # every piece fits alone: nothing finer to cut
                return [p for p in parts if p]
            # one window per word and one still too long: a word that alone exceeds the window
            # (text without spaces). Only now is each word counted, and the long ones cut.
            pieces = [cut for piece in pieces for cut in _fitting(piece, window)]
            n, cut_words = first, True
            continue
        n += 1


def _fitting(word: str, window: Window) -> list[str]:
    """``word`` itself, or, when it alone exceeds the window (text without spaces: Chinese or
    Japanese, a long URL, code), cut into the longest prefixes that fit (binary search on the
    embedder's count), so that no window is ever truncated by the embedder."""
    if window.fits(word):
        return [word]
    out: list[str] = []
    rest = word
    while rest and not window.fits(rest):
        # the longest fitting prefix is in [1, hi]; a token rarely spans 32 characters, so
        # searching beyond that many per token only costs tokenizer time (quadratic on a long run)
        lo, hi = 1, min(len(rest), 32 * window.max_tokens)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if window.fits(rest[:mid]):
                lo = mid
            else:
                hi = mid - 1
        out.append(rest[:lo])
        rest = rest[lo:]
    if rest:
        out.append(rest)
    return out
