"""A user ranked in the database: a request served without bringing the user's rows here.

Why: a worker that has never read a user must otherwise read every row with its vector
(1.5 kB at 384-d) before it ranks anything, about 12× a search that returns ten rows at 1k
items (docs/performance.md). Where the host store computes cosines (PostgreSQL with pgvector,
:meth:`pbr_core.postgres.PgRecords.read_scored`) and another worker shared the user's derived
state for exactly these rows (:mod:`pbr_core.derived`), one statement returns the state and
every row's cosine with the query ``q``, key and version (and the text and metadata of the
short rows); the state holds each
item's inner product with the anchor, the BM25 index and the anchor's most central items. For
``q* = α·q + β·anchor``, every item's cosine with ``q*`` is then ``α·cos + β·affinity``, and
the hybrid ranking runs as on a history in memory (scores equal to float32 rounding).

:class:`ScoredView` stands in for the user's :class:`~pbr_core.snapshot.UserHistory` for one
request. It knows every item's id, host key and cosine with ``q``; a long item's text and
metadata are read from its row only for the items a request shows, each step's in one
statement (the related items and likely results, then any other result; the anchor's central
items come with the state), and only from the very row version the cosines were computed on.
It ranks only vectors in the span of ``q`` and the anchors it holds; any other raises
:class:`NotServed` (as does a custom fusion rule, which may read what only a history in memory
has), and the request is then run on the user's rows as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .anchor import AnchorResult
from .config import PBRConfig
from .derived import CENTRAL_ITEMS, PackedState
from .fusion import MODE_TERMS
from .items import HistoryItem
from .lexical import DEFAULT_STEMMER, LexicalIndex, StemmerName
from .snapshot import AnchorKey, top_k

__all__ = ["NotServed", "ScoredView", "ranks_in_database"]

# How far from the span of q and the anchors a search vector may be, relative to its norm, and
# still be ranked from the cosines (rounding of float32 fusion arithmetic stays far below).
_SPAN_TOLERANCE = 1e-4


class NotServed(LookupError):
    """The view cannot answer this (an item it does not hold, a vector outside its span): run
    the request on the user's rows instead."""


#: Reads the items at some positions from their rows, in one go (None: a row that is not the
#: item the state says, or no longer the version the cosines were computed on).
Load = Callable[[Sequence[int]], Sequence[HistoryItem | None]]


class _Items(Sequence[HistoryItem]):
    """The user's items by position: the state's central items, and the others read from their
    rows (``load``) by the request's steps that read the host (:meth:`many` with ``read``), so
    that no other step (an async request's personalization, on the event loop) waits on the
    database; an item not read there, or that its row does not give, raises
    :class:`NotServed`."""

    def __init__(self, n: int, known: Mapping[int, HistoryItem], load: Load) -> None:
        self._n = n
        self._known = dict(known)
        self._load = load

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, pos: int) -> HistoryItem:  # type: ignore[override]
        return self.many([pos])[0]

    def many(self, positions: Sequence[int], *, read: bool = False) -> list[HistoryItem]:
        """The items at ``positions``; ``read``: those not yet read are read from their rows,
        in one read (else they are not served)."""
        missing = list(dict.fromkeys(p for p in positions if p not in self._known))
        for pos in missing:
            if not 0 <= pos < self._n:
                raise IndexError(pos)
        if missing and not read:
            raise NotServed(f"the item at position {missing[0]} was not read with the view")
        if missing:
            got = list(self._load(missing))
            for pos, item in zip(missing, got, strict=True):
                if item is None:
                    raise NotServed(f"the row of the item at position {pos} is not its")
                self._known[pos] = item
        return [self._known[pos] for pos in positions]


