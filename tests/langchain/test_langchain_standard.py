"""LangChain's own conformance suite for retrievers, on both search paths of PBRRetriever."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import FakeListChatModel
from langchain_core.runnables import ConfigurableField
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_pbr import PBRRetriever

EMB = DeterministicFakeEmbedding(size=32)
HISTORY = {
    "alice": [
        "Booked a table at the vegan bistro for Friday.",
        "Ran 18 km along the canal, new personal best.",
        "My cat Miso needs her vaccine next week.",
        "Reading a book about Japanese home cooking.",
    ],
    "bob": ["Fixed the garage door.", "Bought winter tyres.", "Watched the derby."],
}
ANSWER = json.dumps({"candidates": ["something vegan near the canal", "a quick dinner"]})


def _retriever(store: InMemoryVectorStore | None) -> PBRRetriever:
    docs = [
        Document(page_content=text, metadata={"user_id": user})
        for user, texts in HISTORY.items()
        for text in texts
    ]
    return PBRRetriever.from_documents(docs, embeddings=EMB, vectorstore=store)


class TestPBRRetrieverOverHistory(RetrieversIntegrationTests):
    """The final search runs in pbr_core's per-user index."""

    @property
    def retriever_constructor(self) -> type[PBRRetriever]:
        return PBRRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {
            "llm": FakeListChatModel(responses=[ANSWER]),
            "embeddings": EMB,
            "history": _retriever(None).history,
            "user_id": "alice",
        }

    @property
    def retriever_query_example(self) -> str:
        return "where should I eat on Friday?"


class TestPBRRetrieverOverVectorStore(TestPBRRetrieverOverHistory):
    """The final search runs in a host ``InMemoryVectorStore`` filtered to the user."""

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        retriever = _retriever(InMemoryVectorStore(EMB))
        return {
            **super().retriever_constructor_params,
            "history": retriever.history,
            "vectorstore": retriever.vectorstore,
        }


def _per_request(**params: Any) -> Any:
    """A retriever with no user of its own, the user given per request in run metadata (the way
    that reaches it inside compositions) or as a configurable field."""
    user = params.pop("user_id")
    configurable = params.pop("_configurable", False)
    retriever = PBRRetriever(**params)
    assert retriever.user_id is None
    if configurable:
        per_user = retriever.configurable_fields(user_id=ConfigurableField(id="user_id"))
        return per_user.with_config(configurable={"user_id": user})
    return retriever.with_config(metadata={"user_id": user})


class TestPBRRetrieverWithTheUserInRunMetadata(TestPBRRetrieverOverVectorStore):
    """The suite again, the user coming with each request (``config={"metadata": ...}``)."""

    @property
    def retriever_constructor(self) -> Any:
        return _per_request


class TestPBRRetrieverWithAConfigurableUser(TestPBRRetrieverOverVectorStore):
    """The suite again, the user a configurable field set per request."""

    @property
    def retriever_constructor(self) -> Any:
        return lambda **params: _per_request(**params, _configurable=True)
