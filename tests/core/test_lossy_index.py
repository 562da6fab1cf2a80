"""A vector store whose approximate index loses live records still answers like an exact one.

Chroma's HNSW can leave live records unreachable by ``query()`` after deletes and upserts while
``get()`` still returns them (chroma-core/chroma#7758; seen here as a lost item in the two-worker
test). pbr lists every user's records before a query and holds their vectors, so when the search
is restricted by owner alone it ranks all of the user's items itself, exactly, and the store's
index is not asked. The stores below are the real framework stores with their search told to
drop some records: they isolate that behaviour, which is what is under test.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryResult
from pydantic import PrivateAttr

import langchain_pbr
import llamaindex_pbr
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import PBRConfig
from pbr_core.corpus import scoped_key

EMB = DeterministicFakeEmbedding(size=32)
TEXTS = [
    f"alice note {i} about {topic}"
    for i, topic in enumerate(["tea", "jazz", "rain", "maps", "code"])
]


class LossyStore(InMemoryVectorStore):
    """InMemoryVectorStore whose search never returns the records in ``unreachable``."""

    def __init__(self, embedding: Any) -> None:
        super().__init__(embedding)
        self.unreachable: set[str] = set()

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        found = super().similarity_search_with_score_by_vector(
            embedding, k=len(self.store), **kwargs
        )
        return [(d, s) for d, s in found if d.id not in self.unreachable][:k]


def langchain_pair(**kwargs: Any) -> tuple[langchain_pbr.PBRRetriever, langchain_pbr.PBRRetriever]:
    """The same corpus behind an exact store and behind one that lost item 'n1' and 'n3'."""
    out = []
    for store in (InMemoryVectorStore(EMB), LossyStore(EMB)):
        r = langchain_pbr.PBRRetriever(
            llm=FakeListLLM(responses=['["tea"]', "likes tea"]),
            embeddings=EMB,
            vectorstore=store,
            config=PBRConfig(explain="all"),  # the tests compare scores and explanations
            **kwargs,
        )
        r.add_documents(
            [Document(page_content=t) for t in TEXTS],
            user_id="alice",
            ids=[f"n{i}" for i in range(len(TEXTS))],
        )
        r.add_documents([Document(page_content="bob secret")], user_id="bob", ids=["n1"])
        if isinstance(store, LossyStore):
            store.unreachable = {scoped_key("alice", "n1"), scoped_key("alice", "n3")}
        out.append(r)
    return out[0], out[1]


def summary(docs: list[Document]) -> list[tuple[str | None, str, float]]:
    return [(d.id, d.page_content, round(d.metadata["score"], 6)) for d in docs]


@pytest.mark.parametrize("k", [2, 5, 10])
def test_langchain_results_equal_an_exact_stores_when_the_index_loses_records(k: int) -> None:
    exact, lossy = langchain_pair()
    for query in ("tea", "maps and code", "what do I like"):
        want = summary(exact.invoke(query, user_id="alice", k=k))
        assert summary(lossy.invoke(query, user_id="alice", k=k)) == want
        assert len(want) == min(k, len(TEXTS))


async def test_langchain_async_path_completes_too() -> None:
    exact, lossy = langchain_pair()
    want = summary(await exact.ainvoke("jazz", user_id="alice", k=5))
    assert summary(await lossy.ainvoke("jazz", user_id="alice", k=5)) == want


def test_without_a_view_filter_the_lossy_index_is_not_even_asked() -> None:
    _, lossy = langchain_pair()
    docs = lossy.invoke("tea", user_id="alice", k=5)
    assert {d.id for d in docs} == {"n0", "n1", "n2", "n3", "n4"}
    assert all(d.metadata["store_score"] is None for d in docs)  # pbr ranked; no store search
    assert all(d.page_content.startswith("alice") for d in docs)  # bob's n1 stays bob's


def test_with_a_view_filter_the_store_lists_the_view_and_its_lossy_index_is_not_asked() -> None:
    """An InMemoryVectorStore lists a filtered view exactly (its filter is a callable on
    Document): pbr ranks all of it, so what the lossy index would miss is found (before, the
    store's search answered, and the records it lost were lost)."""
    _, lossy = langchain_pair(search_kwargs={"filter": lambda doc: "maps" not in doc.page_content})
    docs = lossy.invoke("tea", user_id="alice", k=5)
    assert {d.id for d in docs} == {"n0", "n1", "n2", "n4"}
    assert all(d.page_content.startswith("alice") for d in docs)


def test_a_deleted_item_is_not_filled_back() -> None:
    _, lossy = langchain_pair()
    lossy.delete(["n1"], user_id="alice")
    got = {d.id for d in lossy.invoke("tea", user_id="alice", k=5)}
    assert got == {"n0", "n2", "n3", "n4"}


# -- LlamaIndex ----------------------------------------------------------------------------------
class LossySimpleStore(SimpleVectorStore):
    """SimpleVectorStore whose query never returns the nodes in ``unreachable``."""

    _unreachable: set[str] = PrivateAttr(default_factory=set)

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        wanted = query.similarity_top_k
        query.similarity_top_k = len(self.data.embedding_dict)
        got = super().query(query, **kwargs)
        query.similarity_top_k = wanted
        keep = [i for i, key in enumerate(got.ids or []) if key not in self._unreachable][:wanted]
        return VectorStoreQueryResult(
            ids=[(got.ids or [])[i] for i in keep],
            similarities=[(got.similarities or [])[i] for i in keep],
            nodes=[got.nodes[i] for i in keep] if got.nodes else None,
        )


def llamaindex_retriever(store: SimpleVectorStore, **kwargs: Any) -> Any:
    emb = HashEmbedding(dim=32)
    index = VectorStoreIndex(
        [], storage_context=StorageContext.from_defaults(vector_store=store), embed_model=emb
    )
    base = llamaindex_pbr.PBRRetriever(index, llm=MockLLM(max_tokens=8), embed_model=emb)
    source = RelatedNodeInfo(node_id="diary-2026")
    alice = base.for_user("alice", **kwargs)
    alice.add_nodes(
        [
            TextNode(text=t, id_=f"n{i}", relationships={NodeRelationship.SOURCE: source})
            for i, t in enumerate(TEXTS)
        ]
    )
    base.for_user("bob").add_nodes([TextNode(text="bob secret", id_="n1")])
    return alice


def node_summary(nodes: list[Any]) -> list[tuple[str, str, float]]:
    return [(n.node.node_id, n.node.get_content(), round(n.score, 6)) for n in nodes]


@pytest.mark.parametrize("k", [2, 5])
def test_llamaindex_results_equal_an_exact_stores_when_the_index_loses_records(k: int) -> None:
    exact = llamaindex_retriever(SimpleVectorStore(), similarity_top_k=k)
    store = LossySimpleStore()
    lossy = llamaindex_retriever(store, similarity_top_k=k)
    store._unreachable = {scoped_key("alice", "n1"), scoped_key("alice", "n3")}
    for query in ("tea", "maps and code"):
        want = exact.retrieve(query)
        got = lossy.retrieve(query)
        assert node_summary(got) == node_summary(want)
        assert len(got) == min(k, len(TEXTS))
        for node in got:  # a filled node is the stored node: source document, user's id
            assert node.node.ref_doc_id == "diary-2026"
            assert node.node.metadata["user_id"] == "alice"


def test_chroma_nodes_are_read_back_by_key_for_their_owner_only(shared_chroma: Any) -> None:
    from llama_index.vector_stores.chroma import ChromaVectorStore

    col = shared_chroma.client().get_or_create_collection(
        "lossy-nodes", embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
    )
    alice = llamaindex_retriever(ChromaVectorStore(chroma_collection=col))
    host = alice._shared.corpus.host
    keys = [scoped_key("alice", "n1"), scoped_key("bob", "n1")]
    nodes = host.nodes("alice", keys)
    assert list(nodes) == [scoped_key("alice", "n1")]
    node = nodes[keys[0]]
    assert node.get_content() == TEXTS[1] and node.ref_doc_id == "diary-2026"
    assert host.nodes("bob", keys[:1]) == {}
