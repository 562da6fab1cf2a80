"""Per-user history: items, their unit vectors, exact search and cached anchors.

Each user's history is an immutable snapshot (:class:`UserHistory`). A change builds a new
snapshot from validated inputs and swaps it in under a lock, so a query that is running keeps a
consistent view, a rejected change leaves nothing half-written, and everything cached on a
snapshot (its anchors) is invalidated by construction. The new snapshot remembers the previous
one's anchors and where each of its rows was, so that its own anchor is derived incrementally
(:func:`~pbr_core.anchor.update_anchor`) instead of rebuilt.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
import shutil
import threading
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import scipy.sparse as sp

from .anchor import AnchorResult, compute_anchor, update_anchor
from .config import PBRConfig
from .errors import EmbeddingError, PersistenceError, UnknownUserError
from .lexical import LexicalIndex
from .persist import current_snapshot, write_atomically
from .vectors import as_unit_rows

FORMAT_NAME = "pbr-history"
#: Version 2 adds each user's cached anchors (``<key>.anchors.npz``); version 1 folders (no
#: anchors) are still read.
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
#: The files of one save (inside the snapshot folder that ``CURRENT`` names, see
#: :mod:`pbr_core.persist`; directly in the save folder for folders saved by older versions).
MANIFEST_NAME = "manifest.json"
USERS_DIR = "users"

#: A re-upserted vector within this distance (max abs difference) of the stored one is the same
#: vector: the stored bits are kept, so re-adding unchanged items (re-normalised on the way in)
#: neither changes the history's vectors nor costs anchor work.
SAME_VECTOR_ATOL = 1e-6

AnchorKey = tuple[Any, ...]


def _checked_windows(windows: Any, dim: int, what: str) -> np.ndarray:
    """An item's window vectors checked like item vectors (finite, non-zero, the store's
    dimension, normalised), and at least one: a bad window would poison every query's dense
    score of the item and make the saved folder unloadable."""
    rows = as_unit_rows(windows, dim=dim, what=what)
    if rows.shape[0] == 0:
        raise EmbeddingError(f"{what}: no window vectors (omit the item from windows instead)")
    return rows


def check_batch(values: Iterable[Any], what: str) -> list[Any]:
    """``values`` as a list, elements as given: the one rule for a batch of ids or texts.

    A bare string is refused, not iterated: ``delete(user, "xy")`` would otherwise remove the
    items ``"x"`` and ``"y"``, and ``add_texts(user, "hello")`` store five one-letter items.
    """
    if isinstance(values, str | bytes):
        raise TypeError(
            f"{what} must be a list of strings, got the single string {values!r}; pass [{values!r}]"
        )
    return list(values)


def check_ids(ids: Iterable[str], what: str = "ids") -> list[str]:
    """``ids`` as a list of strings (see :func:`check_batch`), core and adapters."""
    return [str(i) for i in check_batch(ids, what)]


@dataclass(frozen=True)
class HistoryItem:
    """One item of a user's history (a chat turn, a session, a note, a purchase).

    Attributes:
        id: unique within the user.
        text: what gets embedded and shown to the LLM.
        metadata: anything JSON-serialisable the host wants back.
        timestamp: POSIX seconds, used to order items chronologically (optional).
    """

    id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    timestamp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "metadata": dict(self.metadata),
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> HistoryItem:
        return cls(
            id=str(row["id"]),
            text=str(row["text"]),
            metadata=dict(row.get("metadata") or {}),
            timestamp=row.get("timestamp"),
        )


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
        self._lexical: LexicalIndex | None = None
        # The previous snapshot's lexical index to derive ours from, and where each of our rows
        # was in it (-1: new or changed text).
        self._lexical_parent: tuple[LexicalIndex, np.ndarray] | None = None
        self._anchors: dict[AnchorKey, AnchorResult | None] = {}
        # Anchors of an earlier snapshot to derive ours from: key -> (anchor, old_positions),
        # old_positions[i] = row i's position in that snapshot, -1 for a new or changed row.
        self._parents: dict[AnchorKey, tuple[AnchorResult, np.ndarray]] = {}
        self._lock = threading.Lock()

    # Locks cannot be pickled or deep-copied: a copy gets fresh ones (and keeps the anchors).
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

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
        return self._window_rows

    def lexical(self) -> LexicalIndex:
        """The BM25 index of the items' texts, built once per snapshot (derived from the
        previous snapshot's index when there is one: only changed items are tokenized)."""
        index = self._lexical
        if index is not None:
            return index
        with self._lock:
            if self._lexical is None:
                parent = self._lexical_parent
                texts = [item.text for item in self.items]
                if parent is None:
                    self._lexical = LexicalIndex.build(texts)
                else:
                    previous, old_positions = parent
                    kept = np.flatnonzero(old_positions >= 0)
                    added = np.flatnonzero(old_positions < 0)
                    staged = previous.derived(old_positions[kept], [texts[i] for i in added])
                    order = np.empty(len(texts), dtype=np.int64)  # our row i is staged row order[i]
                    order[kept] = np.arange(kept.size)
                    order[added] = kept.size + np.arange(added.size)
                    identity = bool((order == np.arange(len(texts))).all())
                    self._lexical = staged if identity else staged.derived(order, [])
                self._lexical_parent = None  # release the previous index
            return self._lexical

    def _inherit_lexical(self, previous: UserHistory, old_positions: np.ndarray) -> None:
        """Remember ``previous``'s lexical index (built or pending) to derive ours from."""
        positions = np.array(old_positions, dtype=np.int64)
        for i, p in enumerate(positions):  # same row, other text: re-tokenized
            if p >= 0 and previous.items[p].text != self.items[i].text:
                positions[i] = -1
        if previous._lexical is not None:
            self._lexical_parent = (previous._lexical, positions)
        elif previous._lexical_parent is not None:
            index, older = previous._lexical_parent
            kept = positions >= 0
            chained = np.full(positions.shape, -1, dtype=np.int64)
            chained[kept] = older[positions[kept]]
            self._lexical_parent = (index, chained)

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
            return self._anchors[key]

    def _inherit_anchors(self, previous: UserHistory, old_positions: np.ndarray) -> None:
        """Remember ``previous``'s anchors (computed or themselves pending) to derive ours from.

        ``old_positions[i]`` is row ``i``'s position in ``previous``, ``-1`` for a new or changed
        row. A pending parent of ``previous`` is chained, so a run of changes without a query in
        between still ends in one incremental update.
        """
        for key, result in list(previous._anchors.items()):
            if result is not None:
                self._parents[key] = (result, old_positions)
        for key, (result, older) in list(previous._parents.items()):
            if key not in self._parents:
                kept = old_positions >= 0
                chained = np.full(old_positions.shape, -1, dtype=np.int64)
                chained[kept] = older[old_positions[kept]]
                self._parents[key] = (result, chained)


