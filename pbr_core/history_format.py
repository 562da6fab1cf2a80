"""The on-disk format of a saved history: what one snapshot folder holds, written and read back.

Owns the manifest (``manifest.json``: format, dimension, embedding model, one entry per user)
and each user's files in ``users/`` (items as JSON lines, vectors as ``.npy``, window vectors and
cached anchors as ``.npz``): :func:`write_user` writes a user, :func:`copy_user` carries an
unread user of a lazy load into a new save, :func:`read_manifest` and :func:`read_user` read them
back with every part checked, so a damaged file is a :class:`PersistenceError` naming it. Where
the snapshot folder lives and how it becomes current atomically is :mod:`pbr_core.persist`'s
business; which users are saved when is :class:`pbr_core.history.HistoryStore`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .anchor import AnchorResult
from .errors import PersistenceError
from .items import HistoryItem
from .snapshot import AnchorKey, UserHistory

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "READABLE_FORMAT_VERSIONS",
    "USERS_DIR",
    "Saved",
    "copy_user",
    "read_manifest",
    "read_user",
    "write_user",
]

FORMAT_NAME = "pbr-history"
#: Version 2 adds each user's cached anchors (``<key>.anchors.npz``); version 1 folders (no
#: anchors) are still read.
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
#: The files of one save (inside the snapshot folder that ``CURRENT`` names, see
#: :mod:`pbr_core.persist`; directly in the save folder for folders saved by older versions).
MANIFEST_NAME = "manifest.json"
USERS_DIR = "users"


def _user_key(user_id: str) -> str:
    """A file-name-safe stable key for any user id (quotes, slashes, operators included)."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:24]


@dataclass(frozen=True)
class Saved:
    """A user of a lazily loaded folder whose files have not been read yet."""

    folder: Path
    entry: Mapping[str, Any]


_encode_json = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode

# A manifest's user key becomes part of file names: never a path separator or "..".
_SAFE_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")

_RESTORE = "restore the folder from a backup, or re-add the history and save again"


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path``, every field a load relies on checked."""

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


def read_user(folder: Path, entry: Mapping[str, Any], dim: int | None) -> UserHistory:
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


def write_user(snap: UserHistory, users: Path) -> dict[str, Any]:
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


def copy_user(saved: Saved, users: Path) -> dict[str, Any]:
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
