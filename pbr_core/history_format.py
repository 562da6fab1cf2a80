"""The on-disk format of a saved history: what one snapshot folder holds, written and read back.

Owns the manifest (``manifest.json``: format, dimension, embedding model, one entry per user)
and each user's files in ``users/`` (items as JSON lines, vectors as ``.npy``, window vectors and
cached anchors as ``.npz``): :func:`write_user` writes a user, :func:`copy_user` carries an
unread user of a lazy load into a new save, :func:`read_manifest` and :func:`read_user` read them
back with every part checked, so a damaged file is a :class:`PersistenceError` naming it. Where
the snapshot folder lives and how it becomes current atomically is :mod:`pbr_core.persist`'s
business; which users are saved when is :class:`pbr_core.history.HistoryStore`'s.

Checksums (format version 3): each user's entry records the size and sha256 of every file it
has (``files``), taken from the bytes as they are written; the manifest records the sha256 of
its other fields in canonical JSON (``manifest_sha256``), so an edit of any value of it, the
file records included, is found, and the chain covers every byte a load relies on. A reader
hashes each file once, from the bytes it parses (no second read): a file that is no longer
parseable names its fault (the bad line, the short array), one that still parses but differs
from what was written is "damaged (checksum mismatch)". The checksum lives in the manifest, not
in ``CURRENT``, so the pointer stays :mod:`pbr_core.persist`'s alone and a snapshot folder is
checkable on its own. Saves of versions 1 and 2 have no checksums and are read unchecked.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .anchor import AnchorResult
from .errors import PersistenceError
from .items import HistoryItem
from .persist import MANIFEST_CHECKSUM, manifest_digest
from .snapshot import AnchorKey, UserHistory

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_CHECKSUM",
    "MANIFEST_NAME",
    "READABLE_FORMAT_VERSIONS",
    "USERS_DIR",
    "Saved",
    "anchor_arrays",
    "anchors_from_arrays",
    "copy_user",
    "manifest_text",
    "read_manifest",
    "read_user",
    "write_user",
]

FORMAT_NAME = "pbr-history"
#: Version 2 adds each user's cached anchors (``<key>.anchors.npz``); version 3 the checksums
#: (each user's ``files``, the manifest's ``manifest_sha256``). Folders of versions 1 and 2 are
#: still read, without verification (they hold no checksums); their next save records them.
FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = (1, 2, 3)
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
_SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")


# -- checksums -------------------------------------------------------------------------------
def manifest_text(header: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> str:
    """The manifest of a save, with its own checksum (:data:`MANIFEST_CHECKSUM`).

    The checksum is taken over the manifest as a loader will parse it (a JSON round trip), so
    what is verified on load is exactly what was written.

    Raises:
        TypeError, ValueError: a value JSON cannot hold (from :func:`json.dumps`).
    """
    manifest = json.loads(json.dumps({**header, "users": list(entries)}))
    manifest[MANIFEST_CHECKSUM] = manifest_digest(manifest)
    return json.dumps(manifest, indent=1)


def _record(data: bytes) -> dict[str, Any]:
    """A file's manifest record: its size and sha256."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _put(path: Path, data: bytes) -> dict[str, Any]:
    """Write ``data`` to ``path``; return its record."""
    path.write_bytes(data)
    return _record(data)


class _HashingWriter:
    """A write-only file that hashes what passes through (so ``np.save`` writes a large array
    in chunks, without a second copy in memory, and it is hashed on the way)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self._sha = hashlib.sha256()
        self._size = 0

    def write(self, data: bytes) -> int:
        self._sha.update(data)
        self._size += len(data)
        return int(self._fh.write(data))

    def record(self) -> dict[str, Any]:
        return {"size": self._size, "sha256": self._sha.hexdigest()}


def _file_names(entry: Mapping[str, Any]) -> list[str]:
    """The files a user's manifest entry says it has."""
    key = str(entry["key"])
    names = [f"{key}.jsonl", f"{key}.npy"]
    names += [f"{key}.anchors.npz"] if entry.get("anchors") else []
    names += [f"{key}.windows.npz"] if entry.get("windows") else []
    return names


