"""``langchain_postgres.PGVector`` under pbr, on a real PostgreSQL + pgvector (the contract suite
runs the ownership rules; here what is PGVector's own): one key column shared by every
collection of the table, and a view filter that makes PostgreSQL search.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake import FakeListLLM
from langchain_postgres import PGVector
from pg_writes import check_written_alike
from pydantic import ValidationError
from sqlalchemy import text

from langchain_pbr import PBRRetriever
from langchain_pbr.stores import _PGVector, host_records
from pbr_core import PBRConfig

EMB = DeterministicFakeEmbedding(size=16)


def _store(engine: Any, collection: str | None = None) -> PGVector:
    name = collection or f"lc-{uuid.uuid4().hex[:8]}"
    return PGVector(embeddings=EMB, connection=engine, collection_name=name)


def _retriever(store: PGVector, **kw: Any) -> PBRRetriever:
    return PBRRetriever(
        llm=FakeListLLM(responses=["a note"]), embeddings=EMB, vectorstore=store, k=10, **kw
    )


def _rows(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM langchain_pg_embedding")).scalar_one())


def test_pgvector_is_verified_against_its_rows(pgvector_engine: Any) -> None:
    r = _retriever(_store(pgvector_engine[0]))
    assert r.corpus.verified  # lists, returns vectors: the store is the truth


def test_pbr_writes_the_rows_add_embeddings_writes(pgvector_engine: Any) -> None:
    """pbr writes PGVector's rows itself (one statement, vectors in binary): the same batch
    written by ``PGVector.add_embeddings`` and by pbr leaves the same rows, column by column
    (id, collection, document, metadata, vector); written again under the same ids, each
    replaces the rows in place, and pbr's revision trigger stamps the owner's write."""
    engine = pgvector_engine[0]
    host = host_records(_store(engine), "user_id")
    assert isinstance(host, _PGVector)
    rows = check_written_alike(
        host.pg,
        engine,
        "SELECT id, collection_id, document, cmetadata::text, embedding::text, "
        "vector_send(embedding) FROM langchain_pg_embedding ORDER BY id",
        "alice",
        16,
    )
    assert [r[2] for r in rows] == sorted(r[2] for r in rows) and "v2" in rows[0][2]


def test_the_same_user_and_id_in_a_second_collection_is_refused_and_nothing_is_written(
    pgvector_engine: Any,
) -> None:
    """langchain_pg_embedding has one primary key for all collections, and PGVector's upsert
    does not move a row between collections: the second collection's add would silently update
    the first one's row. pbr refuses it with what to do instead."""
    engine = pgvector_engine[0]
    notes, mail = _retriever(_store(engine, "notes")), _retriever(_store(engine, "mail"))
    notes.add_documents([Document(page_content="alice pin is 4321")], user_id="alice", ids=["x"])
    with pytest.raises(ValueError, match=r"another collection_id.*user_key"):
        mail.add_documents(
            [Document(page_content="alice new mail"), Document(page_content="alice old")],
            user_id="alice",
            ids=["y", "x"],
        )
    assert _rows(engine) == 1  # nothing of the refused batch landed
    assert [d.page_content for d in notes.invoke("pin", user_id="alice")] == ["alice pin is 4321"]
    assert mail.invoke("pin", user_id="alice") == []


def test_a_view_filter_is_evaluated_by_postgres_within_the_users_rows(pgvector_engine: Any) -> None:
    """A ``filter`` in search_kwargs is evaluated by PostgreSQL, ANDed with the owner, never
    replacing it: PGVector's own filter clause lists the user's rows within it, in SQL
    (``langchain_pbr.stores``), and pbr ranks all of them, so a result carries no store
    score."""
    store = _store(pgvector_engine[0])
    plain = _retriever(store)
    for user in ("alice", "bob"):
        docs = [
            Document(page_content=f"{user} drinks tea", metadata={"topic": "tea"}),
            Document(page_content=f"{user} runs", metadata={"topic": "sport"}),
        ]
        plain.add_documents(docs, user_id=user, ids=["t", "s"])
    viewed = _retriever(
        store,
        search_kwargs={"filter": {"topic": "tea"}},
        config=PBRConfig(search="dense", explain="all"),
    )
    docs = viewed.invoke("tea", user_id="alice")
    assert [(d.id, d.page_content) for d in docs] == [("t", "alice drinks tea")]
    assert docs[0].metadata["store_score"] is None  # listed, not searched with q*
    assert [d.id for d in viewed.invoke("runs", user_id="alice", k=5)] == ["t"]  # within the view


