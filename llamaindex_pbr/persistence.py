"""The files of a saved PBRRetriever: pbr's history, the index (or a partition's indexes) and the
view's settings, saved whole.

A save is one snapshot folder made current atomically (:mod:`pbr_core.persist`). A crash at any
moment leaves the previous save loadable; every damaged file is a ``PersistenceError`` naming it.
This module knows files only: the retriever hands it what to save (:func:`persist`) and builds
itself from what :func:`load` read, so neither module imports the other.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Settings, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager
from llama_index.core.vector_stores import MetadataFilters
from llama_index.core.vector_stores.types import BasePydanticVectorStore

from pbr_core import HistoryStore, PBRConfig, PersistenceError, PromptSet
from pbr_core.persist import (
    MANIFEST_CHECKSUM,
    check_manifest,
    file_records,
    manifest_digest,
    read_current,
    verify_files,
    write_atomically,
)
from pbr_core.vectors import check_dimension

from ._bridge import LlamaIndexEmbedder, default_embed_model, settings_embed_model

#: ``folder → store`` or ``(folder, user_id) → store``: a saved index's vector store; ``user_id``
#: is the partition's user (None for one shared index), so a per-user store (e.g. a Chroma
#: collection per user) can be found by its user rather than by the hashed folder name.
VectorStoreLoader = (
    Callable[[str], BasePydanticVectorStore]
    | Callable[[str, "str | None"], BasePydanticVectorStore]
)

_MANIFEST = "pbr_retriever.json"
_FORMAT = "pbr-llamaindex-retriever"
#: Version 2 adds checksums: the size and sha256 of every index file (``files``) and the
#: manifest's own (``manifest_sha256``); a version 1 save still loads, unverified.
_FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class Saved:
    """What :func:`load` read: the index (or a partition's indexes), the history, the embedding
    model and callback manager it was loaded with, and the view's constructor arguments."""

    index: VectorStoreIndex | dict[str, VectorStoreIndex]
    history: HistoryStore
    embed_model: BaseEmbedding
    callback_manager: CallbackManager
    settings: dict[str, Any]


def persist(
    persist_dir: str | os.PathLike[str],
    *,
    history: HistoryStore,
    index: VectorStoreIndex | None,
    user_indexes: Mapping[str, VectorStoreIndex] | None,
    settings: Mapping[str, Any],
) -> None:
    """Save ``history``, the index (or each user's index) and the view's ``settings`` (its
    constructor arguments: see ``PBRRetriever.settings``) as one snapshot of ``persist_dir``."""
    root = Path(persist_dir)
    manifest = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        **_settings_json(settings),
        "indexes": (
            {user: _user_dir(user) for user in user_indexes} if user_indexes is not None else None
        ),
    }
    commits: list[Callable[[], Path]] = []

    def write(folder: Path) -> None:
        # the histories' lazy users move to the new files only once the whole save is current
        commits.append(history.save_within(folder / "history"))
        if user_indexes is not None:
            for user, part in user_indexes.items():
                part.storage_context.persist(persist_dir=str(folder / "indexes" / _user_dir(user)))
        else:
            assert index is not None
            index.storage_context.persist(persist_dir=str(folder / "index"))
        # LlamaIndex's own files, checksummed so a load detects any damage to them
        sealed = {**manifest, "files": file_records(folder, ["index", "indexes"])}
        sealed[MANIFEST_CHECKSUM] = manifest_digest(sealed)
        (folder / _MANIFEST).write_text(json.dumps(sealed, indent=1), encoding="utf-8")

    # A new snapshot folder made current in one atomic step: a crash leaves the old state.
    write_atomically(
        root,
        write,
        legacy_names=(_MANIFEST, "history", "index", "indexes"),
        legacy_format=_FORMAT,
        manifest=_MANIFEST,
    )
    for commit in commits:
        commit()


def load(
    persist_dir: str | os.PathLike[str],
    *,
    embed_model: BaseEmbedding | None = None,
    vector_store_loader: VectorStoreLoader | None = None,
    callback_manager: CallbackManager | None = None,
) -> Saved:
    """Read a save of :func:`persist` (see ``PBRRetriever.from_persist_dir``); started again on
    the new snapshot where saves meanwhile pruned the one being read."""
    return read_current(
        persist_dir,
        lambda root: _load_snapshot(root, embed_model, vector_store_loader, callback_manager),
        legacy_marker=_MANIFEST,
        what="saved PBRRetriever",
    )