class ScoredView:
    """One user's items scored against one query vector ``q``, for one request.

    Attributes:
        user_id: whose items.
        q: the unit query vector the cosines were computed with.
        keys: each item's host key, by position.
        cosines: each item's cosine with ``q``, by position.
        items: by position, read from their rows on first use (``load``).
    """

    def __init__(
        self,
        state: PackedState,
        q: np.ndarray,
        keys: Sequence[str],
        cosines: np.ndarray,
        load: Load,
    ) -> None:
        self.user_id = state.user_id
        self.q = np.asarray(q, dtype=np.float64)
        self.keys = keys
        self.cosines = np.asarray(cosines, dtype=np.float64)
        self._state = state
        self._positions: dict[str, int] | None = None  # on first use: most requests look none up
        self.items = _Items(len(state.ids), state.central, load)
        self.windows: dict[str, np.ndarray] = {}  # never served for windowed items

    # -- what the request reads of a history ----------------------------------------------------
    def __len__(self) -> int:
        return len(self._state.ids)

    @property
    def dim(self) -> int:
        return self._state.dim

    def position(self, item_id: str) -> int | None:
        if self._positions is None:
            self._positions = dict(zip(self._state.ids, range(len(self._state.ids))))
        return self._positions.get(item_id)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The ``k`` items nearest to ``vector`` (``q`` only), best first."""
        if len(self) == 0 or k <= 0:
            return []
        scores = self.dense_scores(vector)
        return [(int(i), float(scores[i])) for i in top_k(scores, k)]

    def likely_shown(
        self, related: int, terms: Mapping[str, float], k: int, stemmer: StemmerName | None
    ) -> list[int]:
        """Positions a request of ``k`` results will most likely show: its ``related`` items
        (the nearest to ``q``, always shown) and the ``k`` best of each leg for ``q`` and the
        query's words ``terms``, among which a hybrid result nearly always is. Read with the
        related items in one statement, they leave the results' step nothing to read, most
        of the time (one round trip fewer); a result outside them is read then."""
        positions = [pos for pos, _ in self.search(self.q, related)]
        positions += top_k(self.cosines, k).tolist()
        if terms and k > 0 and self.has_lexical(stemmer):
            lexical = self.lexical(stemmer).scores(terms)
            positions += [p for p in top_k(lexical, k).tolist() if lexical[p] > 0]
        return list(dict.fromkeys(positions))

    def dense_scores(self, vector: np.ndarray) -> np.ndarray:
        """Every item's cosine with the unit ``vector``, where ``vector`` is a combination of
        ``q`` and the anchors the view holds (float32, as a history's)."""
        v = np.asarray(vector, dtype=np.float64).reshape(-1)
        anchors = list(self._state.affinity)
        basis = np.stack([self.q, *(self._state.anchors[key].vector for key in anchors)], axis=1)
        weights, *_ = np.linalg.lstsq(basis, v, rcond=None)
        scale = max(float(np.linalg.norm(v)), 1e-12)
        if float(np.linalg.norm(basis @ weights - v)) > _SPAN_TOLERANCE * scale:
            raise NotServed("a search vector outside the span of the query and the anchor")
        scores = weights[0] * self.cosines
        for w, key in zip(weights[1:], anchors):
            scores = scores + w * self._state.affinity[key]
        return scores.astype(np.float32)

    def lexical(self, stemmer: StemmerName | None = DEFAULT_STEMMER) -> LexicalIndex:
        index = self._state.lexical_for(stemmer)
        if index is None:
            raise NotServed(f"no shared BM25 index for analyzer {stemmer!r}")
        return index

    def has_lexical(self, stemmer: StemmerName | None) -> bool:
        return self._state.lexical_for(stemmer) is not None

    def has_anchor(self, config: PBRConfig) -> bool:
        return config.anchor_key in self._state.anchors

    def anchor(self, config: PBRConfig) -> AnchorResult | None:
        try:
            return self._state.anchors[config.anchor_key]
        except KeyError:
            raise NotServed("no shared anchor for these graph parameters") from None


def ranks_in_database(config: PBRConfig) -> bool:
    """Whether requests of ``config`` can be ranked from a shared state: they need nothing but
    ``q``, the anchor and the BM25 index (no LLM term, no re-rank, no neighbour context, an
    explanation of at most the central items a state keeps)."""
    return (
        not any(MODE_TERMS[config.fusion][1:])
        and config.rerank == "none"
        and not config.lexical_context
        and config.top_anchor_items <= CENTRAL_ITEMS
    )


def servable(state: PackedState, config: PBRConfig, anchor_key: AnchorKey | None) -> bool:
    """Whether a request with ``config`` can be ranked from ``state`` alone: it holds the rows
    digest and affinities, no windowed item, the anchor the fusion uses (``anchor_key``; None: none
    used) with its central items, and the BM25 index the search mode reads."""
    if state.rows is None or state.windowed or not state.ids:
        return False
    if anchor_key is not None and len(state.ids) >= 2:  # one item: no anchor (the pipeline's rule)
        result = state.anchors.get(anchor_key)
        if result is None or anchor_key not in state.affinity:
            return False
        wanted = [pos for pos, _ in result.top_items(config.top_anchor_items)]
        if any(pos not in state.central for pos in wanted):
            return False
    return config.search == "dense" or state.lexical_for(config.lexical_stemmer) is not None
