"""The data-ownership contract every adapter keeps, on every backend (pbr_core.corpus).

One suite, run against both adapters × {pbr's own store, the framework's in-memory store, a real
``chroma run`` server, a real PostgreSQL with pgvector (LangChain's ``PGVector``, LlamaIndex's
``PGVectorStore``)}: ids scoped per user, validate-then-write-once, the host store as the truth
(deletes through the store itself, wrapping a populated store), faults mid-write healed by the
next call, one meaning of score, persistence round trips.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata
from llama_index.core.schema import TextNode
from pydantic import Field, PrivateAttr

import langchain_pbr
import llamaindex_pbr
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import EmbeddingError, PBRConfig
from pbr_core.corpus import Record, scoped_key

#: Every result carries its scores and the explanation (the harness reads both off results).
EXPLAINED = PBRConfig(explain="all")

DIM = 32
ADAPTERS = ("langchain", "llamaindex")
BACKENDS = ("own", "memory", "chroma", "pgvector")


# -- LLMs that record every prompt (to prove what reaches them) ---------------------------------
class RecordingLC(FakeListLLM):
    prompts: list[str] = Field(default_factory=list)

    def _call(self, prompt: str, *args: Any, **kwargs: Any) -> str:
        self.prompts.append(prompt)
        return '["a note"]' if "candidates" in prompt.lower() else "a reason"


class RecordingLI(CustomLLM):
    _prompts: list[str] = PrivateAttr(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=False, model_name="recording")

    def complete(self, prompt: str, formatted: bool = False, **kw: Any) -> CompletionResponse:
        self._prompts.append(prompt)
        return CompletionResponse(text="1. a note\n2. another")

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kw: Any
    ) -> CompletionResponseGen:
        yield self.complete(prompt)


# -- one harness per adapter × backend ---------------------------------------------------------
@dataclass
class Hit:
    id: str
    text: str
    score: float
    related: list[str] = field(default_factory=list)
    raw: float | None = None  # the store's own score
    search: dict[str, Any] = field(default_factory=dict)  # how pbr ranked it (both legs)


class Harness:
    """The adapter-neutral verbs of the contract."""

    adapter: str
    backend: str
    prompts: list[str]

    def add(self, user: str, texts: Sequence[str], ids: Sequence[str]) -> list[str]: ...
    def add_users(self, rows: Sequence[tuple[str, str, str]]) -> None: ...  # (user, id, text)
    def delete(self, user: str, ids: Sequence[str]) -> None: ...
    def query(self, user: str, q: str, k: int = 10) -> list[Hit]: ...
    def store_count(self) -> int: ...
    def delete_through_store(self, user: str, item_id: str) -> None: ...
    def write_through_store(self, user: str, item_id: str, text: str) -> None: ...
    def rewrap(self) -> Harness: ...  # a second retriever (another worker) over the same store

    @property
    def corpus(self) -> Any: ...


class LangChainHarness(Harness):
    def __init__(self, backend: str, chroma: Any = None, store: Any = None) -> None:
        self.adapter, self.backend = "langchain", backend
        self.emb = DeterministicFakeEmbedding(size=DIM)
        self.llm = RecordingLC(responses=["x"])
        self.prompts = self.llm.prompts
        self._chroma = chroma  # the Chroma server, or the pgvector engine
        if store is None and backend == "memory":
            store = InMemoryVectorStore(self.emb)
        elif store is None and backend == "chroma":
            from langchain_chroma import Chroma

            store = Chroma(
                client=chroma.client(),
                collection_name=f"contract-{uuid.uuid4().hex[:8]}",
                embedding_function=self.emb,
                collection_configuration={"hnsw": {"space": "cosine"}},
            )
        elif store is None and backend == "pgvector":
            store = _pgvector(self.emb, chroma, f"contract-{uuid.uuid4().hex[:8]}")
        elif store is None and backend == "pgvector-v2":
            store = _pgvector_v2(self.emb, chroma, f"contract_{uuid.uuid4().hex[:8]}", create=True)
        self.store = store
        self.r = langchain_pbr.PBRRetriever(
            llm=self.llm, embeddings=self.emb, vectorstore=store, k=10, config=EXPLAINED
        )

    @property
    def corpus(self) -> Any:
        return self.r.corpus

    def add(self, user: str, texts: Sequence[str], ids: Sequence[str]) -> list[str]:
        docs = [Document(page_content=t) for t in texts]
        return self.r.add_documents(docs, user_id=user, ids=list(ids))

    def add_users(self, rows: Sequence[tuple[str, str, str]]) -> None:
        docs = [Document(id=i, page_content=t, metadata={"user_id": u}) for u, i, t in rows]
        groups = self.r._groups(docs, None)
        self.r.corpus.add_many(groups)  # what from_documents does, on this retriever

    def delete(self, user: str, ids: Sequence[str]) -> None:
        self.r.delete(list(ids), user_id=user)

    def query(self, user: str, q: str, k: int = 10) -> list[Hit]:
        docs = self.r.invoke(q, user_id=user, k=k)
        return [
            Hit(
                d.id or "",
                d.page_content,
                d.metadata["score"],
                _related(d.metadata["pbr"]),
                d.metadata["store_score"],
                d.metadata["pbr_search"],
            )
            for d in docs
        ]

    def store_count(self) -> int:
        if self.backend == "memory":
            return len(self.store.store)
        if self.backend == "chroma":
            return int(self.store._collection.count())
        if self.backend == "pgvector":
            with self.store._make_sync_session() as session:
                collection = self.store.get_collection(session).uuid
            return _count(
                self._chroma, "langchain_pg_embedding WHERE collection_id = :c", c=collection
            )
        if self.backend == "pgvector-v2":
            return _count(self._chroma, self.store._PGVectorStore__vs.table_name)
        return sum(len(self.r.history.get(u)) for u in self.r.history.users())

    def delete_through_store(self, user: str, item_id: str) -> None:
        key = _key_of(self.corpus, user, item_id)
        self.store.delete([key])

    def write_through_store(self, user: str, item_id: str, text: str) -> None:
        self.store.add_documents(
            [Document(page_content=text, metadata={"user_id": user})], ids=[item_id]
        )

    def rewrap(self) -> Harness:
        store = self.store
        if self.backend == "chroma":
            from langchain_chroma import Chroma

            store = Chroma(
                client=self._chroma.client(),
                collection_name=self.store._collection.name,
                embedding_function=self.emb,
            )
        if self.backend == "pgvector":
            store = _pgvector(self.emb, self._chroma, self.store.collection_name)
        if self.backend == "pgvector-v2":
            table = self.store._PGVectorStore__vs.table_name
            store = _pgvector_v2(self.emb, self._chroma, table, create=False)
        return LangChainHarness(self.backend, self._chroma, store)


class LlamaIndexHarness(Harness):
    def __init__(self, backend: str, chroma: Any = None, index: Any = None) -> None:
        self.adapter, self.backend = "llamaindex", backend
        self.emb = HashEmbedding(dim=DIM)
        self.llm = RecordingLI()
        self.prompts = self.llm._prompts
        self._chroma = chroma
        if index is None:
            if backend == "chroma":
                from llama_index.vector_stores.chroma import ChromaVectorStore

                collection = chroma.client().create_collection(
                    f"contract-{uuid.uuid4().hex[:8]}", configuration={"hnsw": {"space": "cosine"}}
                )
                storage = StorageContext.from_defaults(
                    vector_store=ChromaVectorStore(chroma_collection=collection)
                )
                index = VectorStoreIndex([], storage_context=storage, embed_model=self.emb)
            elif backend == "pgvector":
                storage = StorageContext.from_defaults(
                    vector_store=_pgvector_li(chroma, f"contract_{uuid.uuid4().hex[:8]}")
                )
                index = VectorStoreIndex([], storage_context=storage, embed_model=self.emb)
            else:  # "own" and "memory" are the same here: LlamaIndex's SimpleVectorStore
                index = VectorStoreIndex([], embed_model=self.emb)
        self.index = index
        self.r = llamaindex_pbr.PBRRetriever(
            index, llm=self.llm, embed_model=self.emb, similarity_top_k=10, config=EXPLAINED
        )

    @property
    def corpus(self) -> Any:
        return self.r._shared.corpus

    def add(self, user: str, texts: Sequence[str], ids: Sequence[str]) -> list[str]:
        nodes = [TextNode(text=t, id_=i) for t, i in zip(texts, ids)]
        return self.r.for_user(user).add_nodes(nodes)

    def add_users(self, rows: Sequence[tuple[str, str, str]]) -> None:
        nodes = [TextNode(text=t, id_=i, metadata={"user_id": u}) for u, i, t in rows]
        self.r._add(nodes, insert=True, own_only=False)

    def delete(self, user: str, ids: Sequence[str]) -> None:
        self.r.for_user(user).delete_nodes(list(ids))

    def query(self, user: str, q: str, k: int = 10) -> list[Hit]:
        got = self.r.for_user(user, similarity_top_k=k).retrieve(q)
        return [
            Hit(
                n.node.node_id,
                n.node.get_content(),
                float(n.score or 0),
                _related(n.node.metadata["pbr"]),
                n.node.metadata["store_score"],
                n.node.metadata["pbr_search"],
            )
            for n in got
        ]

    def store_count(self) -> int:
        vs = self.index.vector_store
        if self.backend == "chroma":
            return int(vs._collection.count())
        if self.backend == "pgvector":
            return _count(self._chroma, f"{vs.schema_name}.{vs._table_class.__tablename__}")
        return len(vs.data.embedding_dict)

    def delete_through_store(self, user: str, item_id: str) -> None:
        key = _key_of(self.corpus, user, item_id)
        self.index.delete_nodes([key], delete_from_docstore=True)

    def write_through_store(self, user: str, item_id: str, text: str) -> None:
        self.index.insert_nodes([TextNode(text=text, id_=item_id, metadata={"user_id": user})])

    def rewrap(self) -> Harness:
        index = self.index
        if self.backend == "pgvector":  # another worker: its own store object over the table
            storage = StorageContext.from_defaults(
                vector_store=_pgvector_li(self._chroma, index.vector_store.table_name)
            )
            index = VectorStoreIndex([], storage_context=storage, embed_model=self.emb)
        return LlamaIndexHarness(self.backend, self._chroma, index)


def _pgvector(emb: Any, engine: Any, collection: str) -> Any:
    """LangChain's ``PGVector`` on the test server (one engine for the session's stores)."""
    from langchain_postgres import PGVector

    return PGVector(embeddings=emb, connection=engine[0], collection_name=collection)


def _pgvector_v2(emb: Any, engines: Any, table: str, *, create: bool) -> Any:
    """LangChain's v2 ``PGVectorStore`` on the test server: a table of its own (text ids, so
    that records written before pbr may use any id; metadata all in its JSON column)."""
    from langchain_postgres import Column, PGEngine, PGVectorStore

    url = engines[0].url.render_as_string(hide_password=False)
    engine = PGEngine.from_connection_string(url)
    if create:
        engine.init_vectorstore_table(table, DIM, id_column=Column("langchain_id", "TEXT"))
    return PGVectorStore.create_sync(engine=engine, embedding_service=emb, table_name=table)


def _pgvector_li(engines: Any, table: str) -> Any:
    """LlamaIndex's ``PGVectorStore`` on the test server (cosine distance, JSON metadata: its
    defaults)."""
    from llama_index.vector_stores.postgres import PGVectorStore

    sync, async_ = engines
    return PGVectorStore(engine=sync, async_engine=async_, table_name=table, embed_dim=DIM)


def _count(engines: Any, rows: str, **params: Any) -> int:
    """``count(*)`` of ``rows`` (a table, maybe with a WHERE clause), read straight from SQL."""
    from sqlalchemy import text

    with engines[0].connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {rows}"), params).scalar_one())


def _related(pbr: dict[str, Any]) -> list[str]:
    return [h["text"] for h in pbr["related"]] + [h["text"] for h in pbr["anchor_items"]]


def _key_of(corpus: Any, user: str, item_id: str) -> str:
    known = corpus._known.get(user)

    return (
        known.key_of.get(item_id, scoped_key(user, item_id)) if known else scoped_key(user, item_id)
    )


@pytest.fixture(
    params=[(a, b) for a in ADAPTERS for b in BACKENDS] + [("langchain", "pgvector-v2")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    adapter, backend = request.param
    server: Any = None
    if backend == "chroma":
        server = request.getfixturevalue("shared_chroma")
    elif backend.startswith("pgvector"):
        server = request.getfixturevalue("pgvector_engine")
    cls = LangChainHarness if adapter == "langchain" else LlamaIndexHarness
    yield cls(backend, server)


def _stored(h: Harness) -> bool:
    """True where a host store holds the records (the contract's host-truth clauses apply)."""
    return not (h.adapter == "langchain" and h.backend == "own")


ALICE = ["alice pin is 4321", "alice likes green tea", "alice runs on sundays"]
BOB = ["bob plays jazz piano", "bob hates mornings", "bob cooks ramen"]


# -- ids are scoped per user ---------------------------------------------------------------------
def test_two_users_may_use_the_same_id_and_neither_overwrites_the_other(harness: Harness) -> None:
    harness.add("alice", ALICE, ["x", "y", "z"])
    harness.add("bob", BOB, ["x", "y", "z"])
    assert sorted(h.text for h in harness.query("alice", "pin")) == sorted(ALICE)
    assert sorted(h.text for h in harness.query("bob", "jazz")) == sorted(BOB)
    assert {h.id for h in harness.query("bob", "jazz")} == {"x", "y", "z"}  # the user's own ids
    if _stored(harness):
        assert harness.store_count() == 6


def test_a_delete_by_id_removes_only_the_callers_item(harness: Harness) -> None:
    harness.add("alice", ALICE, ["x", "y", "z"])
    harness.add("bob", BOB, ["x", "y", "z"])
    harness.delete("alice", ["x"])
    assert sorted(h.text for h in harness.query("bob", "jazz")) == sorted(BOB)
    assert sorted(h.text for h in harness.query("alice", "pin")) == sorted(ALICE[1:])


def test_deleting_an_id_only_another_user_has_is_refused_and_removes_nothing(
    harness: Harness,
) -> None:
    harness.add("alice", ALICE, ["a1", "a2", "a3"])
    harness.add("bob", BOB, ["b1", "b2", "b3"])
    with pytest.raises(KeyError, match="b1"):
        harness.delete("alice", ["a1", "b1"])
    assert len(harness.query("alice", "pin")) == 3 and len(harness.query("bob", "jazz")) == 3


def test_a_multi_user_batch_with_colliding_loader_ids_keeps_every_users_corpus(
    harness: Harness,
) -> None:
    rows = [(u, f"doc-{i}", f"{u} text {i}") for u in ("alice", "bob") for i in range(3)]
    harness.add_users(rows)
    for user in ("alice", "bob"):
        assert sorted(h.text for h in harness.query(user, "text")) == [
            f"{user} text {i}" for i in range(3)
        ]


def test_an_id_can_be_deleted_and_added_again(harness: Harness) -> None:
    harness.add("alice", ALICE[:1], ["x"])
    harness.delete("alice", ["x"])
    harness.add("alice", ["alice new pin 9999"], ["x"])
    assert [h.text for h in harness.query("alice", "pin")] == ["alice new pin 9999"]


# -- validate everything, then write once --------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        [("alice", "a", "fine"), ("bob", "b", "fine"), ("bob", "b", "duplicate id")],
        [("alice", "a", "fine"), ("bob", "b", "   ")],
        [("alice", "a", "fine"), ("bob", "b\ud800", "lone surrogate id")],
    ],
    ids=["duplicate-id", "blank-text", "unsaveable-id"],
)
def test_an_invalid_multi_user_batch_writes_nothing_anywhere(
    harness: Harness, bad: list[tuple[str, str, str]]
) -> None:
    harness.add("carol", ["carol keeps bees"], ["c"])
    before = harness.store_count()
    with pytest.raises(ValueError):
        harness.add_users(bad)
    assert harness.store_count() == before
    assert harness.query("alice", "fine") == [] and harness.query("bob", "fine") == []