def _verified(path: Path, data: bytes, entry: Mapping[str, Any], what: str) -> bytes:
    """``data`` (read from ``path``), checked against the record in the user's ``entry``.

    A save without checksums (format versions 1 and 2) has no records: nothing to check.
    """
    files = entry.get("files")
    if files is None:
        return data
    want = files[path.name]
    if len(data) != want["size"] or hashlib.sha256(data).hexdigest() != want["sha256"]:
        raise PersistenceError(
            f"{path} ({what}) is damaged (checksum mismatch: "
            f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}..., where the "
            f"save wrote {want['size']} bytes, sha256 {want['sha256'][:16]}...); {_RESTORE}"
        )
    return data


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
    # Verified when it has a checksum or claims a version that writes one, and also when any
    # user has file records: a damaged version number or checksum key cannot switch it off.
    users = manifest.get("users", [])
    recorded = MANIFEST_CHECKSUM in manifest or (
        isinstance(users, list) and any(isinstance(u, dict) and "files" in u for u in users)
    )
    verify = recorded or manifest["format_version"] >= 3
    if verify and manifest.get(MANIFEST_CHECKSUM) != manifest_digest(manifest):
        raise PersistenceError(
            f"{path} is damaged (checksum mismatch: its contents are not what the save "
            f"wrote, the {MANIFEST_CHECKSUM} it records does not match them); {_RESTORE}"
        )
    dim = manifest.get("dim")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0):
        raise damaged(f"dim is {dim!r}, not a positive integer")
    model = manifest.get("embedding_model_id")
    if model is not None and not isinstance(model, str):
        raise damaged(f"embedding_model_id is {model!r}, not a string")
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
        files = entry.get("files")
        if manifest["format_version"] >= 3 and files is None:
            raise damaged(f"user {user_id!r} has no file checksums")
        if files is not None and not (
            isinstance(files, dict)
            and sorted(files) == sorted(_file_names(entry))
            and all(_is_record(r) for r in files.values())
        ):
            raise damaged(f"user {user_id!r} has malformed file checksums")
    return {"dim": dim, "embedding_model_id": model, "users": users}


def _is_record(record: object) -> bool:
    if not isinstance(record, dict):
        return False
    size, sha = record.get("size"), record.get("sha256")
    return (
        isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
        and isinstance(sha, str)
        and bool(_SHA256_HEX.match(sha))
    )


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
    items = _read_items(items_path, entry)
    vectors = _read_vectors(vectors_path, entry)
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
        snapshot._anchors.update(_load_anchors(users / f"{key}.anchors.npz", entry, snapshot))
    return snapshot


def _read_windows(
    path: Path, entry: Mapping[str, Any], user_id: str, dim: int | None
) -> dict[str, np.ndarray]:
    """The window vectors of a user's long items (none in a save without them)."""
    ids = entry.get("windows")
    if not ids:
        return {}
    try:
        data = path.read_bytes()
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            counts, vectors = z["counts"], z["vectors"]
    except Exception as exc:  # whatever numpy's parsers raise for a damaged file
        raise PersistenceError(
            f"damaged history: cannot read {path.name}, the window vectors of user "
            f"{user_id!r} ({exc}); {_RESTORE}"
        ) from exc
    _verified(path, data, entry, f"the window vectors of user {user_id!r}")
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


def _read_items(path: Path, entry: Mapping[str, Any]) -> list[HistoryItem]:
    """The items of a ``.jsonl`` file; PersistenceError naming the file (and line) if damaged.

    Parsed before it is verified, so that a file that is not JSON lines names its bad line.
    """
    what = f"the items of user {str(entry['user_id'])!r}"
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
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
            parsed = [HistoryItem.from_dict(row) for row in rows]
            _verified(path, data, entry, what)
            return parsed
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


