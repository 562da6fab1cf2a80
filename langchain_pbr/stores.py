"""LangChain vector stores as :class:`pbr_core.corpus.HostRecords`: type translation only.

Which stores pbr can verify against (list a user's records, return their vectors):

* ``InMemoryVectorStore``: lists and returns vectors (read from its ``store`` dict).
* ``langchain_chroma.Chroma``: lists (``get(where=...)``) and returns vectors.
* ``langchain_postgres.PGVector`` (sync mode): lists the collection's rows of a user through an
  owner index and returns vectors; a trigger-kept revision makes the per-query check one
  primary-key read. Writes the rows ``add_embeddings`` writes (id, collection, text, metadata,
  vector; an upsert by id) in one statement of pbr's, vectors in binary; ``add_embeddings``
  itself where the table is not laid out as expected (:mod:`pbr_core.postgres`, which holds
  every rule and the SQL; here only the table's column names).
* ``langchain_postgres.PGVectorStore`` (v2) whose metadata is all in its JSON column: the same,
  over its own table and async engine. With ``metadata_columns`` it cannot list (pbr does not
  read metadata back from columns).
* any other ``VectorStore``: cannot list; pbr's own history is the record of each user's items,
  written after the store write succeeded (see :mod:`pbr_core.corpus`). Deletes must then go
  through the retriever: a delete made through the store itself is not seen by pbr.

Ownership, ids and validation are :class:`pbr_core.corpus.Corpus`'s; nothing here decides them.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from pbr_core.adapters_support import check_positive_int
from pbr_core.chroma import check_flat_metadata, collection_of, upsert_in_batches
from pbr_core.corpus import Record
from pbr_core.postgres import (
    PgRecords,
    PgTable,
    ScoredRows,
    UserRows,
    async_engine_sql,
    engine_sql,
    quote_ident,
    record_rows,
)
from pbr_core.retrieval import check_score_threshold

__all__ = [
    "PBR_SEARCH_KWARGS",
    "Found",
    "astore_search",
    "check_search_kwargs",
    "default_filter",
    "host_records",
    "store_search",
    "view_lister",
]

#: ``(store key, store metadata, store score)`` per search result, best first; the key None
#: where the store's ``Document`` has no id.
Found = list[tuple[str | None, dict[str, Any], float | None]]

#: Metadata value types Chroma accepts (it refuses nested containers and None in older servers).


class _Base:
    can_list = False

    def __init__(self, store: VectorStore, user_key: str) -> None:
        self.store = store
        self.user_key = user_key

    def validate(self, records: Sequence[Record]) -> None:
        return None

    def upsert(self, records: Sequence[Record]) -> None:
        raise NotImplementedError

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        self.store.delete(list(keys))

    def _record(
        self, key: str, text: str, metadata: dict[str, Any], vector: Any = None
    ) -> Record | None:
        return Record.stored(key, text, metadata, vector, user_key=self.user_key)

    def list_user(self, user_id: str) -> list[Record]:
        raise NotImplementedError(f"{type(self.store).__name__} cannot list its records")

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        return []


class _InMemory(_Base):
    """``InMemoryVectorStore``: its ``store`` dict (id -> id, vector, text, metadata)."""

    can_list = True
    store: InMemoryVectorStore

    def upsert(self, records: Sequence[Record]) -> None:
        # Written as the store itself writes (add_documents), with pbr's vectors: no re-embedding.
        for r in records:
            self.store.store[r.key] = {
                "id": r.key,
                "vector": [float(x) for x in np.asarray(r.vector)],
                "text": r.text,
                "metadata": dict(r.metadata),
            }

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        self.store.delete(list(keys))

    def list_user(self, user_id: str) -> list[Record]:
        out = []
        for key, row in list(self.store.store.items()):
            meta = row.get("metadata") or {}
            if meta.get(self.user_key) == user_id:
                record = self._record(key, row["text"], dict(meta), row.get("vector"))
                if record is not None:
                    out.append(record)
        return out

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        out = []
        for key in keys:
            row = self.store.store.get(key)
            if row is not None:
                record = self._record(key, row["text"], dict(row["metadata"]), row["vector"])
                if record is not None:
                    out.append(record)
        return out


class _Chroma(_Base):
    """``langchain_chroma.Chroma``: its collection's ``upsert`` / ``get`` / ``delete``."""

    can_list = True

    def validate(self, records: Sequence[Record]) -> None:
        check_flat_metadata(records)

    def upsert(self, records: Sequence[Record]) -> None:
        collection = self.store._collection  # type: ignore[attr-defined]
        upsert_in_batches(
            collection,
            ids=[r.key for r in records],
            embeddings=[np.asarray(r.vector, dtype=np.float32) for r in records],
            documents=[r.text for r in records],
            metadatas=[dict(r.metadata) for r in records],
        )

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        self.store.delete(list(keys))

    def list_user(self, user_id: str) -> list[Record]:
        got = self.store.get(  # type: ignore[attr-defined]
            where={self.user_key: user_id}, include=["documents", "metadatas"]
        )
        return self._records(got, vectors=False)

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        got = self.store.get(  # type: ignore[attr-defined]
            ids=list(keys), include=["documents", "metadatas", "embeddings"]
        )
        return self._records(got, vectors=True)

    def _records(self, got: dict[str, Any], *, vectors: bool) -> list[Record]:
        embeddings = got.get("embeddings") if vectors else None
        out = []
        for i, key in enumerate(got["ids"]):
            vector = embeddings[i] if embeddings is not None else None
            record = self._record(
                key, got["documents"][i] or "", dict(got["metadatas"][i] or {}), vector
            )
            if record is not None:
                out.append(record)
        return out


