"""The re-rank stage is a config flag: both adapters run it without code of their own.

``PBRConfig(rerank="salience")`` reaches the core request through the config every adapter
already passes; with no scorer named, the stage loads the embedded one
(``pbr_core.salience.default_scorer``), replaced here by a fake LM so the test isolates the
wiring (the stage itself: tests/core/test_rerank.py).
"""

from __future__ import annotations

import pytest
from doubles import SecretScorer, langchain_notes_retriever, llamaindex_notes_retriever

from pbr_core import PBRConfig

NOTES = [f"note {i} about the garden" for i in range(7)] + ["the secret code is 4321"]
QUERY = "a note about the garden"
CONFIG = PBRConfig(fusion="plain", rerank="salience", rerank_candidates=8, explain="scores")


@pytest.fixture
def fake_default_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    import pbr_core.salience

    monkeypatch.setattr(pbr_core.salience, "default_scorer", SecretScorer)


def test_langchain_retriever_reranks_with_the_config_flag(fake_default_scorer: None) -> None:
    r = langchain_notes_retriever(NOTES, CONFIG, {"k": 2})
    plain = r.model_copy(update={"config": CONFIG.with_(rerank="none")})
    assert NOTES[-1] not in [d.page_content for d in plain.invoke(QUERY, user_id="ann")]
    got = r.invoke(QUERY, user_id="ann")
    assert got[0].page_content == NOTES[-1] and len(got) == 2
    assert got[0].metadata["pbr_search"]["salience"] == pytest.approx(5.0)


def test_llamaindex_retriever_reranks_with_the_config_flag(fake_default_scorer: None) -> None:
    plain = llamaindex_notes_retriever(NOTES, CONFIG.with_(rerank="none"), 2).retrieve(QUERY)
    assert NOTES[-1] not in [n.node.get_content() for n in plain]
    got = llamaindex_notes_retriever(NOTES, CONFIG, 2).retrieve(QUERY)
    assert got[0].node.get_content() == NOTES[-1] and len(got) == 2
    assert (got[0].score or 0.0) >= (got[1].score or 0.0)
