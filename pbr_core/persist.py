"""Save folders that are replaced atomically: a crash never leaves a half-written save.

A save folder ``path`` holds snapshot subfolders and a one-line pointer file ``CURRENT`` that
names the active one::

    path/
        CURRENT                             "snapshot-20250101T120000.000000Z-1a2b3c4d\\n"
        snapshot-20250101T120000.000000Z-1a2b3c4d/   the state a loader reads
        snapshot-20241231T090000.000000Z-9f8e7d6c/   the previous state, kept for open readers

Why this shape: replacing a whole folder takes two renames (old away, new in), and a crash
between them leaves no folder at all. Replacing one *file* with :func:`os.replace` is atomic on
POSIX and Windows, so the only thing that ever changes in place is ``CURRENT``, and it changes
only after the new snapshot is complete and flushed to disk. At every instant ``CURRENT`` names
a complete snapshot: a crash at any point leaves either the old state or the new one loadable.

The module knows nothing about what is saved: :func:`write_atomically` hands a writer an empty
folder to fill, and :func:`current_snapshot` tells a loader which folder to read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from .errors import PersistenceError

try:  # POSIX: a lock that other processes see too.
    import fcntl
except ImportError:  # pragma: no cover - Windows: writers in one process are still serialised.
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "POINTER_NAME",
    "SNAPSHOT_PREFIX",
    "current_snapshot",
    "new_snapshot_name",
    "read_current",
    "write_atomically",
]

T = TypeVar("T")

#: The pointer file: one line, the name of the active snapshot subfolder.
POINTER_NAME = "CURRENT"
#: Every snapshot subfolder's name starts with this; nothing else in a save folder does.
SNAPSHOT_PREFIX = "snapshot-"

# A snapshot name is one plain path component: no separators, so a damaged or hostile pointer
# can never make a loader read (or a writer prune) outside the save folder.
_SNAPSHOT_NAME = re.compile(r"snapshot-[A-Za-z0-9][A-Za-z0-9._-]{0,199}\Z")
_TMP_POINTER_PREFIX = f".{POINTER_NAME}.tmp-"
_LOCK_NAME = ".write.lock"

#: Per save folder (its real path): the lock of this process's writers and how many hold or
#: wait for it; an entry goes when its last writer leaves, so a process saving to many
#: folders keeps none of them.
_process_locks: dict[str, tuple[threading.Lock, int]] = {}
_process_locks_guard = threading.Lock()


def new_snapshot_name() -> str:
    """A fresh snapshot folder name: UTC time (so names sort by age) and 8 random hex digits."""
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{SNAPSHOT_PREFIX}{now}-{uuid.uuid4().hex[:8]}"


def current_snapshot(
    path: str | os.PathLike[str],
    *,
    legacy_marker: str | None = None,
    what: str = "saved state",
) -> Path:
    """The folder a loader should read for the save folder ``path``.

    Args:
        path: a folder written by :func:`write_atomically`.
        legacy_marker: a file that only the layout of older versions (files directly in
            ``path``, no ``CURRENT``) has, e.g. ``"manifest.json"``. When ``path`` has no
            ``CURRENT`` but has this file, ``path`` itself is returned, so folders saved before
            this layout still load. Without a marker, any entry of ``path`` that is not a
            snapshot folder (or a hidden file) counts as the old layout.
        what: how error messages name the saved thing ("saved history", ...).

    Raises:
        PersistenceError: ``path`` is missing or not a folder, holds no complete save, or its
            ``CURRENT`` is unreadable, damaged, or names a snapshot folder that is missing. The
            message names the file and says what to do.
    """
    folder = Path(path)
    if not folder.is_dir():
        if folder.exists():
            raise PersistenceError(
                f"no {what} at {folder}: it is a file, not a folder; pass the folder that was "
                "saved to"
            )
        raise PersistenceError(
            f"no {what} at {folder} (folder does not exist); check the path, or save there first"
        )
    pointer = folder / POINTER_NAME
    try:
        raw = pointer.read_bytes()
    except FileNotFoundError:
        if _is_legacy(folder, legacy_marker):
            return folder
        if any(_snapshot_folders(folder)):
            raise PersistenceError(
                f"{folder} holds no loadable {what}: {pointer} is missing. Its "
                f"{SNAPSHOT_PREFIX}* folders are unfinished (a first save was interrupted: save "
                f"again) or complete ({pointer} deleted: write the name of the newest complete "
                "one into it); a save keeps them"
            ) from None
        expected = f"neither {POINTER_NAME} nor {legacy_marker}" if legacy_marker else POINTER_NAME
        raise PersistenceError(
            f"{folder} is not a {what}: {expected} in it; pass the folder that was saved to"
        ) from None
    except IsADirectoryError:
        raise PersistenceError(
            f"damaged {what}: {pointer} is a folder, not the one-line file naming the current "
            f"snapshot; remove it and write the name of the newest complete {SNAPSHOT_PREFIX}* "
            f"folder of {folder} into a file {pointer}"
        ) from None
    except OSError as exc:
        raise PersistenceError(
            f"cannot read {pointer}: {exc}; check the folder's permissions"
        ) from exc
    name = _parse_pointer(pointer, raw)
    snapshot = folder / name
    if not snapshot.is_dir():
        raise PersistenceError(
            f"damaged {what}: {pointer} names the snapshot folder {name!r}, but {snapshot} is "
            f"missing (deleted by hand, or copied without it); restore it from a backup, or "
            f"write the name of another complete snapshot-* folder of {folder} into {pointer}"
        )
    return snapshot


def read_current(
    path: str | os.PathLike[str],
    read: Callable[[Path], T],
    *,
    legacy_marker: str | None = None,
    what: str = "saved state",
) -> T:
    """``read`` of the snapshot ``CURRENT`` names (:func:`current_snapshot`), started again on
    the new one where saves to the same folder meanwhile pruned it (a save keeps only the newest
    two snapshots): that is no damage. A :class:`PersistenceError` of a snapshot that is still
    current is raised."""
    folder = Path(path)
    for attempt in range(_READ_ATTEMPTS):
        snapshot = current_snapshot(folder, legacy_marker=legacy_marker, what=what)
        try:
            return read(snapshot)
        except PersistenceError:
            moved = current_snapshot(folder, legacy_marker=legacy_marker, what=what)
            if moved == snapshot or attempt == _READ_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


#: How often :func:`read_current` starts again when saves replaced the snapshot it read.
_READ_ATTEMPTS = 5


def write_atomically(
    path: str | os.PathLike[str],
    write: Callable[[Path], None],
    *,
    legacy_names: Sequence[str] = (),
    legacy_format: str | None = None,
    manifest: str | None = None,
) -> Path:
    """Write a new state into the save folder ``path`` and make it current atomically.

    Steps, and why each is safe to crash in:

    1. ``write`` fills a fresh, empty snapshot subfolder. If it raises, that subfolder is
       removed and the exception propagates: ``CURRENT`` was not touched. (If the process dies
       instead, the unfinished subfolder is removed by the next write.)
    2. Every file and folder of the snapshot is fsynced, so it is on disk before anything
       points at it.
    3. A temporary pointer file is written and fsynced, then :func:`os.replace`\\ d onto
       ``CURRENT``: the one atomic step. Before it the old state is current, after it the new.
    4. Older snapshots are pruned, keeping the new one and the one ``CURRENT`` named before (a
       reader that opened it can finish). Snapshot folders named by neither, such as those of a
       crashed writer, are removed. When ``CURRENT`` was damaged, no snapshot is pruned: one of
       them may be the only copy of the previous state.

    Writers of the same ``path`` are serialised (a lock shared by threads and, on POSIX,
    processes), so one writer's pruning never removes another's snapshot in progress. ``write``
    must therefore not write to the same ``path`` itself.

    Args:
        path: the save folder; created when missing. It may hold the layout of older versions
            (files directly in it): the new state then goes into a snapshot subfolder as usual.
        write: fills the folder it is given (which exists and is empty).
        legacy_names: the entries of the older layout, its manifest first (e.g.
            ``("manifest.json", "users")``). Where ``path`` held a save of that layout when the
            write began (its manifest a JSON object whose ``"format"`` is ``legacy_format``),
            those found directly in ``path`` are removed once the new ``CURRENT`` is in place
            (the new layout never puts anything there under these names), so an older version
            of the library cannot read stale data from them. Anywhere else they are the
            caller's own files under the same names, and are left alone.
        legacy_format: the older layout's manifest ``"format"``; required with
            ``legacy_names``.
        manifest: the file every save of this kind puts at the top of its snapshot. Where the
            snapshot ``CURRENT`` names lacks it but holds another top-level ``.json`` file, the
            folder holds another kind of save (a retriever's, a history store's), which this
            write would replace and its pruning then remove: refused.

    Returns:
        The new snapshot folder (now named by ``CURRENT``).

    Raises:
        PersistenceError: ``path`` exists and is not a folder, cannot be written to, or holds
            another kind of save (``manifest``).
        Whatever ``write`` raised, unchanged.
    """
    for legacy_name in legacy_names:
        if (
            legacy_name in (POINTER_NAME, _LOCK_NAME)
            or legacy_name.startswith((SNAPSHOT_PREFIX, _TMP_POINTER_PREFIX))
            or Path(legacy_name).name != legacy_name
        ):
            raise ValueError(
                f"legacy name {legacy_name!r} is not a plain file name of the old layout; pass "
                f"names of entries directly in the folder, other than {POINTER_NAME} and "
                f"{SNAPSHOT_PREFIX}*"
            )
    if legacy_names and legacy_format is None:
        raise ValueError("legacy_names need the legacy_format that marks a save of that layout")
    folder = Path(path)
    _not_inside_a_save(folder)
    if folder.exists() and not folder.is_dir():
        raise PersistenceError(
            f"cannot save to {folder}: it is a file, not a folder; remove it or pick another path"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PersistenceError(f"cannot create the save folder {folder}: {exc}") from exc
    pointer = folder / POINTER_NAME
    with _writer_lock(folder):
        previous, pointer_ok = _previous_snapshot(folder)
        if manifest is not None and previous is not None:
            _check_same_kind(folder, folder / previous, manifest)
        legacy = (
            [folder / legacy_name for legacy_name in legacy_names]
            if legacy_names and _holds_format(folder / legacy_names[0], legacy_format)
            else []
        )
        name = new_snapshot_name()
        snapshot = folder / name
        try:
            snapshot.mkdir()
        except OSError as exc:
            raise PersistenceError(f"cannot write to the save folder {folder}: {exc}") from exc
        tmp = folder / f"{_TMP_POINTER_PREFIX}{uuid.uuid4().hex[:8]}"
        try:
            write(snapshot)
            _fsync_tree(snapshot)
            _write_synced(tmp, f"{name}\n".encode("ascii"))
            try:
                os.replace(tmp, pointer)
            except OSError as exc:  # e.g. CURRENT is a folder
                raise PersistenceError(
                    f"cannot save to {folder}: {pointer} cannot be replaced ({exc}); it must be "
                    "the one-line file a save writes: remove what is there and save again"
                ) from exc
        except BaseException:
            # Still the old state, unless the interruption came after os.replace returned.
            tmp.unlink(missing_ok=True)
            if _named_by(pointer) != name:
                shutil.rmtree(snapshot, ignore_errors=True)
            raise
        _fsync_dir(folder)
        keep = {name, previous} if pointer_ok else None
        _prune(folder, keep, legacy)
    return snapshot


# -- internals -------------------------------------------------------------------------------
def _not_inside_a_save(folder: Path) -> None:
    """PersistenceError if ``folder`` is a snapshot folder of a save (its parent has
    ``CURRENT``), however it is spelt (a symlink, ``"."`` from inside it): it loads (read as a
    save of the older layout), but a save to it would remove its files as that layout's."""
    real = folder.resolve()
    if _SNAPSHOT_NAME.match(real.name) and (real.parent / POINTER_NAME).exists():
        raise PersistenceError(
            f"cannot save to {folder}: it is a snapshot folder inside the save folder "
            f"{real.parent} ({real.name}); save to {real.parent}"
        )


