"""Every user's history in one process: :class:`HistoryStore`, pbr's per-user cache.

The store owns which snapshot (:class:`~pbr_core.snapshot.UserHistory`) is current for each
user, and every change to it: a change is validated completely
(:mod:`pbr_core.items`), builds a new snapshot and swaps it in under a lock, so a rejected change
leaves nothing half-written. It also decides what a save holds and when a lazily loaded user is
read; the files themselves are :mod:`pbr_core.history_format`'s, and the atomic replacement of a
save folder is :mod:`pbr_core.persist`'s.

The names that lived here before the history was split by concern (``HistoryItem``,
``UserHistory``, ``top_k``, ``check_batch``, ``check_ids``, ``check_serialisable``) are
re-exported, so ``from pbr_core.history import ...`` keeps working.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import EmbeddingError, PersistenceError, UnknownUserError
from .history_format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    USERS_DIR,
    Saved,
    copy_user,
    manifest_text,
    read_manifest,
    read_user,
    write_user,
)
from .items import HistoryItem, check_batch, check_ids, check_serialisable, checked_windows
from .persist import current_snapshot, write_atomically
from .snapshot import UserHistory, top_k
from .vectors import as_unit_rows

__all__ = [
    "SAME_VECTOR_ATOL",
    "HistoryItem",
    "HistoryStore",
    "UserHistory",
    "check_batch",
    "check_ids",
    "check_serialisable",
    "top_k",
]

#: A re-upserted vector within this distance (max abs difference) of the stored one is the same
#: vector: the stored bits are kept, so re-adding unchanged items (re-normalised on the way in)
#: neither changes the history's vectors nor costs anchor work.
SAME_VECTOR_ATOL = 1e-6


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
        # A user of a folder loaded with lazy=True is a Saved entry until first used.
        self._users: dict[str, UserHistory | Saved] = {}
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
        if not isinstance(history, Saved):
            return history
        with self._lock:
            history = self._users.get(user_id)
            if isinstance(history, Saved):
                history = read_user(history.folder, history.entry, self.dim)
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
                item_id: checked_windows(
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
        # (user, what it was loaded as, its entry in the new save)
        copied: list[tuple[str, Saved, dict[str, Any]]] = []
        unchanged = f"nothing was replaced: {target} still holds the previous save"

        def write(folder: Path) -> None:
            users = folder / USERS_DIR
            users.mkdir()
            entries: list[dict[str, Any]] = []
            for user_id, snap in users_now:
                try:
                    if isinstance(snap, Saved):
                        entries.append(copy_user(snap, users))
                        copied.append((user_id, snap, entries[-1]))
                    else:
                        entries.append(write_user(snap, users))
                except (OSError, ValueError, TypeError, RecursionError) as exc:
                    raise PersistenceError(
                        f"could not save user {user_id!r}: {exc}; {unchanged}. Fix this user's "
                        f"data (or drop_user({user_id!r})) and save again"
                    ) from exc
            try:
                text = manifest_text(header, entries)
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
                for user_id, saved, entry in copied:
                    if self._users.get(user_id) is saved:
                        self._users[user_id] = Saved(snapshot, entry)
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
        process answers its first query without rebuilding any anchor. The manifest records the
        size and sha256 of every file and a checksum of itself, so that a load finds any damage
        (:mod:`pbr_core.history_format`). Users of a lazily loaded folder that were never read
        are copied file by file, with the checksums recorded when they were saved (their files
        are not read), and are read from the new snapshot afterwards (the one they were loaded
        from may be pruned by a later save).

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
        older version, the files directly in it. Every file of a user is checked against the
        size and sha256 its manifest records, and the manifest against its own checksum, as it
        is read (about 1 ms per 1,000 items of dimension 384). Format versions 1 and 2 (saved
        before checksums) are read without that check; the next save records them.

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
        manifest = read_manifest(snapshot / MANIFEST_NAME)
        store = cls(dim=manifest["dim"], embedding_model_id=manifest["embedding_model_id"])
        for entry in manifest["users"]:
            user_id = entry["user_id"]
            if lazy:
                store._users[user_id] = Saved(snapshot, entry)
            else:
                store._users[user_id] = read_user(snapshot, entry, store.dim)
        return store


#: How often :meth:`HistoryStore.load` starts again when saves replaced the snapshot it read.
_LOAD_ATTEMPTS = 5
