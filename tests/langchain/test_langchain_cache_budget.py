"""pbr's per-user cache under a byte budget, through LangChain's and LangGraph's real stores:
evicted users are read back from the store, and every ranking equals an unbudgeted one's."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import FakeListChatModel
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_pbr import PBRRetriever
from pbr_core import HistoryStore, PBRConfig

EMB = DeterministicFakeEmbedding(size=64)
ANSWER = json.dumps({"candidates": ["something vegetarian and quick", "no peanuts for Ana"]})
TOPICS = ["curry", "marathon", "cello", "ramen", "camera", "peanuts", "garden", "chess"]
USERS = [f"user{u}" for u in range(6)]
# The paper's fusion: hash vectors are nearly orthogonal to the query, so "safe" would drop
# every term and the test would compare plain searches only.
CONFIG = PBRConfig(fusion="paper", explain="scores")
ANCHOR_ONLY = PBRConfig(fusion="no_prf")  # the memory store has no LLM here


def documents() -> list[Document]:
    return [
        Document(
            page_content=f"{user} wrote about {topic} and {TOPICS[(i * 3 + u) % 8]} (note {i})",
            metadata={"user_id": user, "n": i},
        )
        for u, user in enumerate(USERS)
        for i, topic in enumerate(TOPICS)
    ]


def retriever(store: Any, history: HistoryStore, embeddings: Any = EMB) -> PBRRetriever:
    return PBRRetriever(
        llm=FakeListChatModel(responses=[ANSWER]),
        embeddings=embeddings,
        vectorstore=store,
        history=history,
        k=4,
        config=CONFIG,
    )


def ranked(r: PBRRetriever, query: str, user: str) -> list[tuple[str, float]]:
    return [(d.page_content, round(d.metadata["score"], 6)) for d in r.invoke(query, user_id=user)]


def test_retriever_rankings_with_a_budget_equal_an_unbudgeted_ones() -> None:
    store = InMemoryVectorStore(EMB)
    small = retriever(store, HistoryStore(max_cache_bytes=0))
    for user in USERS:
        small.add_documents([d for d in documents() if d.metadata["user_id"] == user], user_id=user)
    big = retriever(store, HistoryStore(max_cache_bytes=10**12))  # wraps the filled store
    for query in ("what should I cook tonight?", "a hobby for the weekend"):
        for user in USERS:
            assert ranked(small, query, user) == ranked(big, query, user)
            assert small.history.users() == [user]  # only the user being served is held
    assert small.history.evictions >= 2 * len(USERS) - 1
    assert big.history.evictions == 0


def test_langgraph_store_rankings_with_a_budget_equal_an_unbudgeted_ones() -> None:
    pytest.importorskip("langgraph")
    from doubles import BagOfWords
    from langgraph.store.memory import InMemoryStore

    from langchain_pbr import PBRStore

    inner = InMemoryStore()
    small = PBRStore(inner, BagOfWords(), config=ANCHOR_ONLY, max_cache_bytes=0)
    big = PBRStore(inner, BagOfWords(), config=ANCHOR_ONLY)
    for doc in documents():
        small.put(
            ("memories", doc.metadata["user_id"]),
            f"m{doc.metadata['n']}",
            {"content": doc.page_content},
        )
    for query in ("curry and chess", "a camera for the marathon"):
        for user in USERS:
            got = small.search(("memories", user), query=query, limit=4)
            want = big.search(("memories", user), query=query, limit=4)
            assert [(i.key, round(i.score or 0, 6)) for i in got] == [
                (i.key, round(i.score or 0, 6)) for i in want
            ]
    assert small.corpus.cache.evictions >= 2 * len(USERS) - 1
    assert len(small.corpus.cache) == 1


class CountingEmbedding(DeterministicFakeEmbedding):
    """DeterministicFakeEmbedding that counts the documents it embeds."""

    documents_embedded: int = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.documents_embedded += len(texts)
        return super().embed_documents(texts)


def test_over_a_chroma_server_evicted_users_are_read_back_with_chromas_vectors(
    shared_chroma: Any,
) -> None:
    pytest.importorskip("langchain_chroma")
    from langchain_chroma import Chroma

    emb = CountingEmbedding(size=64)
    store = Chroma(
        client=shared_chroma.client(),
        collection_name=f"budget-{uuid.uuid4().hex[:8]}",
        embedding_function=emb,
        collection_configuration={"hnsw": {"space": "cosine"}},
    )

    def make(history: HistoryStore, embeddings: CountingEmbedding) -> PBRRetriever:
        return retriever(store, history, embeddings)

    counted = [CountingEmbedding(size=64), CountingEmbedding(size=64)]
    small = make(HistoryStore(max_cache_bytes=0), counted[0])
    for user in USERS:
        docs = [d for d in documents() if d.metadata["user_id"] == user]
        small.add_documents(docs, user_id=user)
    big = make(HistoryStore(max_cache_bytes=10**12), counted[1])
    for user in USERS:  # the unbudgeted worker reads every user in once
        ranked(big, "warm up", user)
    before = [e.documents_embedded for e in counted]
    for query in ("what should I cook tonight?", "a hobby for the weekend"):
        for user in USERS:
            assert ranked(small, query, user) == ranked(big, query, user)
    # Both embed the same feedback texts; the budgeted one re-reads its users with Chroma's
    # vectors, embedding none of their items again.
    after = [e.documents_embedded for e in counted]
    assert after[0] - before[0] == after[1] - before[1] > 0
    assert small.history.evictions >= 2 * len(USERS) - 1
