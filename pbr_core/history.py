"""Per-user history: items, their unit vectors, exact search and cached anchors.

Each user's history is an immutable snapshot (:class:`UserHistory`). A change builds a new
snapshot from validated inputs and swaps it in under a lock, so a query that is running keeps a
consistent view, a rejected change leaves nothing half-written, and everything cached on a
snapshot (its anchors) is invalidated by construction. The new snapshot remembers the previous
one's anchors and where each of its rows was, so that its own anchor is derived incrementally
(:func:`~pbr_core.anchor.update_anchor`) instead of rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .anchor import AnchorResult, compute_anchor, update_anchor
from .config import PBRConfig
from .errors import EmbeddingError, PersistenceError, UnknownUserError
from .vectors import as_unit_rows

FORMAT_NAME = "pbr-history"
#: Version 2 adds each user's cached anchors (``<key>.anchors.npz``); version 1 folders (no
#: anchors) are still read.
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)

#: A re-upserted vector within this distance (max abs difference) of the stored one is the same
#: vector: the stored bits are kept, so re-adding unchanged items (re-normalised on the way in)
#: neither changes the history's vectors nor costs anchor work.
SAME_VECTOR_ATOL = 1e-6

AnchorKey = tuple[Any, ...]


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


class UserHistory:
    """An immutable snapshot of one user's history."""

    def __init__(
        self, user_id: str, items: Sequence[HistoryItem], vectors: np.ndarray, version: int
    ) -> None:
        self.user_id = user_id
        self.items: tuple[HistoryItem, ...] = tuple(items)
        self.vectors = vectors
        self.vectors.setflags(write=False)
        self.version = version
        self._positions = {item.id: i for i, item in enumerate(self.items)}
        self._anchors: dict[AnchorKey, AnchorResult | None] = {}
        # Anchors of an earlier snapshot to derive ours from: key -> (anchor, old_positions),
        # old_positions[i] = row i's position in that snapshot, -1 for a new or changed row.
        self._parents: dict[AnchorKey, tuple[AnchorResult, np.ndarray]] = {}
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
        k = min(k, n)
        top = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
        top = top[np.lexsort((top, -scores[top]))]
        return [(int(i), float(scores[i])) for i in top]

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
    def upsert(self, user_id: str, items: Sequence[HistoryItem], vectors: Any) -> UserHistory:
        """Add items (replacing those with the same id) and return the new snapshot.

        Everything is validated before anything changes: duplicate ids in the batch, a count
        mismatch, NaN/inf or zero vectors, or a wrong dimension raise and leave the store as it was.
        """
        if not isinstance(user_id, str) or not user_id:
            raise ValueError("user_id must be a non-empty string")
        items = list(items)
        ids = [item.id for item in items]
        if len(set(ids)) != len(ids):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"duplicate item ids in one batch: {dupes}")
        for item in items:
            if not item.text or not item.text.strip():
                raise ValueError(f"item {item.id!r} has empty text")
        with self._lock:
            if not items:
                return self._current(user_id) or self._replace(user_id, [], None)
            rows = as_unit_rows(vectors, dim=self.dim, what=f"vectors for user {user_id!r}")
            if rows.shape[0] != len(items):
                raise EmbeddingError(f"{len(items)} items but {rows.shape[0]} vectors")
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
            return self._replace(user_id, merged_items, new_vectors, old_positions)

    def delete(self, user_id: str, ids: Iterable[str]) -> UserHistory:
        """Remove items by id; unknown ids raise ``KeyError`` and nothing is removed."""
        with self._lock:
            old = self.get(user_id)
            drop = set(ids)
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
        vectors: np.ndarray | None,
        old_positions: np.ndarray | None = None,
    ) -> UserHistory:
        old = self._current(user_id)
        if vectors is None:
            vectors = np.zeros((0, self.dim or 0), dtype=np.float32)
        snapshot = UserHistory(user_id, items, vectors, version=(old.version + 1) if old else 1)
        if old is not None and old_positions is not None:
            snapshot._inherit_anchors(old, old_positions)
        self._users[user_id] = snapshot
        return snapshot

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write every user to ``path`` (a folder), atomically replacing an earlier save.

        Each user's items (JSON lines), vectors (``.npy``) and the anchors computed so far
        (``.anchors.npz``: graph, PageRank and anchor per parameter set), so that a restarted
        process answers its first query without rebuilding any anchor. Users of a lazily loaded
        folder that were never read are copied file by file.
        """
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        users = tmp / "users"
        users.mkdir(parents=True)
        with self._lock:
            snapshots = list(self._users.values())
            manifest: dict[str, Any] = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "dim": self.dim,
                "embedding_model_id": self.embedding_model_id,
                "users": [],
            }
        for snap in snapshots:
            if isinstance(snap, _Saved):
                manifest["users"].append(_copy_user(snap, users))
                continue
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
            manifest["users"].append(entry)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        if old.exists():
            shutil.rmtree(old)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, lazy: bool = False) -> HistoryStore:
        """Read a folder written by :meth:`save`; raise PersistenceError if missing or damaged.

        Args:
            path: the folder.
            lazy: read only the manifest now and each user's files on first use (first query,
                upsert, ...). A restarted server then answers its first query after reading one
                user, not all of them; a damaged user file raises :class:`PersistenceError` when
                that user is first used, and the folder must stay in place until then.
        """
        folder = Path(path)
        manifest_path = folder / "manifest.json"
        if not folder.is_dir():
            raise PersistenceError(f"no saved history at {folder} (folder does not exist)")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PersistenceError(
                f"{folder} is not a saved history: manifest.json missing"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PersistenceError(f"damaged manifest {manifest_path}: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            raise PersistenceError(f"{manifest_path} is not a {FORMAT_NAME} manifest")
        if manifest.get("format_version") not in READABLE_FORMAT_VERSIONS:
            raise PersistenceError(
                f"{folder} was saved in format version {manifest.get('format_version')}, "
                f"this library reads versions {list(READABLE_FORMAT_VERSIONS)}"
            )
        store = cls(dim=manifest.get("dim"), embedding_model_id=manifest.get("embedding_model_id"))
        for entry in manifest.get("users", []):
            try:
                user_id = str(entry["user_id"])
                str(entry["key"])
            except (KeyError, TypeError) as exc:
                raise PersistenceError(f"damaged manifest {manifest_path}: {exc}") from exc
            if lazy:
                store._users[user_id] = _Saved(folder, entry)
            else:
                store._users[user_id] = _read_user(folder, entry, store.dim)
        return store


@dataclass(frozen=True)
class _Saved:
    """A user of a lazily loaded folder whose files have not been read yet."""

    folder: Path
    entry: Mapping[str, Any]


_encode_json = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode


def _read_user(folder: Path, entry: Mapping[str, Any], dim: int | None) -> UserHistory:
    """One user's snapshot from a saved folder, every part checked against the manifest."""
    user_id, key = str(entry["user_id"]), str(entry["key"])
    try:
        with (folder / "users" / f"{key}.jsonl").open(encoding="utf-8") as fh:
            # split("\n"), not splitlines(): JSON leaves U+2028 and friends unescaped in a line.
            lines = [line for line in fh.read().split("\n") if line.strip()]
        # One JSON array: a single parser call instead of one per line.
        items = [HistoryItem.from_dict(row) for row in json.loads("[" + ",".join(lines) + "]")]
        vectors = np.load(folder / "users" / f"{key}.npy", allow_pickle=False)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise PersistenceError(f"damaged history in {folder}: {exc}") from exc
    if len(items) != entry.get("count") or vectors.shape[0] != len(items):
        raise PersistenceError(
            f"damaged history in {folder}: user {user_id!r} lists {entry.get('count')} "
            f"items, found {len(items)} items and {vectors.shape[0]} vectors"
        )
    if len(items) and (vectors.ndim != 2 or vectors.shape[1] != dim):
        raise PersistenceError(
            f"damaged history in {folder}: user {user_id!r} vectors have shape "
            f"{vectors.shape}, expected (n, {dim})"
        )
    if not np.isfinite(vectors).all():
        raise PersistenceError(f"damaged history in {folder}: NaN/inf in {user_id!r}")
    snapshot = UserHistory(
        user_id, items, vectors.astype(np.float32, copy=False), int(entry.get("version", 1))
    )
    if entry.get("anchors"):
        snapshot._anchors.update(
            _load_anchors(folder / "users" / f"{key}.anchors.npz", entry["anchors"], snapshot)
        )
    return snapshot


def _copy_user(saved: _Saved, users: Path) -> dict[str, Any]:
    """Copy an unread user's files into a new save; return its manifest entry."""
    key = str(saved.entry["key"])
    names = [f"{key}.jsonl", f"{key}.npy"] + (
        [f"{key}.anchors.npz"] if saved.entry.get("anchors") else []
    )
    try:
        for name in names:
            shutil.copyfile(saved.folder / "users" / name, users / name)
    except OSError as exc:
        raise PersistenceError(
            f"user {saved.entry['user_id']!r} was not read yet and its files in {saved.folder} "
            f"are gone: {exc}"
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
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise PersistenceError(
            f"damaged anchors of user {snapshot.user_id!r} in {path.parent.parent}: {exc}"
        ) from exc
    return out
