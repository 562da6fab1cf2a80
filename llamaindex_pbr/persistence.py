"""PBRRetriever.persist / from_persist_dir: files plus the constructor's arguments, saved whole.

A save is one snapshot folder made current atomically (:mod:`pbr_core.persist`): pbr's history,
the index (or each user's index of a partition) and a manifest of the view's settings. A crash
at any moment leaves the previous save loadable; every damaged file is a ``PersistenceError``
naming it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core import Settings, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.vector_stores import MetadataFilters
from llama_index.core.vector_stores.types import BasePydanticVectorStore

from pbr_core import GenerationCache, HistoryStore, PBRConfig, PersistenceError, PromptSet
from pbr_core.persist import current_snapshot, write_atomically
from pbr_core.vectors import check_dimension

from ._bridge import LlamaIndexEmbedder, default_embed_model, settings_embed_model

#: ``folder → store`` or ``(folder, user_id) → store``: a saved index's vector store; ``user_id``
#: is the partition's user (None for one shared index), so a per-user store (e.g. a Chroma
#: collection per user) can be found by its user rather than by the hashed folder name.
VectorStoreLoader = (
    Callable[[str], BasePydanticVectorStore]
    | Callable[[str, "str | None"], BasePydanticVectorStore]
)

if TYPE_CHECKING:
    from .retrievers import PBRRetriever, VectorStoreFactory

_MANIFEST = "pbr_retriever.json"
_FORMAT = "pbr-llamaindex-retriever"
_FORMAT_VERSION = 1


def persist(retriever: PBRRetriever, persist_dir: str | os.PathLike[str]) -> None:
    """See :meth:`PBRRetriever.persist`."""
    shared = retriever._shared
    root = Path(persist_dir)
    try:
        kwargs_json = json.loads(json.dumps(shared.retriever_kwargs))
    except TypeError as exc:
        raise ValueError(
            f"retriever_kwargs must be JSON-serialisable to persist ({exc}); leave them "
            "out and pass them again to from_persist_dir"
        ) from exc
    indexes = (
        {user: _user_dir(user) for user in shared.user_indexes}
        if shared.user_indexes is not None
        else None
    )
    prompts = retriever.personalizer.prompts
    manifest = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "user_id": retriever._user_id,
        "user_id_key": shared.user_id_key,
        "similarity_top_k": retriever._top_k,
        "filters": retriever._filters.model_dump(mode="json") if retriever._filters else None,
        "config": retriever.config.to_dict(),
        "prompts": (
            {
                "utterances": prompts.utterances,
                "reasoning": prompts.reasoning,
                "style": prompts.style,
            }
            if prompts is not None
            else None
        ),
        "prompt_style": shared.prompt_style,
        "strict": retriever._is_strict(),
        "retriever_kwargs": kwargs_json,
        "indexes": indexes,
    }

    commits: list[Callable[[], Path]] = []

    def write(folder: Path) -> None:
        # the histories' lazy users move to the new files only once the whole save is current
        commits.append(retriever.personalizer.store.save_within(folder / "history"))
        if shared.user_indexes is not None:
            for user, index in shared.user_indexes.items():
                index.storage_context.persist(persist_dir=str(folder / "indexes" / _user_dir(user)))
        else:
            assert shared.index is not None
            shared.index.storage_context.persist(persist_dir=str(folder / "index"))
        (folder / _MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")

    # A new snapshot folder made current in one atomic step: a crash leaves the old state.
    write_atomically(root, write, legacy_names=(_MANIFEST, "history", "index", "indexes"))
    for commit in commits:
        commit()


def from_persist_dir(
    cls: type[PBRRetriever],
    persist_dir: str | os.PathLike[str],
    *,
    llm: LLM | None = None,
    embed_model: BaseEmbedding | None = None,
    vector_store_loader: VectorStoreLoader | None = None,
    vector_store_factory: VectorStoreFactory | None = None,
    cache: GenerationCache | str | None = None,
    callback_manager: CallbackManager | None = None,
    verbose: bool = False,
) -> PBRRetriever:
    """See :meth:`PBRRetriever.from_persist_dir`."""
    takes_user = vector_store_loader is not None and _takes_two(vector_store_loader)
    from .retrievers import DEFAULT_SIMILARITY_TOP_K, DEFAULT_USER_ID_KEY

    root = current_snapshot(persist_dir, legacy_marker=_MANIFEST, what="saved PBRRetriever")
    manifest = _read_manifest(root)
    callback_manager = callback_manager or Settings.callback_manager
    embed_model = embed_model or settings_embed_model() or default_embed_model(callback_manager)
    history = HistoryStore.load(root / "history")
    check_dimension(LlamaIndexEmbedder(embed_model), history.dim, str(root))

    def load(folder: Path, user: str | None = None) -> VectorStoreIndex:
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
        index = {user: load(root / "indexes" / key, user) for user, key in indexes}
    else:
        index = load(root / "index")
    prompts = manifest.get("prompts")
    filters = manifest.get("filters")
    return cls(
        index,
        user_id=manifest.get("user_id"),
        llm=llm,
        embed_model=embed_model,
        similarity_top_k=int(manifest.get("similarity_top_k", DEFAULT_SIMILARITY_TOP_K)),
        filters=MetadataFilters.model_validate(filters) if filters else None,
        user_id_key=manifest.get("user_id_key", DEFAULT_USER_ID_KEY),
        vector_store_factory=vector_store_factory,
        history=history,
        config=PBRConfig(**manifest["config"]) if manifest.get("config") else None,
        prompts=PromptSet(**prompts) if prompts else None,
        prompt_style=manifest.get("prompt_style"),
        cache=cache,
        strict=bool(manifest.get("strict", False)),
        retriever_kwargs=manifest.get("retriever_kwargs") or None,
        callback_manager=callback_manager,
        verbose=verbose,
    )


def _takes_two(loader: Callable[..., Any]) -> bool:
    """Whether a vector_store_loader takes ``(folder, user_id)`` rather than ``(folder)``."""
    try:
        params = inspect.signature(loader).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: the one-argument form
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


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
    if manifest.get("format_version") != _FORMAT_VERSION:
        raise PersistenceError(
            f"{root} was saved in format version {manifest.get('format_version')}, this "
            f"library reads version {_FORMAT_VERSION}"
        )
    return manifest
