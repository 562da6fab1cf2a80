"""A per-user BM25 lexical index over the items of one user's history.

Dense retrieval misses exact words (names, codes, years) that a user's own items share with the
query; BM25 over the same items catches them. The index is an immutable snapshot, like the
history it mirrors: a change makes a new index with :meth:`LexicalIndex.derived`, cheaply, and
the old one stays valid for the threads still reading it.

Scoring is BM25 as Lucene computes it (``bm25s``' default ``method="lucene"``), for a query term
``t`` of weight ``w`` and an item ``d``::

    idf(t)     = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    score(d)  += w · idf(t) · tf(t, d) / (tf(t, d) + k1 · (1 - b + b · dl(d) / avgdl))

with ``N`` items, ``df`` the number of items containing ``t``, ``tf`` the raw count of ``t`` in
``d``, ``dl`` the item's length in tokens (after stop-word removal) and ``avgdl`` their mean.
``idf`` and ``avgdl`` change with every added or removed item, so only raw counts are stored and
the formula is evaluated at query time over the postings of the query's terms alone.

Analysis matches ``bm25s.tokenize``: lower-case the text, take the matches of ``(?u)\\b\\w\\w+\\b``
(scikit-learn's and bm25s' default pattern: runs of two or more word characters, so single letters
and punctuation are dropped and "don't" gives "don") and drop :data:`ENGLISH_STOP_WORDS`
(:func:`tokenize`: the *words*); an index built with ``stemmer="english"`` then reduces each word
to its stem with the English Snowball stemmer (PyStemmer, the one bm25s uses: "visited", "visiting"
and "visits" all index as "visit"). The stemmer belongs to the index (:attr:`LexicalIndex.stemmer`,
default :data:`DEFAULT_STEMMER`, None: the words as they are; stemming raised LoCoMo's recall but
lowered PrefEval's N@5, ``docs/hybrid.md``): a query is given as words (a string, or the term ->
weight mapping of :func:`query_terms`) and the index stems them itself, so items and queries, LLM
feedback included, always meet under one analyzer, and an index derived from another keeps its
analyzer.
"""

from __future__ import annotations

import math
import re
import sys
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, get_args

import numpy as np
import scipy.sparse as sp

from ._marks import MARKS

__all__ = [
    "DEFAULT_B",
    "DEFAULT_K1",
    "DEFAULT_STEMMER",
    "ENGLISH_STOP_WORDS",
    "STEMMERS",
    "TOKENIZER_VERSION",
    "LexicalIndex",
    "StemmerName",
    "analyze",
    "query_terms",
    "stem",
    "tokenize",
]

#: CPython caches the ints -5..256: column numbers past them are one int object each.
_SMALL_INTS = 257
_INT_BYTES = sys.getsizeof(2**20)

#: The stemmers an index can analyze with (Snowball algorithm names of PyStemmer).
StemmerName = Literal["english"]
STEMMERS: tuple[StemmerName, ...] = get_args(StemmerName)
#: What :meth:`LexicalIndex.build` analyzes with unless told (None: the words as they are).
DEFAULT_STEMMER: StemmerName | None = None
#: BM25's term-frequency saturation and length normalisation unless told: lower than bm25s'
#: 1.5 and 0.75, so a short item holding a question word once is not outscored by a long item
#: repeating it; chosen with the hybrid rule on the tuning split of every data set
#: (``benchmarks/hybrid_tuning.py``, ``docs/hybrid.md``).
DEFAULT_K1 = 0.5
DEFAULT_B = 0.25