def check_serialisable(user_id: str, items: Iterable[HistoryItem]) -> None:
    """Raise ``ValueError`` unless ``user_id`` and every item can be saved exactly as given.

    A save writes one folder for all users, so a single unsaveable value (a lone surrogate from
    bytes decoded with ``errors="surrogateescape"``, a ``datetime`` in metadata, a NaN
    timestamp) would make every later :meth:`HistoryStore.save` fail, for everyone. This check
    runs in :meth:`HistoryStore.upsert` before anything changes; an adapter calls it too before
    it writes the items to its host vector store, so a rejected batch is written nowhere.

    Rules: the user id, item ids and texts are strings encodable as UTF-8; metadata is a mapping
    whose keys and values JSON can hold (str, int, float, bool, None, lists and dicts of them),
    UTF-8 encodable; a timestamp is a finite ``int``/``float`` (POSIX seconds) or None.

    Raises:
        ValueError: naming the user, the item and the field, and saying how to fix it.
    """
    _check_utf8(user_id, f"user id {user_id!r}")
    for n, item in enumerate(items):
        if not isinstance(item, HistoryItem):
            raise ValueError(
                f"item {n} for user {user_id!r} is a {type(item).__name__}, not a HistoryItem"
            )
        if not isinstance(item.id, str):
            raise ValueError(
                f"item {n} for user {user_id!r} has a {type(item.id).__name__} id {item.id!r}; "
                "ids are strings: pass str(id)"
            )
        where = f"item {item.id!r} of user {user_id!r}"
        if not isinstance(item.text, str):
            raise ValueError(
                f"{where} has a {type(item.text).__name__} text; the text must be a string"
            )
        _check_timestamp(item.timestamp, where)
        if not isinstance(item.metadata, Mapping):
            raise ValueError(
                f"{where} has metadata of type {type(item.metadata).__name__}; pass a dict"
            )
        try:  # the fast path: the whole item, exactly as save() will write it
            _check_encoder.encode(item.to_dict()).encode("utf-8")
        except (TypeError, ValueError, RecursionError):
            _explain_unserialisable(item, where)


class _Unserialisable(TypeError):
    def __init__(self, value: object) -> None:
        self.value = value
        super().__init__(f"{type(value).__name__} is not JSON-serialisable")


def _refuse(value: object) -> Any:
    raise _Unserialisable(value)


# Like the encoder of save(), plus circular-reference detection and a hook naming the culprit.
_check_encoder = json.JSONEncoder(ensure_ascii=False, check_circular=True, default=_refuse)


def _check_utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start] if isinstance(exc.object, str) else "?"
        raise ValueError(
            f"{what} is not valid Unicode: it holds the lone surrogate {bad!r} at position "
            f"{exc.start} (typically bytes decoded with errors='surrogateescape'), which cannot "
            "be saved as UTF-8; decode the source bytes with the right encoding, or clean the "
            "string with s.encode('utf-8', 'replace').decode('utf-8')"
        ) from None