class _PGVector(_Base):
    """``langchain_postgres.PGVector``: its ``langchain_pg_embedding`` rows of one collection
    (``id``, ``collection_id``, ``document``, ``cmetadata`` JSONB, ``embedding``), read, deleted
    and written by :class:`~pbr_core.postgres.PgRecords`: the rows ``add_embeddings`` writes
    (the record's key, text, metadata and vector; an upsert by id), in one statement; the
    store's own ``add_embeddings`` (with pbr's vectors) where the table is not as expected."""

    can_list = True

    def __init__(self, store: VectorStore, user_key: str) -> None:
        super().__init__(store, user_key)
        pg: Any = store
        with pg._make_sync_session() as session:
            collection = pg.get_collection(session)
        if collection is None:
            raise ValueError(
                f"PGVector collection {pg.collection_name!r} does not exist; create the store "
                "with create_collection (the default) before wrapping it"
            )
        table = pg.EmbeddingStore.__table__
        sql = engine_sql(pg._engine)
        schema = table.schema or _schema_of(sql, table.name)
        self.pg = PgRecords(
            PgTable(
                schema=schema,
                name=table.name,
                key="id",
                text="document",
                metadata="cmetadata",
                vector="embedding",
                scope_column="collection_id",
                scope=pg.collection_name,  # looked up by name, as the store does on each call
                scope_lookup=(
                    f"(SELECT uuid FROM {quote_ident(schema)}.langchain_pg_collection "
                    "WHERE name = :pbr_scope)"
                ),
            ),
            sql,
            user_key,
            self._write,
            rows=record_rows,
        )

    def _write(self, records: Sequence[Record]) -> None:
        self.store.add_embeddings(  # type: ignore[attr-defined]
            texts=[r.text for r in records],
            embeddings=[[float(x) for x in np.asarray(r.vector)] for r in records],
            metadatas=[dict(r.metadata) for r in records],
            ids=[r.key for r in records],
        )

    def validate(self, records: Sequence[Record]) -> None:
        self.pg.validate(records)

    def upsert(self, records: Sequence[Record]) -> None:
        self.pg.upsert(records)

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        self.pg.delete(user_id, keys)

    def list_user(self, user_id: str) -> list[Record]:
        return self.pg.list_user(user_id)

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        return self.pg.fetch(user_id, keys)

    def change_token(self, user_id: str) -> str | None:
        return self.pg.change_token(user_id)

    def read_user(self, user_id: str) -> UserRows | None:
        return self.pg.read_user(user_id)

    def write_state(self, user_id: str, token: str, state: bytes) -> bool:
        return self.pg.write_state(user_id, token, state)

    @property
    def can_score(self) -> bool:
        return self.pg.can_score

    def read_scored(self, user_id: str, query: np.ndarray) -> ScoredRows | None:
        return self.pg.read_scored(user_id, query)


class _PGVectorStore(_PGVector):
    """``langchain_postgres.PGVectorStore`` (the v2 store: a table of its own, an async engine
    run by ``PGEngine``) whose metadata is all in its JSON column (no ``metadata_columns``):
    rows of ``id_column``, ``content_column``, ``metadata_json_column``, ``embedding_column``,
    written by the store's own ``add_embeddings`` (an upsert by id)."""

    def __init__(self, store: VectorStore, user_key: str) -> None:
        _Base.__init__(self, store, user_key)
        inner = _v2_inner(store)
        assert inner is not None
        self.pg = PgRecords(
            PgTable(
                schema=inner.schema_name,
                name=inner.table_name,
                key=inner.id_column,
                text=inner.content_column,
                metadata=inner.metadata_json_column,
                vector=inner.embedding_column,
            ),
            async_engine_sql(inner.engine, store._engine._run_as_sync),  # type: ignore[attr-defined]
            user_key,
            self._write,
        )


