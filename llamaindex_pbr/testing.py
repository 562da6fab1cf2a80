"""Deterministic test doubles for code that uses :class:`~llamaindex_pbr.PBRRetriever`.

LlamaIndex's ``MockEmbedding`` returns one constant vector, so every node ties and no ranking
can be tested. :class:`HashEmbedding` is a bag of hashed words: texts that share words get close
vectors, the same text always gets the same vector, and nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import Field

__all__ = ["HashEmbedding"]

_WORD = re.compile(r"\w+", re.UNICODE)


def _unit(seed_text: str, dim: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(seed_text.encode("utf-8")).digest()[:8], "little")
    vector = np.random.default_rng(seed).normal(size=dim)
    return vector / np.linalg.norm(vector)


class HashEmbedding(BaseEmbedding):
    """A bag-of-words embedding from sha256-seeded word vectors (unit norm, ``dim`` floats).

    Instantiate:
        .. code-block:: python

            from llamaindex_pbr.testing import HashEmbedding

            embed_model = HashEmbedding(dim=64)
            embed_model.get_query_embedding("long run on Sunday")   # 64 floats, unit norm
    """

    dim: int = Field(default=64, ge=2)
    model_name: str = Field(default="hash-bag-of-words")

    @classmethod
    def class_name(cls) -> str:
        return "HashEmbedding"

    def embed(self, text: str) -> list[float]:
        """Sum of the words' vectors plus a little of the whole text's own vector."""
        words = _WORD.findall(text.lower())
        vector = 0.1 * _unit(text, self.dim)
        for word in words:
            vector = vector + _unit(word, self.dim)
        return [float(x) for x in vector / np.linalg.norm(vector)]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self.embed(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self.embed(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self.embed(query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return self.embed(text)
