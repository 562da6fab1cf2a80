"""pbr's per-user cache under a byte budget, through LlamaIndex: a retriever over an index that
lists reads evicted users back; the memory block, whose history is the only record, refuses an
explicit budget."""

from __future__ import annotations

import pytest
from llama_index.core.llms.mock import MockLLM
from llama_index.core.schema import TextNode

from llamaindex_pbr import PBRMemoryBlock, PBRRetriever
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import HistoryStore, PBRConfig

USERS = [f"u{u}" for u in range(5)]
TOPICS = ["run", "banana", "marathon", "knee", "pasta", "lyon", "camera", "film"]


def nodes() -> list[TextNode]:
    return [
        TextNode(
            text=f"{user}: {topic} and {TOPICS[(i + u * 3) % 8]} ({i})",
            id_=f"{user}-{i}",
            metadata={"user_id": user},
        )
        for u, user in enumerate(USERS)
        for i, topic in enumerate(TOPICS)
    ]


def test_retriever_rankings_with_a_budget_equal_an_unbudgeted_ones() -> None:
    def make(budget: int) -> PBRRetriever:
        return PBRRetriever.from_defaults(
            nodes=nodes(),
            llm=MockLLM(),
            embed_model=HashEmbedding(dim=64),
            similarity_top_k=3,
            config=PBRConfig(fusion="paper"),
            history=HistoryStore(max_cache_bytes=budget),
        )

    small, big = make(0), make(10**12)
    for user in USERS:
        got = small.for_user(user).retrieve("what should I eat before my run?")
        want = big.for_user(user).retrieve("what should I eat before my run?")
        assert [(n.node.node_id, round(n.score or 0, 6)) for n in got] == [
            (n.node.node_id, round(n.score or 0, 6)) for n in want
        ]
    assert small._shared.corpus.cache.evictions >= len(USERS) - 1


def test_the_memory_block_refuses_an_explicit_budget() -> None:
    with pytest.raises(ValueError, match="cannot be read back"):
        PBRMemoryBlock(
            user_id="u1", embed_model=HashEmbedding(dim=64), store=HistoryStore(max_cache_bytes=1)
        )
