"""LlamaIndex's ``PGVectorStore`` under pbr, on a real PostgreSQL + pgvector (the contract suite
runs the ownership rules; here what is the store's own): a view filter PostgreSQL evaluates,
listed in SQL or searched, sync and async, within the user's rows, and a replaced node that
leaves one row.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores import MetadataFilter, MetadataFilters
from pg_writes import check_written_alike
from sqlalchemy import text

from llamaindex_pbr import PBRRetriever
from llamaindex_pbr.stores import IndexRecords
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import PBRConfig
from pbr_core.corpus import Corpus
from pbr_core.postgres import PgRecords

EMB = HashEmbedding(dim=32)


def _base(
    engines: Any, table: str = "notes", config: PBRConfig | None = None
) -> tuple[PBRRetriever, Any]:
    from llama_index.vector_stores.postgres import PGVectorStore

    engine, async_engine = engines
    store = PGVectorStore(engine=engine, async_engine=async_engine, table_name=table, embed_dim=32)
    index = VectorStoreIndex(
        [], storage_context=StorageContext.from_defaults(vector_store=store), embed_model=EMB
    )
    llm = MockLLM(max_tokens=4)
    return PBRRetriever(index, llm=llm, embed_model=EMB, config=config), store


def _fill(base: PBRRetriever) -> None:
    for user in ("ann", "ben"):
        base.for_user(user).add_nodes(
            [
                TextNode(text=f"{user} drinks tea", id_="t", metadata={"topic": "tea"}),
                TextNode(text=f"{user} runs", id_="s", metadata={"topic": "sport"}),
            ]
        )


TEA = MetadataFilters(filters=[MetadataFilter(key="topic", value="tea")])


def test_a_view_filter_searches_in_postgres_within_the_users_rows(pgvector_engine: Any) -> None:
    base, _ = _base(pgvector_engine)
    _fill(base)
    got = base.for_user("ann", filters=TEA, similarity_top_k=5).retrieve("tea")
    assert [(n.node.node_id, n.node.get_content()) for n in got] == [("t", "ann drinks tea")]


async def test_an_async_view_filter_search_keeps_to_the_user(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's own async search of a filtered view (pbr's SQL lister of it switched off,
    as for a store whose queries the app customizes) keeps to the user."""
    import llamaindex_pbr.retrievers

    monkeypatch.setattr(llamaindex_pbr.retrievers, "view_lister", lambda store, filters: None)
    base, _ = _base(pgvector_engine)
    _fill(base)
    got = await base.for_user("ben", filters=TEA, similarity_top_k=5).aretrieve("tea")
    assert [(n.node.node_id, n.node.get_content()) for n in got] == [("t", "ben drinks tea")]


