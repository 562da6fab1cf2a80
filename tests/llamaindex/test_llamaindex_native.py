"""LlamaIndex idioms the per-user retriever honours (per-call user, settable top-k/filters,
per-user delete_ref_doc)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.vector_stores import MetadataFilter, MetadataFilters

from llamaindex_pbr import PBRRetriever
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import PBRConfig

EMB = HashEmbedding(dim=32)


def docs() -> list[Document]:
    # Both users have a document "diary" (their own ids), two chunks each, with a topic.
    return [
        Document(text=f"{u} diary page {i}", id_="diary", metadata={"user_id": u, "topic": t})
        for u in ("ann", "ben")
        for i, t in enumerate(("food", "sport"))
    ]


EXPLAINED = PBRConfig(explain="all")


def base_over(index: VectorStoreIndex | None = None) -> PBRRetriever:
    if index is None:
        return PBRRetriever.from_defaults(nodes=[], llm=MockLLM(max_tokens=4), embed_model=EMB)
    return PBRRetriever(index, llm=MockLLM(max_tokens=4), embed_model=EMB)


def add_docs(base: PBRRetriever) -> None:
    for d in docs():  # split into nodes whose source document is "diary"
        base.for_user(d.metadata["user_id"]).add_documents([d])


def test_the_user_can_be_given_per_call() -> None:
    base = base_over()
    add_docs(base)
    got = base.retrieve("diary", user_id="ben")
    assert got and {n.node.metadata["user_id"] for n in got} == {"ben"}
    with pytest.raises(ValueError, match="no user"):
        base.retrieve("diary")


def test_a_view_for_another_user_does_not_inherit_the_filters() -> None:
    base = base_over()
    add_docs(base)
    food = MetadataFilters(filters=[MetadataFilter(key="topic", value="food")])
    ann_food = base.for_user("ann", filters=food, similarity_top_k=10)
    assert {n.node.metadata["topic"] for n in ann_food.retrieve("diary")} == {"food"}
    assert ann_food.for_user("ann").filters is food  # the same user keeps them
    ben = ann_food.for_user("ben")
    assert ben.filters is None
    assert {n.node.metadata["topic"] for n in ben.retrieve("diary")} == {"food", "sport"}


def test_top_k_and_filters_can_be_set_on_a_view() -> None:
    base = base_over()
    add_docs(base)
    ann = base.for_user("ann")
    ann.similarity_top_k = 1
    assert len(ann.retrieve("diary")) == 1
    ann.filters = MetadataFilters(filters=[MetadataFilter(key="topic", value="sport")])
    ann.similarity_top_k = 10
    assert [n.node.metadata["topic"] for n in ann.retrieve("diary")] == ["sport"]
    with pytest.raises(ValueError, match="similarity_top_k"):
        ann.similarity_top_k = 0
    assert base.for_user("ann").similarity_top_k != 0


@pytest.mark.parametrize("condition", ["or", "not"])
def test_or_and_not_view_filters_work_on_the_default_store_and_keep_to_the_user(
    condition: str,
) -> None:
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores import FilterCondition

    base = base_over()
    for u in ("ann", "ben"):
        nodes = [
            TextNode(text=f"{u} note {i}", id_=f"{u}-{i}", metadata={"user_id": u, "n": i})
            for i in range(6)
        ]
        base.for_user(u).add_nodes(nodes)
    view = MetadataFilters(
        filters=[MetadataFilter(key="n", value=1), MetadataFilter(key="n", value=4)],
        condition=FilterCondition(condition),
    )
    native = base.index.as_retriever(similarity_top_k=20, filters=view).retrieve("note")
    want = {n.node.get_content() for n in native if n.node.metadata["user_id"] == "ann"}
    got = base.for_user("ann", filters=view, similarity_top_k=20).retrieve("note")
    assert want and {n.node.get_content() for n in got} == want  # SimpleVectorStore cannot nest


@pytest.fixture(params=["simple", "chroma", "pgvector"])
def listed(request: Any) -> PBRRetriever:
    """An empty base over a store pbr lists: a SimpleVectorStore, a collection of its own on
    the shared ``chroma run`` server, or a ``PGVectorStore`` in a fresh PostgreSQL database."""
    if request.param == "simple":
        return base_over()
    if request.param == "pgvector":
        from llama_index.vector_stores.postgres import PGVectorStore

        engine, async_engine = request.getfixturevalue("pgvector_engine")
        store = PGVectorStore(
            engine=engine, async_engine=async_engine, table_name="listed", embed_dim=EMB.dim
        )
        storage = StorageContext.from_defaults(vector_store=store)
        return base_over(VectorStoreIndex([], storage_context=storage, embed_model=EMB))
    from llama_index.vector_stores.chroma import ChromaVectorStore

    server = request.getfixturevalue("shared_chroma")
    collection = server.client().create_collection(f"listed-{uuid.uuid4().hex[:8]}")
    storage = StorageContext.from_defaults(
        vector_store=ChromaVectorStore(chroma_collection=collection)
    )
    return base_over(VectorStoreIndex([], storage_context=storage, embed_model=EMB))


def test_delete_ref_doc_removes_only_the_users_own_document(listed: PBRRetriever) -> None:
    base = listed
    add_docs(base)
    ann, ben = base.for_user("ann", similarity_top_k=10), base.for_user("ben", similarity_top_k=10)
    ann.delete_ref_doc("diary")
    assert ann.retrieve("diary") == []
    assert len(ben.retrieve("diary")) == 2  # ben's "diary" is another document
    with pytest.raises(KeyError, match="diary"):
        ann.delete_ref_doc("diary")


def test_an_ingestion_pipeline_into_the_store_is_every_users_history(shared_chroma: Any) -> None:
    """The usual LlamaIndex ingestion (IngestionPipeline writing to a vector store, then
    VectorStoreIndex.from_vector_store) needs no re-adding: the store is the record."""
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = shared_chroma.client().create_collection(f"ingest-{uuid.uuid4().hex[:8]}")
    store = ChromaVectorStore(chroma_collection=collection)
    pipeline = IngestionPipeline(transformations=[SentenceSplitter(), EMB], vector_store=store)
    # Document ids unique across users: LlamaIndex's own pipeline gives the chunks of documents
    # sharing an id the metadata of one of them (ann's text tagged as ben's; see the docs).
    pipeline.run(
        documents=[d.model_copy(update={"id_": f"{d.id_}-{i}"}) for i, d in enumerate(docs())]
    )
    index = VectorStoreIndex.from_vector_store(store, embed_model=EMB)
    # explain="all": the related history, read off the nodes below, is the user's own
    base = PBRRetriever(index, llm=MockLLM(max_tokens=4), embed_model=EMB, config=EXPLAINED)
    for user in ("ann", "ben"):
        got = base.retrieve("diary page", user_id=user)
        assert {n.node.get_content() for n in got} == {f"{user} diary page {i}" for i in (0, 1)}
        related = got[0].node.metadata["pbr"]["related"]
        assert related and all(h["text"].startswith(user) for h in related)


def test_an_ingestion_pipelines_nodes_can_be_added_through_a_view() -> None:
    """A pipeline without a vector store returns embedded nodes: a view adds them as they are
    (not embedded again) for its user."""
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter

    nodes = IngestionPipeline(transformations=[SentenceSplitter(), EMB]).run(
        documents=[d for d in docs() if d.metadata["user_id"] == "ann"]
    )
    assert all(n.embedding is not None for n in nodes)
    base = base_over()
    base.for_user("ann").add_nodes(nodes)
    got = base.retrieve("diary page", user_id="ann")
    assert {n.node.get_content() for n in got} == {"ann diary page 0", "ann diary page 1"}
    assert base.retrieve("diary page", user_id="ben") == []


def test_refresh_ref_docs_rewrites_only_the_users_changed_documents(listed: PBRRetriever) -> None:
    base = listed
    ann, ben = base.for_user("ann", similarity_top_k=10), base.for_user("ben", similarity_top_k=10)
    for user in (ann, ben):
        assert user.refresh_ref_docs([Document(text="notes v1", id_="notes")]) == [True]
    same, changed, new = (
        Document(text="notes v1", id_="notes"),
        Document(text="notes v2", id_="notes"),
        Document(text="todo", id_="todo"),
    )
    assert ann.refresh_ref_docs([same]) == [False]
    assert ann.refresh_ref_docs([changed, new]) == [True, True]
    assert sorted(n.node.get_content() for n in ann.retrieve("notes todo")) == ["notes v2", "todo"]
    assert [n.node.get_content() for n in ben.retrieve("notes")] == ["notes v1"]  # untouched
    assert ann.refresh_ref_docs([changed, new]) == [False, False]


def test_two_refreshes_of_one_document_at_once_leave_one_copy_of_the_new_version() -> None:
    """The second refresh waits for the first, then finds the document unchanged (before, both
    listed the old nodes, both added a copy, and the second's delete raised KeyError: two copies
    of the new version, which no later refresh removed)."""
    import threading

    embedding, resume = threading.Event(), threading.Event()

    class Pausing(HashEmbedding):
        armed: bool = False

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            if self.armed and any("v2" in t for t in texts):
                self.armed = False
                embedding.set()  # the first refresh listed the old nodes, and now embeds
                resume.wait(10)
            return super()._get_text_embeddings(texts)

    emb = Pausing(dim=32)
    ann = PBRRetriever.from_defaults(nodes=[], llm=MockLLM(max_tokens=4), embed_model=emb)
    ann = ann.for_user("ann", similarity_top_k=10)
    ann.refresh_ref_docs([Document(text="notes v1", id_="notes")])
    emb.armed = True
    got: dict[str, Any] = {}
    v2 = Document(text="notes v2", id_="notes")
    first = threading.Thread(target=lambda: got.setdefault("first", ann.refresh_ref_docs([v2])))
    first.start()
    assert embedding.wait(10)
    second = threading.Thread(target=lambda: got.setdefault("second", ann.refresh_ref_docs([v2])))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # it waits for the first
    resume.set()
    first.join(10)
    second.join(10)
    assert got == {"first": [True], "second": [False]}
    assert [n.node.get_content() for n in ann.retrieve("notes")] == ["notes v2"]


def test_refresh_ref_docs_of_your_own_index_leaves_an_unchanged_document_unread_or_not() -> None:
    """Over an index LlamaIndex wrote itself, a user no request had read yet had every
    unchanged document deleted and embedded again (pbr looked its nodes up by its own keys;
    from a review)."""
    from llamaindex_pbr import tag_nodes

    emb = HashEmbedding(dim=64)
    docs = tag_nodes([Document(text="Day 1: ran 10 km, ate pasta.", id_="diary")], "alice")
    index = VectorStoreIndex.from_documents(docs, embed_model=emb)
    before = set(index.vector_store.data.embedding_dict)
    alice = PBRRetriever(index, llm=MockLLM(max_tokens=8), embed_model=emb).for_user("alice")
    assert alice.refresh_ref_docs(docs) == [False]
    assert set(index.vector_store.data.embedding_dict) == before


def test_refresh_ref_docs_keeps_a_node_whose_deterministic_id_the_new_version_reuses(
    listed: PBRRetriever,
) -> None:
    from llama_index.core.node_parser import SentenceSplitter

    split = SentenceSplitter(id_func=lambda i, doc: f"{doc.doc_id}-{i}")  # ids from the document
    ann = listed.for_user("ann", similarity_top_k=10)
    assert ann.refresh_ref_docs([Document(text="notes v1", id_="notes")], transformations=[split])
    changed = Document(text="notes v2", id_="notes")
    assert ann.refresh_ref_docs([changed], transformations=[split]) == [True]
    got = ann.retrieve("notes")
    assert [(n.node.node_id, n.node.get_content()) for n in got] == [("notes-0", "notes v2")]
    assert ann.refresh_ref_docs([changed], transformations=[split]) == [False]


def test_a_chat_engine_needs_a_view_and_the_error_says_how() -> None:
    from llama_index.core.chat_engine import ContextChatEngine

    base = base_over()
    add_docs(base)
    llm = MockLLM(max_tokens=4)
    with pytest.raises(ValueError, match=r"chat engine needs a view.*for_user\('u1'\)"):
        ContextChatEngine.from_defaults(retriever=base, llm=llm).chat("diary?")
    engine = ContextChatEngine.from_defaults(retriever=base.for_user("ann"), llm=llm)
    reply = engine.chat("diary?")
    assert reply.source_nodes and {n.node.metadata["user_id"] for n in reply.source_nodes} == {
        "ann"
    }


def _diary() -> dict[str, list[str]]:
    return {
        "ann": ["ann runs ten km", "ann bakes bread", "ann eats a banana before a run"],
        "ben": ["ben shoots film", "ben runs a marathon"],
    }


def test_an_index_built_from_tag_nodes_ranks_like_from_defaults_nodes() -> None:
    """#39 point 8: nodes tagged as the quickstart tags them, in your own VectorStoreIndex, are
    embedded without ``user_id: ann`` and rank as ``from_defaults(nodes=...)`` ranks them."""
    from llama_index.core.schema import MetadataMode, TextNode

    from llamaindex_pbr import tag_nodes

    texts = _diary()
    raw = [TextNode(text=t, metadata={"user_id": u}) for u, ts in texts.items() for t in ts]
    tagged = [n for u, ts in texts.items() for n in tag_nodes([TextNode(text=t) for t in ts], u)]
    assert all(n.metadata["user_id"] in texts for n in tagged)
    for node in tagged:  # the user key is in neither the embedder's nor the LLM's text
        assert "user_id" not in node.get_content(metadata_mode=MetadataMode.EMBED)
        assert "user_id" not in node.get_content(metadata_mode=MetadataMode.LLM)

    index = VectorStoreIndex(tagged, embed_model=EMB)
    ours = PBRRetriever.from_defaults(index=index, llm=MockLLM(max_tokens=4), embed_model=EMB)
    theirs = PBRRetriever.from_defaults(nodes=raw, llm=MockLLM(max_tokens=4), embed_model=EMB)
    for user in texts:
        for query in ("who runs before a banana", "film and bread"):
            got = [
                (n.node.get_content(), round(n.score or 0, 6))
                for n in ours.for_user(user).retrieve(query)
            ]
            want = [
                (n.node.get_content(), round(n.score or 0, 6))
                for n in theirs.for_user(user).retrieve(query)
            ]
            assert got and got == want


def test_tag_nodes_refuses_a_node_of_another_user_and_leaves_yours_alone() -> None:
    from llama_index.core.schema import TextNode

    from llamaindex_pbr import tag_nodes

    mine = TextNode(text="x")
    (copy,) = tag_nodes([mine], "ann")
    assert mine.metadata == {} and mine.excluded_embed_metadata_keys == []
    assert copy.metadata == {"user_id": "ann"}
    with pytest.raises(ValueError, match="tagged user_id='ben'"):
        tag_nodes([TextNode(text="y", metadata={"user_id": "ben"})], "ann")
    with pytest.raises(ValueError):
        tag_nodes([mine], "")


def test_tag_nodes_reads_a_none_user_as_no_user_as_from_defaults_does() -> None:
    """The one owner rule (``from_defaults(nodes=...)``, ``from_documents``): a None under the
    key names no user. tag_nodes refused the node as "tagged user_id=None"."""
    from llama_index.core.schema import TextNode

    from llamaindex_pbr import tag_nodes

    (copy,) = tag_nodes([TextNode(text="x", metadata={"user_id": None})], "ann")
    assert copy.metadata == {"user_id": "ann"}


def test_retriever_kwargs_doc_ids_is_refused_at_construction_not_ignored() -> None:
    """#39 point 10: ``doc_ids`` reached SimpleVectorStore, which ignores it, so every document
    came back; it is refused up front with what to do instead."""
    with pytest.raises(ValueError, match=r"doc_ids.*filters="):
        PBRRetriever.from_defaults(
            documents=docs(),
            llm=MockLLM(max_tokens=4),
            embed_model=EMB,
            retriever_kwargs={"doc_ids": ["diary"]},
        )


def test_a_where_in_the_stores_kwargs_is_refused_for_filters() -> None:
    """Chroma refuses a 'where' given beside the metadata filter pbr passes, and the error was
    turned into advice for stores that cannot filter (from a review)."""
    with pytest.raises(ValueError, match=r"may not set 'where'.*filters=MetadataFilters"):
        PBRRetriever.from_defaults(
            documents=docs(),
            llm=MockLLM(max_tokens=4),
            embed_model=EMB,
            retriever_kwargs={"vector_store_kwargs": {"where": {"year": 2024}}},
        )


@pytest.mark.parametrize("key", ["alpha", "sparse_top_k", "hybrid_top_k", "embed_model"])
def test_retriever_kwargs_that_could_never_act_are_refused_at_construction(key: str) -> None:
    """VectorIndexRetriever takes them, but they act only in a store query mode pbr refuses,
    or (embed_model) for a query without a vector, which pbr never sends: accepted, then
    without effect (from a review)."""
    with pytest.raises(ValueError, match=rf"\['{key}'\]: they would have no effect"):
        PBRRetriever.from_defaults(
            documents=docs(),
            llm=MockLLM(max_tokens=4),
            embed_model=EMB,
            retriever_kwargs={key: EMB if key == "embed_model" else 1},
        )


@pytest.mark.parametrize("key", ["similarity_cutoff", "similarty_top_k"])
def test_retriever_kwargs_that_llamaindex_would_ignore_are_refused_at_construction(
    key: str,
) -> None:
    """``VectorIndexRetriever`` drops a key it does not know (a typo, a postprocessor's
    argument): refused up front, as LangChain's ``search_kwargs`` are, naming what it takes
    (before, constructed and silently ignored)."""
    with pytest.raises(ValueError, match=rf"{key}.*vector_store_query_mode"):
        PBRRetriever.from_defaults(
            documents=docs(),
            llm=MockLLM(max_tokens=4),
            embed_model=EMB,
            retriever_kwargs={key: 1},
        )
    taken = PBRRetriever.from_defaults(
        documents=docs(),
        llm=MockLLM(max_tokens=4),
        embed_model=EMB,
        retriever_kwargs={"vector_store_query_mode": "default", "vector_store_kwargs": {}},
    )
    assert taken is not None