def _schema_of(sql: Any, table: str) -> str:
    """The schema holding ``table`` as the store's own connections find it: PGVector names its
    tables unqualified, so a connection's ``search_path`` (e.g. ``options=-csearch_path=app``)
    decides; ``public`` where the table cannot be found yet."""
    rows = sql(
        [
            (
                "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = to_regclass(:t)",
                {"t": quote_ident(table)},
            )
        ]
    )
    return str(rows[0][0]) if rows else "public"


def _v2_inner(store: VectorStore) -> Any:
    """The ``AsyncPGVectorStore`` inside a v2 ``PGVectorStore`` whose metadata is all JSON, or
    None (another store; or metadata columns, which pbr does not read back)."""
    module = sys.modules.get("langchain_postgres.v2.vectorstores")
    cls = getattr(module, "PGVectorStore", None) if module is not None else None
    if cls is None or not isinstance(store, cls):
        return None
    inner = getattr(store, "_PGVectorStore__vs", None)
    if inner is None or inner.metadata_columns or not inner.metadata_json_column:
        return None
    return inner


def _is_pgvector(store: VectorStore) -> bool:
    """A sync-mode ``langchain_postgres.PGVector`` (imported only if installed)."""
    return _any_pgvector(store) and not store.async_mode  # type: ignore[attr-defined]


def _is_async_pgvector(store: VectorStore) -> bool:
    """An async-mode ``langchain_postgres.PGVector``."""
    return _any_pgvector(store) and bool(store.async_mode)  # type: ignore[attr-defined]


def _any_pgvector(store: VectorStore) -> bool:
    module = sys.modules.get("langchain_postgres")  # a PGVector means it was imported
    PGVector = getattr(module, "PGVector", None) if module is not None else None
    return PGVector is not None and isinstance(store, PGVector)


class _Opaque(_Base):
    """Any other ``VectorStore``: written through ``add_documents`` (it embeds), never listed."""

    def upsert(self, records: Sequence[Record]) -> None:
        docs = [Document(id=r.key, page_content=r.text, metadata=dict(r.metadata)) for r in records]
        self.store.add_documents(docs, ids=[r.key for r in records])

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        self.store.delete(list(keys))


def host_records(store: VectorStore, user_key: str) -> _Base:
    """The :class:`~pbr_core.corpus.HostRecords` view of a LangChain ``VectorStore``."""
    if isinstance(store, InMemoryVectorStore):
        return _InMemory(store, user_key)
    if collection_of(store) is not None:
        return _Chroma(store, user_key)
    if _is_pgvector(store):
        return _PGVector(store, user_key)
    if _v2_inner(store) is not None:
        if getattr(store._engine, "_loop", None) is None:  # type: ignore[attr-defined]
            raise ValueError(
                "this PGVectorStore's PGEngine has no background loop "
                "(PGEngine.from_engine(engine) without loop=), so pbr cannot run its statements "
                "from the retriever; make the engine with PGEngine.from_connection_string(url) "
                "or PGEngine.from_engine(engine, loop=a_running_loop_in_another_thread)"
            )
        return _PGVectorStore(store, user_key)
    if _is_async_pgvector(store):
        raise ValueError(
            "a PGVector in async mode cannot be written from pbr's write path (langchain_postgres "
            "refuses its sync methods, which pbr's add and delete call); wrap a PGVector made "
            "with a sync engine (PGVector(connection=create_engine(url), ...): pbr's async "
            "methods run it off the event loop), or langchain_postgres's PGVectorStore"
        )
    return _Opaque(store, user_key)