def _holds_format(manifest: Path, format_name: str | None) -> bool:
    """Whether ``manifest`` is a JSON object whose ``"format"`` is ``format_name`` (never
    raises: anything else, a damaged one included, is not a save of that layout)."""
    try:
        with manifest.open("rb") as fh:
            head = json.loads(fh.read(_MANIFEST_LIMIT))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(head, dict) and head.get("format") == format_name


#: The most of a legacy manifest read to tell its format (a larger one is not taken for one).
_MANIFEST_LIMIT = 256 * 1024 * 1024


def _parse_pointer(pointer: Path, raw: bytes) -> str:
    """The snapshot name in a pointer file's bytes; PersistenceError if it is not one."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        text = None
    name = text.rstrip("\r\n") if text is not None else ""
    if text is None or "\n" in name or not _SNAPSHOT_NAME.match(name):
        raise PersistenceError(
            f"damaged {pointer}: expected one line naming a snapshot folder "
            f"({SNAPSHOT_PREFIX}...), found {raw[:80]!r}; write the name of the newest complete "
            f"{SNAPSHOT_PREFIX}* folder of {pointer.parent} into it, or save again"
        )
    return name


def _named_by(pointer: Path) -> str | None:
    """The name ``pointer`` holds, None when it is missing or damaged (never raises)."""
    try:
        return _parse_pointer(pointer, pointer.read_bytes())
    except (OSError, PersistenceError):
        return None


def _previous_snapshot(folder: Path) -> tuple[str | None, bool]:
    """(name ``CURRENT`` holds or None, whether the pointer is trustworthy for pruning).

    No ``CURRENT`` in a folder without snapshots is trustworthy (nothing to keep); beside
    snapshot folders it is not (they may be complete, the pointer deleted), nor is a damaged
    or dangling one.
    """
    pointer = folder / POINTER_NAME
    if not pointer.exists():
        return None, not any(_snapshot_folders(folder))
    name = _named_by(pointer)
    if name is None or not (folder / name).is_dir():
        return None, False
    return name, True


def _check_same_kind(folder: Path, snapshot: Path, manifest: str) -> None:
    """PersistenceError where ``snapshot`` (the current one) is a save of another kind: it
    lacks ``manifest`` and holds another manifest (a top-level ``.json`` file). A snapshot with
    neither is damaged, and a new save may replace it."""
    if (snapshot / manifest).exists():
        return
    others = sorted(p.name for p in snapshot.glob("*.json") if p.is_file())
    if others:
        raise PersistenceError(
            f"cannot save to {folder}: it holds another kind of save ({snapshot.name} has "
            f"{others[0]}, not {manifest}), which this save would replace and then remove; "
            "save to another folder, or delete that save first"
        )


def _is_legacy(folder: Path, marker: str | None) -> bool:
    if marker is not None:
        return (folder / marker).exists()
    return any(
        not entry.name.startswith((".", SNAPSHOT_PREFIX)) and entry.name != POINTER_NAME
        for entry in folder.iterdir()
    )


def _snapshot_folders(folder: Path) -> Iterator[Path]:
    for entry in folder.iterdir():
        if entry.name.startswith(SNAPSHOT_PREFIX) and entry.is_dir():
            yield entry


def _prune(folder: Path, keep: set[str | None] | None, legacy: Sequence[Path]) -> None:
    """Remove old and abandoned snapshots, stray temp pointers and the legacy files.

    Best effort: the new state is already current, so a file that cannot be removed now
    (a reader on Windows holding it open) is left for the next write.
    """
    for entry in list(folder.iterdir()):
        if entry.name.startswith(_TMP_POINTER_PREFIX):
            with suppress(OSError):
                entry.unlink(missing_ok=True)
        elif (
            keep is not None
            and entry.name.startswith(SNAPSHOT_PREFIX)
            and entry.name not in keep
            and entry.is_dir()
        ):
            shutil.rmtree(entry, ignore_errors=True)
    for entry in legacy:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with suppress(OSError):
                entry.unlink(missing_ok=True)


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_tree(root: Path) -> None:
    """Flush every file under ``root`` to disk, then the folders (so their entries are too)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for filename in filenames:
            with open(os.path.join(dirpath, filename), "rb") as fh:
                os.fsync(fh.fileno())
    for dirpath, _dirnames, _filenames in os.walk(root, topdown=False):
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename or a new file in it); a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder; its renames are durable without this.
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def _writer_lock(folder: Path) -> Iterator[None]:
    """Serialise writers of ``folder``: threads of this process, and other processes on POSIX."""
    key = os.path.realpath(folder)
    with _process_locks_guard:
        lock, users = _process_locks.get(key, (None, 0))
        lock = lock or threading.Lock()
        _process_locks[key] = (lock, users + 1)
    try:
        with lock:
            if fcntl is None:  # pragma: no cover
                yield
                return
            try:
                fh = (folder / _LOCK_NAME).open("a+b")
            except OSError as exc:  # never an unserialised save: two could interleave
                raise PersistenceError(
                    f"cannot lock the save folder {folder} ({folder / _LOCK_NAME}: {exc}); "
                    "make the folder writable by this user, or remove what is in the way"
                ) from exc
            with fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    finally:
        with _process_locks_guard:
            users = _process_locks[key][1] - 1
            if users:
                _process_locks[key] = (lock, users)
            else:
                del _process_locks[key]