def _load_snapshot(
    root: Path,
    embed_model: BaseEmbedding | None,
    vector_store_loader: VectorStoreLoader | None,
    callback_manager: CallbackManager | None,
) -> Saved:
    takes_user = vector_store_loader is not None and _takes_two(vector_store_loader)
    manifest = _read_manifest(root)
    verify_files(root, manifest.get("files") or {})  # version 1: no records, nothing to check
    callback_manager = callback_manager or Settings.callback_manager
    embed_model = embed_model or settings_embed_model() or default_embed_model(callback_manager)
    history = HistoryStore.load(root / "history")
    check_dimension(LlamaIndexEmbedder(embed_model), history.dim, str(root))

    def load_index(folder: Path, user: str | None = None) -> VectorStoreIndex:
        if not folder.is_dir():
            raise PersistenceError(f"{root} is damaged: the index folder {folder} is missing")
        vector_store = None
        if vector_store_loader is not None:  # a partition's user, not only its hashed folder
            loader: Any = vector_store_loader
            vector_store = loader(str(folder), user) if takes_user else loader(str(folder))
        if vector_store is None and not (folder / "default__vector_store.json").exists():
            raise PersistenceError(
                f"the index saved in {folder} keeps its vectors in a store that persists itself "
                "(e.g. a Chroma server), so its folder holds none: pass "
                "vector_store_loader=lambda folder: ChromaVectorStore(chroma_collection=...) "
                "(or your store's own loader) to from_persist_dir"
            )
        try:
            storage = StorageContext.from_defaults(
                persist_dir=str(folder), vector_store=vector_store
            )
            index = load_index_from_storage(
                storage, embed_model=embed_model, callback_manager=callback_manager
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PersistenceError(f"damaged index in {folder}: {exc!r}") from exc
        if not isinstance(index, VectorStoreIndex):
            raise PersistenceError(f"{folder} holds a {type(index).__name__}, not a vector index")
        return index

    index: VectorStoreIndex | dict[str, VectorStoreIndex]
    if manifest.get("indexes") is not None:
        indexes = manifest["indexes"].items()
        index = {user: load_index(root / "indexes" / key, user) for user, key in indexes}
    else:
        index = load_index(root / "index")
    return Saved(index, history, embed_model, callback_manager, _settings_of(manifest))


#: The view's constructor arguments a save keeps, as (name, to JSON, from JSON).
_SETTINGS: tuple[tuple[str, Callable[[Any], Any], Callable[[Any], Any]], ...] = (
    ("user_id", lambda v: v, lambda v: v),
    ("user_id_key", lambda v: v, lambda v: v),
    ("similarity_top_k", lambda v: v, int),
    ("filters", lambda f: f.model_dump(mode="json"), MetadataFilters.model_validate),
    ("config", lambda c: c.to_dict(), lambda d: PBRConfig(**d)),
    (
        "prompts",
        lambda p: {"utterances": p.utterances, "reasoning": p.reasoning, "style": p.style},
        lambda d: PromptSet(**d),
    ),
    ("prompt_style", lambda v: v, lambda v: v),
    ("strict", bool, bool),
    ("retriever_kwargs", lambda v: v, lambda v: v),
)


def _settings_json(settings: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, to_json, _ in _SETTINGS:
        value = settings.get(name)
        out[name] = None if value is None else to_json(value)
    try:
        return json.loads(json.dumps(out))
    except TypeError as exc:
        raise ValueError(
            f"retriever_kwargs must be JSON-serialisable to persist ({exc}); leave them "
            "out and pass them again to from_persist_dir"
        ) from exc


def _settings_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The saved constructor arguments; one absent, null or empty keeps its default."""
    return {
        name: from_json(manifest[name]) for name, _, from_json in _SETTINGS if manifest.get(name)
    }


def _takes_two(loader: Callable[..., Any]) -> bool:
    """Whether a vector_store_loader takes ``(folder, user_id)`` rather than ``(folder)``: its
    second positional parameter is required or names a user (``user_id``, ``user``; another
    optional one is the loader's own, e.g. ``FaissVectorStore.from_persist_dir(persist_dir,
    fs=None)``), or it takes ``*args``."""
    try:
        params = inspect.signature(loader).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: the one-argument form
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2:
        second = positional[1]
        return second.default is second.empty or "user" in second.name
    return any(p.kind is p.VAR_POSITIONAL for p in params)


def _user_dir(user_id: str) -> str:
    """A folder name for any user id (slashes, dots, unicode): a stable hash."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:24]


def _read_manifest(root: Path) -> dict[str, Any]:
    path = root / _MANIFEST
    if not root.is_dir():
        raise PersistenceError(f"no saved PBRRetriever at {root} (folder does not exist)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PersistenceError(f"{root} is not a saved PBRRetriever: {_MANIFEST} missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PersistenceError(f"damaged {path}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise PersistenceError(f"{path} is not a {_FORMAT} manifest")
    if manifest.get("format_version") not in _READABLE_VERSIONS:
        raise PersistenceError(
            f"{root} was saved in format version {manifest.get('format_version')}, this "
            f"library reads versions {list(_READABLE_VERSIONS)}"
        )
    # checked unless the save is genuinely of version 1 (no checksum and no file records)
    if manifest.get("format_version") != 1 or MANIFEST_CHECKSUM in manifest or "files" in manifest:
        check_manifest(manifest, path)
    return manifest