def _read_vectors(path: Path, entry: Mapping[str, Any]) -> np.ndarray:
    """The vectors of a ``.npy`` file; PersistenceError naming the file if damaged."""
    what = f"the vectors of user {str(entry['user_id'])!r}"
    try:
        data = path.read_bytes()
        vectors = np.load(io.BytesIO(data), allow_pickle=False)
    except FileNotFoundError:
        raise PersistenceError(f"damaged history: {path} ({what}) is missing; {_RESTORE}") from None
    except Exception as exc:  # whatever numpy's parsers raise for a damaged file
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
    _verified(path, data, entry, what)
    return vectors


def write_user(snap: UserHistory, users: Path) -> dict[str, Any]:
    """Write one user's files into ``users``; return its manifest entry, with each file's
    size and sha256 (taken from the bytes as they are written, not read back)."""
    key = _user_key(snap.user_id)
    files: dict[str, dict[str, Any]] = {}
    text = "".join([_encode_json(item.to_dict()) + "\n" for item in snap.items])
    files[f"{key}.jsonl"] = _put(users / f"{key}.jsonl", text.encode("utf-8"))
    with (users / f"{key}.npy").open("wb") as fh:
        writer = _HashingWriter(fh)
        np.save(writer, np.asarray(snap.vectors))
    files[f"{key}.npy"] = writer.record()
    entry: dict[str, Any] = {
        "user_id": snap.user_id,
        "key": key,
        "count": len(snap),
        "version": snap.version,
    }
    anchors = [(k, a) for k, a in list(snap._anchors.items()) if a is not None]
    if anchors:
        path = users / f"{key}.anchors.npz"
        entry["anchors"], files[path.name] = _save_anchors(path, anchors)
    if snap.windows:
        ids = list(snap.windows)
        buffer = io.BytesIO()
        np.savez(
            buffer,
            counts=np.array([len(snap.windows[i]) for i in ids], dtype=np.int64),
            vectors=np.concatenate([np.asarray(snap.windows[i]) for i in ids]),
        )
        files[f"{key}.windows.npz"] = _put(users / f"{key}.windows.npz", buffer.getvalue())
        entry["windows"] = ids
    if snap.host_keys:
        entry["host_keys"] = dict(snap.host_keys)
    entry["files"] = files
    return entry


def copy_user(saved: Saved, users: Path) -> dict[str, Any]:
    """Copy an unread user's files into a new save; return its manifest entry.

    The files are not read: their records come from the manifest they were loaded with, which
    was verified, so a file damaged since is still found damaged when the new save is read. A
    user of a save without checksums (versions 1 and 2) gets them now, from the bytes copied.
    """
    recorded = saved.entry.get("files")
    files: dict[str, dict[str, Any]] = {}
    try:
        for name in _file_names(saved.entry):
            source = saved.folder / USERS_DIR / name
            if recorded is not None:
                shutil.copyfile(source, users / name)
            else:
                files[name] = _put(users / name, source.read_bytes())
    except OSError as exc:
        raise PersistenceError(
            f"it was not read yet and its files in {saved.folder} are gone ({exc}); load the "
            "folder again"
        ) from exc
    return {**saved.entry, "files": recorded if recorded is not None else files}