# Alphabetical, one initial letter a line.
_STOP_WORDS = """
    a about above after again against ain all also am an and any are aren as at
    be because been before being below between both but by
    can could couldn
    did didn do does doesn doing don down during
    each either
    few for from further
    had hadn has hasn have haven having he her here hers herself him himself his how
    i if in into is isn it its itself
    just
    ll
    me might mightn more most must mustn my myself
    needn neither no nor not now
    of off on once only or other ought our ours ourselves out over own
    re
    same shall shan she should shouldn so some such
    than that the their theirs them themselves then there these they this those through to too
    under until up upon us
    ve very
    was wasn we were weren what whatever when where whether which while who whom whose why will
    with within without would wouldn
    yet you your yours yourself yourselves
"""
#: Function words that say nothing about what an item is about, lower-case. A list of our own in
#: the spirit of the NLTK and Lucene English lists, with the fragments the token pattern leaves of
#: contractions ("don't" -> "don", "I'll" -> "ll"), but not "won" ("won't"), which is also a
#: content word, nor "may", which is also a month. Single letters never survive the token pattern
#: and are listed only for completeness.
ENGLISH_STOP_WORDS: frozenset[str] = frozenset(_STOP_WORDS.split())

#: The tokenizer's version, kept with what holds BM25 indexes (a pickled history, a shared
#: state's format), so an index of another version is rebuilt, not read: 3 reads a dotted
#: capital I (Turkish "İ", which lower-cases to "i" and a combining dot) as "i"; 2 keeps
#: combining marks and matches text in NFC form; 1 cut words at their marks.
TOKENIZER_VERSION = 3

_TOKEN = re.compile(r"(?u)\b\w\w+\b")
# The same runs of two or more word characters, combining marks counted as word characters
# (for text that is not ASCII: with no mark, it finds exactly what _TOKEN finds).
_TOKEN_WITH_MARKS = re.compile(f"[\\w{MARKS}]{{2,}}")


def tokenize(text: str) -> list[str]:
    """The index terms of ``text``, in order, repeats kept (they are the term frequencies).

    Lower-cased before matching, as bm25s does, so that an item and a query written in different
    case meet; digit runs ("2023") are terms like any other. Text that is not ASCII is put in
    NFC form first (``"cafe\u0301"`` and ``"café"`` are one term), and a word's combining
    marks are part of it (the vowel signs of Devanagari, Bengali, Tamil or Thai; without them
    such words were cut into fragments). A dotted capital I ("İ") is read as "i", as its
    lower case is written without the dot.
    """
    if text.isascii():
        found = _TOKEN.findall(text.lower())
    else:
        if not unicodedata.is_normalized("NFC", text):
            text = unicodedata.normalize("NFC", text)
        # "İstanbul".lower() is "i\u0307stanbul": without the dot it meets "istanbul"
        found = _TOKEN_WITH_MARKS.findall(text.lower().replace("i\u0307", "i"))
    return [t for t in found if t not in ENGLISH_STOP_WORDS]


def check_stemmer(stemmer: object) -> StemmerName | None:
    """``stemmer`` if it names a known stemmer (or is None: no stemming), else ValueError."""
    if stemmer is not None and stemmer not in STEMMERS:
        raise ValueError(f"stemmer must be one of {STEMMERS} or None, got {stemmer!r}")
    return stemmer


# PyStemmer's stemmer objects are not thread-safe: one per thread and language. Each keeps its
# own cache of recent words (10,000 by default), which is most of its speed on chat text.
_stemmers = threading.local()


def _stem_words(stemmer: StemmerName) -> Callable[[list[str]], list[str]]:
    made: dict[str, Callable[[list[str]], list[str]]] | None = getattr(_stemmers, "by_name", None)
    if made is None:
        made = _stemmers.by_name = {}
    fn = made.get(stemmer)
    if fn is None:
        import Stemmer  # PyStemmer

        fn = made[stemmer] = Stemmer.Stemmer(stemmer).stemWords
    return fn


def stem(words: Sequence[str], stemmer: StemmerName | None) -> list[str]:
    """``words`` reduced to their stems (``stemmer=None``: unchanged), in order."""
    if stemmer is None or not words:
        return list(words)
    return _stem_words(stemmer)(list(words))


def analyze(text: str, stemmer: StemmerName | None = DEFAULT_STEMMER) -> list[str]:
    """The index terms of ``text`` under ``stemmer``: :func:`tokenize`, then :func:`stem`."""
    return stem(tokenize(text), stemmer)


