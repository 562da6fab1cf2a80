"""Test doubles that tests in more than one folder share (fakes isolate a unit, nothing more).

``tests/`` is on ``sys.path`` for every test (pytest's rootdir conftest), so ``from doubles import
...`` works from any folder; a test never imports another test module across folders.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings

from pbr_core import PBRConfig
from pbr_core.corpus import ITEM_ID_KEY, Record
from pbr_core.salience import TokenLogProbs

DIM = 256


class BagOfWords(Embeddings):
    """A deterministic bag-of-words embedder (hashed words); counts what it embeds."""

    def __init__(self) -> None:
        self.documents = 0
        self.queries = 0

    @staticmethod
    def vector(text: str) -> list[float]:
        v = np.zeros(DIM, dtype=np.float64)
        for word in re.findall(r"\w+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
            v[h % DIM] += 1.0
        v[0] += 0.01  # no zero vector
        return list(v / np.linalg.norm(v))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.documents += len(texts)
        return [self.vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        self.queries += 1
        return self.vector(text)


class SecretScorer:
    """log p(target | context) = −20, +5 when the context holds "secret"; counts its calls."""

    model_id = "test/secret"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def logprobs(
        self,
        contexts: Sequence[str],
        targets: Sequence[str],
        conditions: Sequence[str] | None = None,
    ) -> list[TokenLogProbs]:
        self.calls.append(list(contexts))
        return [TokenLogProbs(-20.0 + 5.0 * ("secret" in c), 4) for c in contexts]


def langchain_notes_retriever(
    notes: Sequence[str], config: PBRConfig, search_kwargs: dict[str, Any], user_id: str = "ann"
) -> Any:
    """A real LangChain ``PBRRetriever`` holding ``notes`` for ``user_id``: an in-memory vector
    store, :class:`BagOfWords` embeddings and a fake LLM (the config decides if it is called)."""
    from langchain_core.documents import Document
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_pbr import PBRRetriever

    emb = BagOfWords()
    retriever = PBRRetriever(
        llm=FakeListLLM(responses=["x"]),
        embeddings=emb,
        vectorstore=InMemoryVectorStore(emb),
        config=config,
        search_kwargs=search_kwargs,
    )
    retriever.add_documents([Document(page_content=t) for t in notes], user_id=user_id)
    return retriever


def llamaindex_notes_retriever(
    notes: Sequence[str], config: PBRConfig, top_k: int, user_id: str = "ann"
) -> Any:
    """A real LlamaIndex ``PBRRetriever`` over ``notes`` of ``user_id``, bound to that user:
    hashed embeddings and a mock LLM (the config decides if it is called)."""
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import TextNode

    from llamaindex_pbr import PBRRetriever
    from llamaindex_pbr.testing import HashEmbedding

    return PBRRetriever.from_defaults(
        nodes=[TextNode(text=t, metadata={"user_id": user_id}) for t in notes],
        llm=MockLLM(max_tokens=4),
        embed_model=HashEmbedding(dim=256),
        similarity_top_k=top_k,
        config=config,
    ).for_user(user_id)


class ListingHost:
    """A host store that lists its records and returns their vectors (a dict): a
    :class:`~pbr_core.corpus.HostRecords` for tests of the corpus itself."""

    can_list = True

    def __init__(self) -> None:
        self.rows: dict[str, Record] = {}
        self.listed: list[str] = []

    def validate(self, records: Sequence[Record]) -> None:
        return None

    def upsert(self, records: Sequence[Record]) -> None:
        for r in records:  # held as a store holds it: pbr's id key is read back, not kept
            meta = {k: v for k, v in r.metadata.items() if k != ITEM_ID_KEY}
            self.rows[r.key] = dataclasses.replace(r, metadata=meta, extra=None)

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        for key in keys:
            self.rows.pop(key, None)

    def list_user(self, user_id: str) -> list[Record]:
        self.listed.append(user_id)
        return [r for r in self.rows.values() if r.user_id == user_id]

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        return [self.rows[k] for k in keys if k in self.rows]


class SilentHost(ListingHost):
    """A host store that cannot list: pbr's history is the only record."""

    can_list = False