def _check_timestamp(timestamp: object, where: str) -> None:
    if timestamp is None:
        return
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise ValueError(
            f"{where} has a timestamp of type {type(timestamp).__name__} ({timestamp!r}); pass "
            "POSIX seconds as a float (e.g. float(value), or value.timestamp() for a datetime) "
            "or None"
        )
    try:
        finite = math.isfinite(timestamp)
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError(
            f"{where} has the timestamp {timestamp!r}; pass finite POSIX seconds or None"
        )


def _explain_unserialisable(item: HistoryItem, where: str) -> NoReturn:
    """Raise a ValueError naming what in ``item`` :func:`check_serialisable` refused."""
    _check_utf8(item.id, f"the id of {where}")
    _check_utf8(item.text, f"the text of {where}")
    for key, value in item.metadata.items():
        field_name = f"metadata[{key!r}] of {where}"
        try:
            _check_encoder.encode({key: value}).encode("utf-8")
        except _Unserialisable as exc:
            culprit = exc.value
            if isinstance(culprit, (_dt.datetime, _dt.date, _dt.time)):
                advice = (
                    "convert it to an ISO string (value.isoformat()) or POSIX seconds "
                    "(value.timestamp())"
                )
            elif type(culprit).__module__ == "numpy":
                advice = "convert it to a Python value (value.item() or value.tolist())"
            else:
                advice = "convert it to str, int, float, bool, None, or a list or dict of them"
            what = "is" if culprit is value else "holds"
            raise ValueError(
                f"{field_name} {what} a {type(culprit).__module__}.{type(culprit).__qualname__}"
                f" ({culprit!r}), which JSON cannot hold; {advice}"
            ) from None
        except UnicodeEncodeError:
            _check_utf8(str(key), f"the key of {field_name}")
            _find_surrogate(value, field_name)
        except ValueError as exc:  # "Circular reference detected"
            raise ValueError(
                f"{field_name} cannot be saved as JSON ({exc}); pass a plain copy without "
                "references to itself"
            ) from None
        except (TypeError, RecursionError) as exc:  # keys JSON cannot hold, too deep nesting
            raise ValueError(
                f"{field_name} cannot be saved as JSON ({exc}); use string keys and plain "
                "values (str, int, float, bool, None, lists and dicts of them)"
            ) from None
    raise ValueError(f"{where} cannot be saved as JSON; pass plain strings and a plain dict")