def default_filter(
    store: VectorStore, user_key: str, user_id: str, extra: Any = None
) -> dict[str, Any]:
    """The search keyword arguments that keep ``store`` to ``user_id``'s documents, ANDed with
    ``extra`` (the ``filter`` of ``search_kwargs``), never replaced by it.

    ``InMemoryVectorStore`` filters with a callable on ``Document``; most other stores (Chroma,
    FAISS, PGVector, ...) accept ``{"filter": {key: value}}`` (Chroma's ``$and`` combines two).
    Pass ``filter_builder`` for anything else (e.g. a Qdrant ``Filter``).
    """
    if isinstance(store, InMemoryVectorStore):
        if extra is not None and not callable(extra):
            raise ValueError(
                "InMemoryVectorStore filters with a callable on Document; the filter in "
                f"search_kwargs is a {type(extra).__name__}"
            )

        def owned(doc: Document) -> bool:
            mine = doc.metadata.get(user_key) == user_id
            return bool(mine and (extra is None or extra(doc)))

        return {"filter": owned}
    if extra is None:
        return {"filter": {user_key: user_id}}
    if not isinstance(extra, dict):
        raise ValueError(
            f"the filter in search_kwargs is a {type(extra).__name__}; for this store pass a "
            "filter_builder (user id -> search keyword arguments) that includes the user"
        )
    return {"filter": {"$and": [{user_key: user_id}, extra]}}


def with_view_filter(built: dict[str, Any], extra: Any) -> dict[str, Any]:
    """``filter_builder``'s search keyword arguments with the ``filter`` of ``search_kwargs``
    ANDed in, never dropped: two callables (``InMemoryVectorStore``) become one, two dicts a
    ``$and``; a builder that sets no ``filter`` gets ``extra`` as it. Anything else cannot be
    combined safely and is refused."""
    if extra is None:
        return built
    mine = built.get("filter")
    if mine is None:
        return {**built, "filter": extra}
    if callable(mine) and callable(extra):
        return {**built, "filter": lambda doc: bool(mine(doc) and extra(doc))}
    if isinstance(mine, dict) and isinstance(extra, dict):
        return {**built, "filter": {"$and": [mine, extra]}}
    raise ValueError(
        f"filter_builder gives a {type(mine).__name__} filter and search_kwargs a "
        f"{type(extra).__name__} one, which pbr cannot combine; put the view's filter into "
        "filter_builder (user id -> search keyword arguments) and leave it out of search_kwargs"
    )


#: The ``search_kwargs`` keys pbr itself gives a meaning, LangChain's, on every store: ``k`` (the
#: default ``k``), ``filter`` (ANDed with the user's) and ``score_threshold`` (a minimum of the
#: results' ``score``, applied by pbr after ranking: ``pbr_core.retrieval.Request``).
PBR_SEARCH_KWARGS = ("k", "filter", "score_threshold")
#: The search methods :func:`store_search` / :func:`astore_search` call, in the order tried.
_SEARCH_METHODS = (
    "similarity_search_with_score_by_vector",
    "similarity_search_by_vector_with_relevance_scores",  # Chroma's name for it
    "similarity_search_by_vector",
)
_ASYNC_SEARCH = "asimilarity_search_with_score_by_vector"


def _search_method(store: VectorStore) -> Any:
    return next(m for m in (getattr(store, n, None) for n in _SEARCH_METHODS) if m is not None)


