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

import numpy as np

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
        count_many: the same for many texts in one call (a tokenizer's batch encoding, about
            twice as fast per text as ``count`` on short texts), or None to call ``count``.
    """

    max_tokens: int
    count: Callable[[str], int]
    count_many: Callable[[list[str]], list[int]] | None = None

    def fits(self, text: str) -> bool:
        return self.count(text) <= self.max_tokens

    def counts(self, texts: list[str]) -> list[int]:
        """The token count of each text."""
        if self.count_many is None or not texts:
            return [self.count(text) for text in texts]
        return list(self.count_many(texts))


def _sentence_transformer_window(model: Any) -> Window | None:
    limit = getattr(model, "max_seq_length", None)
    tokenizer = getattr(model, "tokenizer", None)
    if not isinstance(limit, int) or limit <= 0 or tokenizer is None:
        return None
    if not hasattr(tokenizer, "tokenize"):
        return None
    special = getattr(tokenizer, "num_special_tokens_to_add", None)
    reserved = int(special()) if callable(special) else 2
    return Window(
        max(1, limit - reserved),
        lambda text: len(tokenizer.tokenize(text)),
        _batch_count(tokenizer),
    )


def _batch_count(tokenizer: Any) -> Callable[[list[str]], list[int]] | None:
    """A Hugging Face tokenizer's batch count (its encoding without special tokens, the tokens
    ``tokenize`` gives), or None for a tokenizer that is not callable that way."""
    if not callable(tokenizer) or not hasattr(tokenizer, "model_input_names"):
        return None

    def count_many(texts: list[str]) -> list[int]:
        encoded = tokenizer(
            texts,
            add_special_tokens=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )
        return [len(ids) for ids in encoded["input_ids"]]

    return count_many


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

    Linear in the text's length: each distinct word is counted once, a word longer than the
    window is cut by counting only prefixes about one window long, the partition is searched on
    the word counts, and each chosen window is counted once more to confirm it (a tokenizer
    whose count of a text is not the sum of its words' counts, such as SentencePiece, is
    corrected there, window by window).
    """
    if len(text) <= 8 * window.max_tokens and window.fits(text):
        return [text]  # a short text: one count (a long one is never counted whole)
    pieces = re.findall(r"\S+\s*", text)
    distinct = list(dict.fromkeys(pieces))
    known = dict(zip(distinct, window.counts(distinct)))
    counts = [known[p] for p in pieces]
    if sum(counts) <= window.max_tokens and window.fits(text):
        return [text]
    if any(c > window.max_tokens for c in counts):
        # a word that alone exceeds the window (text without spaces): cut it, and count its cuts
        cut = [part for p, c in zip(pieces, counts) for part in _cut_if_long(p, c, window)]
        pieces = [part for part, _ in cut]
        counts = [count for _, count in cut]
    bounds = _equal_bounds(np.asarray(counts, dtype=np.int64), window.max_tokens)
    runs = [pieces[a:b] for a, b in itertools.pairwise(bounds)]
    joined = ["".join(run).strip() for run in runs]
    parts: list[str] = []
    for run, part, tokens in zip(runs, joined, window.counts(joined)):
        parts += [part] if tokens <= window.max_tokens else _confirmed(run, window)
    return [p for p in parts if p]


def _equal_bounds(counts: np.ndarray, limit: int) -> list[int]:
    """Piece indices cutting ``counts`` into the fewest runs of about equal length (piece
    numbers differing by at most one) whose token sums are each at most ``limit``; greedy
    packing where no such cut comes within a few hundred tries of the estimate (pieces of very
    unequal counts)."""
    total, size = int(counts.sum()), len(counts)
    sums = np.concatenate([[0], np.cumsum(counts)])
    first = max(2, math.ceil(total / limit))
    for n in range(min(first, size), min(size, first + _EQUAL_TRIES) + 1):
        bounds = np.rint(np.arange(n + 1) * size / n).astype(np.int64)  # round half to even
        if int((sums[bounds[1:]] - sums[bounds[:-1]]).max()) <= limit:
            return bounds.tolist()
    out, start = [0], 0
    for i in range(size):
        if sums[i + 1] - sums[start] > limit:
            out.append(i)
            start = i
    return [*out, size]


# How many window numbers above the estimate the equal cut tries before packing greedily.
_EQUAL_TRIES = 256


def _confirmed(pieces: list[str], window: Window) -> list[str]:
    """``pieces`` joined as one window, or halved until each half fits, when the tokenizer
    counts the joined text longer than the sum of its pieces."""
    text = "".join(pieces).strip()
    if len(pieces) == 1 or window.fits(text):
        return [text]
    half = len(pieces) // 2
    return _confirmed(pieces[:half], window) + _confirmed(pieces[half:], window)


def _cut_if_long(word: str, count: int, window: Window) -> list[tuple[str, int]]:
    """``word`` with its count, or, when it alone exceeds the window (text without spaces:
    Chinese or Japanese, a long URL, code), its cuts into prefixes that fit and nearly fill the
    window, each with its count, so that no window is ever truncated by the embedder."""
    if count <= window.max_tokens:
        return [(word, count)]
    out: list[tuple[str, int]] = []
    start, guess = 0, window.max_tokens
    while start < len(word):
        length, tokens = _cut(word, start, window, guess)
        out.append((word[start : start + length], tokens))
        start += length
        guess = length
    return out


def _cut(word: str, start: int, window: Window, guess: int) -> tuple[int, int]:
    """The length of a prefix of ``word[start:]`` that fits the window and fills it to within
    :data:`_FILL` (or the longest that fits, or the whole rest), and its count.

    Searched from ``guess`` (the previous cut's length: text without spaces is about uniform),
    by the secant on the count, kept inside the bracket of lengths known to fit and not to fit,
    bisection where the secant does not shrink it: about one or two counts of one window's text
    per cut, so a long run costs time linear in its length. Never more than 32 characters per
    token are tried: a token rarely spans more.
    """
    limit = window.max_tokens
    enough = limit - max(1, int(limit * _FILL))
    top = min(len(word) - start, 32 * limit)
    fit, fit_tokens, fail = 0, 0, top + 1  # lengths known to fit / not to fit
    length = max(1, min(guess, top))
    for step in itertools.count():
        tokens = window.count(word[start : start + length])
        if tokens <= limit:
            fit, fit_tokens = length, tokens
            if tokens >= enough or length == top:
                break
        else:
            fail = length
        if fail - fit <= 1:
            break
        aim = (enough + limit) / 2
        secant = round(length * aim / max(tokens, 1))
        length = secant if fit < secant < fail and step < 8 else (fit + fail) // 2
    if fit == 0:  # not even one character fits: cut it alone (the embedder truncates it)
        return 1, window.count(word[start : start + 1])
    return fit, fit_tokens


# How far below the window's length a cut of text without spaces may stop (a share of it).
_FILL = 0.05