def test_a_view_filter_is_listed_in_sql_and_ranked_whole(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's own filter clause lists the view's rows (node ids and metadata, no distance),
    as LangChain's PGVector is listed: the one note holding the question's word is found
    wherever it is in the dense leg, and the store's vector search is not called."""
    from llama_index.vector_stores.postgres import PGVectorStore

    base, _ = _base(pgvector_engine, config=PBRConfig(fusion="plain", search="lexical"))
    nodes = [
        TextNode(text=f"note {i} about the garden", id_=f"n{i}", metadata={"kind": "note"})
        for i in range(60)
    ]
    nodes.append(TextNode(text="a zebra escaped from the zoo", id_="z", metadata={"kind": "note"}))
    nodes.append(TextNode(text="zebra crossing photos", id_="d", metadata={"kind": "draft"}))
    base.for_user("ann").add_nodes(nodes)
    base.for_user("ben").add_nodes([TextNode(text="a zebra", id_="z", metadata={"kind": "note"})])
    notes = MetadataFilters(filters=[MetadataFilter(key="kind", value="note")])
    view = base.for_user("ann", filters=notes, similarity_top_k=5)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a listed view is not searched")

    monkeypatch.setattr(PGVectorStore, "query", never)
    monkeypatch.setattr(PGVectorStore, "aquery", never)
    for got in (view.retrieve("zebra"), asyncio.run(view.aretrieve("zebra"))):
        texts = [n.node.get_content() for n in got]
        assert texts[0] == "a zebra escaped from the zoo"
        assert "zebra crossing photos" not in texts and "a zebra" not in texts


def test_replacing_a_node_leaves_one_row_with_the_new_text(pgvector_engine: Any) -> None:
    """``PGVectorStore.add`` only inserts (its ``node_id`` is no key): pbr deletes the old row in
    the same transaction, so a replacement is not a duplicate."""
    base, store = _base(pgvector_engine)
    ann = base.for_user("ann", similarity_top_k=5)
    ann.add_nodes([TextNode(text="ann old note", id_="n")])
    ann.add_nodes([TextNode(text="ann new note", id_="n")])
    with pgvector_engine[0].connect() as conn:
        rows = conn.execute(text(f"SELECT text FROM {store.schema_name}.data_notes")).all()
    assert [r[0] for r in rows] == ["ann new note"]
    assert [n.node.get_content() for n in ann.retrieve("note")] == ["ann new note"]


@pytest.mark.parametrize("jsonb", [False, True])
def test_pbr_writes_the_rows_the_store_writes(pgvector_engine: Any, jsonb: bool) -> None:
    """pbr writes ``PGVectorStore``'s rows itself (its ``_node_to_table_row``, one statement,
    vectors in binary, the keys' old rows deleted first): the same batch written through the
    store's session and by pbr leaves the same rows, column by column (node_id, text, the
    metadata's JSON text, the vector) in the same order; written again, each key keeps one row,
    the new one, and pbr's revision trigger stamps the owner's write."""
    from llama_index.vector_stores.postgres import PGVectorStore

    engine, async_engine = pgvector_engine
    store = PGVectorStore(
        engine=engine, async_engine=async_engine, table_name="rows", embed_dim=32, use_jsonb=jsonb
    )
    index = VectorStoreIndex(
        [], storage_context=StorageContext.from_defaults(vector_store=store), embed_model=EMB
    )
    pg = IndexRecords(index, "user_id").pg
    assert pg is not None
    rows = check_written_alike(
        pg,
        engine,
        "SELECT node_id, text, metadata_::text, embedding::text, vector_send(embedding) "
        f"FROM {store.schema_name}.data_rows ORDER BY id",
        "ann",
        32,
    )
    assert [r[0] for r in rows] == [f"key-{i}" for i in range(12)]  # one row a key, in order


def test_a_per_user_partition_of_postgres_tables_is_verified(pgvector_engine: Any) -> None:
    """One ``PGVectorStore`` table per user (``vector_store_factory``): every row of a table is
    its user's; a row deleted through the store is gone at the next query."""
    from llama_index.vector_stores.postgres import PGVectorStore

    engine, async_engine = pgvector_engine
    stores: dict[str, Any] = {}

    def factory(user: str) -> Any:
        stores[user] = PGVectorStore(
            engine=engine, async_engine=async_engine, table_name=f"part_{user}", embed_dim=32
        )
        return stores[user]

    base = PBRRetriever.from_defaults(
        nodes=[], llm=MockLLM(max_tokens=4), embed_model=EMB, vector_store_factory=factory
    )
    for user in ("ann", "ben"):
        base.for_user(user).add_nodes(
            [TextNode(text=f"{user} note {i}", id_=f"n{i}") for i in range(3)]
        )
    ann = base.for_user("ann", similarity_top_k=5)
    assert sorted(n.node.get_content() for n in ann.retrieve("note")) == [
        f"ann note {i}" for i in range(3)
    ]
    key = base.personalizer.corpus.key_of("ann", "n0")
    stores["ann"].delete_nodes([key])
    assert sorted(n.node.node_id for n in ann.retrieve("note")) == ["n1", "n2"]
    assert len(base.for_user("ben", similarity_top_k=5).retrieve("note")) == 3


@pytest.mark.parametrize("own_write", [True, False])
def test_replacing_a_users_node_leaves_another_users_row_of_the_same_id(
    pgvector_engine: Any, own_write: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two users' rows written before pbr may share a ``node_id`` (no key in LlamaIndex's
    table): ann's update deletes her row only, by pbr's own statement or the store's session
    (before, both deleted every row of the id: ben's was lost)."""
    from llama_index.vector_stores.postgres import PGVectorStore

    from pbr_core.postgres import PgRecords

    if not own_write:  # pbr writes through the store's session where its table is unexpected
        monkeypatch.setattr(PgRecords, "bulk_plan", lambda self: None)
    base, store = _base(pgvector_engine, table="shared_ids")
    assert isinstance(store, PGVectorStore)
    store.add(
        [
            TextNode(
                id_="doc-0",
                text=f"{user} likes green tea",
                metadata={"user_id": user},
                embedding=EMB.get_text_embedding(f"{user} likes green tea"),
            )
            for user in ("ann", "ben")
        ]
    )
    ben, ann = base.for_user("ben", similarity_top_k=5), base.for_user("ann", similarity_top_k=5)
    assert [n.node.get_content() for n in ben.retrieve("tea")] == ["ben likes green tea"]
    assert [n.node.get_content() for n in ann.retrieve("tea")] == ["ann likes green tea"]
    ann.add_nodes([TextNode(id_="doc-0", text="ann now likes black tea")])  # under "doc-0"
    with pgvector_engine[0].connect() as conn:
        rows = conn.execute(
            text(f"SELECT text FROM {store.schema_name}.data_shared_ids ORDER BY text")
        ).all()
    assert [r[0] for r in rows] == ["ann now likes black tea", "ben likes green tea"]
    assert [n.node.get_content() for n in ben.retrieve("tea")] == ["ben likes green tea"]


@pytest.mark.parametrize("how", ["isolation_level", "connect_args", "session fallback"])
def test_over_an_autocommit_engine_a_failed_replacement_keeps_the_old_row(
    pgvector_engine: Any, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replacement (delete of the key's rows, then the insert) is one transaction even over
    an engine whose connections autocommit (``isolation_level="AUTOCOMMIT"``, or the driver's
    ``connect_args={"autocommit": True}``), by pbr's statement or the store's session: an
    insert that fails leaves the old row (before, the delete had committed on its own: the item
    was gone); and a connection goes back to the pool autocommitting, as it came."""
    import numpy as np
    from llama_index.vector_stores.postgres import PGVectorStore
    from sqlalchemy import create_engine

    from pbr_core import HistoryItem
    from pbr_core.corpus import Corpus
    from pbr_core.postgres import PgRecords

    if how == "connect_args":
        engine = create_engine(pgvector_engine[0].url, connect_args={"autocommit": True})
    else:
        engine = create_engine(pgvector_engine[0].url, isolation_level="AUTOCOMMIT")
    if how == "session fallback":  # pbr writes through the store's session
        monkeypatch.setattr(PgRecords, "bulk_plan", lambda self: None)
    try:
        store = PGVectorStore(
            engine=engine, async_engine=pgvector_engine[1], table_name="auto", embed_dim=32
        )
        index = VectorStoreIndex(
            [], storage_context=StorageContext.from_defaults(vector_store=store), embed_model=EMB
        )
        corpus = Corpus(IndexRecords(index, "user_id"), embedder=EMB)
        vector = np.eye(32, dtype=np.float32)[:1]
        corpus.add("alice", [HistoryItem(id="n1", text="alice pin is 1234")], vectors=vector)
        with engine.connect() as conn:
            conn.execute(
                text(
                    "CREATE FUNCTION pbr_test_boom() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'injected failure'; END $$"
                )
            )
            conn.execute(
                text(
                    f"CREATE TRIGGER boom BEFORE INSERT ON {store.schema_name}.data_auto "
                    "FOR EACH ROW EXECUTE FUNCTION pbr_test_boom()"
                )
            )
        with pytest.raises(Exception, match="injected failure"):
            corpus.add("alice", [HistoryItem(id="n1", text="alice pin is 5678")], vectors=vector)
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT text FROM {store.schema_name}.data_auto")).all()
            assert conn.connection.driver_connection.autocommit  # as it was lent
        assert [r[0] for r in rows] == ["alice pin is 1234"]
    finally:
        with engine.connect() as conn:
            conn.execute(text("DROP FUNCTION IF EXISTS pbr_test_boom() CASCADE"))
        engine.dispose()


def test_a_batch_replaces_its_owners_rows_owner_by_owner_in_owner_order(
    pgvector_engine: Any,
) -> None:
    """Each owner's delete and insert run before the next owner's, owners in order: pbr's
    trigger then locks the owners' revision rows in one order in every worker (a delete of
    every key first, then the inserts, locked them in two orders: two workers replacing the
    same users' nodes deadlocked, 25 of 40 batches)."""
    from pbr_core import HistoryItem

    base, _ = _base(pgvector_engine, table="order")
    pg = base._shared.corpus.host.pg  # type: ignore[union-attr]
    seen: list[tuple[str, str | None]] = []
    real = pg.sql

    def spy(statements: Any) -> Any:
        seen.extend((sql.split()[0], params.get("pbr_owner")) for sql, params in statements)
        return real(statements)

    pg.sql = spy
    batch = {u: [HistoryItem(f"{u}{i}", f"{u} note {i}") for i in range(2)] for u in ("ben", "ann")}
    base._shared.corpus.add_many(batch)
    writes = [(verb, owner) for verb, owner in seen if verb in ("DELETE", "WITH")]
    assert writes == [("DELETE", "ann"), ("WITH", None), ("DELETE", "ben"), ("WITH", None)]


def _answer(nodes: Any) -> list[Any]:
    return [
        (n.node.node_id, round(n.score, 5), n.node.get_content(), n.node.metadata) for n in nodes
    ]


def _counting(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[str]]:
    """The users of each scored read (a request ranked in the database), and the threads of
    each read of a user's rows with their vectors."""
    views: list[str] = []
    reads: list[str] = []
    scored, read_user = PgRecords.read_scored, PgRecords.read_user

    def counted_view(self: PgRecords, user_id: str, *args: Any) -> Any:
        views.append(user_id)
        return scored(self, user_id, *args)

    def counted_read(self: PgRecords, user_id: str) -> Any:
        reads.append(threading.current_thread().name)
        return read_user(self, user_id)

    monkeypatch.setattr(PgRecords, "read_scored", counted_view)
    monkeypatch.setattr(PgRecords, "read_user", counted_read)
    return views, reads


def test_a_worker_new_to_a_user_ranks_them_in_postgres_as_a_warm_one_would(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first worker to read ann cold shares her derived state; a worker new to her then
    ranks her in the database (no row read with its vector), sync and async, and answers as
    the first does."""
    no_prf = PBRConfig(fusion="no_prf")
    writer, _ = _base(pgvector_engine, config=no_prf)
    writer.for_user("ann").add_nodes(
        [
            TextNode(text=f"ann {'tea' if i % 3 else 'runs'} {i} at {i % 5} pm", id_=f"n{i}")
            for i in range(30)
        ]
    )
    first, _ = _base(pgvector_engine, config=no_prf)
    expected = _answer(first.for_user("ann", similarity_top_k=5).retrieve("tea at night"))
    views, reads = _counting(monkeypatch)
    cold, _ = _base(pgvector_engine, config=no_prf)
    assert _answer(cold.for_user("ann", similarity_top_k=5).retrieve("tea at night")) == expected
    other, _ = _base(pgvector_engine, config=no_prf)
    got = asyncio.run(other.for_user("ann", similarity_top_k=5).aretrieve("tea at night"))
    assert _answer(got) == expected
    assert views == ["ann", "ann"]
    assert not [name for name in reads if not name.startswith("pbr-read-later")]


def test_a_writer_that_derives_after_writing_lets_a_new_worker_rank_in_postgres(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``derive_after_write`` set on the writer's corpus, its node adds leave a shared
    state behind (derived in its background thread), so a worker new to ann ranks her first
    request in the database, answering as a worker that reads her rows."""
    no_prf = PBRConfig(fusion="no_prf")
    writer, _ = _base(pgvector_engine, config=no_prf)
    writer.personalizer.corpus.derive_after_write = no_prf
    writer.for_user("ann").add_nodes(
        [
            TextNode(text=f"ann {'tea' if i % 3 else 'runs'} {i} at {i % 5} pm", id_=f"n{i}")
            for i in range(30)
        ]
    )
    assert writer.personalizer.corpus.join_background(10)
    pg = writer._shared.corpus.host.pg  # type: ignore[union-attr]
    assert pg.sql([("SELECT count(*) FROM pbr_states", {})])[0][0] == 1  # ann's, shared again
    views, reads = _counting(monkeypatch)
    cold, _ = _base(pgvector_engine, config=no_prf)
    got = _answer(cold.for_user("ann", similarity_top_k=5).retrieve("tea at night"))
    assert views == ["ann"] and not [n for n in reads if not n.startswith("pbr-read-later")]
    monkeypatch.setattr(Corpus, "rank_cold_in_database", False)
    rows_read, _ = _base(pgvector_engine, config=no_prf)
    assert got == _answer(rows_read.for_user("ann", similarity_top_k=5).retrieve("tea at night"))


@pytest.mark.parametrize("cold", [True, False])
def test_a_node_rewritten_after_it_was_ranked_is_not_returned_under_its_old_ranking(
    pgvector_engine: Any, monkeypatch: pytest.MonkeyPatch, cold: bool
) -> None:
    """The ranked nodes are read back by key after ranking (in the database for a worker new
    to the user, from the cache for a warm one): a row another process rewrote in between was
    returned with the score of its old text (from a review). It is left out, as a deleted one."""
    no_prf = PBRConfig(fusion="no_prf")
    writer, _ = _base(pgvector_engine, config=no_prf)
    writer.for_user("ann").add_nodes(
        [
            TextNode(text=f"ann {'tea' if i % 3 else 'runs'} {i} at {i % 5} pm", id_=f"n{i}")
            for i in range(30)
        ]
    )
    # the first cold reader shares ann's derived state: the next new worker ranks in postgres
    _base(pgvector_engine, config=no_prf)[0].for_user("ann", similarity_top_k=3).retrieve("tea")
    reader = writer if not cold else _base(pgvector_engine, config=no_prf)[0]
    real_nodes, rewritten = IndexRecords.nodes, []

    def nodes_after_a_rewrite(self: IndexRecords, user_id: str, keys: Any) -> Any:
        with pgvector_engine[0].begin() as conn:
            conn.execute(
                text("UPDATE data_notes SET text = 'REWRITTEN' WHERE node_id = :k"), {"k": keys[0]}
            )
        rewritten.append(keys[0])
        return real_nodes(self, user_id, keys)

    monkeypatch.setattr(IndexRecords, "nodes", nodes_after_a_rewrite)
    got = reader.for_user("ann", similarity_top_k=3).retrieve("tea at night")
    assert rewritten and len(got) == 2
    assert not any(n.node.get_content() == "REWRITTEN" for n in got)