def query_terms(parts: Sequence[tuple[str, float]]) -> dict[str, float]:
    """A weighted query from several texts: word -> sum over parts of weight × count in part.

    Lets the user's own words count more than generated expansions, e.g.
    ``[(query, 1.0), (pseudo_utterance, 0.3)]``. The keys are words (:func:`tokenize`), not
    stems: the index that scores the query stems them with its own analyzer. Words keep their
    first-appearance order, which fixes the order of the floating-point sums in
    :meth:`LexicalIndex.scores`.
    """
    weights: dict[str, float] = {}
    for text, weight in parts:
        w = float(weight)
        for term, count in Counter(tokenize(text)).items():
            weights[term] = weights.get(term, 0.0) + w * count
    return weights


def _count(
    texts: Sequence[str], vocab: dict[str, int], stemmer: StemmerName | None
) -> tuple[sp.csc_matrix, np.ndarray]:
    """Raw term counts of ``texts`` (items × terms, CSC) and their lengths in tokens.

    New terms are appended to ``vocab`` (mutated) as new columns, so a dict's insertion order is
    always its column order.
    """
    cols: list[int] = []
    lengths: list[int] = []
    stem_words = None if stemmer is None else _stem_words(stemmer)
    for text in texts:
        tokens = tokenize(text)
        if stem_words is not None and tokens:
            tokens = stem_words(tokens)
        lengths.append(len(tokens))
        cols.extend([vocab.setdefault(t, len(vocab)) for t in tokens])
    dl = np.asarray(lengths, dtype=np.int32)
    rows = np.repeat(np.arange(len(texts), dtype=np.int32), dl)
    ones = np.ones(len(cols), dtype=np.int32)
    counts = sp.coo_matrix(
        (ones, (rows, np.asarray(cols, dtype=np.int32))), shape=(len(texts), len(vocab))
    ).tocsc()  # sums the repeats of a term within an item: the term frequencies
    counts.sum_duplicates()
    return counts, dl


