"""One user's history as an immutable snapshot: items, unit vectors, exact search, cached anchors.

A change to a user's history builds a new :class:`UserHistory` (see
:class:`pbr_core.history.HistoryStore`) instead of editing one, so a query that is running keeps
a consistent view and everything cached on a snapshot (its anchors, its BM25 index) is
invalidated by construction. The new snapshot remembers the previous one's anchors and lexical
index and where each of its rows was, so that its own are derived incrementally
(:func:`~pbr_core.anchor.update_anchor`) instead of rebuilt.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .anchor import AnchorResult, compute_anchor, update_anchor
from .config import PBRConfig
from .items import HistoryItem
from .lexical import (
    DEFAULT_STEMMER,
    TOKENIZER_VERSION,
    LexicalIndex,
    StemmerName,
    check_stemmer,
)

__all__ = ["AnchorKey", "UserHistory", "item_nbytes", "items_at", "top_k"]

#: Which anchor a snapshot caches: :attr:`PBRConfig.anchor_key` (the graph parameters).
AnchorKey = tuple[Any, ...]


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` highest ``scores``, best first, equal scores by position: an O(n)
    selection, then only those ``k`` sorted.

    Ties at the cut are resolved by position too (the first tied items are kept), so the top k
    is always the first k of the top k + 1; ``argpartition`` alone keeps an arbitrary one.
    """
    n = len(scores)
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k < n:
        kth = np.partition(scores, n - k)[n - k]  # the k-th highest score
        above = np.flatnonzero(scores > kth)
        top = np.concatenate([above, np.flatnonzero(scores == kth)[: k - above.size]])
    else:
        top = np.arange(n)
    return top[np.lexsort((top, -scores[top]))]


def items_at(history: UserHistory, positions: Sequence[int]) -> list[HistoryItem]:
    """The items at ``positions`` of ``history``, or of a view standing in for one
    (:class:`pbr_core.view.ScoredView`), whose items are read from their rows on demand: the
    items one step shows (its results, its related items) are then read in one statement,
    not one each."""
    many = getattr(history.items, "many", None)
    return list(many(positions)) if many is not None else [history.items[p] for p in positions]


#: Bytes of one dict entry (hash, key and value pointers, the table's slack), and the fixed
#: part of one item: its object and ``__dict__``, its metadata dict, its slot in the items tuple
#: and in the id -> position dict (CPython 3.11, measured with tracemalloc; see item_nbytes).
_DICT_ENTRY_BYTES = 50
_ITEM_BYTES = 260