def test_a_view_filter_is_listed_in_sql_and_ranked_whole(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PGVector's own filter clause lists the view's rows (keys and metadata, no distance): the
    one note holding the question's word is found wherever it is in the dense leg, and the
    store's vector search is not called."""
    store = _store(pgvector_engine[0])
    notes = [Document(f"note {i} about the garden", metadata={"kind": "note"}) for i in range(60)]
    notes.append(Document("a zebra escaped from the zoo", metadata={"kind": "note"}))
    notes.append(Document("zebra crossing photos", metadata={"kind": "draft"}))
    _retriever(store).add_documents(notes, user_id="alice", ids=[f"n{i}" for i in range(62)])
    viewed = _retriever(
        store, search_kwargs={"filter": {"kind": "note"}}, config=PBRConfig(search="lexical")
    )

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a listed view is not searched")

    monkeypatch.setattr(type(store), "similarity_search_with_score_by_vector", never)
    got = [d.page_content for d in viewed.invoke("zebra", user_id="alice", k=5)]
    assert got[0] == "a zebra escaped from the zoo" and "zebra crossing photos" not in got


async def test_an_async_request_with_a_view_filter_searches_a_sync_pgvector(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync-mode PGVector has ``asimilarity_search_with_score_by_vector`` but refuses it
    ("must be called with async_mode"): where its view is searched (here: pbr's SQL lister of
    it switched off, as for a PGVector without JSONB metadata), pbr runs the sync search in a
    worker thread."""
    import langchain_pbr.retrievers

    monkeypatch.setattr(langchain_pbr.retrievers, "view_lister", lambda store, kwargs: None)
    store = _store(pgvector_engine[0])
    plain = _retriever(store)
    docs = [
        Document(page_content="alice drinks tea", metadata={"topic": "tea"}),
        Document(page_content="alice runs", metadata={"topic": "sport"}),
    ]
    plain.add_documents(docs, user_id="alice", ids=["t", "s"])
    viewed = _retriever(store, search_kwargs={"filter": {"topic": "tea"}})
    found = await viewed.ainvoke("tea", user_id="alice")
    assert [d.id for d in found] == ["t"]


def _v2_store(engines: Any, **table: Any) -> Any:
    """LangChain's v2 ``PGVectorStore`` on a table of its own."""
    from langchain_postgres import PGEngine, PGVectorStore

    engine = PGEngine.from_connection_string(engines[0].url.render_as_string(hide_password=False))
    name = f"v2_{uuid.uuid4().hex[:8]}"
    engine.init_vectorstore_table(name, 16, **table)
    columns = [c.name for c in table.get("metadata_columns", [])]
    return PGVectorStore.create_sync(
        engine=engine, embedding_service=EMB, table_name=name, metadata_columns=columns
    )


async def test_a_v2_pgvectorstore_is_verified_and_searched_within_the_user(
    pgvector_engine: Any,
) -> None:
    """The v2 store, metadata in its JSON column: listed (verified), and a view filter searched
    by PostgreSQL keeps to the user, sync and async (its native async search)."""
    store = _v2_store(pgvector_engine)
    plain = _retriever(store)
    assert plain.corpus.verified
    for user in ("alice", "bob"):
        docs = [
            Document(page_content=f"{user} drinks tea", metadata={"topic": "tea"}),
            Document(page_content=f"{user} runs", metadata={"topic": "sport"}),
        ]
        plain.add_documents(docs, user_id=user, ids=["t", "s"])
    viewed = _retriever(store, search_kwargs={"filter": {"topic": "tea"}})
    assert [d.page_content for d in viewed.invoke("tea", user_id="bob")] == ["bob drinks tea"]
    found = await viewed.ainvoke("tea", user_id="alice")
    assert [d.page_content for d in found] == ["alice drinks tea"]


def test_a_v2_pgvectorstore_with_metadata_columns_is_not_listed(pgvector_engine: Any) -> None:
    """Metadata split over columns is not read back by pbr: such a store is one pbr cannot list
    (its history is the record), not one it would read half of."""
    from langchain_postgres import Column

    store = _v2_store(pgvector_engine, metadata_columns=[Column("user_id", "TEXT")])
    assert not _retriever(store).corpus.verified


def test_a_second_worker_serves_a_user_cold_from_what_the_first_shared(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker is a PBRRetriever of its own over one collection. The first to read a user
    cold shares the anchor and BM25 index it derived (one row of pbr_states per collection
    and user); the next cold worker, sync or async, takes them and answers alike."""
    engine = pgvector_engine[0]
    collection = f"lc-{uuid.uuid4().hex[:8]}"
    writer = _retriever(_store(engine, collection), config=PBRConfig(fusion="no_prf"))
    notes = [f"alice note {i}: {'tea' if i % 2 else 'trains'} at {i} pm" for i in range(8)]
    writer.add_documents([Document(page_content=t) for t in notes], user_id="alice")
    other = _retriever(_store(engine, "elsewhere"), config=PBRConfig(fusion="no_prf"))
    other.add_documents([Document(page_content="alice elsewhere")], user_id="alice")

    def worker() -> PBRRetriever:
        return _retriever(_store(engine, collection), config=PBRConfig(fusion="no_prf"))

    first = [d.page_content for d in worker().invoke("tea at night", user_id="alice")]
    with engine.connect() as conn:
        shared = conn.execute(text("SELECT count(*) FROM pbr_states")).scalar_one()
    assert shared == 1  # alice of this collection only (the writer and `other` read warm)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the anchor was built again")

    monkeypatch.setattr("pbr_core.snapshot.compute_anchor", refuse)
    assert [d.page_content for d in worker().invoke("tea at night", user_id="alice")] == first
    again = asyncio.run(worker().ainvoke("tea at night", user_id="alice"))
    assert [d.page_content for d in again] == first


def test_tables_found_through_the_connections_search_path_are_the_ones_pbr_reads_and_writes(
    pgvector_engine: Any,
) -> None:
    """PGVector names its tables unqualified, so a connection's ``search_path`` puts them in
    another schema: pbr reads and writes those, not ``public``'s (before, it assumed
    ``public``: every add failed, or, with another app's tables there, missed the store's
    rows)."""
    from sqlalchemy import create_engine

    engine = pgvector_engine[0]
    with engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA app"))
    app = create_engine(engine.url, connect_args={"options": "-csearch_path=app,public"})
    try:
        store = _store(app, "c")  # its tables made in app, the first schema of its path
        other = _store(engine, "c")  # another application's tables, in public
        other.add_documents([Document("OTHER APP alice secret", metadata={"user_id": "alice"})])
        r = _retriever(store, config=PBRConfig(fusion="no_prf"))
        r.add_documents([Document("alice likes tea")], user_id="alice", ids=["t"])
        store.add_documents([Document("alice via the store", metadata={"user_id": "alice"})])
        got = sorted(d.page_content for d in r.invoke("tea", user_id="alice"))
        assert got == ["alice likes tea", "alice via the store"]
        with app.connect() as conn:
            assert (
                conn.execute(text("SELECT count(*) FROM app.langchain_pg_embedding")).scalar() == 2
            )
    finally:
        app.dispose()


def test_postgres_stores_pbr_cannot_drive_are_refused_at_construction(pgvector_engine: Any) -> None:
    """An async-mode PGVector refuses the sync methods pbr's writes call, and a PGVectorStore
    whose PGEngine has no background loop cannot run pbr's statements: each is refused when the
    retriever is made, saying what to use (before, the first had every add fail and the second
    was reported verified while every add, query and delete failed)."""
    from langchain_postgres import PGEngine, PGVectorStore

    async_engine = pgvector_engine[1]
    store = PGVector(embeddings=EMB, connection=async_engine, collection_name="a", async_mode=True)
    with pytest.raises(ValidationError, match=r"async mode.*sync engine"):
        _retriever(store)

    async def v2_without_loop() -> PGVectorStore:
        pg = PGEngine.from_engine(async_engine)
        await pg.ainit_vectorstore_table("v2_no_loop", 16)
        return await PGVectorStore.create(engine=pg, embedding_service=EMB, table_name="v2_no_loop")

    with pytest.raises(ValidationError, match=r"no background loop.*from_connection_string"):
        _retriever(asyncio.run(v2_without_loop()))


def test_a_collection_recreated_by_another_process_is_the_one_pbr_reads_and_writes(
    pgvector_engine: Any,
) -> None:
    """Another worker starting with ``pre_delete_collection=True`` gives the collection a new
    uuid; the store looks it up by name on every call, and so does pbr now (before, pbr kept
    the uuid it read when made: it saw none of the store's writes again and every add failed
    with a foreign key violation)."""
    engine = pgvector_engine[0]
    store = _store(engine, "notes")
    r = _retriever(store, config=PBRConfig(fusion="no_prf"))
    r.add_documents([Document("alice likes tea")], user_id="alice", ids=["t"])
    PGVector(embeddings=EMB, connection=engine, collection_name="notes", pre_delete_collection=True)
    assert r.invoke("tea", user_id="alice") == []  # the reset deleted the rows
    store.add_documents([Document("alice via the store", metadata={"user_id": "alice"})])
    assert [d.page_content for d in r.invoke("tea", user_id="alice")] == ["alice via the store"]
    r.add_documents([Document("alice drinks coffee")], user_id="alice", ids=["c"])
    got = sorted(d.page_content for d in r.invoke("coffee", user_id="alice"))
    assert got == ["alice drinks coffee", "alice via the store"]
    store.delete_collection()
    with pytest.raises(ValueError, match="no longer exists"):
        r.add_documents([Document("alice again")], user_id="alice", ids=["a"])


def test_a_batch_of_several_users_writes_their_rows_in_owner_order(pgvector_engine: Any) -> None:
    """pbr's trigger locks each owner's revision row as that owner's rows are written: two
    workers writing the same users in other orders deadlocked (PostgreSQL aborted a batch in
    each of 5 rounds of two 3,000-row batches); the rows now go in owner order, the same for
    every worker."""
    from pbr_core import HistoryItem
    from pbr_core.corpus import scoped_key

    r = _retriever(_store(pgvector_engine[0]))
    pg = r.corpus.host.pg  # type: ignore[union-attr]
    written: list[list[str]] = []
    real = pg.sql

    def spy(statements: Any) -> Any:
        written.extend(list(p["pbr_keys"]) for _, p in statements if "pbr_keys" in p)
        return real(statements)

    pg.sql = spy
    users = ["ben", "ann", "cai"]
    r.corpus.add_many(
        {u: [HistoryItem(f"{u}{i}", f"{u} note {i}") for i in range(3)] for u in users}
    )
    owner_of = {scoped_key(u, f"{u}{i}"): u for u in users for i in range(3)}
    assert [owner_of[k] for k in written[-1]] == ["ann"] * 3 + ["ben"] * 3 + ["cai"] * 3


def test_a_collection_renamed_into_the_stores_name_is_seen_by_a_warm_worker(
    pgvector_engine: Any,
) -> None:
    """A blue/green re-index renames the rebuilt collection to the served name: no row
    changes, but the name finds another collection now, and the token says so (before, a warm
    worker served the old collection's rows; a cold one the new)."""
    engine = pgvector_engine[0]
    name = f"lc-{uuid.uuid4().hex[:8]}"
    served = _store(engine, name)
    warm = _retriever(served)
    warm.add_documents([Document("alice old index: likes tea")], user_id="alice", ids=["a"])
    rebuilt = _store(engine, f"{name}-v2")
    rebuilt.add_documents(
        [Document("alice new index: likes coffee", metadata={"user_id": "alice"})]
    )
    assert [d.page_content for d in warm.invoke("drinks", user_id="alice")] == [
        "alice old index: likes tea"
    ]
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE langchain_pg_collection SET name = :old WHERE name = :name"),
            {"old": f"{name}-old", "name": name},
        )
        conn.execute(
            text("UPDATE langchain_pg_collection SET name = :name WHERE name = :v2"),
            {"name": name, "v2": f"{name}-v2"},
        )
    assert [d.page_content for d in warm.invoke("drinks", user_id="alice")] == [
        "alice new index: likes coffee"
    ]