def _find_surrogate(value: object, where: str) -> None:
    """Raise the lone-surrogate ValueError for the first string in ``value`` that holds one."""
    if isinstance(value, str):
        _check_utf8(value, where)
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            _check_utf8(str(key), f"a key in {where}")
            _find_surrogate(inner, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, inner in enumerate(value):
            _find_surrogate(inner, f"{where}[{i}]")
    _check_utf8(_check_encoder.encode(value), where)


def _user_key(user_id: str) -> str:
    """A file-name-safe stable key for any user id (quotes, slashes, operators included)."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:24]


class HistoryStore:
    """All users' histories, in memory, with validation, persistence and a shared dimension.

    Args:
        dim: vector dimension; fixed by the first insert when not given.
        embedding_model_id: recorded on save and checked on load, so vectors of one model are
            never searched with another's queries.
    """

    def __init__(self, dim: int | None = None, embedding_model_id: str | None = None) -> None:
        self.dim = dim
        self.embedding_model_id = embedding_model_id
        # A user of a folder loaded with lazy=True is a _Saved entry until first used.
        self._users: dict[str, UserHistory | _Saved] = {}
        self._lock = threading.RLock()

    # -- reading -------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def __contains__(self, user_id: object) -> bool:
        return user_id in self._users

    def __len__(self) -> int:
        return len(self._users)

    def users(self) -> list[str]:
        return list(self._users)

    def get(self, user_id: str) -> UserHistory:
        """The user's current snapshot; :class:`UnknownUserError` if the user was never added."""
        history = self._current(user_id)
        if history is None:
            raise UnknownUserError(user_id)
        return history

    def _current(self, user_id: str) -> UserHistory | None:
        """The user's snapshot (read from disk first if loaded lazily), None if unknown."""
        history = self._users.get(user_id)
        if not isinstance(history, _Saved):
            return history
        with self._lock:
            history = self._users.get(user_id)
            if isinstance(history, _Saved):
                history = _read_user(history.folder, history.entry, self.dim)
                self._users[user_id] = history  # same dict position: users() keeps its order
            return history

    def known_vectors(self, user_id: str, items: Sequence[HistoryItem]) -> list[np.ndarray | None]:
        """Stored vectors of items whose id *and* text are already stored (no re-embedding)."""
        history = self._current(user_id)
        out: list[np.ndarray | None] = []
        for item in items:
            pos = history.position(item.id) if history is not None else None
            if pos is not None and history is not None and history.items[pos].text == item.text:
                out.append(np.asarray(history.vectors[pos]))
            else:
                out.append(None)
        return out

    # -- writing -------------------------------------------------------------------------------
    def upsert(
        self,
        user_id: str,
        items: Sequence[HistoryItem],
        vectors: Any,
        windows: Mapping[str, np.ndarray] | None = None,
        host_keys: Mapping[str, str] | None = None,
    ) -> UserHistory:
        """Add items (replacing those with the same id) and return the new snapshot.

        ``windows``: item id -> unit vectors of the windows of an item longer than the embedder
        reads (:mod:`pbr_core.windows`); a replaced item's old windows are dropped with its text.
        ``host_keys``: item id -> the key a host store that cannot list holds it under, where
        that is not pbr's own (:class:`pbr_core.corpus.Corpus` keeps them; saved with the user).

        Everything is validated before anything changes: duplicate ids in the batch, a count
        mismatch, NaN/inf or zero vectors, a wrong dimension, or a value that could not be saved
        (see :func:`check_serialisable`) raise and leave the store as it was.

        An empty batch changes nothing: it returns the user's snapshot, or, for a user with no
        history, an empty snapshot that is *not* stored (the user stays unknown, and its first
        real batch fixes the dimension as usual).
        """
        if not isinstance(user_id, str) or not user_id:
            raise ValueError("user_id must be a non-empty string")
        items = list(items)
        check_serialisable(user_id, items)
        ids = [item.id for item in items]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"duplicate item ids in one batch: {dupes}")
        for item in items:
            if not item.text or not item.text.strip():
                raise ValueError(f"item {item.id!r} has empty text")
        for what, given in (("windows", windows), ("host_keys", host_keys)):
            stray = sorted(set(given or {}) - set(ids))
            if stray:
                raise ValueError(f"{what} given for item(s) {stray}, which are not in this batch")
        bad_keys = sorted(
            i for i, k in (host_keys or {}).items() if not isinstance(k, str) or not k
        )
        if bad_keys:
            raise ValueError(f"host_keys of item(s) {bad_keys} must be non-empty strings")
        with self._lock:
            if not items:
                current = self._current(user_id)
                if current is not None:
                    return current
                empty = np.zeros((0, self.dim or 0), dtype=np.float32)
                return UserHistory(user_id, [], empty, version=0)
            rows = as_unit_rows(vectors, dim=self.dim, what=f"vectors for user {user_id!r}")
            if rows.shape[0] != len(items):
                raise EmbeddingError(f"{len(items)} items but {rows.shape[0]} vectors")
            windows = {
                item_id: _checked_windows(
                    w, rows.shape[1], f"windows of item {item_id!r} of user {user_id!r}"
                )
                for item_id, w in (windows or {}).items()
            }
            old = self._current(user_id)
            merged_items = list(old.items) if old is not None else []
            positions = {it.id: i for i, it in enumerate(merged_items)}
            replace_pos = [
                (positions[it.id], j) for j, it in enumerate(items) if it.id in positions
            ]
            fresh = [j for j, it in enumerate(items) if it.id not in positions]
            if old is not None:
                base = np.array(old.vectors, dtype=np.float32)
            else:
                base = np.zeros((0, rows.shape[1]), dtype=np.float32)
            # Where each new row was in the old snapshot; -1 for new rows and changed vectors.
            old_positions = np.arange(base.shape[0] + len(fresh), dtype=np.int64)
            old_positions[base.shape[0] :] = -1
            for pos, j in replace_pos:
                merged_items[pos] = items[j]
                if np.abs(base[pos] - rows[j]).max() > SAME_VECTOR_ATOL:
                    base[pos] = rows[j]
                    old_positions[pos] = -1
            merged_items.extend(items[j] for j in fresh)
            new_vectors = np.concatenate([base, rows[fresh]]) if fresh else base
            if self.dim is None:
                self.dim = int(rows.shape[1])
            return self._replace(
                user_id, merged_items, new_vectors, old_positions, windows, host_keys
            )

    def delete(self, user_id: str, ids: Iterable[str]) -> UserHistory:
        """Remove items by id; unknown ids raise ``KeyError`` and nothing is removed."""
        drop = set(check_ids(ids))
        with self._lock:
            old = self.get(user_id)
            missing = sorted(i for i in drop if old.position(i) is None)
            if missing:
                raise KeyError(f"user {user_id!r} has no item(s) {missing}")
            keep = np.array(
                [i for i, item in enumerate(old.items) if item.id not in drop], dtype=np.int64
            )
            return self._replace(
                user_id,
                [old.items[i] for i in keep],
                np.asarray(old.vectors)[keep].copy(),
                keep,
            )

    def drop_user(self, user_id: str) -> None:
        with self._lock:
            if user_id not in self._users:
                raise UnknownUserError(user_id)
            del self._users[user_id]

    def _replace(
        self,
        user_id: str,
        items: Sequence[HistoryItem],
        vectors: np.ndarray,
        old_positions: np.ndarray | None = None,
        windows: Mapping[str, np.ndarray] | None = None,
        host_keys: Mapping[str, str] | None = None,
    ) -> UserHistory:
        old = self._current(user_id)
        kept = {}
        if old is not None:  # windows of items whose text did not change
            texts = {item.id: item.text for item in items}
            kept = {i: w for i, w in old.windows.items() if texts.get(i) == old.item(i).text}
        snapshot = UserHistory(
            user_id,
            items,
            vectors,
            version=(old.version + 1) if old else 1,
            windows={**kept, **(windows or {})},
            host_keys={**(old.host_keys if old is not None else {}), **(host_keys or {})},
        )
        if old is not None and old_positions is not None:
            snapshot._inherit_anchors(old, old_positions)
            snapshot._inherit_lexical(old, old_positions)
        self._users[user_id] = snapshot
        return snapshot

    # -- persistence ---------------------------------------------------------------------------
    def save_within(self, path: str | os.PathLike[str]) -> Callable[[], Path]:
        """:meth:`save`, for a save that is part of a larger atomic write (an adapter saving
        its index beside the histories): returns ``commit``, to call once the larger write has
        succeeded. Until then, users of a lazy load that were never read keep reading their
        old files; if the larger write fails and removes this folder, nothing points into it.
        """
        target = Path(path)
        with self._lock:
            users_now = list(self._users.items())
            header: dict[str, Any] = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "dim": self.dim,
                "embedding_model_id": self.embedding_model_id,
            }
        copied: list[tuple[str, _Saved]] = []
        unchanged = f"nothing was replaced: {target} still holds the previous save"

        def write(folder: Path) -> None:
            users = folder / USERS_DIR
            users.mkdir()
            entries: list[dict[str, Any]] = []
            for user_id, snap in users_now:
                try:
                    if isinstance(snap, _Saved):
                        entries.append(_copy_user(snap, users))
                        copied.append((user_id, snap))
                    else:
                        entries.append(_write_user(snap, users))
                except (OSError, ValueError, TypeError, RecursionError) as exc:
                    raise PersistenceError(
                        f"could not save user {user_id!r}: {exc}; {unchanged}. Fix this user's "
                        f"data (or drop_user({user_id!r})) and save again"
                    ) from exc
            try:
                text = json.dumps({**header, "users": entries}, indent=1)
            except (TypeError, ValueError) as exc:
                raise PersistenceError(
                    f"could not write the manifest ({exc}); {unchanged}. The store's dim must "
                    "be an int and its embedding_model_id a string"
                ) from exc
            (folder / MANIFEST_NAME).write_text(text, encoding="utf-8")

        snapshot = write_atomically(target, write, legacy_names=(MANIFEST_NAME, USERS_DIR))

        def commit() -> Path:
            with self._lock:
                # The copies are in the new snapshot: read them from there from now on.
                for user_id, saved in copied:
                    if self._users.get(user_id) is saved:
                        self._users[user_id] = _Saved(snapshot, saved.entry)
            return target

        return commit

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write every user to the folder ``path``, atomically replacing an earlier save.

        The save fills a new snapshot subfolder of ``path`` and becomes current in one atomic
        step (see :mod:`pbr_core.persist`): an error or a crash at any point leaves the previous
        save loadable, and a process loading ``path`` meanwhile reads the old state or the new
        one, never a mix. The previous snapshot is kept until the next save, so a lazy loader
        that opened it can go on reading; older ones are removed. A folder saved by an older
        version (files directly in it) is converted.

        Each user's items (JSON lines), vectors (``.npy``) and the anchors computed so far
        (``.anchors.npz``: graph, PageRank and anchor per parameter set), so that a restarted
        process answers its first query without rebuilding any anchor. Users of a lazily loaded
        folder that were never read are copied file by file, and are read from the new snapshot
        afterwards (the one they were loaded from may be pruned by a later save).

        Returns:
            ``path`` as a :class:`~pathlib.Path`: what :meth:`load` takes.

        Raises:
            PersistenceError: a user could not be written (the message names it) or the folder
                cannot be written to; ``path`` still holds the previous save, unchanged.
        """
        return self.save_within(path)()

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, lazy: bool = False) -> HistoryStore:
        """Read a folder written by :meth:`save`; raise PersistenceError if missing or damaged.

        Reads the snapshot that the folder's ``CURRENT`` names, or, for a folder saved by an
        older version, the files directly in it; format versions 1 and 2 are read.

        Args:
            path: the folder.
            lazy: read only the manifest now and each user's files on first use (first query,
                upsert, ...). A restarted server then answers its first query after reading one
                user, not all of them. A damaged user file raises :class:`PersistenceError` when
                that user is first used, and the snapshot must stay in place until then: a save
                by this store keeps it readable, but two saves to ``path`` by *another* store or
                process prune it.

        Raises:
            PersistenceError: the folder is missing or a file in it is damaged; the message
                names the file.
        """
        folder = Path(path)
        for attempt in range(_LOAD_ATTEMPTS):
            snapshot = current_snapshot(folder, legacy_marker=MANIFEST_NAME, what="saved history")
            try:
                return cls._load_snapshot(snapshot, lazy)
            except PersistenceError:
                # Saves to the same folder meanwhile (a save prunes all but the newest two
                # snapshots) can remove the one being read: that is no damage, read the new one.
                moved = current_snapshot(folder, legacy_marker=MANIFEST_NAME, what="saved history")
                if moved == snapshot or attempt == _LOAD_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _load_snapshot(cls, snapshot: Path, lazy: bool) -> HistoryStore:
        manifest = _read_manifest(snapshot / MANIFEST_NAME)
        store = cls(dim=manifest["dim"], embedding_model_id=manifest["embedding_model_id"])
        for entry in manifest["users"]:
            user_id = entry["user_id"]
            if lazy:
                store._users[user_id] = _Saved(snapshot, entry)
            else:
                store._users[user_id] = _read_user(snapshot, entry, store.dim)
        return store


@dataclass(frozen=True)
class _Saved:
    """A user of a lazily loaded folder whose files have not been read yet."""

    folder: Path
    entry: Mapping[str, Any]


_encode_json = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode

# A manifest's user key becomes part of file names: never a path separator or "..".
_SAFE_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")

_RESTORE = "restore the folder from a backup, or re-add the history and save again"
#: How often :meth:`HistoryStore.load` starts again when saves replaced the snapshot it read.
_LOAD_ATTEMPTS = 5


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path``, every field :meth:`HistoryStore.load` relies on checked."""

    def damaged(detail: str) -> PersistenceError:
        return PersistenceError(f"damaged manifest {path}: {detail}; {_RESTORE}")

    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PersistenceError(
            f"damaged saved history: {path} is missing (the snapshot folder {path.parent} is "
            f"incomplete); {_RESTORE}"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise damaged(f"not JSON ({exc})") from exc
    except OSError as exc:
        raise PersistenceError(f"cannot read {path}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise PersistenceError(f"{path} is not a {FORMAT_NAME} manifest; {_RESTORE}")
    if manifest.get("format_version") not in READABLE_FORMAT_VERSIONS:
        raise PersistenceError(
            f"{path.parent} was saved in format version {manifest.get('format_version')}, "
            f"this library reads versions {list(READABLE_FORMAT_VERSIONS)}; load it with the "
            "version of the library that saved it"
        )
    dim = manifest.get("dim")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0):
        raise damaged(f"dim is {dim!r}, not a positive integer")
    model = manifest.get("embedding_model_id")
    if model is not None and not isinstance(model, str):
        raise damaged(f"embedding_model_id is {model!r}, not a string")
    users = manifest.get("users", [])
    if not isinstance(users, list):
        raise damaged("'users' is not a list")
    seen: set[str] = set()
    for n, entry in enumerate(users):
        if not isinstance(entry, dict):
            raise damaged(f"user entry {n} is not an object")
        user_id, key, count = entry.get("user_id"), entry.get("key"), entry.get("count")
        if not isinstance(user_id, str) or not user_id:
            raise damaged(f"user entry {n} has no user_id string")
        if user_id in seen:
            raise damaged(f"user {user_id!r} is listed twice")
        seen.add(user_id)
        if not isinstance(key, str) or not _SAFE_KEY.match(key):
            raise damaged(f"user {user_id!r} has the file key {key!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise damaged(f"user {user_id!r} has the item count {count!r}")
        version = entry.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int):
            raise damaged(f"user {user_id!r} has the version {version!r}")
        anchors = entry.get("anchors")
        if anchors is not None and not (
            isinstance(anchors, list)
            and all(isinstance(a, dict) and isinstance(a.get("anchor_key"), list) for a in anchors)
        ):
            raise damaged(f"user {user_id!r} has malformed anchor entries")
    return {"dim": dim, "embedding_model_id": model, "users": users}


def _read_user(folder: Path, entry: Mapping[str, Any], dim: int | None) -> UserHistory:
    """One user's snapshot from a saved folder, every part checked against the manifest."""
    try:
        return _read_user_files(folder, entry, dim)
    except PersistenceError:
        if (folder / MANIFEST_NAME).is_file():
            raise
        # the snapshot went away while (or before) it was read: pruned, not damaged
        raise _gone(folder, str(entry["user_id"])) from None


def _gone(folder: Path, user_id: str) -> PersistenceError:
    return PersistenceError(
        f"the saved history {folder} that user {user_id!r} was to be read from is gone "
        "(a save keeps only the newest and the previous snapshot, and converts a folder of "
        "the older layout, so later saves to the same place removed it); load the save "
        "folder again"
    )


def _read_user_files(folder: Path, entry: Mapping[str, Any], dim: int | None) -> UserHistory:
    user_id, key = str(entry["user_id"]), str(entry["key"])
    if not (folder / MANIFEST_NAME).is_file():
        raise _gone(folder, user_id)
    users = folder / USERS_DIR
    items_path, vectors_path = users / f"{key}.jsonl", users / f"{key}.npy"
    items = _read_items(items_path, user_id)
    vectors = _read_vectors(vectors_path, user_id)
    if len(items) != entry.get("count") or vectors.shape[0] != len(items):
        raise PersistenceError(
            f"damaged history in {folder}: user {user_id!r} lists {entry.get('count')} "
            f"items, found {len(items)} items in {items_path.name} and {vectors.shape[0]} "
            f"vectors in {vectors_path.name}; {_RESTORE}"
        )
    if len(items) and (vectors.ndim != 2 or vectors.shape[1] != dim):
        raise PersistenceError(
            f"damaged history in {folder}: user {user_id!r} vectors in {vectors_path.name} "
            f"have shape {vectors.shape}, expected (n, {dim}); {_RESTORE}"
        )
    if not np.isfinite(vectors).all():
        raise PersistenceError(
            f"damaged history in {folder}: NaN/inf in {vectors_path.name}, the vectors of "
            f"user {user_id!r}; {_RESTORE}"
        )
    windows = _read_windows(users / f"{key}.windows.npz", entry, user_id, dim)
    host_keys = entry.get("host_keys") or {}
    if not isinstance(host_keys, dict) or not all(
        isinstance(i, str) and isinstance(k, str) for i, k in host_keys.items()
    ):
        raise PersistenceError(
            f"damaged manifest in {folder}: the host keys of user {user_id!r} are not a "
            f"mapping of item ids to keys; {_RESTORE}"
        )
    snapshot = UserHistory(
        user_id,
        items,
        vectors.astype(np.float32, copy=False),
        int(entry.get("version", 1)),
        windows=windows,
        host_keys=host_keys,
    )
    if entry.get("anchors"):
        snapshot._anchors.update(
            _load_anchors(users / f"{key}.anchors.npz", entry["anchors"], snapshot)
        )
    return snapshot


def _read_windows(
    path: Path, entry: Mapping[str, Any], user_id: str, dim: int | None
) -> dict[str, np.ndarray]:
    """The window vectors of a user's long items (none in a save without them)."""
    ids = entry.get("windows")
    if not ids:
        return {}
    try:
        with np.load(path) as z:
            counts, vectors = z["counts"], z["vectors"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise PersistenceError(
            f"damaged history: cannot read {path.name}, the window vectors of user "
            f"{user_id!r} ({exc}); {_RESTORE}"
        ) from exc
    if (
        len(counts) != len(ids)
        or vectors.ndim != 2
        or vectors.shape[0] != int(counts.sum())
        or (dim is not None and vectors.shape[1] != dim)
        or not np.isfinite(vectors).all()
    ):
        raise PersistenceError(
            f"damaged history: {path.name} does not hold the window vectors the manifest lists "
            f"for user {user_id!r}; {_RESTORE}"
        )
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return {
        str(i): vectors[bounds[j] : bounds[j + 1]].astype(np.float32) for j, i in enumerate(ids)
    }


def _read_items(path: Path, user_id: str) -> list[HistoryItem]:
    """The items of a ``.jsonl`` file; PersistenceError naming the file (and line) if damaged."""
    what = f"the items of user {user_id!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PersistenceError(f"damaged history: {path} ({what}) is missing; {_RESTORE}") from None
    except UnicodeDecodeError as exc:
        raise PersistenceError(
            f"damaged history: {path} ({what}) is not UTF-8 text ({exc}); {_RESTORE}"
        ) from exc
    except OSError as exc:
        raise PersistenceError(f"cannot read {path} ({what}): {exc}") from exc
    # split("\n"), not splitlines(): JSON leaves U+2028 and friends unescaped in a line.
    lines = [line for line in text.split("\n") if line.strip()]
    try:
        # One JSON array: a single parser call instead of one per line.
        rows = json.loads("[" + ",".join(lines) + "]")
        if len(rows) == len(lines):
            return [HistoryItem.from_dict(row) for row in rows]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        pass
    # Something is wrong: find the first bad line, to name it.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise TypeError(f"a JSON {type(row).__name__}, not an object")
            HistoryItem.from_dict(row)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise PersistenceError(
                f"damaged history: line {number} of {path} ({what}) is not an item "
                f"({type(exc).__name__}: {exc}); {_RESTORE}"
            ) from exc
    raise PersistenceError(f"damaged history: {path} ({what}) cannot be read; {_RESTORE}")


def _read_vectors(path: Path, user_id: str) -> np.ndarray:
    """The vectors of a ``.npy`` file; PersistenceError naming the file if damaged."""
    what = f"the vectors of user {user_id!r}"
    try:
        vectors = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise PersistenceError(f"damaged history: {path} ({what}) is missing; {_RESTORE}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise PersistenceError(
            f"damaged history: {path} ({what}) cannot be read ({type(exc).__name__}: {exc}); "
            f"{_RESTORE}"
        ) from exc
    if not isinstance(vectors, np.ndarray) or not np.issubdtype(vectors.dtype, np.floating):
        if hasattr(vectors, "close"):
            vectors.close()
        raise PersistenceError(
            f"damaged history: {path} ({what}) does not hold an array of floats; {_RESTORE}"
        )
    return vectors


def _write_user(snap: UserHistory, users: Path) -> dict[str, Any]:
    """Write one user's files into ``users``; return its manifest entry."""
    key = _user_key(snap.user_id)
    with (users / f"{key}.jsonl").open("w", encoding="utf-8") as fh:
        fh.write("".join([_encode_json(item.to_dict()) + "\n" for item in snap.items]))
    np.save(users / f"{key}.npy", np.asarray(snap.vectors))
    entry: dict[str, Any] = {
        "user_id": snap.user_id,
        "key": key,
        "count": len(snap),
        "version": snap.version,
    }
    anchors = [(k, a) for k, a in list(snap._anchors.items()) if a is not None]
    if anchors:
        entry["anchors"] = _save_anchors(users / f"{key}.anchors.npz", anchors)
    if snap.windows:
        ids = list(snap.windows)
        np.savez(
            users / f"{key}.windows.npz",
            counts=np.array([len(snap.windows[i]) for i in ids], dtype=np.int64),
            vectors=np.concatenate([np.asarray(snap.windows[i]) for i in ids]),
        )
        entry["windows"] = ids
    if snap.host_keys:
        entry["host_keys"] = dict(snap.host_keys)
    return entry


def _copy_user(saved: _Saved, users: Path) -> dict[str, Any]:
    """Copy an unread user's files into a new save; return its manifest entry."""
    key = str(saved.entry["key"])
    names = [f"{key}.jsonl", f"{key}.npy"]
    names += [f"{key}.anchors.npz"] if saved.entry.get("anchors") else []
    names += [f"{key}.windows.npz"] if saved.entry.get("windows") else []
    try:
        for name in names:
            shutil.copyfile(saved.folder / USERS_DIR / name, users / name)
    except OSError as exc:
        raise PersistenceError(
            f"it was not read yet and its files in {saved.folder} are gone ({exc}); load the "
            "folder again"
        ) from exc
    return dict(saved.entry)


def _save_anchors(
    path: Path, anchors: Sequence[tuple[AnchorKey, AnchorResult]]
) -> list[dict[str, Any]]:
    """Write anchors' arrays to one ``.npz``; return their manifest entries (key and scalars)."""
    arrays: dict[str, np.ndarray] = {}
    entries: list[dict[str, Any]] = []
    for i, (key, result) in enumerate(anchors):
        graph = result.graph.tocsr()
        arrays[f"{i}_vector"] = np.asarray(result.vector)
        arrays[f"{i}_pagerank"] = np.asarray(result.pagerank)
        arrays[f"{i}_indptr"] = graph.indptr
        arrays[f"{i}_indices"] = graph.indices
        arrays[f"{i}_data"] = graph.data
        entries.append(
            {
                "anchor_key": list(key),
                "iterations": result.iterations,
                "converged": result.converged,
            }
        )
    with path.open("wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
    return entries


def _load_anchors(
    path: Path, entries: Sequence[Mapping[str, Any]], snapshot: UserHistory
) -> dict[AnchorKey, AnchorResult]:
    """Read what :func:`_save_anchors` wrote for ``snapshot``, checking every shape."""
    n, d = len(snapshot), snapshot.dim
    out: dict[AnchorKey, AnchorResult] = {}
    try:
        with np.load(path, allow_pickle=False) as arrays:
            for i, entry in enumerate(entries):
                vector = arrays[f"{i}_vector"]
                pi = arrays[f"{i}_pagerank"]
                indptr = arrays[f"{i}_indptr"]
                indices = arrays[f"{i}_indices"]
                data = arrays[f"{i}_data"]
                ok = (
                    vector.shape == (d,)
                    and pi.shape == (n,)
                    and indptr.shape == (n + 1,)
                    and indices.shape == data.shape == (int(indptr[-1]),)
                    and np.isfinite(vector).all()
                    and np.isfinite(pi).all()
                    and (indices.size == 0 or (indices.min() >= 0 and indices.max() < n))
                )
                if not ok:
                    raise ValueError(f"anchor {i} does not fit {n} items of dimension {d}")
                graph = sp.csr_matrix((data, indices, indptr), shape=(n, n))
                out[tuple(entry["anchor_key"])] = AnchorResult(
                    vector=vector,
                    pagerank=pi,
                    graph=graph,
                    iterations=int(entry["iterations"]),
                    converged=bool(entry["converged"]),
                )
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        KeyError,
        ValueError,
        TypeError,
        AttributeError,
    ) as exc:
        raise PersistenceError(
            f"damaged anchors of user {snapshot.user_id!r}: {path} cannot be read "
            f"({type(exc).__name__}: {exc}); {_RESTORE}"
        ) from exc
    return out