def _save_anchors(
    path: Path, anchors: Sequence[tuple[AnchorKey, AnchorResult]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Write anchors' arrays to one ``.npz``; return their manifest entries (key and scalars)
    and the file's record."""
    entries, arrays = anchor_arrays(anchors)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return entries, _put(path, buffer.getvalue())


def anchor_arrays(
    anchors: Sequence[tuple[AnchorKey, AnchorResult]], prefix: str = ""
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Anchors as JSON entries (key and scalars) and named arrays (``{prefix}{i}_vector``...),
    the form a saved folder (:func:`write_user`) and a packed state (:mod:`pbr_core.derived`)
    keep them in; :func:`anchors_from_arrays` reads them back."""
    arrays: dict[str, np.ndarray] = {}
    entries: list[dict[str, Any]] = []
    for i, (key, result) in enumerate(anchors):
        graph = result.graph.tocsr()
        arrays[f"{prefix}{i}_vector"] = np.asarray(result.vector)
        arrays[f"{prefix}{i}_pagerank"] = np.asarray(result.pagerank)
        arrays[f"{prefix}{i}_indptr"] = graph.indptr
        arrays[f"{prefix}{i}_indices"] = graph.indices
        arrays[f"{prefix}{i}_data"] = graph.data
        entries.append(
            {
                "anchor_key": list(key),
                "iterations": result.iterations,
                "converged": result.converged,
            }
        )
    return entries, arrays


def anchors_from_arrays(
    entries: Sequence[Mapping[str, Any]],
    arrays: Mapping[str, np.ndarray],
    n: int,
    d: int,
    prefix: str = "",
) -> dict[AnchorKey, AnchorResult]:
    """What :func:`anchor_arrays` wrote, for a history of ``n`` items of dimension ``d``, every
    shape checked, and what makes it an anchor (edge weights finite and positive, a self-loop
    on every node, a PageRank that sums to 1): ``ValueError``, ``KeyError`` or ``TypeError``
    where one does not fit, so a state written wrong is rebuilt, never adopted."""
    out: dict[AnchorKey, AnchorResult] = {}
    for i, entry in enumerate(entries):
        vector = arrays[f"{prefix}{i}_vector"]
        pi = arrays[f"{prefix}{i}_pagerank"]
        indptr = arrays[f"{prefix}{i}_indptr"]
        indices = arrays[f"{prefix}{i}_indices"]
        data = arrays[f"{prefix}{i}_data"]
        ok = (
            vector.shape == (d,)
            and pi.shape == (n,)
            and indptr.shape == (n + 1,)
            and np.issubdtype(indptr.dtype, np.integer)
            and np.issubdtype(indices.dtype, np.integer)
            and indices.shape == data.shape == (int(indptr[-1]),)
            and int(indptr[0]) == 0
            and bool((np.diff(indptr) >= 0).all())
            and np.isfinite(vector).all()
            and (indices.size == 0 or (indices.min() >= 0 and indices.max() < n))
            # what an anchor is, not only its shapes: positive finite edge weights with a
            # self-loop on every node, and a PageRank that is a distribution
            and bool(np.isfinite(data).all() and (data > 0).all())
            and bool(np.isfinite(pi).all() and (pi >= 0).all())
            and abs(float(pi.sum()) - 1.0) <= 1e-6
        )
        graph = sp.csr_matrix((data, indices, indptr), shape=(n, n)) if ok else None
        if graph is None or not bool((graph.diagonal() > 0).all()):
            raise ValueError(f"anchor {i} does not fit {n} items of dimension {d}")
        out[tuple(entry["anchor_key"])] = AnchorResult(
            vector=vector,
            pagerank=pi,
            graph=graph,
            iterations=int(entry["iterations"]),
            converged=bool(entry["converged"]),
        )
    return out


def _load_anchors(
    path: Path, user: Mapping[str, Any], snapshot: UserHistory
) -> dict[AnchorKey, AnchorResult]:
    """Read what :func:`_save_anchors` wrote for ``snapshot``, checking every shape."""
    n, d = len(snapshot), snapshot.dim
    entries: Sequence[Mapping[str, Any]] = user["anchors"]
    try:
        raw = path.read_bytes()
        with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
            out = anchors_from_arrays(entries, arrays, n, d)
    except Exception as exc:  # whatever numpy's parsers raise for a damaged file
        raise PersistenceError(
            f"damaged anchors of user {snapshot.user_id!r}: {path} cannot be read "
            f"({type(exc).__name__}: {exc}); {_RESTORE}"
        ) from exc
    _verified(path, raw, user, f"the anchors of user {snapshot.user_id!r}")
    return out
