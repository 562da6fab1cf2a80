"""Every user's history in one process: :class:`HistoryStore`, pbr's per-user cache.

The store owns which snapshot (:class:`~pbr_core.snapshot.UserHistory`) is current for each
user, and every change to it: a change is validated completely
(:mod:`pbr_core.items`), builds a new snapshot and swaps it in under a lock, so a rejected change
leaves nothing half-written. It also decides what a save holds and when a lazily loaded user is
read; the files themselves are :mod:`pbr_core.history_format`'s, and the atomic replacement of a
save folder is :mod:`pbr_core.persist`'s.

**A byte budget.** Over a host store that lists a user's records
(:class:`~pbr_core.corpus.Corpus`), or for a lazily loaded user unchanged since its save, the
store is only a cache: the least recently used such users are evicted whole when the resident
users hold more than ``max_cache_bytes`` (:attr:`HistoryStore.cached_bytes`), and read back on
their next use. A user that can be read back from nowhere is never evicted.

The names that lived here before the history was split by concern (``HistoryItem``,
``UserHistory``, ``top_k``, ``check_batch``, ``check_ids``, ``check_serialisable``) are
re-exported, so ``from pbr_core.history import ...`` keeps working.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

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
from .items import (
    HistoryItem,
    check_batch,
    check_ids,
    check_one_history,
    check_serialisable,
    checked_windows,
)
from .persist import read_current, write_atomically
from .snapshot import UserHistory, top_k
from .vectors import as_unit_rows

__all__ = [
    "DEFAULT_MAX_CACHE_BYTES",
    "SAME_VECTOR_ATOL",
    "HistoryItem",
    "HistoryStore",
    "ReadBack",
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

#: The budget of a :class:`HistoryStore` given no ``max_cache_bytes`` (bytes): 1 GiB, about 400
#: warm users of 1,000 items at 384-d (2.1-2.8 MB each). It bounds only users that can be read
#: back, so a store that is the only record of its users is never cut by it.
DEFAULT_MAX_CACHE_BYTES = 1 << 30


class ReadBack(Protocol):
    """Who can read a store's user back from elsewhere: a :class:`~pbr_core.corpus.Corpus`
    over a host store that lists its records. :meth:`HistoryStore.attach` registers one; the
    store asks it before evicting a user (the store imports no corpus)."""

    def can_read_back(self, user_id: str) -> bool:
        """Whether ``user_id`` can be read back in full from elsewhere (False: never evicted
        until it is read again)."""
        ...

    def release(self, user_id: str) -> bool:
        """Forget what the owner knows of ``user_id`` (so its next read re-reads the user in
        full) and return True; False where the user is being read or written now (it is tried
        again after the other users)."""
        ...


def _check_budget(max_cache_bytes: object) -> int | None:
    if max_cache_bytes is None:
        return None
    if isinstance(max_cache_bytes, bool) or not isinstance(max_cache_bytes, int):
        raise ValueError(
            f"max_cache_bytes must be a number of bytes (an int >= 0) or None for the default "
            f"({DEFAULT_MAX_CACHE_BYTES}), got {max_cache_bytes!r}"
        )
    if max_cache_bytes < 0:
        raise ValueError(f"max_cache_bytes must be >= 0 bytes, got {max_cache_bytes}")
    return max_cache_bytes


class HistoryStore:
    """All users' histories, in memory, with validation, persistence and a shared dimension.

    Args:
        dim: vector dimension; fixed by the first insert when not given.
        embedding_model_id: recorded on save and checked on load, so vectors of one model are
            never searched with another's queries.
        max_cache_bytes: the budget (bytes) of the users held in memory
            (:attr:`cached_bytes`). When it is exceeded, the least recently used users that
            can be read back are evicted whole: a user of a lazy load unchanged since its save
            goes back to its saved files, a user of a :class:`~pbr_core.corpus.Corpus` over a
            host store that lists is dropped and re-read from the host on its next use. The
            user being read stays even if it alone exceeds the budget. None (default):
            :data:`DEFAULT_MAX_CACHE_BYTES`, applied to users that can be read back only. An
            explicit budget is refused by a corpus whose users cannot be read back (no host
            store, or one that cannot list, and no lazy load): there it would have to lose
            data. See docs/deployment.md.
    """

    def __init__(
        self,
        dim: int | None = None,
        embedding_model_id: str | None = None,
        *,
        max_cache_bytes: int | None = None,
    ) -> None:
        budget = _check_budget(max_cache_bytes)
        # checked as a load checks them: a store that took them would save a folder no load reads
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
            raise ValueError(f"dim must be an integer >= 1 or None, got {dim!r}")
        if embedding_model_id is not None and not isinstance(embedding_model_id, str):
            raise ValueError(
                f"embedding_model_id must be a string or None, got {embedding_model_id!r}"
            )
        self.dim = dim
        self.embedding_model_id = embedding_model_id
        #: The budget in bytes, and whether it was given (an explicit one is refused where
        #: users cannot be read back; the default applies only to users that can be).
        self.max_cache_bytes = DEFAULT_MAX_CACHE_BYTES if budget is None else budget
        self.budget_explicit = budget is not None
        #: Loaded with lazy=True: a user unchanged since its save may go back to its files.
        self.lazy = False
        #: Users evicted so far (a count, for monitoring).
        self.evictions = 0
        # A user of a folder loaded with lazy=True is a Saved entry until first used.
        self._users: dict[str, UserHistory | Saved] = {}
        self._lock = threading.RLock()
        # Resident users (a UserHistory in _users) and their last measured bytes: those that may
        # be evicted, least recently used first, and those that could not be when last tried
        # (tried again when next read, or after a save).
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._held: dict[str, int] = {}
        self._total = 0
        # users whose snapshot built a cache since they were measured (UserHistory._grow
        # tells): a request builds its user's anchor and BM25 index after the read that
        # measured the user, however many other users are read meanwhile
        self._grew: set[str] = set()
        # User -> (the saved entry it was read from or last saved as, the snapshot then).
        self._origin: dict[str, tuple[Saved, UserHistory | None]] = {}
        self._owners: list[weakref.ref[ReadBack]] = []

    # -- reading -------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_owners")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_sizes" not in state:  # pickled before the cache budget: count its users now
            fresh = HistoryStore(state.get("dim"), state.get("embedding_model_id"))
            state = {**fresh.__dict__, **state}
            resident = [u for u, h in state["_users"].items() if isinstance(h, UserHistory)]
            state["_sizes"] = OrderedDict.fromkeys(resident, 0)
        self.__dict__.update(state)
        self.__dict__.pop("_recent", None)  # pickled when the last 8 users read were remeasured
        self.__dict__.setdefault("_grew", set())
        self._lock = threading.RLock()
        self._owners = []  # an owner registers itself again (Corpus.__setstate__)

    @property
    def cached_bytes(self) -> int:
        """Bytes the resident users hold, measured now (every resident user's
        :meth:`~pbr_core.snapshot.UserHistory.nbytes`: items estimated, arrays exact: vectors,
        windows, anchors, BM25 index). Users not yet read from a lazy load count 0."""
        with self._lock:
            for user_id in [*self._sizes, *self._held]:
                self._measure(user_id)
            return self._total

    def attach(self, owner: ReadBack) -> None:
        """Let ``owner`` (a corpus over a host store that lists) release users for eviction.

        Held by a weak reference: the store does not keep its owner alive. Where several owners
        share the store, a user is evicted only if every one of them releases it.
        """
        with self._lock:
            self._owners = [r for r in self._owners if r() not in (None, owner)]
            self._owners.append(weakref.ref(owner))

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
        """The user's snapshot (read from disk first if loaded lazily), None if unknown; a read
        makes the user the most recently used one."""
        if user_id not in self._users:
            return None
        while True:
            with self._lock:
                history = self._users.get(user_id)
                if not isinstance(history, Saved):
                    if history is not None:
                        self._touch(user_id)
                    return history
                saved = history
            # The files are read outside the store's lock (hundreds of ms for a large user):
            # other users' reads do not wait for this one's disk.
            try:
                read = read_user(saved.folder, saved.entry, self.dim)
            except PersistenceError:
                with self._lock:
                    if self._users.get(user_id) is saved:
                        raise
                continue  # a save of this store moved the user (and pruned its old files)
            with self._lock:
                if self._users.get(user_id) is saved:
                    self._users[user_id] = read  # same dict position: users() keeps its order
                    self._origin[user_id] = (saved, read)
                    self._touch(user_id)
                    return read
            # changed meanwhile (read by another thread, written, dropped, or moved by a
            # save): what it is now decides

    def needs_read(self, user_id: str) -> bool:
        """Whether the user's files are still to be read (a lazy load's user not used yet, or
        evicted back to its files): the next use reads the disk."""
        return isinstance(self._users.get(user_id), Saved)

    # -- the budget ----------------------------------------------------------------------------
    def _touch(self, user_id: str) -> None:
        """Make ``user_id`` (resident) the most recently used, measure it, and evict others
        while the budget is exceeded (lock held)."""
        while self._grew:  # the users whose snapshot built a cache since they were measured
            self._measure(self._grew.pop())
        if user_id in self._held:
            self._sizes[user_id] = self._held.pop(user_id)
        elif user_id not in self._sizes:
            self._sizes[user_id] = 0
        self._sizes.move_to_end(user_id)
        history = self._users.get(user_id)
        if isinstance(history, UserHistory) and history._watcher is None:
            history._watcher = functools.partial(self._grew.add, user_id)
        self._measure(user_id)
        self._evict(keep=user_id)

    def _measure(self, user_id: str) -> None:
        """Update the recorded bytes of a resident user (lock held)."""
        history = self._users.get(user_id)
        table = self._sizes if user_id in self._sizes else self._held
        if not isinstance(history, UserHistory) or user_id not in table:
            return
        held = history.nbytes()
        self._total += held - table[user_id]
        table[user_id] = held

    def _evict(self, keep: str | None) -> None:
        """Evict least recently used users that can be read back until the resident ones fit
        the budget; ``keep`` (the user being read) is never evicted (lock held)."""
        for _ in range(len(self._sizes)):  # each candidate is looked at once
            if self._total <= self.max_cache_bytes:
                return
            victim = next((u for u in self._sizes if u != keep), None)
            if victim is None:
                return
            self._release(victim)

    def _release(self, user_id: str) -> None:
        """Evict one resident user if it can be read back; else set it aside: until it is
        read again if it cannot be read back, after the others if it is busy."""
        history = self._users[user_id]
        origin = self._origin.get(user_id)
        if origin is not None and origin[1] is history:
            self._users[user_id] = origin[0]  # unchanged since the save: read again from it
        else:
            owners = [owner for ref in self._owners if (owner := ref()) is not None]
            if not owners or not all(owner.can_read_back(user_id) for owner in owners):
                self._held[user_id] = self._sizes.pop(user_id)
                return
            if not all(owner.release(user_id) for owner in owners):
                self._sizes.move_to_end(user_id)
                return
            del self._users[user_id]
        self._forget(user_id)
        self.evictions += 1

    def _forget(self, user_id: str) -> None:
        """Stop counting ``user_id`` (evicted or dropped; lock held)."""
        self._total -= self._sizes.pop(user_id, 0) + self._held.pop(user_id, 0)
        self._origin.pop(user_id, None)

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
        *,
        checked: bool = False,
    ) -> UserHistory:
        """Add items (replacing those with the same id) and return the new snapshot.

        ``windows``: item id -> unit vectors of the windows of an item longer than the embedder
        reads (:mod:`pbr_core.windows`); a replaced item's old windows are dropped with its text.
        ``host_keys``: item id -> the key a host store that cannot list holds it under, where
        that is not pbr's own (:class:`pbr_core.corpus.Corpus` keeps them; saved with the user).

        Everything is validated before anything changes: duplicate ids in the batch, a count
        mismatch, NaN/inf or zero vectors, a wrong dimension, or a value that could not be saved
        (see :func:`check_serialisable`) raise and leave the store as it was. ``checked``: the
        caller has just run :func:`check_serialisable` on exactly these items (a cold read of
        1k items: ~2 ms not spent twice).

        An empty batch changes nothing: it returns the user's snapshot, or, for a user with no
        history, an empty snapshot that is *not* stored (the user stays unknown, and its first
        real batch fixes the dimension as usual).
        """
        if not isinstance(user_id, str) or not user_id:
            raise ValueError("user_id must be a non-empty string")
        items = list(items)
        if not checked:
            check_serialisable(user_id, items)
        check_one_history(items)
        ids = [item.id for item in items]
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
            self._forget(user_id)

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
        origin = self._origin.get(user_id)
        if origin is not None and origin[1] is not None:  # changed since read: it cannot go
            self._origin[user_id] = (origin[0], None)  # back, and the old snapshot is let go
        self._touch(user_id)
        return snapshot

    # -- persistence ---------------------------------------------------------------------------
    def save_within(self, path: str | os.PathLike[str]) -> Callable[[], Path]:
        """:meth:`save`, for a save that is part of a larger atomic write (an adapter saving
        its index beside the histories): returns ``commit``, to call once the larger write has
        succeeded. Until then, users of a lazy load that were never read keep reading their
        old files; if the larger write fails and removes this folder, nothing points into it.
        """
        target = Path(path)
        # (user, what it was loaded as, its entry in the new save)
        copied: list[tuple[str, Saved, dict[str, Any]]] = []
        # (user, the snapshot written, its entry in the new save)
        written: list[tuple[str, UserHistory, dict[str, Any]]] = []
        unchanged = f"nothing was replaced: {target} still holds the previous save"

        def write(folder: Path) -> None:
            # Read under the folder's writer lock: of two saves of this store to one folder,
            # the one that commits last has read the store last (read before the lock, an
            # older read could replace a newer save).
            with self._lock:
                users_now = list(self._users.items())
                header: dict[str, Any] = {
                    "format": FORMAT_NAME,
                    "format_version": FORMAT_VERSION,
                    "dim": self.dim,
                    "embedding_model_id": self.embedding_model_id,
                }
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
                        written.append((user_id, snap, entries[-1]))
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

        snapshot = write_atomically(
            target,
            write,
            legacy_names=(MANIFEST_NAME, USERS_DIR),
            legacy_format=FORMAT_NAME,
            manifest=MANIFEST_NAME,
        )

        def here(saved: Saved) -> bool:
            """Whether ``saved`` lies in the folder just saved to (a snapshot of it, or the
            folder itself in the older layout, which the save converts): only that folder's
            saves remove it. A save elsewhere (an export, a backup the app may delete) moves no
            read there."""
            folder = snapshot.parent.resolve()
            return folder in (saved.folder.resolve(), saved.folder.resolve().parent)

        def commit() -> Path:
            with self._lock:
                # The copies are in the new snapshot: read them from there from now on.
                for user_id, saved, entry in copied:
                    if not here(saved):
                        continue
                    copy = Saved(snapshot, entry)
                    if self._users.get(user_id) is saved:
                        self._users[user_id] = copy
                    origin = self._origin.get(user_id)
                    if origin is not None and origin[0] is saved:  # read during the save: an
                        # eviction reads it back from the copy (the old files may be pruned)
                        self._origin[user_id] = (copy, origin[1])
                if self.lazy:  # users unchanged since this save may go back to it
                    for user_id, snap, entry in written:
                        origin = self._origin.get(user_id)
                        if origin is not None and not here(origin[0]):
                            continue  # it goes back to the folder it came from
                        if self._users.get(user_id) is snap:
                            self._origin[user_id] = (Saved(snapshot, entry), snap)
                            if user_id in self._held:
                                self._sizes[user_id] = self._held.pop(user_id)
                                self._sizes.move_to_end(user_id, last=False)
                    self._evict(keep=None)
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
        are not read), and are read from the new snapshot afterwards where ``path`` is the
        folder they were loaded from (a later save there may prune the old snapshot); a save to
        another folder (an export, a backup) leaves them reading, and evicted back to, the
        folder they came from. A user with no saved files yet goes back to this save's files.

        Returns:
            ``path`` as a :class:`~pathlib.Path`: what :meth:`load` takes.

        Raises:
            PersistenceError: a user could not be written (the message names it) or the folder
                cannot be written to; ``path`` still holds the previous save, unchanged.
        """
        return self.save_within(path)()

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        lazy: bool = False,
        max_cache_bytes: int | None = None,
    ) -> HistoryStore:
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
                process prune it. A user unchanged since the load (or since this store's last
                save) may be evicted back to its files under ``max_cache_bytes``.
            max_cache_bytes: the store's budget (see :class:`HistoryStore`).

        Raises:
            PersistenceError: the folder is missing or a file in it is damaged; the message
                names the file.
        """
        return read_current(
            path,
            lambda snapshot: cls._load_snapshot(snapshot, lazy, max_cache_bytes),
            legacy_marker=MANIFEST_NAME,
            what="saved history",
        )

    @classmethod
    def _load_snapshot(
        cls, snapshot: Path, lazy: bool, max_cache_bytes: int | None
    ) -> HistoryStore:
        manifest = read_manifest(snapshot / MANIFEST_NAME)
        store = cls(
            dim=manifest["dim"],
            embedding_model_id=manifest["embedding_model_id"],
            max_cache_bytes=max_cache_bytes,
        )
        store.lazy = lazy
        with store._lock:
            for entry in manifest["users"]:
                user_id = entry["user_id"]
                if lazy:
                    store._users[user_id] = Saved(snapshot, entry)
                else:
                    store._users[user_id] = read_user(snapshot, entry, store.dim)
                    store._touch(user_id)
        return store