def _named_parameters(method: Any) -> set[str]:
    """The keyword parameters ``method`` names (not ``**kwargs``: what it does with those is
    unknown: InMemoryVectorStore ignores them, Chroma passes them on to its client)."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in params if p.kind in kinds} - {"self", "embedding", "k"}


def check_search_kwargs(store: VectorStore, search_kwargs: dict[str, Any]) -> None:
    """Refuse, at construction, a ``search_kwargs`` key that would be ignored or fail at the
    first query: the same rule on every store.

    ``k``, ``filter`` and ``score_threshold`` are pbr's (:data:`PBR_SEARCH_KWARGS`; ``k`` an
    integer >= 1, ``score_threshold`` a finite number); any other key goes to the store's search
    by vector and must be a parameter that method names, e.g. ``fetch_k`` for FAISS or
    ``where_document`` for Chroma. A key the method only takes as ``**kwargs`` is refused:
    ``InMemoryVectorStore`` drops those silently and Chroma's client raises ``TypeError``.

    Raises:
        ValueError: naming the key, the method and what to do instead.
    """
    if "k" in search_kwargs:
        check_positive_int(search_kwargs["k"], "search_kwargs['k']")
    check_score_threshold(search_kwargs.get("score_threshold"))
    methods = [_search_method(store)]
    native = _native_async(store)
    if native is not None:
        methods.append(native)
    for key in sorted(set(search_kwargs) - set(PBR_SEARCH_KWARGS)):
        lacking = [m for m in methods if key not in _named_parameters(m)]
        if lacking:
            name = f"{type(store).__name__}.{lacking[0].__name__}"
            takes = sorted(_named_parameters(lacking[0]) - {"filter"})
            raise ValueError(
                f"search_kwargs key {key!r} is not a parameter of {name}, the search by vector "
                f"pbr calls: it would be ignored or fail at the first query. pbr's own keys are "
                f"{list(PBR_SEARCH_KWARGS)} (score_threshold: a minimum of metadata['score'], "
                "on every store); this store's search also takes "
                f"{takes or 'nothing else'}. Drop {key!r}, or for an MMR-style search wrap "
                "the results (pbr ranks every candidate itself)"
            )


def _native_async(store: VectorStore) -> Any:
    """The store's native async scored search, or None: also None for a ``PGVector`` built in
    sync mode, whose async methods exist but fail ("must be called with async_mode")."""
    if _is_pgvector(store):
        return None
    return getattr(store, _ASYNC_SEARCH, None)


def view_lister(store: VectorStore, kwargs: Mapping[str, Any]) -> Callable[[], Found] | None:
    """Where ``store`` can list exactly the documents a search with ``kwargs`` searches (the
    user's filter ANDed with the view's), what lists them, reading keys and metadata only:
    ``InMemoryVectorStore`` (its filter is a callable on ``Document``), Chroma (``where`` /
    ``where_document``) and a sync-mode ``PGVector`` with JSONB metadata (its own filter
    clause, in SQL). pbr then ranks every document of the view itself. None for any other
    store or argument: the store's own filtered search lists the view instead
    (:func:`pbr_core.retrieval._listed_view`), a search for all of the user's records."""
    if isinstance(store, InMemoryVectorStore) and set(kwargs) <= {"filter"}:
        keep = kwargs.get("filter")

        def in_memory() -> Found:
            out: Found = []
            for key, row in list(store.store.items()):
                meta = dict(row.get("metadata") or {})
                if keep is None or keep(Document(id=key, page_content=row["text"], metadata=meta)):
                    out.append((key, meta, None))
            return out

        return in_memory
    collection = collection_of(store)
    if collection is not None and set(kwargs) <= {"filter", "where_document"}:

        def chroma() -> Found:
            got = collection.get(
                where=kwargs.get("filter"),
                where_document=kwargs.get("where_document"),
                include=["metadatas"],
            )
            metas = got.get("metadatas") or [None] * len(got["ids"])
            return [(key, dict(meta or {}), None) for key, meta in zip(got["ids"], metas)]

        return chroma
    if _is_pgvector(store) and set(kwargs) <= {"filter"} and getattr(store, "use_jsonb", False):
        return _pgvector_lister(store, kwargs.get("filter"))
    return None


def _pgvector_lister(store: Any, where: Any) -> Callable[[], Found]:
    """A ``PGVector``'s rows within ``where``, by the clause its own search builds from it
    (``_create_filter_clause``): in SQL, without computing a distance or reading a vector or
    a text (one user's filtered view of 500 of 1k items: 6-10 ms, against 42-44 ms for the
    store's search for all of them; docs/data-ownership.md, benchmarks/filtered_view.py)."""

    def pgvector() -> Found:
        rows = store.EmbeddingStore
        with store._make_sync_session() as session:
            collection = store.get_collection(session)
            if collection is None:
                return []
            within = [rows.collection_id == collection.uuid]
            clause = store._create_filter_clause(where) if where else None
            if clause is not None:
                within.append(clause)
            found = session.query(rows.id, rows.cmetadata).filter(*within).all()
        return [(key, dict(meta or {}), None) for key, meta in found]

    return pgvector


def store_search(store: VectorStore, vector: list[float], k: int, kwargs: dict[str, Any]) -> Found:
    """Search by vector through whichever scored method the store has."""
    scored = getattr(store, "similarity_search_with_score_by_vector", None)
    if scored is None:  # Chroma's name for it
        scored = getattr(store, "similarity_search_by_vector_with_relevance_scores", None)
    pairs: list[tuple[Document, float | None]]
    if scored is not None:
        pairs = [(doc, float(score)) for doc, score in scored(vector, k=k, **kwargs)]
    else:
        pairs = [(doc, None) for doc in store.similarity_search_by_vector(vector, k=k, **kwargs)]
    return [(doc.id, dict(doc.metadata), score) for doc, score in pairs]


async def astore_search(
    store: VectorStore, vector: list[float], k: int, kwargs: dict[str, Any]
) -> Found:
    """Async :func:`store_search`: native when the store has it, else in a worker thread."""
    native = _native_async(store)
    if native is not None:
        pairs = [(doc, float(score)) for doc, score in await native(vector, k=k, **kwargs)]
        return [(doc.id, dict(doc.metadata), score) for doc, score in pairs]
    return await asyncio.to_thread(store_search, store, vector, k, kwargs)
