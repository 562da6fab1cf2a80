"""Per-user history: items, their unit vectors, a faiss index and a cached anchor.

Each user's history is an immutable snapshot (:class:`UserHistory`). A change builds a new
snapshot from validated inputs and swaps it in under a lock, so a query that is running keeps a
consistent view, a rejected change leaves nothing half-written, and everything cached on a
snapshot (its faiss index, its anchors) is invalidated by construction.
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

import faiss
import numpy as np

from .anchor import AnchorResult, compute_anchor
from .config import PBRConfig
from .errors import EmbeddingError, PersistenceError, UnknownUserError
from .vectors import as_unit_rows

FORMAT_NAME = "pbr-history"
FORMAT_VERSION = 1


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
        self._index: faiss.Index | None = None
        self._anchors: dict[tuple[Any, ...], AnchorResult | None] = {}
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
        """Positions and inner products of the ``k`` items nearest to ``vector``, best first."""
        if len(self.items) == 0 or k <= 0:
            return []
        index = self._index
        if index is None:
            with self._lock:
                if self._index is None:
                    built = faiss.IndexFlatIP(self.dim)
                    built.add(np.ascontiguousarray(self.vectors))
                    self._index = built
                index = self._index
        query = np.ascontiguousarray(np.asarray(vector, dtype=np.float32).reshape(1, -1))
        scores, ids = index.search(query, min(k, len(self.items)))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def anchor(self, config: PBRConfig) -> AnchorResult | None:
        """The anchor for ``config``'s graph parameters, computed once per snapshot."""
        key = config.anchor_key
        if key in self._anchors:
            return self._anchors[key]
        with self._lock:
            if key not in self._anchors:
                self._anchors[key] = compute_anchor(np.asarray(self.vectors), config)
            return self._anchors[key]


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
        self._users: dict[str, UserHistory] = {}
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
        try:
            return self._users[user_id]
        except KeyError:
            raise UnknownUserError(user_id) from None

    def known_vectors(self, user_id: str, items: Sequence[HistoryItem]) -> list[np.ndarray | None]:
        """Stored vectors of items whose id *and* text are already stored (no re-embedding)."""
        history = self._users.get(user_id)
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
                return self._users.get(user_id) or self._replace(user_id, [], None)
            rows = as_unit_rows(vectors, dim=self.dim, what=f"vectors for user {user_id!r}")
            if rows.shape[0] != len(items):
                raise EmbeddingError(f"{len(items)} items but {rows.shape[0]} vectors")
            old = self._users.get(user_id)
            merged_items = list(old.items) if old is not None else []
            merged_vecs = [np.asarray(old.vectors)] if old is not None else []
            positions = {it.id: i for i, it in enumerate(merged_items)}
            replace_pos = [
                (positions[it.id], j) for j, it in enumerate(items) if it.id in positions
            ]
            fresh = [j for j, it in enumerate(items) if it.id not in positions]
            base = np.concatenate(merged_vecs) if merged_vecs else np.zeros((0, rows.shape[1]))
            base = base.astype(np.float32, copy=True)
            for pos, j in replace_pos:
                merged_items[pos] = items[j]
                base[pos] = rows[j]
            merged_items.extend(items[j] for j in fresh)
            new_vectors = np.concatenate([base, rows[fresh]]) if fresh else base
            if self.dim is None:
                self.dim = int(rows.shape[1])
            return self._replace(user_id, merged_items, new_vectors)

    def delete(self, user_id: str, ids: Iterable[str]) -> UserHistory:
        """Remove items by id; unknown ids raise ``KeyError`` and nothing is removed."""
        with self._lock:
            old = self.get(user_id)
            drop = set(ids)
            missing = sorted(i for i in drop if old.position(i) is None)
            if missing:
                raise KeyError(f"user {user_id!r} has no item(s) {missing}")
            keep = [i for i, item in enumerate(old.items) if item.id not in drop]
            return self._replace(
                user_id, [old.items[i] for i in keep], np.asarray(old.vectors)[keep].copy()
            )

    def drop_user(self, user_id: str) -> None:
        with self._lock:
            self.get(user_id)
            del self._users[user_id]

    def _replace(
        self, user_id: str, items: Sequence[HistoryItem], vectors: np.ndarray | None
    ) -> UserHistory:
        old = self._users.get(user_id)
        if vectors is None:
            vectors = np.zeros((0, self.dim or 0), dtype=np.float32)
        snapshot = UserHistory(user_id, items, vectors, version=(old.version + 1) if old else 1)
        self._users[user_id] = snapshot
        return snapshot

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write every user to ``path`` (a folder), atomically replacing an earlier save."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "users").mkdir(parents=True)
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
            key = _user_key(snap.user_id)
            with (tmp / "users" / f"{key}.jsonl").open("w", encoding="utf-8") as fh:
                for item in snap.items:
                    fh.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")
            np.save(tmp / "users" / f"{key}.npy", np.asarray(snap.vectors))
            manifest["users"].append(
                {"user_id": snap.user_id, "key": key, "count": len(snap), "version": snap.version}
            )
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        if target.exists():
            target.rename(old)
        tmp.rename(target)
        if old.exists():
            shutil.rmtree(old)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HistoryStore:
        """Read a folder written by :meth:`save`; raise PersistenceError if missing or damaged."""
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
        if manifest.get("format_version") != FORMAT_VERSION:
            raise PersistenceError(
                f"{folder} was saved in format version {manifest.get('format_version')}, "
                f"this library reads version {FORMAT_VERSION}"
            )
        store = cls(dim=manifest.get("dim"), embedding_model_id=manifest.get("embedding_model_id"))
        for entry in manifest.get("users", []):
            try:
                user_id, key = str(entry["user_id"]), str(entry["key"])
                with (folder / "users" / f"{key}.jsonl").open(encoding="utf-8") as fh:
                    items = [HistoryItem.from_dict(json.loads(line)) for line in fh if line.strip()]
                vectors = np.load(folder / "users" / f"{key}.npy", allow_pickle=False)
            except (OSError, KeyError, ValueError, TypeError) as exc:
                raise PersistenceError(f"damaged history in {folder}: {exc}") from exc
            if len(items) != entry.get("count") or vectors.shape[0] != len(items):
                raise PersistenceError(
                    f"damaged history in {folder}: user {user_id!r} lists {entry.get('count')} "
                    f"items, found {len(items)} items and {vectors.shape[0]} vectors"
                )
            if len(items) and (vectors.ndim != 2 or vectors.shape[1] != store.dim):
                raise PersistenceError(
                    f"damaged history in {folder}: user {user_id!r} vectors have shape "
                    f"{vectors.shape}, expected (n, {store.dim})"
                )
            if not np.isfinite(vectors).all():
                raise PersistenceError(f"damaged history in {folder}: NaN/inf in {user_id!r}")
            store._users[user_id] = UserHistory(
                user_id, items, vectors.astype(np.float32), int(entry.get("version", 1))
            )
        return store