# -- checksums: a damaged file is detected, never silently read ------------------------------------
#: The key of a manifest's own checksum (:func:`manifest_digest` of its other fields). It
#: detects damage and edits by hand, not a forger (anyone can recompute it).
MANIFEST_CHECKSUM = "manifest_sha256"


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of ``manifest`` without its :data:`MANIFEST_CHECKSUM`, in canonical JSON (sorted
    keys, no spaces, ASCII): re-indenting the file changes nothing, any edit of a value does."""
    rest = {k: v for k, v in manifest.items() if k != MANIFEST_CHECKSUM}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def check_manifest(manifest: Mapping[str, Any], path: Path) -> None:
    """Raise :class:`PersistenceError` naming ``path`` unless ``manifest`` carries its own
    checksum and it matches."""
    if manifest.get(MANIFEST_CHECKSUM) != manifest_digest(manifest):
        raise PersistenceError(
            f"{path} is damaged (its checksum does not match its contents); restore the folder "
            "from a backup, or build the state again and save it"
        )


def file_records(root: Path, folders: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file below ``root / folder`` for each of ``folders``, keyed by
    its path relative to ``root`` (POSIX separators): what a manifest records of files another
    library wrote (a LlamaIndex index's JSON files)."""
    records = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*")):
            if path.is_file():
                data = path.read_bytes()
                records[path.relative_to(root).as_posix()] = {
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
    return records


def verify_files(root: Path, records: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise :class:`PersistenceError` naming the first file of ``records`` (from
    :func:`file_records`) that is missing below ``root`` or differs from what was saved."""
    for name, want in records.items():
        path = root / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise PersistenceError(
                f"{path} is missing from the save; restore the folder from a backup"
            ) from None
        if len(data) != want.get("size") or hashlib.sha256(data).hexdigest() != want.get("sha256"):
            raise PersistenceError(
                f"{path} is damaged (checksum mismatch: it is not the file the save wrote); "
                "restore the folder from a backup, or build the state again and save it"
            )