class LexicalIndex:
    """BM25 (Lucene variant, as bm25s' default ``method="lucene"``:
    ``idf = ln(1 + (N - df + 0.5)/(df + 0.5))``, term part
    ``tf / (tf + k1 * (1 - b + b * dl / avgdl))``) over one user's items.

    Immutable: build one with :meth:`build`, change it with :meth:`derived`. Stores a vocabulary
    (term -> column), the raw term frequencies as a CSC matrix (items × terms, so a term's
    postings are one contiguous slice) and the item lengths in tokens; nothing that depends on
    ``N`` or ``avgdl``. Safe to read from several threads, and picklable.

    Attributes:
        k1: term-frequency saturation (≥ 0; 0 makes BM25 count presence only).
        b: length normalisation in [0, 1] (0: none, 1: full).
        stemmer: the analyzer's stemmer (None: words as they are). Items were indexed with it
            and every query is stemmed with it; :meth:`derived` keeps it.
    """

    k1: float
    b: float
    # An index pickled before stemming existed indexed words as they are.
    stemmer: StemmerName | None = None

    def __init__(
        self,
        vocab: Mapping[str, int],
        tf: sp.csc_matrix,
        dl: np.ndarray,
        *,
        k1: float,
        b: float,
        stemmer: StemmerName | None = None,
    ) -> None:
        """Wrap prepared parts (use :meth:`build`); the arguments are owned by the index."""
        self.k1 = k1
        self.b = b
        self.stemmer = stemmer
        self._vocab = vocab
        self._tf = tf
        self._dl = dl
        n = int(dl.shape[0])
        total = int(dl.sum(dtype=np.int64))
        # The length part of the BM25 denominator, per item. It depends on avgdl, so it is
        # recomputed for every snapshot (O(N), from the stored lengths), never stored in ``_tf``.
        # Without any token there are no postings and it is never read.
        avgdl = total / n if total else 1.0
        self._norm: np.ndarray = k1 * (1.0 - b + b * (dl.astype(np.float64) / avgdl))

    @classmethod
    def build(
        cls,
        texts: Sequence[str],
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        stemmer: StemmerName | None = DEFAULT_STEMMER,
    ) -> LexicalIndex:
        """An index over ``texts``, item ``i`` being ``texts[i]``, with BM25's ``k1`` and ``b``
        (:data:`DEFAULT_K1`, :data:`DEFAULT_B`; bm25s' defaults are 1.5 and 0.75), analyzed with
        ``stemmer`` (:data:`DEFAULT_STEMMER`; None: no stemming)."""
        if not (math.isfinite(k1) and k1 >= 0.0):
            raise ValueError(f"k1 must be finite and >= 0, got {k1!r}")
        if not (0.0 <= b <= 1.0):
            raise ValueError(f"b must lie in [0, 1], got {b!r}")
        stemmer = check_stemmer(stemmer)
        vocab: dict[str, int] = {}
        tf, dl = _count(texts, vocab, stemmer)
        return cls(vocab, tf, dl, k1=float(k1), b=float(b), stemmer=stemmer)

    def parts(self) -> tuple[list[str], dict[str, np.ndarray]]:
        """The index as its terms (in column order) and arrays (term frequencies as CSC, item
        lengths): what :meth:`from_parts` takes back, for a state kept outside the process
        (:mod:`pbr_core.derived`)."""
        tf = self._tf
        arrays = {"indptr": tf.indptr, "indices": tf.indices, "data": tf.data, "dl": self._dl}
        return list(self._vocab), arrays

    @classmethod
    def from_parts(
        cls,
        terms: Sequence[str] | str,
        arrays: Mapping[str, np.ndarray],
        *,
        k1: float,
        b: float,
        stemmer: StemmerName | None,
    ) -> LexicalIndex:
        """The index :meth:`parts` gave, every shape checked and the counts consistent (whole
        numbers, each item's length their sum): ``ValueError`` where one does not fit, so a
        damaged or foreign state is never read as an index.

        ``terms`` as one string, one term per line: looked up in that string, never split
        (for an index that serves one request: a few lookups among thousands of terms); its
        terms are then not checked to be distinct (a state's checksum says they are what pbr
        wrote)."""
        indptr, indices = np.asarray(arrays["indptr"]), np.asarray(arrays["indices"])
        data, dl = np.asarray(arrays["data"]), np.asarray(arrays["dl"])
        vocab: Mapping[str, int]
        if isinstance(terms, str):
            vocab = _Lines(terms)
            m = distinct = len(vocab)
        else:
            vocab = dict(zip(terms, range(len(terms))))
            m, distinct = len(terms), len(vocab)
            if not set(map(type, vocab)) <= {str}:
                raise ValueError("the lexical index's terms are not all strings")
        n = int(dl.shape[0]) if dl.ndim == 1 else -1
        ok = (
            n >= 0
            and distinct == m
            and indptr.shape == (m + 1,)
            and np.issubdtype(indptr.dtype, np.integer)
            and np.issubdtype(indices.dtype, np.integer)
            and np.issubdtype(dl.dtype, np.integer)
            and indices.shape == data.shape == (int(indptr[-1]) if m + 1 else 0,)
            and bool((np.diff(indptr) >= 0).all())
            and int(indptr[0]) == 0
            and (indices.size == 0 or (int(indices.min()) >= 0 and int(indices.max()) < n))
            and np.issubdtype(data.dtype, np.integer)
            and bool((data > 0).all())
            and (data.size == 0 or int(data.max()) < 2**31)
            and bool((dl >= 0).all())
        )
        # each item's length is the sum of its counts (a count moved or duplicated shows here)
        ok = ok and np.array_equal(np.bincount(indices, weights=data, minlength=n), dl)
        if not ok:
            raise ValueError("the lexical index's parts do not fit together")
        tf = sp.csc_matrix((data.astype(np.int32), indices, indptr), shape=(n, m))
        return cls(vocab, tf, dl, k1=float(k1), b=float(b), stemmer=check_stemmer(stemmer))

    @property
    def nbytes(self) -> int:
        """Bytes the index holds (counted once, it is immutable): the vocabulary's dict, its
        strings (an ASCII string's size per term: a non-ASCII term is counted short) and its
        column numbers (an int object each past CPython's 257 cached small ints), the term
        frequencies (CSC data, indices, pointers), the lengths and the per-item norms."""
        held: int | None = self.__dict__.get("_nbytes")
        if held is None:
            tf, vocab = self._tf, self._vocab
            held = sys.getsizeof(vocab) + len(vocab) * sys.getsizeof("") + sum(map(len, vocab))
            held += max(0, len(vocab) - _SMALL_INTS) * _INT_BYTES
            held += tf.data.nbytes + tf.indices.nbytes + tf.indptr.nbytes
            held += self._dl.nbytes + self._norm.nbytes
            self.__dict__["_nbytes"] = held
        return held

    def __len__(self) -> int:
        """Number of items (rows), including those without any term."""
        return int(self._dl.shape[0])

    def __repr__(self) -> str:
        return (
            f"LexicalIndex(items={len(self)}, terms={len(self._vocab)}, "
            f"postings={self._tf.nnz}, k1={self.k1}, b={self.b}, stemmer={self.stemmer!r})"
        )

    def _terms(self, query: str | Mapping[str, float]) -> Mapping[str, float]:
        """``query`` as index terms -> weight: words stemmed with :attr:`stemmer`, the weights
        of words sharing a stem summed, in first-appearance order."""
        words = query_terms([(query, 1.0)]) if isinstance(query, str) else query
        if self.stemmer is None or not words:
            return words
        out: dict[str, float] = {}
        for term, weight in zip(stem(list(words), self.stemmer), words.values()):
            out[term] = out.get(term, 0.0) + float(weight)
        return out

    def derived(self, keep: Sequence[int] | np.ndarray, added: Sequence[str]) -> LexicalIndex:
        """A new index over ``self``'s items ``keep`` (in that order), then the ``added`` texts.

        ``self`` is left as it was: snapshots are shared between threads. Only ``added`` is
        tokenized (with :attr:`stemmer`); kept items are copied as counts, so the cost is
        O(len(added) tokens) in Python plus O(nnz + terms) in numpy/scipy. Scores equal
        :meth:`build` over the same texts in the same order with the same stemmer, to the bit
        (column numbers may differ; scores do not depend on them). Terms no item uses any more
        are dropped once they outnumber the live ones, so a long run of replacements does not
        grow the vocabulary without bound.

        Raises:
            TypeError: ``keep`` is not integer (a boolean mask is refused, not read as 0/1).
            IndexError: an index of ``keep`` is not in ``range(len(self))``.
        """
        rows = _as_rows(keep, len(self))
        kept = self._tf[rows, :]
        vocab = dict(self._vocab)
        new, new_dl = _count(added, vocab, self.stemmer)
        n_cols = len(vocab)
        if kept.shape[1] != n_cols:  # the new terms are new, empty columns of the kept part
            pad = np.full(n_cols - kept.shape[1], kept.indptr[-1], dtype=kept.indptr.dtype)
            kept = sp.csc_matrix(
                (kept.data, kept.indices, np.concatenate([kept.indptr, pad])),
                shape=(kept.shape[0], n_cols),
            )
        tf = sp.csc_matrix(sp.vstack([kept, new], format="csc", dtype=np.int32))
        dl = np.concatenate([self._dl[rows], new_dl])
        live = np.flatnonzero(np.diff(tf.indptr))
        if n_cols - live.size > live.size:
            tf = sp.csc_matrix(tf[:, live])
            terms = list(vocab)  # insertion order is column order
            vocab = {terms[c]: i for i, c in enumerate(live.tolist())}
        return LexicalIndex(vocab, tf, dl, k1=self.k1, b=self.b, stemmer=self.stemmer)

    def scores(self, query: str | Mapping[str, float]) -> np.ndarray:
        """BM25 score of every item for ``query``: float32, shape ``(len(self),)``.

        A ``str`` is analyzed like the items; a repeated word counts once per occurrence (weight
        = count). A mapping is word -> weight (as from :func:`query_terms`; its keys are not
        tokenized again, but stemmed with :attr:`stemmer`, so pass words, not stems). Unknown
        terms, and items sharing no term with the query, score 0. Only the postings of the
        query's terms are read, so the cost grows with how many items contain them, not with the
        size of the vocabulary. Summed in float64, in the query's (stemmed) term order, then
        rounded to float32.
        """
        weights = self._terms(query)
        n = len(self)
        acc = np.zeros(n, dtype=np.float64)
        indptr, indices, data = self._tf.indptr, self._tf.indices, self._tf.data
        for term, weight in weights.items():
            col = self._vocab.get(term)
            if col is None or weight == 0:
                continue
            start, end = int(indptr[col]), int(indptr[col + 1])
            df = end - start
            if df == 0:
                continue
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            rows = indices[start:end]
            tf = data[start:end].astype(np.float64)
            acc[rows] += (float(weight) * idf) * (tf / (tf + self._norm[rows]))
        return acc.astype(np.float32)

    def ceiling(self, query: str | Mapping[str, float]) -> float:
        """The highest score any item could get for ``query``: ``Σ weight · idf`` over its terms.

        BM25's term part tends to 1 as a term's count grows, so no item reaches this bound; a
        score divided by it says how much of the query an item covers (between 0 and 1),
        comparably across queries and users. A term no item holds counts with ``df = 0``: an item
        that matches one word of a four-word query covers little of it.
        """
        weights = self._terms(query)
        n = len(self)
        indptr = self._tf.indptr
        total = 0.0
        for term, weight in weights.items():
            col = self._vocab.get(term)
            df = 0 if col is None else int(indptr[col + 1] - indptr[col])
            total += float(weight) * math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        return total