def _chained(older: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Where each row was in the snapshot a pending parent belongs to: ``positions`` (each row's
    place in the previous snapshot, -1 for a new or changed row) composed with that snapshot's
    own ``older`` positions."""
    kept = positions >= 0
    chained = np.full(positions.shape, -1, dtype=np.int64)
    chained[kept] = older[positions[kept]]
    return chained


def item_nbytes(item: HistoryItem) -> int:
    """Bytes one item holds, estimated: :data:`_ITEM_BYTES` plus its id and text strings and
    each metadata key and value (``sys.getsizeof``, shallow: a nested value counts its outer
    container only). Within about 15% of tracemalloc's count of a user (flat metadata)."""
    held = _ITEM_BYTES + sys.getsizeof(item.id) + sys.getsizeof(item.text)
    for key, value in item.metadata.items():
        held += _DICT_ENTRY_BYTES + sys.getsizeof(key) + sys.getsizeof(value)
    return held


class UserHistory:
    """An immutable snapshot of one user's history."""

    def __init__(
        self,
        user_id: str,
        items: Sequence[HistoryItem],
        vectors: np.ndarray,
        version: int,
        windows: Mapping[str, np.ndarray] | None = None,
        host_keys: Mapping[str, str] | None = None,
    ) -> None:
        self.user_id = user_id
        self.items: tuple[HistoryItem, ...] = tuple(items)
        self.vectors = vectors
        self.vectors.setflags(write=False)
        self.version = version
        self._positions = {item.id: i for i, item in enumerate(self.items)}
        # Items longer than the embedder reads: item id -> unit vectors of its windows (see
        # pbr_core.windows). Their dense score is their best window's.
        self.windows: dict[str, np.ndarray] = {
            i: w for i, w in (windows or {}).items() if i in self._positions
        }
        # Item id -> the host store's key, for items a host that cannot list holds under a key
        # of its own (recorded, not written, by pbr): the only record of where they are, so a
        # delete after a restart still finds them (pbr_core.corpus).
        self.host_keys: dict[str, str] = {
            i: k for i, k in (host_keys or {}).items() if i in self._positions
        }
        self._window_rows: tuple[np.ndarray, np.ndarray] | None = None
        # The BM25 index of the items under each analyzer a search asked for (its stemmer).
        self._lexical: dict[StemmerName | None, LexicalIndex] = {}
        # which tokenizer its BM25 indexes were built with (an unpickled older one: rebuilt)
        self._tokenizer = TOKENIZER_VERSION
        # Per analyzer, the previous snapshot's index to derive ours from, and where each of our
        # rows was in it (-1: new or changed text).
        self._lexical_parents: dict[StemmerName | None, tuple[LexicalIndex, np.ndarray]] = {}
        self._anchors: dict[AnchorKey, AnchorResult | None] = {}
        # Anchors of an earlier snapshot to derive ours from: key -> (anchor, old_positions),
        # old_positions[i] = row i's position in that snapshot, -1 for a new or changed row.
        self._parents: dict[AnchorKey, tuple[AnchorResult, np.ndarray]] = {}
        self._items_nbytes: int | None = None  # item_nbytes summed, on first nbytes()
        # How often a cache (anchor, BM25 index, window rows) was built or inherited, and
        # nbytes() as of that count.
        self._grown = 0
        self._counted: tuple[int, int] | None = None
        # told when a cache is built: the store holding this snapshot counts it then
        self._watcher: Callable[[], None] | None = None
        self._lock = threading.Lock()

    # Locks cannot be pickled or deep-copied: a copy gets fresh ones (and keeps the anchors).
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_watcher")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name, default in (("_items_nbytes", None), ("_grown", 0), ("_counted", None)):
            self.__dict__.setdefault(name, default)  # pickled before the cache budget
        if not isinstance(self.__dict__.get("_lexical"), dict):  # pickled before the analyzers
            index = self.__dict__.get("_lexical")
            parent = self.__dict__.pop("_lexical_parent", None)
            self._lexical = {}
            if index is not None:  # with the other analyzers' indexes it hung on itself
                self._lexical = {**index.__dict__.pop("_others", {}), index.stemmer: index}
            if parent is not None:
                parent[0].__dict__.pop("_others", None)
            self._lexical_parents = {} if parent is None else {parent[0].stemmer: parent}
            self._counted = None  # its count held one index; the others are counted now
        if self.__dict__.get("_tokenizer") != TOKENIZER_VERSION:  # indexes of another tokenizer
            self._lexical, self._lexical_parents = {}, {}  # (their terms would miss the
            self._tokenizer = TOKENIZER_VERSION  # query's): built again on first use
            self._counted = None
        self._watcher = None
        self._lock = threading.Lock()

    def _grow(self) -> None:
        """A cache was built or inherited: :meth:`nbytes` counts anew, and the store holding
        this snapshot is told, so that its budget counts the cache now, however many other
        users were read meanwhile."""
        self._grown += 1
        watcher = self._watcher
        if watcher is not None:
            watcher()

    def __len__(self) -> int:
        return len(self.items)

    def nbytes(self) -> int:
        """An estimate of the bytes this snapshot holds, for a cache budget
        (:class:`~pbr_core.history.HistoryStore` ``max_cache_bytes``).

        Exact for the arrays (vectors, windows, anchors with their graphs, the BM25 index and
        what a pending incremental update keeps of the previous snapshot); the items' Python
        objects are estimated (:func:`item_nbytes`, counted once per snapshot). Caches built
        later (the first query's anchor and BM25 index) are counted when this is called again;
        in between, the count is kept (O(1)).
        """
        grown, counted = self._grown, self._counted
        if counted is not None and counted[0] == grown:
            return counted[1]
        held = self._items_nbytes
        if held is None:
            held = self._items_nbytes = sum(item_nbytes(item) for item in self.items)
        held += self.vectors.nbytes + sum(w.nbytes for w in self.windows.values())
        held += _DICT_ENTRY_BYTES * (len(self.windows) + 2 * len(self.host_keys))
        if self._window_rows is not None:
            held += sum(part.nbytes for part in self._window_rows)
        for anchor in list(self._anchors.values()):
            held += anchor.nbytes if anchor is not None else 0
        for anchor, positions in list(self._parents.values()):
            held += anchor.nbytes + positions.nbytes
        for lexical in list(self._lexical.values()):
            held += lexical.nbytes
        for lexical, positions in list(self._lexical_parents.values()):
            held += lexical.nbytes + positions.nbytes
        self._counted = (grown, held)  # a cache built meanwhile bumped _grown: counted again
        return held

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def position(self, item_id: str) -> int | None:
        return self._positions.get(item_id)

    def item(self, item_id: str) -> HistoryItem:
        pos = self._positions.get(item_id)
        if pos is None:
            raise KeyError(f"user {self.user_id!r} has no item {item_id!r}")
        return self.items[pos]

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Positions and inner products of the ``k`` items nearest to ``vector``, best first.

        Exact brute force over the snapshot's own vectors (one BLAS matrix-vector product and an
        O(n) selection): as fast as a flat faiss index for one query, without a second copy of
        the vectors per user. Equal scores are ordered by position.
        """
        n = len(self.items)
        if n == 0 or k <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        scores = self.vectors @ query
        return [(int(i), float(scores[i])) for i in top_k(scores, k)]

    def dense_scores(self, vector: np.ndarray) -> np.ndarray:
        """Cosine of every item with the unit ``vector`` (float32): an item with windows scores
        as its best window, so a long item is found by any part of it."""
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        scores = self.vectors @ query if len(self.items) else np.zeros(0, dtype=np.float32)
        if self.windows:
            owners, rows = self._windowed()
            best = np.full(len(self.items), -np.inf, dtype=np.float32)
            np.maximum.at(best, owners, rows @ query)
            scores = np.maximum(scores, best)
        return scores

    def _windowed(self) -> tuple[np.ndarray, np.ndarray]:
        if self._window_rows is None:
            owners = np.concatenate(
                [
                    np.full(len(w), self._positions[i], dtype=np.int64)
                    for i, w in self.windows.items()
                ]
            )
            rows = np.concatenate([np.asarray(w, dtype=np.float32) for w in self.windows.values()])
            self._window_rows = (owners, rows)
            self._grow()
        return self._window_rows

    def lexical(self, stemmer: StemmerName | None = DEFAULT_STEMMER) -> LexicalIndex:
        """The BM25 index of the items' texts analyzed with ``stemmer``
        (:attr:`~pbr_core.config.PBRConfig.lexical_stemmer`), built once per snapshot and
        analyzer (derived from the previous snapshot's index under that analyzer when there is
        one: only changed items are tokenized)."""
        index = self._lexical.get(stemmer)
        if index is not None:
            return index
        stemmer = check_stemmer(stemmer)
        with self._lock:
            index = self._lexical.get(stemmer)
            if index is None:
                parent = self._lexical_parents.get(stemmer)
                texts = [item.text for item in self.items]
                if parent is None:
                    index = LexicalIndex.build(texts, stemmer=stemmer)
                else:
                    previous, old_positions = parent
                    kept = np.flatnonzero(old_positions >= 0)
                    added = np.flatnonzero(old_positions < 0)
                    staged = previous.derived(old_positions[kept], [texts[i] for i in added])
                    order = np.empty(len(texts), dtype=np.int64)  # our row i is staged row order[i]
                    order[kept] = np.arange(kept.size)
                    order[added] = kept.size + np.arange(added.size)
                    identity = bool((order == np.arange(len(texts))).all())
                    index = staged if identity else staged.derived(order, [])
                self._lexical[stemmer] = index
                self._lexical_parents.pop(stemmer, None)  # release the previous index
                self._grow()
            return index

    def has_lexical(self, stemmer: StemmerName | None) -> bool:
        """Whether :meth:`lexical` for ``stemmer`` is built (it returns at once)."""
        return stemmer in self._lexical

    def has_anchor(self, config: PBRConfig) -> bool:
        """Whether :meth:`anchor` for ``config`` is computed (it returns at once)."""
        return config.anchor_key in self._anchors

    def lexical_indexes(self) -> list[LexicalIndex]:
        """The BM25 indexes built so far (one per analyzer asked for): what a shared state
        keeps (:mod:`pbr_core.derived`)."""
        return list(self._lexical.values())

    def _inherit_lexical(self, previous: UserHistory, old_positions: np.ndarray) -> None:
        """Remember ``previous``'s lexical indexes to derive ours from, per analyzer.

        The indexes ``previous`` built (or took from a shared state) are carried. Its pending
        parents are chained on only when it built none (a run of changes without a query in
        between); after a query, an analyzer that query did not ask for is dropped, so an
        analyzer asked for once is not held (and counted against the cache budget) for good.
        Asked for again, it is built in full.
        """
        positions = np.array(old_positions, dtype=np.int64)
        for i, p in enumerate(positions):  # same row, other text: re-tokenized
            if p >= 0 and previous.items[p].text != self.items[i].text:
                positions[i] = -1
        built = list(previous._lexical.items())
        for stemmer, index in built:
            self._lexical_parents[stemmer] = (index, positions)
        if not built:
            for stemmer, (index, older) in list(previous._lexical_parents.items()):
                self._lexical_parents[stemmer] = (index, _chained(older, positions))
        self._grow()

    def anchor(self, config: PBRConfig) -> AnchorResult | None:
        """The anchor for ``config``'s graph parameters, computed once per snapshot.

        Derived from the previous snapshot's anchor for the same parameters when there is one
        (only the graph rows the change touched are recomputed, PageRank is warm-started), else
        built from scratch.
        """
        key = config.anchor_key
        try:
            return self._anchors[key]
        except KeyError:
            pass
        with self._lock:
            if key not in self._anchors:
                vectors = np.asarray(self.vectors)
                parent = self._parents.get(key)
                if parent is not None:
                    self._anchors[key] = update_anchor(parent[0], vectors, parent[1], config)
                else:
                    self._anchors[key] = compute_anchor(vectors, config)
                self._parents.pop(key, None)  # release the previous graph
                self._grow()
            return self._anchors[key]

    def adopt(
        self, anchors: Mapping[AnchorKey, AnchorResult], lexical: Sequence[LexicalIndex] = ()
    ) -> None:
        """Take anchors and BM25 indexes built elsewhere over exactly these items, in this
        order (another worker's, :mod:`pbr_core.derived`): those not built here yet."""
        for index in lexical:
            if len(index) != len(self.items):
                raise ValueError(f"a BM25 index of {len(index)} items for {len(self)}")
        with self._lock:
            for key, result in anchors.items():
                if self._anchors.get(key) is None:
                    self._anchors[key] = result
                    self._parents.pop(key, None)
            for index in lexical:
                if index.stemmer not in self._lexical:
                    self._lexical[index.stemmer] = index
                    self._lexical_parents.pop(index.stemmer, None)
            self._grow()

    def _inherit_anchors(self, previous: UserHistory, old_positions: np.ndarray) -> None:
        """Remember ``previous``'s anchors (computed or themselves pending) to derive ours from.

        ``old_positions[i]`` is row ``i``'s position in ``previous``, ``-1`` for a new or changed
        row. ``previous``'s pending parents are chained only when it computed none (a run of
        changes without a query in between still ends in one incremental update); after a
        query, the anchor of parameters it did not ask for is dropped, as a lexical analyzer's
        index is, so parameters asked for once are not held (and counted against the cache
        budget) for good. Asked for again, that anchor is built in full.
        """
        computed = list(previous._anchors.items())
        for key, result in computed:
            if result is not None:
                self._parents[key] = (result, old_positions)
        if not computed:
            for key, (result, older) in list(previous._parents.items()):
                self._parents[key] = (result, _chained(older, old_positions))
        self._grow()
