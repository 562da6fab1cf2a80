"""LlamaIndex indexes as :class:`pbr_core.corpus.HostRecords`: type translation only.

Which vector stores pbr can verify against (list a user's nodes, return their vectors):

* ``SimpleVectorStore`` (the default in-memory store): vectors and metadata from the store, text
  from the index's docstore.
* ``ChromaVectorStore``: nodes from the collection (``get(where=...)``), vectors included.
* ``PGVectorStore`` (``llama-index-vector-stores-postgres``): the user's rows of its
  ``data_<table>`` through an owner index, vectors included, checked per query by one
  primary-key read of a trigger-kept revision (:mod:`pbr_core.postgres` holds every rule and
  the SQL, which writes the store's own rows in one statement; here only the column names and
  how LlamaIndex makes a row).
* any other store: cannot list; pbr's own history is the record of each user's nodes, written
  after the index write succeeded. Deletes must go through the retriever.

Ownership, ids and validation are :class:`pbr_core.corpus.Corpus`'s; nothing here decides them.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import MetadataFilters
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from pbr_core.chroma import check_flat_metadata, collection_of, upsert_in_batches
from pbr_core.corpus import ITEM_ID_KEY, Record
from pbr_core.items import copy_metadata
from pbr_core.postgres import (
    PgRecords,
    PgRow,
    PgTable,
    ScoredRows,
    UserRows,
    engine_sql,
    transaction,
)
from pbr_core.retrieval import Candidates

from ._bridge import with_keys

_log = logging.getLogger("pbr")

__all__ = [
    "IndexRecords",
    "PartitionRecords",
    "docstore_nodes",
    "listable",
    "records_of",
    "stored_node",
    "user_node",
]

# Keys LlamaIndex adds to a node's metadata in a vector store (not the user's metadata).
_LLAMA_KEYS = ("_node_content", "_node_type", "document_id", "doc_id", "ref_doc_id")


def _is_chroma(store: object) -> bool:
    return collection_of(store) is not None


def _is_postgres(store: object) -> bool:
    """A ``PGVectorStore`` (its module imported: a store of it exists)."""
    module = sys.modules.get("llama_index.vector_stores.postgres")
    cls = getattr(module, "PGVectorStore", None) if module is not None else None
    return cls is not None and isinstance(store, cls)


def view_lister(store: Any, filters: MetadataFilters) -> Callable[[], Candidates] | None:
    """Where ``store`` can list exactly the nodes a search with ``filters`` (the user's filter
    ANDed with the view's) searches, what lists them, keys and metadata only: a
    ``PGVectorStore``, by the clause its own search builds from the filters, in SQL (no
    distance, no vector, no text). pbr then ranks every node of the view itself. None for any
    other store, or one whose queries the app customizes (``customize_query_fn``): the store's
    own filtered search lists the view (:func:`pbr_core.retrieval._listed_view`).
    LangChain's ``PGVector`` is listed the same way (:mod:`langchain_pbr.stores`)."""
    if not _is_postgres(store) or getattr(store, "_customize_query_fn", None) is not None:
        return None

    def postgres() -> Candidates:
        from sqlalchemy import select

        store._initialize()
        rows = store._table_class
        stmt = select(rows.node_id, rows.metadata_).where(store._recursively_apply_filters(filters))
        with store._session() as session:
            found = session.execute(stmt).all()
        return [(key, dict(meta or {}), None) for key, meta in found]

    return postgres


def listable(index: VectorStoreIndex) -> bool:
    """Whether pbr can list the index's nodes per user (and so verify against it)."""
    store = index.vector_store
    return isinstance(store, SimpleVectorStore) or _is_chroma(store) or _is_postgres(store)


def _pg_records(store: Any, user_key: str, owner: str | None) -> PgRecords:
    """:class:`PgRecords` of a ``PGVectorStore``'s table: ``node_id`` (not unique: the newest
    ``id`` wins), ``text``, ``metadata_`` (LlamaIndex's node dict: read back as the node's
    metadata), ``embedding``. The store creates its table on first use; so does this. Rows are
    the store's own (``_node_to_table_row``), written by pbr's one statement after a delete of
    their keys; through the store's session where the table is not as expected."""
    store._initialize()
    table = store._table_class.__table__

    def rows(records: Sequence[Record]) -> list[PgRow]:
        out = []
        for record in records:
            row = store._node_to_table_row(stored_node(record, user_key))
            out.append(PgRow(row.node_id, row.text, row.metadata_, record.vector))
        return out

    def write(records: Sequence[Record]) -> None:
        # LlamaIndex's add only inserts (node_id is no key): the old rows of these keys are
        # deleted in the same transaction, so a replacement is atomic and nothing duplicates.
        from sqlalchemy.orm import Session

        # Of each record's owner only (another user may hold a row of the same node_id), owner
        # by owner in owner order (pbr's trigger locks their revision rows in that order), in one
        # transaction whatever the engine's autocommit.
        by_owner: dict[str, list[Record]] = {}
        for record in records:
            by_owner.setdefault(record.user_id, []).append(record)
        column = table.c.node_id
        with transaction(store._engine) as conn, Session(bind=conn) as session:
            for user, mine in sorted(by_owner.items()):
                gone = column.in_([r.key for r in mine])
                if owner is None:  # a shared table: the owner's rows (a partition's are all)
                    gone = gone & (table.c.metadata_[user_key].astext == user)
                session.execute(table.delete().where(gone))
                session.add_all(store._node_to_table_row(stored_node(r, user_key)) for r in mine)
                session.flush()

    return PgRecords(
        PgTable(
            schema=table.schema or "public",
            name=table.name,
            key="node_id",
            text="text",
            metadata="metadata_",
            vector="embedding",
            newest="id",
        ),
        engine_sql(store._engine),
        user_key,
        write,
        read_metadata=lambda key, meta, text: dict(_row_node(key, meta, text).metadata),
        owner=owner,
        rows=rows,
    )


def _row_node(key: str, metadata: Mapping[str, Any] | None, text: str) -> BaseNode:
    """A Chroma or PostgreSQL row as the node LlamaIndex stored (relationships restored from its
    ``_node_content``), under the row's id; a row written by something other than LlamaIndex
    becomes a text node with its metadata, LlamaIndex's own keys removed."""
    meta = dict(metadata or {})
    try:
        node = metadata_dict_to_node(meta, text=text)
    except (ValueError, TypeError):
        node = TextNode(text=text, metadata={k: v for k, v in meta.items() if k not in _LLAMA_KEYS})
    return node.model_copy(update={"id_": key})


def stored_node(record: Record, user_key: str) -> BaseNode:
    """The node pbr writes for ``record``: the user's node under the store key, tagged."""
    template = record.extra if isinstance(record.extra, BaseNode) else None
    if template is None:
        template = TextNode(text=record.text)
    return template.model_copy(
        update={
            "id_": record.key,
            "metadata": dict(record.metadata),
            "embedding": [float(x) for x in np.asarray(record.vector)],
            "excluded_llm_metadata_keys": with_keys(
                template.excluded_llm_metadata_keys, user_key, ITEM_ID_KEY
            ),
            "excluded_embed_metadata_keys": with_keys(
                template.excluded_embed_metadata_keys, user_key, ITEM_ID_KEY
            ),
        }
    )


def user_node(node: BaseNode, item_id: str) -> BaseNode:
    """A stored node as its user sees it: the user's own id, pbr's bookkeeping key removed."""
    # a copy that shares no nested value: changing a result never changes the stored node
    metadata = copy_metadata({k: v for k, v in node.metadata.items() if k != ITEM_ID_KEY})
    return node.model_copy(update={"id_": item_id, "metadata": metadata, "embedding": None})


class IndexRecords:
    """One ``VectorStoreIndex`` (shared by all users, or one user's in a partition)."""

    def __init__(self, index: VectorStoreIndex, user_key: str, owner: str | None = None) -> None:
        self.index = index
        self.user_key = user_key
        self.owner = owner  # a partition's index: untagged nodes are the owner's
        self._orphans_warned = False  # vectors without their docstore node: warned once
        store = index.vector_store
        self.pg = _pg_records(store, user_key, owner) if _is_postgres(store) else None

    @property
    def can_list(self) -> bool:
        return listable(self.index)

    def validate(self, records: Sequence[Record]) -> None:
        if _is_chroma(self.index.vector_store):
            check_flat_metadata(records, noun="node")
        if self.pg is not None:
            self.pg.validate(records)

    def change_token(self, user_id: str) -> str | None:
        """See :meth:`pbr_core.postgres.PgRecords.change_token` (None for other stores)."""
        return self.pg.change_token(user_id) if self.pg is not None else None

    def read_user(self, user_id: str) -> UserRows | None:
        """See :meth:`pbr_core.postgres.PgRecords.read_user` (None for other stores: list)."""
        return self.pg.read_user(user_id) if self.pg is not None else None

    def write_state(self, user_id: str, token: str, state: bytes) -> bool:
        """See :meth:`pbr_core.postgres.PgRecords.write_state` (nothing for other stores)."""
        return self.pg.write_state(user_id, token, state) if self.pg is not None else False

    @property
    def can_score(self) -> bool:
        """Whether :meth:`read_scored` ranks in the database (PostgreSQL with pbr's trigger)."""
        return self.pg is not None and self.pg.can_score

    def read_scored(self, user_id: str, query: np.ndarray) -> ScoredRows | None:
        """See :meth:`pbr_core.postgres.PgRecords.read_scored` (None for other stores)."""
        return self.pg.read_scored(user_id, query) if self.pg is not None else None

    def upsert(self, records: Sequence[Record]) -> None:
        if self.pg is not None:
            self.pg.upsert(records)
            return
        nodes = [stored_node(r, self.user_key) for r in records]
        store = self.index.vector_store
        if _is_chroma(store):
            # Chroma's add ignores ids it has: upsert, so a retry or a replacement is applied.
            metadatas = []
            for node in nodes:
                meta = node_to_metadata_dict(node, remove_text=True, flat_metadata=True)
                metadatas.append({k: ("" if v is None else v) for k, v in meta.items()})
            upsert_in_batches(
                store._collection,  # type: ignore[attr-defined]
                ids=[n.node_id for n in nodes],
                embeddings=[n.get_embedding() for n in nodes],
                metadatas=metadatas,
                documents=[n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes],
            )
        else:
            self.index.insert_nodes(nodes)  # embeddings given: nothing is re-embedded

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        store = self.index.vector_store
        if self.pg is not None:
            self.pg.delete(user_id, keys)
        elif _is_chroma(store):
            store._collection.delete(ids=list(keys))  # type: ignore[attr-defined]
        else:
            self.index.delete_nodes(list(keys), delete_from_docstore=True)

    def list_user(self, user_id: str) -> list[Record]:
        return self._read(user_id, None, vectors=False)

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        return self._read(user_id, list(keys), vectors=True)

    def _read(self, user_id: str, keys: list[str] | None, *, vectors: bool) -> list[Record]:
        store = self.index.vector_store
        if self.pg is not None:
            return self.pg.fetch(user_id, keys) if keys is not None else self.pg.list_user(user_id)
        if _is_chroma(store):
            return self._read_chroma(store, user_id, keys, vectors)
        if isinstance(store, SimpleVectorStore):
            return self._read_simple(store, user_id, keys)
        raise NotImplementedError(f"{type(store).__name__} cannot list its nodes")

    def _read_chroma(
        self, store: Any, user_id: str, keys: list[str] | None, vectors: bool
    ) -> list[Record]:
        include = ["documents", "metadatas"] + (["embeddings"] if vectors else [])
        if keys is not None:
            got = store._collection.get(ids=keys, include=include)
        elif self.owner is not None:
            got = store._collection.get(include=include)
        else:
            got = store._collection.get(where={self.user_key: user_id}, include=include)
        embeddings = got.get("embeddings") if vectors else None
        out = []
        for i, key in enumerate(got["ids"]):
            text = got["documents"][i] or ""
            node_meta = dict(_row_node(key, got["metadatas"][i], text).metadata)
            vector = embeddings[i] if embeddings is not None else None
            record = self._record(key, text, node_meta, vector)
            if record is not None and record.user_id == user_id:
                out.append(record)
        return out

    def _read_simple(
        self, store: SimpleVectorStore, user_id: str, keys: list[str] | None
    ) -> list[Record]:
        data = store.data
        wanted = keys if keys is not None else list(data.embedding_dict)
        docstore = self.index.docstore
        out = []
        orphans = 0
        for key in wanted:
            vector = data.embedding_dict.get(key)
            if vector is None:
                continue
            meta = data.metadata_dict.get(key)
            if meta is not None and self.owner is None and meta.get(self.user_key) != user_id:
                continue  # another user's node: its text is not even read
            node = docstore.get_node(key, raise_error=False)
            if node is None:
                orphans += 1  # a vector without its node: nothing to show or to personalize with
                continue
            record = self._record(
                key, node.get_content(metadata_mode=MetadataMode.NONE), node.metadata, vector
            )
            if record is not None and record.user_id == user_id:
                out.append(record)
        if orphans and keys is None and not self._orphans_warned:
            self._orphans_warned = True
            _log.warning(
                "pbr: the SimpleVectorStore holds %d vector(s) of a user whose node the index's "
                "docstore lacks (written around the index, e.g. by an IngestionPipeline): they "
                "cannot be ranked; build the index from the nodes instead",
                orphans,
            )
        return out

    def _record(
        self, key: str, text: str, metadata: Mapping[str, Any], vector: Any
    ) -> Record | None:
        return Record.stored(key, text, metadata, vector, user_key=self.user_key, owner=self.owner)

    def nodes(self, user_id: str, keys: Sequence[str]) -> dict[str, BaseNode]:
        """The stored nodes of ``keys`` (store keys) that belong to ``user_id``, as a search
        returns them (text and relationships restored, no embedding)."""
        if not keys:
            return {}  # Chroma refuses a get() of no ids
        store = self.index.vector_store
        found: list[BaseNode] = []
        if self.pg is not None:
            found = [_row_node(k, meta, text) for k, text, meta in self.pg.rows(user_id, keys)]
        elif _is_chroma(store):
            got = store._collection.get(ids=list(keys), include=["documents", "metadatas"])  # type: ignore[attr-defined]
            for key, meta, text in zip(got["ids"], got["metadatas"], got["documents"]):
                found.append(_row_node(key, meta, text or ""))
        else:
            found = [n for n in self.index.docstore.get_nodes(list(keys), raise_error=False) if n]
        return {n.node_id: n for n in found if n.metadata.get(self.user_key, self.owner) == user_id}

    def ref_doc_ids(self, user_id: str) -> dict[str, str]:
        """The user's node ids (their own) -> the id of the document each node came from."""
        store = self.index.vector_store
        rows: Iterable[tuple[str, Mapping[str, Any]]]
        if self.pg is not None:
            rows = [(k, meta) for k, _, meta in self.pg.rows(user_id, None)]
        elif _is_chroma(store):
            where = None if self.owner is not None else {self.user_key: user_id}
            got = store._collection.get(where=where, include=["metadatas"])  # type: ignore[attr-defined]
            rows = zip(got["ids"], (dict(m or {}) for m in got["metadatas"]))
        elif isinstance(store, SimpleVectorStore):
            rows = list(store.data.metadata_dict.items())
        else:
            raise NotImplementedError(f"{type(store).__name__} cannot list its nodes")
        out: dict[str, str] = {}
        for key, meta in rows:
            owner = meta.get(self.user_key, self.owner)
            ref = meta.get("ref_doc_id")
            if owner == user_id and isinstance(ref, str) and ref != "None":
                out[str(meta.get(ITEM_ID_KEY, key))] = ref
        return out


class PartitionRecords:
    """One index per user (``{user_id: index}``), routed by owner; ``new_index`` builds a new
    user's index on their first write (None: only the given users can be written)."""

    def __init__(
        self,
        indexes: dict[str, VectorStoreIndex],
        new_index: Callable[[str], VectorStoreIndex] | None,
        user_key: str,
    ) -> None:
        self.indexes = indexes
        self.new_index = new_index
        self.user_key = user_key
        self._lock = threading.Lock()
        self._parts: dict[str, tuple[VectorStoreIndex, IndexRecords]] = {}

    def index_for(self, user_id: str, *, create: bool = False) -> VectorStoreIndex | None:
        """The user's index; with ``create``, built by ``new_index`` when missing."""
        index = self.indexes.get(user_id)
        if index is None and create:
            with self._lock:
                index = self.indexes.get(user_id)
                if index is None:
                    if self.new_index is None:
                        raise ValueError(
                            f"user {user_id!r} has no index in this per-user partition; pass "
                            "vector_store_factory= (user_id → vector store) or add their index"
                        )
                    index = self.indexes[user_id] = self.new_index(user_id)
        return index

    @property
    def can_list(self) -> bool:
        return all(listable(index) for index in self.indexes.values())

    def _part(self, user_id: str, create: bool | None = None) -> IndexRecords | None:
        """The user's records; a read (``create`` None) opens the user's index through
        ``new_index`` where there is one: another worker, or this app before a restart, may
        have written the user's store, which this worker has not opened yet."""
        if create is None:
            create = self.new_index is not None
        index = self.index_for(user_id, create=create)
        if index is None:
            return None
        cached = self._parts.get(user_id)
        if cached is None or cached[0] is not index:  # built once per index (a PG setup)
            cached = self._parts[user_id] = (index, IndexRecords(index, self.user_key, user_id))
        return cached[1]

    def validate(self, records: Sequence[Record]) -> None:
        for user_id in {r.user_id for r in records}:
            part = self._part(user_id, create=True)
            assert part is not None
            part.validate([r for r in records if r.user_id == user_id])

    def upsert(self, records: Sequence[Record]) -> None:
        for user_id in dict.fromkeys(r.user_id for r in records):
            part = self._part(user_id, create=True)
            assert part is not None
            part.upsert([r for r in records if r.user_id == user_id])

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        part = self._part(user_id)
        if part is not None:
            part.delete(user_id, keys)

    def list_user(self, user_id: str) -> list[Record]:
        part = self._part(user_id)
        return [] if part is None else part.list_user(user_id)

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        part = self._part(user_id)
        return [] if part is None else part.fetch(user_id, keys)

    def nodes(self, user_id: str, keys: Sequence[str]) -> dict[str, BaseNode]:
        part = self._part(user_id)
        return {} if part is None else part.nodes(user_id, keys)

    def ref_doc_ids(self, user_id: str) -> dict[str, str]:
        part = self._part(user_id)
        return {} if part is None else part.ref_doc_ids(user_id)


def records_of(
    index: VectorStoreIndex | None,
    per_user: dict[str, VectorStoreIndex] | None,
    user_key: str,
    vector_store_factory: Callable[[str], Any] | None,
    embed_model: Any,
    callback_manager: Any,
) -> IndexRecords | PartitionRecords:
    """The records of one shared ``index``, or of a per-user partition whose new users get an
    index over ``vector_store_factory(user)`` (none: a user not in ``per_user`` has nothing)."""
    if index is not None:
        return IndexRecords(index, user_key)

    def new_index(user: str) -> VectorStoreIndex:
        assert vector_store_factory is not None
        storage = StorageContext.from_defaults(vector_store=vector_store_factory(user))
        return VectorStoreIndex(
            nodes=[],
            storage_context=storage,
            embed_model=embed_model,
            callback_manager=callback_manager,
        )

    factory = new_index if vector_store_factory is not None else None
    return PartitionRecords(per_user if per_user is not None else {}, factory, user_key)


def docstore_nodes(
    sources: Sequence[tuple[str | None, VectorStoreIndex]], user_key: str
) -> tuple[list[BaseNode], list[str]]:
    """The non-empty nodes the indexes' docstores hold and their owners (``metadata[user_key]``,
    or the partition's user): what pbr records once for a store it cannot list."""
    nodes: list[BaseNode] = []
    users: list[str] = []
    for owner, index in sources:
        ids = list(index.index_struct.nodes_dict.values())
        for node in index.docstore.get_nodes(ids, raise_error=False) if ids else []:
            user = owner if owner is not None else node.metadata.get(user_key)
            if isinstance(user, str) and user and node.get_content(MetadataMode.NONE).strip():
                nodes.append(node)
                users.append(user)
    return nodes, users