class _Lines(Mapping[str, int]):
    """A vocabulary kept as its terms joined by line breaks (term ``i`` on line ``i``), looked
    up in place: building a dict of thousands of terms would cost a request that looks up a
    few of them more than the lookups."""

    def __init__(self, joined: str) -> None:
        self._text = "\n" + joined + "\n"
        self._size = joined.count("\n") + 1 if joined else 0
        self._found: dict[str, int | None] = {}  # a request looks each query term up ~3 times

    def get(self, term: str, default: Any = None) -> Any:
        if not self._size or not isinstance(term, str) or "\n" in term:
            return default
        if term in self._found:
            column = self._found[term]
        else:
            at = self._text.find("\n" + term + "\n")
            column = self._found[term] = None if at < 0 else self._text.count("\n", 0, at)
        return default if column is None else column

    def __getitem__(self, term: str) -> int:
        column: int | None = self.get(term)
        if column is None:
            raise KeyError(term)
        return column

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[str]:
        return iter(self._text[1:-1].split("\n") if self._size else ())


def _as_rows(keep: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    """``keep`` as a checked 1-D intp array of row numbers."""
    if isinstance(keep, range):
        rows = np.arange(keep.start, keep.stop, keep.step, dtype=np.intp)
    else:
        rows = np.asarray(keep)
        if rows.size == 0:
            rows = rows.astype(np.intp).reshape(0)
        elif rows.dtype == np.bool_ or not np.issubdtype(rows.dtype, np.integer):
            raise TypeError(f"keep must hold integer row numbers, got dtype {rows.dtype}")
        rows = rows.astype(np.intp, copy=False)
    if rows.ndim != 1:
        raise ValueError(f"keep must be one-dimensional, got shape {rows.shape}")
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= n):
        raise IndexError(f"keep holds row numbers outside range({n})")
    return rows
