"""The re-rank stage is a config flag: both adapters run it without code of their own.

``PBRConfig(rerank="salience")`` reaches the core request through the config every adapter
already passes; with no scorer named, the stage loads the embedded one
(``pbr_core.salience.default_scorer``), replaced here by a fake LM so the test isolates the
wiring (the stage itself: tests/core/test_rerank.py).
"""

from __future__ import annotations

import pytest
from doubles import SecretScorer

from pbr_core import PBRConfig

NOTES = [f"note {i} about the garden" for i in range(7)] + ["the secret code is 4321"]
QUERY = "a note about the garden"
CONFIG = PBRConfig(fusion="plain", rerank="salience", rerank_candidates=8, explain="scores")


@pytest.fixture
def fake_default_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    import pbr_core.salience

    monkeypatch.setattr(pbr_core.salience, "default_scorer", SecretScorer)


def test_langchain_retriever_reranks_with_the_config_flag(fake_default_scorer: None) -> None:
    from doubles import BagOfWords
    from langchain_core.documents import Document
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_pbr import PBRRetriever

    emb = BagOfWords()
    r = PBRRetriever(
        llm=FakeListLLM(responses=["x"]),
        embeddings=emb,
        vectorstore=InMemoryVectorStore(emb),
        config=CONFIG,
        search_kwargs={"k": 2},
    )
    r.add_documents([Document(page_content=t) for t in NOTES], user_id="ann")
    plain = r.model_copy(update={"config": CONFIG.with_(rerank="none")})
    assert NOTES[-1] not in [d.page_content for d in plain.invoke(QUERY, user_id="ann")]
    got = r.invoke(QUERY, user_id="ann")
    assert got[0].page_content == NOTES[-1] and len(got) == 2
    assert got[0].metadata["pbr_search"]["salience"] == pytest.approx(5.0)


def test_llamaindex_retriever_reranks_with_the_config_flag(fake_default_scorer: None) -> None:
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import TextNode

    from llamaindex_pbr import PBRRetriever
    from llamaindex_pbr.testing import HashEmbedding

    def retriever(config: PBRConfig) -> PBRRetriever:
        return PBRRetriever.from_defaults(
            nodes=[TextNode(text=t, metadata={"user_id": "ann"}) for t in NOTES],
            llm=MockLLM(max_tokens=4),
            embed_model=HashEmbedding(dim=256),
            similarity_top_k=2,
            config=config,
        ).for_user("ann")

    plain = retriever(CONFIG.with_(rerank="none")).retrieve(QUERY)
    assert NOTES[-1] not in [n.node.get_content() for n in plain]
    got = retriever(CONFIG).retrieve(QUERY)
    assert got[0].node.get_content() == NOTES[-1] and len(got) == 2
    assert (got[0].score or 0.0) >= (got[1].score or 0.0)
