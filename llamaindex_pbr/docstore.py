"""One user's nodes as a read-only LlamaIndex docstore, keyed by the user's own node ids.

Why: a result node's relationships (``prev_node``, ``next_node``, ``parent_node``,
``child_nodes``) name the user's own ids, as the node itself does, while the index holds each
node under pbr's key (:func:`pbr_core.corpus.scoped_key`): ``index.docstore`` cannot resolve them,
so LlamaIndex's ``PrevNextNodePostprocessor`` and ``AutoPrevNextNodePostprocessor`` failed with
"doc_id ... not found". This view resolves a user's id through the corpus to the key the store
holds it under and returns the node as results show it (:func:`~llamaindex_pbr.stores.user_node`),
read from the store itself, so it works over a docstore, Chroma or PostgreSQL alike. Only the
user's own nodes are found: another user's id is not there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.schema import BaseNode
from llama_index.core.storage.docstore.types import BaseDocumentStore, RefDocInfo

from pbr_core.corpus import Corpus

from .stores import user_node

__all__ = ["UserDocstore"]

_READ_ONLY = (
    "a user's docstore view is read-only: add and delete through the retriever "
    "(add_nodes, delete_nodes), which keep the index and pbr's history in step"
)


class UserDocstore(BaseDocumentStore):
    """``user_id``'s nodes of ``corpus``'s host index, by the user's own ids (module docstring);
    what :attr:`llamaindex_pbr.PBRRetriever.docstore` returns for a view."""

    def __init__(self, corpus: Corpus, user_id: str) -> None:
        self._corpus = corpus
        self._user_id = user_id

    def _nodes(self, ids: Sequence[str] | None) -> dict[str, BaseNode]:
        """The user's nodes of ``ids`` (all of them: None), as results show them."""
        # the snapshot the user's last request read and verified (the cache's), else read now:
        # a postprocessor asks once per neighbour, and each ask must not list the user again
        history = self._corpus.cache._current(self._user_id) or self._corpus.history(self._user_id)
        host = self._corpus.host
        if history is None or host is None:
            return {}
        wanted = [it.id for it in history.items] if ids is None else list(ids)
        held = [i for i in wanted if history.position(i) is not None]
        keys = {self._corpus.key_of(self._user_id, i): i for i in held}
        stored = host.nodes(self._user_id, list(keys))  # type: ignore[attr-defined]
        return {keys[k]: user_node(node, keys[k]) for k, node in stored.items()}

    @property
    def docs(self) -> dict[str, BaseNode]:
        return self._nodes(None)

    def get_document(self, doc_id: str, raise_error: bool = True) -> BaseNode | None:
        node = self._nodes([doc_id]).get(doc_id)
        if node is None and raise_error:
            raise ValueError(f"doc_id {doc_id} not found among user {self._user_id!r}'s nodes")
        return node

    async def aget_document(self, doc_id: str, raise_error: bool = True) -> BaseNode | None:
        return self.get_document(doc_id, raise_error)

    def document_exists(self, doc_id: str) -> bool:
        return doc_id in self._nodes([doc_id])

    async def adocument_exists(self, doc_id: str) -> bool:
        return self.document_exists(doc_id)

    def get_document_hash(self, doc_id: str) -> str | None:
        node = self.get_document(doc_id, raise_error=False)
        return None if node is None else node.hash

    async def aget_document_hash(self, doc_id: str) -> str | None:
        return self.get_document_hash(doc_id)

    def get_all_document_hashes(self) -> dict[str, str]:
        return {node.hash: node_id for node_id, node in self.docs.items()}

    async def aget_all_document_hashes(self) -> dict[str, str]:
        return self.get_all_document_hashes()

    def get_all_ref_doc_info(self) -> dict[str, RefDocInfo] | None:
        return None  # what the retriever's refresh and delete_ref_doc keep per user

    async def aget_all_ref_doc_info(self) -> dict[str, RefDocInfo] | None:
        return None

    def get_ref_doc_info(self, ref_doc_id: str) -> RefDocInfo | None:
        return None

    async def aget_ref_doc_info(self, ref_doc_id: str) -> RefDocInfo | None:
        return None

    # -- writes: refused ---------------------------------------------------------------------------
    def add_documents(self, docs: Sequence[BaseNode], *args: Any, **kwargs: Any) -> None:
        raise TypeError(_READ_ONLY)

    async def async_add_documents(
        self, docs: Sequence[BaseNode], *args: Any, **kwargs: Any
    ) -> None:
        raise TypeError(_READ_ONLY)

    def delete_document(self, doc_id: str, raise_error: bool = True) -> None:
        raise TypeError(_READ_ONLY)

    async def adelete_document(self, doc_id: str, raise_error: bool = True) -> None:
        raise TypeError(_READ_ONLY)

    def delete_ref_doc(self, ref_doc_id: str, raise_error: bool = True) -> None:
        raise TypeError(_READ_ONLY)

    async def adelete_ref_doc(self, ref_doc_id: str, raise_error: bool = True) -> None:
        raise TypeError(_READ_ONLY)

    def set_document_hash(self, doc_id: str, doc_hash: str) -> None:
        raise TypeError(_READ_ONLY)

    async def aset_document_hash(self, doc_id: str, doc_hash: str) -> None:
        raise TypeError(_READ_ONLY)

    def set_document_hashes(self, doc_hashes: dict[str, str]) -> None:
        raise TypeError(_READ_ONLY)

    async def aset_document_hashes(self, doc_hashes: dict[str, str]) -> None:
        raise TypeError(_READ_ONLY)
