"""The embedded Gemma 3 270M wrapped as a LlamaIndex LLM, end to end (slow: loads the model)."""

from __future__ import annotations

import importlib.util

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TextNode

from llamaindex_pbr import EXPLANATION_KEY, LocalGemmaLLM, PBRRetriever
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import PBRConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None
        or importlib.util.find_spec("transformers") is None,
        reason="the embedded models need the [local] extra (torch, transformers)",
    ),
]

HISTORY = {
    "u1": [
        "I run 10k every Sunday morning along the river",
        "My favourite snack before a run is a banana with peanut butter",
        "Pasta the night before a long run works best for me",
    ],
    "u2": [
        "My sister lives in Lyon and I visit her every summer",
        "I shoot black and white film on a Leica M6",
        "Lyon has the best bouchons",
    ],
}


@pytest.fixture(scope="module")
def gemma() -> LocalGemmaLLM:
    return LocalGemmaLLM(max_new_tokens=12)


async def test_completes_sync_async_and_chat(gemma: LocalGemmaLLM) -> None:
    prompt = "Three things to pack for a rainy hike:\n1."
    text = gemma.complete(prompt).text
    assert isinstance(text, str)
    assert (await gemma.acomplete(prompt)).text == text  # sampling is seeded by the prompt
    reply = await gemma.achat([ChatMessage(role="user", content="Name a fruit.")])
    assert isinstance(reply.message.content, str)
    assert (
        gemma.metadata.model_name.startswith("gemma-3-270m") and gemma.prompt_style == "completion"
    )


def test_stream_complete_streams_the_completion(gemma: LocalGemmaLLM) -> None:
    prompt = "Three things to pack for a rainy hike:\n1."
    chunks = list(gemma.stream_complete(prompt))
    assert "".join(c.delta or "" for c in chunks) == chunks[-1].text == gemma.complete(prompt).text


def test_query_engine_with_the_embedded_llm(gemma: LocalGemmaLLM) -> None:
    nodes = [
        TextNode(text=text, id_=f"{user}-{i}", metadata={"user_id": user})
        for user, texts in HISTORY.items()
        for i, text in enumerate(texts)
    ]
    retriever = PBRRetriever.from_defaults(
        nodes=nodes,
        llm=gemma,
        embed_model=HashEmbedding(dim=64),
        user_id="u1",
        config=PBRConfig(explain="all"),  # the source node carries the explanation read below
    )
    engine = RetrieverQueryEngine.from_args(retriever, llm=gemma)
    response = engine.query("what should I eat before my run?")
    assert isinstance(response.response, str)
    assert response.source_nodes
    assert {n.node.metadata["user_id"] for n in response.source_nodes} == {"u1"}
    explanation = response.source_nodes[0].node.metadata[EXPLANATION_KEY]
    # Gemma's short answers may or may not parse; either way the request is explained.
    assert "query" in explanation["used"]
    for term in ("utterances", "reasoning"):
        assert term in explanation["used"] or term in explanation["dropped"]