def test_a_nan_vector_in_a_multi_user_batch_writes_nothing(harness: Harness) -> None:
    before = harness.store_count()
    items = {
        "alice": [_item("a", "alice ok")],
        "bob": [_item("b", "bob nan")],
    }
    vectors = {"alice": np.ones((1, DIM)), "bob": np.full((1, DIM), np.nan)}
    with pytest.raises(EmbeddingError):
        harness.corpus.add_many(items, vectors=vectors)
    assert harness.store_count() == before


def test_retrying_the_same_add_is_idempotent(harness: Harness) -> None:
    harness.add("alice", ALICE, ["x", "y", "z"])
    harness.add("alice", ALICE, ["x", "y", "z"])
    assert len(harness.query("alice", "pin")) == 3
    if _stored(harness):
        assert harness.store_count() == 3


def test_a_fault_midway_through_the_host_write_is_healed_by_the_next_calls(
    harness: Harness,
) -> None:
    if not _stored(harness):
        pytest.skip("pbr's own store has no second write to fail")
    host = harness.corpus.host
    real = host.upsert
    calls: list[int] = []

    def half_then_fail(records: Sequence[Record]) -> None:
        calls.append(len(records))
        real(records[: len(records) // 2])  # part of the batch lands, then the server dies
        raise ConnectionResetError("server gone mid-write")

    host.upsert = half_then_fail
    with pytest.raises(ConnectionError):
        harness.add("alice", [*ALICE, "alice fourth"], ["a", "b", "c", "d"])
    host.upsert = real
    landed = harness.query("alice", "pin")
    assert sorted(h.id for h in landed) == ["a", "b"]  # the landed rows are ordinary items
    harness.delete("alice", ["a"])  # ... and deletable
    harness.add("alice", [*ALICE, "alice fourth"], ["a", "b", "c", "d"])  # the retry
    assert sorted(h.id for h in harness.query("alice", "pin")) == ["a", "b", "c", "d"]
    assert harness.store_count() == 4  # no duplicate


# -- the host store is the truth -----------------------------------------------------------------
def test_an_item_deleted_through_the_store_itself_never_reaches_a_prompt(
    harness: Harness,
) -> None:
    if not _stored(harness):
        pytest.skip("no host store to delete through")
    harness.add("alice", ALICE, ["x", "y", "z"])
    harness.delete_through_store("alice", "x")
    harness.prompts.clear()
    hits = harness.query("alice", "pin")
    assert "alice pin is 4321" not in {h.text for h in hits}
    assert all("alice pin is 4321" not in related for h in hits for related in h.related)
    assert harness.prompts and not any("4321" in p for p in harness.prompts)


def test_a_second_worker_over_the_same_store_sees_the_first_ones_writes(harness: Harness) -> None:
    if not _stored(harness) or harness.backend == "own":
        pytest.skip("needs a store shared by two retrievers")
    first = harness
    harness.add("alice", ALICE[:2], ["x", "y"])
    second = harness.rewrap()
    assert sorted(h.text for h in second.query("alice", "pin")) == sorted(ALICE[:2])
    first.add("alice", ALICE[2:], ["z"])
    first.delete("alice", ["x"])
    assert sorted(h.text for h in second.query("alice", "pin")) == sorted(ALICE[1:])
    second.add("alice", ["alice second worker"], ["w"])
    assert "alice second worker" in {h.text for h in first.query("alice", "pin")}


def test_wrapping_a_populated_store_needs_no_re_adding(harness: Harness) -> None:
    if not _stored(harness) or harness.backend == "own":
        pytest.skip("needs a host store written by someone else")
    harness.write_through_store("dave", "d1", "dave collects stamps")
    harness.write_through_store("dave", "d2", "dave grows tomatoes")
    fresh = harness.rewrap()
    hits = fresh.query("dave", "stamps")
    assert sorted(h.text for h in hits) == ["dave collects stamps", "dave grows tomatoes"]
    fresh.delete("dave", ["d1"])  # an item written before pbr is deletable by its id
    assert [h.text for h in fresh.query("dave", "stamps")] == ["dave grows tomatoes"]


def test_re_adding_an_item_written_before_pbr_replaces_it_and_a_delete_removes_both(
    harness: Harness,
) -> None:
    if not _stored(harness) or harness.backend == "own":
        pytest.skip("needs a host store written by someone else")
    harness.write_through_store("dave", "d1", "dave old note")
    fresh = harness.rewrap()  # a process that has not read dave yet
    fresh.add("dave", ["dave new note"], ["d1"])
    assert [h.text for h in fresh.query("dave", "note")] == ["dave new note"]
    fresh.delete("dave", ["d1"])
    assert fresh.query("dave", "note") == [] and harness.rewrap().query("dave", "note") == []


# -- one meaning of score ------------------------------------------------------------------------
def test_scores_mean_the_same_on_every_store(harness: Harness) -> None:
    """pbr ranks the user's items itself on every store (hybrid by default): ``score`` is the
    fused score in [0, 1], best first; the dense leg is the cosine with ``q*`` and the lexical
    leg BM25, whatever the store; no store score, as no store search ran."""
    harness.add("alice", ALICE + BOB, ["1", "2", "3", "4", "5", "6"])
    hits = harness.query("alice", "pin")
    scores = [h.score for h in hits]
    assert len(scores) == 6 and scores == sorted(scores, reverse=True)
    assert all(0.0 <= x <= 1.0 for x in scores) and all(h.raw is None for h in hits)
    assert hits[0].text == "alice pin is 4321"  # the only item with the query's word
    assert hits[0].search["lexical_rank"] == 1 and hits[0].search["lexical"] > 0
    assert all(h.search["lexical_rank"] is None for h in hits[1:])
    assert all(h.search["mode"] == "hybrid" and -1 <= h.search["dense"] <= 1 for h in hits)
    dense_order = sorted(hits, key=lambda h: -h.search["dense"])
    assert [h.search["dense_rank"] for h in dense_order] == [1, 2, 3, 4, 5, 6]


def _item(item_id: str, text: str) -> Any:
    from pbr_core import HistoryItem

    return HistoryItem(id=item_id, text=text)
