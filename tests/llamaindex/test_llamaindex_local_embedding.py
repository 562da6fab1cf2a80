"""The embedded all-MiniLM-L6-v2 as a LlamaIndex embedding model (slow: loads the model)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from llama_index.core.llms.mock import MockLLM
from llama_index.core.schema import TextNode

from llamaindex_pbr import LocalMiniLMEmbedding, PBRRetriever

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("sentence_transformers") is None,
        reason="the embedded models need the [local] extra (sentence-transformers)",
    ),
]


async def test_retrieves_by_meaning_with_the_real_embedder() -> None:
    embed_model = LocalMiniLMEmbedding()
    vector = embed_model.get_query_embedding("long run")
    assert len(vector) == 384 and np.isclose(np.linalg.norm(vector), 1.0, atol=1e-4)
    assert np.allclose(await embed_model.aget_query_embedding("long run"), vector, atol=1e-5)
    texts = {
        "u1": [
            "My favourite snack before a run is a banana with peanut butter",
            "I repaired the bathroom tiles last weekend",
            "My cat sleeps on the printer",
        ],
        "u2": ["I eat porridge before every race", "I sing in a choir"],
    }
    nodes = [
        TextNode(text=t, id_=f"{u}-{i}", metadata={"user_id": u})
        for u, ts in texts.items()
        for i, t in enumerate(ts)
    ]
    retriever = PBRRetriever.from_defaults(
        nodes=nodes, llm=MockLLM(max_tokens=8), embed_model=embed_model, similarity_top_k=1
    )
    (top,) = retriever.for_user("u1").retrieve("what should I eat before my run?")
    assert top.node.node_id == "u1-0"
    (top,) = await retriever.for_user("u2").aretrieve("what should I eat before my run?")
    assert top.node.node_id == "u2-0"
