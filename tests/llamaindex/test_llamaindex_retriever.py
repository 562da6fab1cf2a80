"""llamaindex_pbr.PBRRetriever: a LlamaIndex retriever, then its behaviour as a specification."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager, CBEventType
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.retrieval import RetrievalEndEvent
from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler
from llama_index.core.llms import (
    ChatMessage,
    CompletionResponse,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.mock import MockLLM
from llama_index.core.postprocessor import PrevNextNodePostprocessor
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import (
    Document,
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    TextNode,
)
from llama_index.core.vector_stores import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    VectorStoreQuery,
    VectorStoreQueryResult,
)
from pydantic import Field, PrivateAttr

from llamaindex_pbr import (
    EXPLANATION_KEY,
    LocalGemmaLLM,
    LocalMiniLMEmbedding,
    PBRDegradedEvent,
    PBREvent,
    PBRRetriever,
)
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import (
    EmbeddingError,
    GenerationError,
    PBRConfig,
    PersistenceError,
    UnknownUserError,
)
from pbr_core.corpus import scoped_key

HISTORY = {
    "u1": [
        ("I run 10k every Sunday morning along the river", "sport"),
        ("My favourite snack before a run is a banana with peanut butter", "food"),
        ("I am training for the Paris marathon in April", "sport"),
        ("Pasta the night before a long run works best for me", "food"),
        ("My knee hurts after hill repeats", "health"),
    ],
    "u2": [
        ("My sister lives in Lyon and I visit her every summer", "family"),
        ("I collect vintage film cameras", "hobby"),
        ("I shoot black and white film on a Leica M6", "hobby"),
        ("Lyon has the best bouchons, I eat there before every run", "food"),
    ],
    "u3": [("I only ever eat bananas before a run", "food")],
}
QUERY = "what should I eat before my run?"


def _nodes() -> list[TextNode]:
    return [
        TextNode(text=text, id_=f"{user}-{i}", metadata={"user_id": user, "topic": topic})
        for user, items in HISTORY.items()
        for i, (text, topic) in enumerate(items)
    ]


def _owner(nws: NodeWithScore) -> str:
    return nws.node.node_id.split("-")[0]


#: The paper's fusion: these tests check every term's plumbing; hash vectors are nearly orthogonal
#: to the query, so the default "safe" fusion would (rightly) drop them all.
# explain="all": these tests read the explanation off the nodes (by default: events only)
PAPER = PBRConfig(fusion="paper", explain="all")


@pytest.fixture
def embed_model() -> HashEmbedding:
    return HashEmbedding(dim=64)


@pytest.fixture
def base(embed_model: HashEmbedding) -> PBRRetriever:
    """A base retriever (no user) over every user's nodes, echoing MockLLM."""
    return PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=MockLLM(),
        embed_model=embed_model,
        similarity_top_k=3,
        config=PAPER,
    )


class FilterlessStore(SimpleVectorStore):
    """Behaves like FaissVectorStore: refuses metadata filters instead of applying them."""

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        if query.filters is not None:
            raise ValueError("Metadata filters not implemented for Faiss yet.")
        return super().query(query, **kwargs)


class ScriptedLLM(CustomLLM):
    """Answers every prompt with ``text``, or raises ``error``; counts sync and async calls."""

    text: str = "1. a banana\n2. oats with honey\n3. toast"
    error: str | None = None
    _calls: list[str] = PrivateAttr(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=False, model_name="scripted")

    def _answer(self, kind: str) -> CompletionResponse:
        self._calls.append(kind)
        if self.error is not None:
            raise RuntimeError(self.error)
        return CompletionResponse(text=self.text)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._answer("sync")

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        return self._answer("async")

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        raise NotImplementedError


class RendezvousLLM(ScriptedLLM):
    """Both P-PRF calls must be in flight at once, or neither returns (a failed call)."""

    _barrier: threading.Barrier = PrivateAttr(
        default_factory=lambda: threading.Barrier(2, timeout=10)
    )
    _arrived: int = PrivateAttr(default=0)
    _both: asyncio.Event | None = PrivateAttr(default=None)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._barrier.wait()
        return self._answer("sync")

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        if self._both is None:
            self._both = asyncio.Event()
        self._arrived += 1
        if self._arrived == 2:
            self._both.set()
        await asyncio.wait_for(self._both.wait(), timeout=10)
        return self._answer("async")


class AsyncOnlyEmbedding(HashEmbedding):
    """Raises on sync calls once ``forbid_sync()`` is called (after the index is built)."""

    _forbidden: bool = PrivateAttr(default=False)

    def forbid_sync(self) -> None:
        self._forbidden = True

    def embed(self, text: str) -> list[float]:
        return super().embed(text)

    def _get_query_embedding(self, query: str) -> list[float]:
        assert not self._forbidden, "sync embedding called on the async path"
        return self.embed(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        assert not self._forbidden, "sync embedding called on the async path"
        return self.embed(text)


class Recorder(BaseCallbackHandler):
    """Legacy callback handler that records (event type, event id, parent id)."""

    def __init__(self) -> None:
        super().__init__(event_starts_to_ignore=[], event_ends_to_ignore=[])
        self.starts: list[tuple[CBEventType, str, str]] = []

    def on_event_start(
        self,
        event_type: CBEventType,
        payload: dict[str, Any] | None = None,
        event_id: str = "",
        parent_id: str = "",
        **kwargs: Any,
    ) -> str:
        self.starts.append((event_type, event_id, parent_id))
        return event_id

    def on_event_end(
        self, event_type: CBEventType, payload: Any = None, event_id: str = "", **kwargs: Any
    ) -> None:
        pass

    def start_trace(self, trace_id: str | None = None) -> None:
        pass

    def end_trace(self, trace_id: str | None = None, trace_map: Any = None) -> None:
        pass


class EventCollector(BaseEventHandler):
    events: list[BaseEvent] = Field(default_factory=list)

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)


@pytest.fixture
def instrumented() -> Iterator[tuple[SimpleSpanHandler, EventCollector]]:
    root = get_dispatcher()
    spans, events = SimpleSpanHandler(), EventCollector()
    root.add_span_handler(spans)
    root.add_event_handler(events)
    try:
        yield spans, events
    finally:
        root.span_handlers.remove(spans)
        root.event_handlers.remove(events)


# -- what it is ----------------------------------------------------------------------------------
def test_class() -> None:
    names_of_base_classes = [b.__name__ for b in PBRRetriever.__mro__]
    assert BaseRetriever.__name__ in names_of_base_classes


def test_from_defaults_takes_exactly_one_of_index_nodes_documents(
    embed_model: HashEmbedding,
) -> None:
    with pytest.raises(ValueError, match="exactly one of index, nodes or documents, got none"):
        PBRRetriever.from_defaults(llm=MockLLM(), embed_model=embed_model)
    index = VectorStoreIndex(_nodes(), embed_model=embed_model)
    with pytest.raises(ValueError, match="got index and nodes"):
        PBRRetriever.from_defaults(index=index, nodes=_nodes(), llm=MockLLM())


def test_from_documents_splits_and_tags_them_with_the_user(embed_model: HashEmbedding) -> None:
    docs = [Document(text=text, metadata={"topic": topic}) for text, topic in HISTORY["u1"]]
    retriever = PBRRetriever.from_defaults(
        documents=docs, user_id="u1", llm=MockLLM(), embed_model=embed_model
    )
    got = retriever.retrieve(QUERY)
    assert got and all(n.node.metadata["user_id"] == "u1" for n in got)
    assert len(retriever.personalizer.store.get("u1")) == len(docs)


# -- queries -------------------------------------------------------------------------------------
def test_returns_the_users_nodes_with_scores_and_explanation(base: PBRRetriever) -> None:
    got = base.for_user("u1").retrieve(QUERY)
    assert len(got) == 3
    assert all(_owner(n) == "u1" and n.score is not None for n in got)
    explanation = got[0].node.metadata[EXPLANATION_KEY]
    assert explanation["user_id"] == "u1" and explanation["query"] == QUERY
    assert set(explanation["used"]) == {"query", "anchor", "utterances", "reasoning"}
    assert explanation["w1"] is not None and explanation["anchor_items"]
    assert not explanation["degraded"]
    json.dumps(explanation)  # JSON-ready


def test_empty_query_is_refused(base: PBRRetriever) -> None:
    with pytest.raises(ValueError, match="empty query"):
        base.for_user("u1").retrieve("   ")


async def test_empty_query_is_refused_async(base: PBRRetriever) -> None:
    with pytest.raises(ValueError, match="empty query"):
        await base.for_user("u1").aretrieve("")


def test_similarity_top_k_larger_than_the_users_corpus(base: PBRRetriever) -> None:
    got = base.for_user("u1", similarity_top_k=100).retrieve(QUERY)
    assert sorted(n.node.node_id for n in got) == [f"u1-{i}" for i in range(5)]


def test_a_user_with_one_item_has_no_anchor_and_still_gets_it(base: PBRRetriever) -> None:
    got = base.for_user("u3").retrieve(QUERY)
    assert [n.node.node_id for n in got] == ["u3-0"]
    explanation = got[0].node.metadata[EXPLANATION_KEY]
    assert "anchor" in explanation["missing"] and explanation["degraded"]


def test_unknown_user_gets_nothing_and_the_reason(
    base: PBRRetriever, instrumented: tuple[SimpleSpanHandler, EventCollector]
) -> None:
    _, events = instrumented
    assert base.for_user("nobody").retrieve(QUERY) == []
    degraded = [e for e in events.events if isinstance(e, PBRDegradedEvent)]
    reason = degraded[-1].data["missing"]["utterances"] if degraded else ""
    assert "has no history" in reason and "plain query" in reason


def test_unknown_user_raises_in_strict_mode(base: PBRRetriever) -> None:
    with pytest.raises(UnknownUserError, match="nobody"):
        base.for_user("nobody", strict=True).retrieve(QUERY)


def test_a_retriever_without_user_says_how_to_get_one(base: PBRRetriever) -> None:
    with pytest.raises(ValueError, match=r"for_user\('u1'\)"):
        base.retrieve(QUERY)


def test_invalid_similarity_top_k(base: PBRRetriever) -> None:
    with pytest.raises(ValueError, match="similarity_top_k"):
        base.for_user("u1", similarity_top_k=0)


# -- filters and isolation -----------------------------------------------------------------------
def test_filters_apply_within_the_user(base: PBRRetriever) -> None:
    food = MetadataFilters(filters=[MetadataFilter(key="topic", value="food")])
    got = base.for_user("u1", filters=food, similarity_top_k=10).retrieve(QUERY)
    assert sorted(n.node.node_id for n in got) == ["u1-1", "u1-3"]


@pytest.mark.parametrize("way", ["sync", "async"])
def test_a_filtered_view_ranks_every_node_in_it_as_langchain_does(
    embed_model: HashEmbedding, way: str
) -> None:
    """The one node holding the question's word is long and far from the query in the dense
    leg: a filtered view searched for pbr's best candidates left it out (the store's top 40),
    while the same view in LangChain, and the unfiltered retriever, found it."""
    words = [
        "alpha",
        "bravo",
        "charlie",
        "delta",
        "echo",
        "foxtrot",
        "golf",
        "hotel",
        "india",
        "juliet",
        "kilo",
        "lima",
    ]
    notes = [" ".join(words[(3 * i) % 12 : (3 * i) % 12 + 3]) for i in range(100)]
    nodes = [
        TextNode(id_=f"n{i}", text=t, metadata={"user_id": "ann", "kind": "note"})
        for i, t in enumerate(notes)
    ]
    far = " ".join(f"w{j}" for j in range(300))
    nodes.append(
        TextNode(id_="zebra", text=f"zebra {far}", metadata={"user_id": "ann", "kind": "note"})
    )
    base = PBRRetriever.from_defaults(
        nodes=nodes,
        llm=MockLLM(),
        embed_model=embed_model,
        config=PBRConfig(fusion="plain", search="lexical", explain="scores"),
        similarity_top_k=3,
    )
    notes_only = MetadataFilters(filters=[MetadataFilter(key="kind", value="note")])
    view = base.for_user("ann", filters=notes_only)
    got = view.retrieve("zebra") if way == "sync" else asyncio.run(view.aretrieve("zebra"))
    assert [n.node.node_id for n in got][:1] == ["zebra"]
    assert got[0].node.metadata["store_score"] is not None  # listed by the store's search for q*
    assert [n.node.node_id for n in base.for_user("ann").retrieve("zebra")][:1] == ["zebra"]


def test_filters_cannot_reach_another_users_nodes(base: PBRRetriever) -> None:
    other = MetadataFilters(filters=[MetadataFilter(key="user_id", value="u2")])
    assert base.for_user("u1", filters=other, similarity_top_k=10).retrieve(QUERY) == []
    assert asyncio.run(base.for_user("u1", filters=other).aretrieve(QUERY)) == []
    anyone = MetadataFilters(
        filters=[MetadataFilter(key="user_id", value=["u1", "u2"], operator=FilterOperator.IN)]
    )
    got = base.for_user("u1", filters=anyone, similarity_top_k=10).retrieve(QUERY)
    assert got and {_owner(n) for n in got} == {"u1"}


def test_a_store_that_cannot_nest_filters_is_told_not_post_filtered(base: PBRRetriever) -> None:
    either = MetadataFilters(
        filters=[
            MetadataFilter(key="topic", value="food"),
            MetadataFilter(key="topic", value="health"),
        ],
        condition=FilterCondition.OR,
    )
    # an OR needs no nesting on SimpleVectorStore: the user's own node ids restrict the search
    got = base.for_user("u1", filters=either, similarity_top_k=10).retrieve(QUERY)
    assert got and {_owner(n) for n in got} == {"u1"}
    assert {n.node.metadata["topic"] for n in got} <= {"food", "health"}
    nested = MetadataFilters(
        filters=[either, MetadataFilter(key="topic", value="sport")], condition=FilterCondition.OR
    )  # which the store cannot evaluate at all (nor can LlamaIndex's own retriever)
    with pytest.raises(ValueError, match="one index per user"):
        base.for_user("u1", filters=nested).retrieve(QUERY)


def test_two_users_back_to_back_on_one_instance(base: PBRRetriever) -> None:
    for _ in range(2):
        for user in ("u1", "u2", "u1", "u3"):
            got = base.for_user(user, similarity_top_k=10).retrieve(QUERY)
            assert got and {_owner(n) for n in got} == {user}
            related = got[0].node.metadata[EXPLANATION_KEY]["related"]
            assert {item["id"].split("-")[0] for item in related} == {user}


async def test_two_users_back_to_back_and_concurrently_async(base: PBRRetriever) -> None:
    for user in ("u1", "u2", "u1"):
        got = await base.for_user(user, similarity_top_k=10).aretrieve(QUERY)
        assert got and {_owner(n) for n in got} == {user}
    users = ["u1", "u2", "u3", "u2", "u1"]
    results = await asyncio.gather(
        *(base.for_user(u, similarity_top_k=10).aretrieve(QUERY) for u in users)
    )
    for user, got in zip(users, results):
        assert got and {_owner(n) for n in got} == {user}
        assert got[0].node.metadata[EXPLANATION_KEY]["user_id"] == user


def test_per_user_partition_for_a_store_that_cannot_filter(embed_model: HashEmbedding) -> None:
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=MockLLM(),
        embed_model=embed_model,
        similarity_top_k=10,
        vector_store_factory=lambda user_id: FilterlessStore(),
    )
    assert isinstance(retriever.index, dict) and set(retriever.index) == set(HISTORY)
    for user in ("u1", "u2", "u1"):
        got = retriever.for_user(user).retrieve(QUERY)
        assert len(got) == len(HISTORY[user]) and {_owner(n) for n in got} == {user}
    assert retriever.for_user("nobody").retrieve(QUERY) == []


def test_one_shared_store_that_cannot_filter_is_refused_with_advice(
    embed_model: HashEmbedding,
) -> None:
    from llama_index.core import StorageContext

    storage = StorageContext.from_defaults(vector_store=FilterlessStore())
    index = VectorStoreIndex(_nodes(), storage_context=storage, embed_model=embed_model)
    retriever = PBRRetriever.from_defaults(index=index, user_id="u1", llm=MockLLM())
    # pbr lists the store and ranks the user's nodes itself: no filter is sent, nothing refused
    assert {_owner(n) for n in retriever.retrieve(QUERY)} == {"u1"}
    # a view filter makes the store search, with the user filter it cannot apply
    wanted = MetadataFilters(filters=[MetadataFilter(key="topic", value="food")])
    with pytest.raises(ValueError, match="one index per user"):
        retriever.for_user("u1", filters=wanted).retrieve(QUERY)


# -- your index, your nodes ----------------------------------------------------------------------
class CountingEmbedding(HashEmbedding):
    _texts: list[str] = PrivateAttr(default_factory=list)

    def _get_text_embedding(self, text: str) -> list[float]:
        self._texts.append(text)
        return self.embed(text)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        self._texts.append(text)
        return self.embed(text)


def test_reuses_your_index_and_its_stored_vectors() -> None:
    embed_model = CountingEmbedding(dim=64)
    index = VectorStoreIndex(_nodes(), embed_model=embed_model)
    embedded = len(embed_model._texts)
    retriever = PBRRetriever.from_defaults(index=index, user_id="u2", llm=MockLLM())
    assert len(embed_model._texts) == embedded  # the history came from the store
    assert retriever.embed_model is embed_model
    got = retriever.retrieve(QUERY)
    assert got and {_owner(n) for n in got} == {"u2"}
    assert retriever.personalizer.store.users() == ["u2"]  # read on first use
    history = retriever.personalizer.store.get("u2")
    for item, vector in zip(history.items, history.vectors):  # the store's vectors, read back
        stored = np.asarray(index.vector_store.get(item.id))
        assert np.allclose(vector, stored / np.linalg.norm(stored), atol=1e-6)


def test_your_nodes_and_the_docstore_are_not_modified(base: PBRRetriever) -> None:
    nodes = _nodes()
    before = [dict(n.metadata) for n in nodes]
    retriever = PBRRetriever.from_defaults(
        nodes=nodes, llm=MockLLM(), embed_model=HashEmbedding(dim=64), user_id="u1"
    )
    got = retriever.retrieve(QUERY)
    assert [n.metadata for n in nodes] == before
    assert all(n.embedding is None for n in nodes)
    index = retriever.index
    assert isinstance(index, VectorStoreIndex)
    stored = index.docstore.get_node(scoped_key("u1", got[0].node.node_id))
    assert EXPLANATION_KEY not in stored.metadata


def test_the_explanation_and_user_id_are_hidden_from_the_llm(base: PBRRetriever) -> None:
    node = base.for_user("u1").retrieve(QUERY)[0].node
    assert EXPLANATION_KEY in node.metadata and "user_id" in node.metadata
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        text = node.get_content(metadata_mode=mode)
        assert "pseudo_utterances" not in text and "u1" not in text
        assert "topic: " in text  # the user's own metadata is untouched


def test_add_and_delete_nodes_through_a_users_view(base: PBRRetriever) -> None:
    u1 = base.for_user("u1", similarity_top_k=10)
    u1.add_nodes([TextNode(text="Oatmeal two hours before a race", id_="u1-new")])
    assert "u1-new" in {n.node.node_id for n in u1.retrieve(QUERY)}
    assert base.personalizer.store.get("u1").position("u1-new") is not None
    with pytest.raises(KeyError, match="u2-0"):
        u1.delete_nodes(["u2-0"])  # another user's node: refused, nothing removed
    u1.delete_nodes(["u1-new"])
    assert "u1-new" not in {n.node.node_id for n in u1.retrieve(QUERY)}
    assert len(base.for_user("u2", similarity_top_k=10).retrieve(QUERY)) == len(HISTORY["u2"])


def test_from_defaults_user_id_tags_the_nodes_that_name_no_user(embed_model: HashEmbedding) -> None:
    nodes = [
        TextNode(text="alice runs marathons"),
        TextNode(text="alice swims", metadata={"user_id": None}),  # names no user either
        TextNode(text="bob plays jazz", metadata={"user_id": "bob"}),
    ]
    r = PBRRetriever.from_defaults(
        nodes=nodes, user_id="alice", llm=MockLLM(), embed_model=embed_model, similarity_top_k=5
    )
    assert sorted(n.node.get_content() for n in r.retrieve("q")) == [
        "alice runs marathons",
        "alice swims",
    ]
    assert [n.node.get_content() for n in r.for_user("bob").retrieve("q")] == ["bob plays jazz"]


async def test_filters_given_without_a_user_apply_to_every_users_requests(
    embed_model: HashEmbedding, tmp_path: Path
) -> None:
    """A retriever without a user is queried through ``for_user`` or ``retrieve(user_id=...)``,
    and both dropped its filters as another user's: they never applied (saved and loaded
    too), where a LangChain ``search_kwargs`` filter applies to every user."""
    nodes = [
        TextNode(text="tea in the morning", id_="n1", metadata={"user_id": "a", "topic": "food"}),
        TextNode(text="tea and a run", id_="n2", metadata={"user_id": "a", "topic": "sport"}),
        TextNode(text="tea with cake", id_="n3", metadata={"user_id": "b", "topic": "food"}),
    ]
    food = MetadataFilters(filters=[MetadataFilter(key="topic", value="food")])
    shared = PBRRetriever.from_defaults(
        nodes=nodes, llm=MockLLM(), embed_model=embed_model, filters=food, similarity_top_k=10
    )
    shared.persist(tmp_path / "p")
    loaded = PBRRetriever.from_persist_dir(tmp_path / "p", llm=MockLLM(), embed_model=embed_model)
    for r in (shared, loaded):
        assert [n.node.node_id for n in r.retrieve("tea", user_id="a")] == ["n1"]
        assert [n.node.node_id for n in await r.aretrieve("tea", user_id="a")] == ["n1"]
        assert [n.node.node_id for n in r.for_user("b").retrieve("tea")] == ["n3"]
    # a view of one user still starts another user's view without its filters
    alice_sport = shared.for_user(
        "a", filters=MetadataFilters(filters=[MetadataFilter(key="topic", value="sport")])
    )
    assert [n.node.node_id for n in alice_sport.retrieve("tea")] == ["n2"]
    assert alice_sport.for_user("b").filters is None


def test_a_filter_that_keeps_every_node_returns_what_no_filter_does(
    embed_model: HashEmbedding,
) -> None:
    """Equal scores (one note saved six times) kept the order the store returned its hits in,
    so a filter removing nothing changed which copies came back (from a review): ties follow
    the user's history, filtered or not."""
    from llama_index.core.vector_stores import FilterOperator

    texts = ["I walked Rex in the park"] * 6 + ["groceries: milk, eggs", "call mum on Sunday"]
    nodes = [
        TextNode(
            text=t,
            id_=f"day{d}",
            metadata={"user_id": "ann", "day": d},
            excluded_embed_metadata_keys=["day"],  # the copies embed alike
        )
        for d, t in enumerate(texts, start=1)
    ]
    r = PBRRetriever.from_defaults(
        nodes=nodes, llm=MockLLM(), embed_model=embed_model, similarity_top_k=3
    )
    keep_all = MetadataFilters(
        filters=[MetadataFilter(key="day", value=0, operator=FilterOperator.GT)]
    )
    query = "where did I walk Rex?"
    plain = [(n.node.node_id, n.score) for n in r.for_user("ann").retrieve(query)]
    filtered = [
        (n.node.node_id, n.score) for n in r.for_user("ann", filters=keep_all).retrieve(query)
    ]
    assert [i for i, _ in plain] == ["day1", "day2", "day3"]
    assert filtered == plain


def test_a_view_refuses_another_users_nodes(base: PBRRetriever) -> None:
    stray = TextNode(text="Not mine", metadata={"user_id": "u2"})
    with pytest.raises(ValueError, match="belongs to user 'u2'"):
        base.for_user("u1").add_nodes([stray])
    with pytest.raises(ValueError, match="has no 'user_id' metadata"):
        base.add_nodes([TextNode(text="Whose?")])


def test_a_node_with_an_empty_id_is_refused_before_anything_is_written(base: PBRRetriever) -> None:
    """A node's id is what the caller retrieves and deletes it by: pbr makes none up for it."""
    u2 = base.for_user("u2", similarity_top_k=10)
    before = {n.node.node_id for n in u2.retrieve(QUERY)}
    with pytest.raises(ValueError, match="of user 'u2' has an empty id"):
        u2.add_nodes([TextNode(text="Oat milk in my coffee", id_="")])
    assert {n.node.node_id for n in u2.retrieve(QUERY)} == before


async def test_aadd_nodes(base: PBRRetriever) -> None:
    u2 = base.for_user("u2", similarity_top_k=10)
    await u2.aadd_nodes([TextNode(text="Croissant before my run", id_="u2-new")])
    assert "u2-new" in {n.node.node_id for n in await u2.aretrieve(QUERY)}


def test_for_user_is_a_cheap_view_sharing_state(base: PBRRetriever) -> None:
    u1, u2 = base.for_user("u1"), base.for_user("u2")
    assert u1.personalizer is base.personalizer is u2.personalizer
    assert u1.index is base.index
    u1.retrieve(QUERY)
    anchors_cached = base.personalizer.store.get("u1")._anchors
    assert len(anchors_cached) == 1
    base.for_user("u1", similarity_top_k=1).retrieve(QUERY)
    assert base.personalizer.store.get("u1")._anchors is anchors_cached
    assert (u1.user_id, u2.user_id, base.user_id) == ("u1", "u2", None)


# -- settings fallback ---------------------------------------------------------------------------
def test_falls_back_to_settings(
    monkeypatch: pytest.MonkeyPatch, embed_model: HashEmbedding
) -> None:
    llm = MockLLM()
    monkeypatch.setattr(Settings, "_llm", llm)
    monkeypatch.setattr(Settings, "_embed_model", embed_model)
    retriever = PBRRetriever.from_defaults(nodes=_nodes(), user_id="u1")
    assert retriever.llm is llm and retriever.embed_model is embed_model
    assert retriever.retrieve(QUERY)


def test_falls_back_to_the_embedded_models_without_touching_openai(
    monkeypatch: pytest.MonkeyPatch, embed_model: HashEmbedding
) -> None:
    monkeypatch.setattr(Settings, "_llm", None)
    monkeypatch.setattr(Settings, "_embed_model", None)
    index = VectorStoreIndex(_nodes(), embed_model=embed_model)
    retriever = PBRRetriever.from_defaults(index=index, user_id="u1")
    assert isinstance(retriever.llm, LocalGemmaLLM)  # weights load on the first call only
    assert retriever.embed_model is embed_model  # the index's own model
    assert isinstance(PBRRetriever.from_defaults(nodes=[]).embed_model, LocalMiniLMEmbedding)
    assert Settings._llm is None and Settings._embed_model is None


# -- degradation ---------------------------------------------------------------------------------
def test_llm_failure_degrades_and_is_reported(
    embed_model: HashEmbedding, instrumented: tuple[SimpleSpanHandler, EventCollector]
) -> None:
    _, events = instrumented
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=ScriptedLLM(error="quota exceeded"),
        embed_model=embed_model,
        config=PAPER,
        user_id="u1",
    )
    got = retriever.retrieve(QUERY)
    assert got and {_owner(n) for n in got} == {"u1"}
    explanation = got[0].node.metadata[EXPLANATION_KEY]
    assert explanation["degraded"] and set(explanation["used"]) == {"query", "anchor"}
    assert "quota exceeded" in explanation["dropped"]["utterances"]
    assert "quota exceeded" in explanation["dropped"]["reasoning"]
    assert any(isinstance(e, PBRDegradedEvent) for e in events.events)
    with pytest.raises(GenerationError, match="quota exceeded"):
        retriever.for_user("u1", strict=True).retrieve(QUERY)


def test_no_log_record_of_a_degraded_request_names_the_user(
    embed_model: HashEmbedding, caplog: pytest.LogCaptureFixture
) -> None:
    user = "bob@example.com"
    nodes = [
        TextNode(text=t, id_=f"n{i}", metadata={"user_id": user})
        for i, t in enumerate(["bob runs", "bob cooks"])
    ]
    retriever = PBRRetriever.from_defaults(
        nodes=nodes,
        llm=ScriptedLLM(error="quota exceeded"),
        embed_model=embed_model,
        config=PAPER,
        user_id=user,
    )
    with caplog.at_level(logging.DEBUG):
        got = retriever.retrieve(QUERY)
    assert got[0].node.metadata[EXPLANATION_KEY]["degraded"]
    assert any(r.name.startswith("pbr.") for r in caplog.records)  # the degraded request is logged
    assert not any(user in r.getMessage() for r in caplog.records)  # without the user id


async def test_unparseable_llm_output_degrades_async(embed_model: HashEmbedding) -> None:
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=ScriptedLLM(text="   "),
        embed_model=embed_model,
        user_id="u2",
        config=PAPER,
    )
    got = await retriever.aretrieve(QUERY)
    assert got and {_owner(n) for n in got} == {"u2"}
    explanation = got[0].node.metadata[EXPLANATION_KEY]
    assert explanation["missing"] == {
        "utterances": "the LLM answer was empty",
        "reasoning": "the LLM answer was empty",
    }


# -- concurrency ---------------------------------------------------------------------------------
def test_the_two_llm_calls_run_concurrently(embed_model: HashEmbedding) -> None:
    llm = RendezvousLLM()
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(), llm=llm, embed_model=embed_model, user_id="u1", config=PAPER
    )
    explanation = retriever.retrieve(QUERY)[0].node.metadata[EXPLANATION_KEY]
    assert not explanation["degraded"], explanation["dropped"]
    assert llm._calls == ["sync", "sync"]


async def test_the_async_path_is_native(embed_model: HashEmbedding) -> None:
    llm, embed = RendezvousLLM(), AsyncOnlyEmbedding(dim=64)
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(), llm=llm, embed_model=embed, user_id="u1", config=PAPER
    )
    embed.forbid_sync()
    got = await retriever.aretrieve(QUERY)
    assert not got[0].node.metadata[EXPLANATION_KEY]["degraded"]
    assert llm._calls == ["async", "async"]  # concurrent (rendezvous) and never the sync API


async def loop_ran_meanwhile(work: Any) -> tuple[Any, int]:
    """``await work`` and how often a ticker ran on the event loop meanwhile (every 10 ms).
    A loop blocked by a synchronous call runs it once at most; a loop left free, many times
    (at least 2 asked for below: a loaded machine starves a free loop far less than that)."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        return await work, ticks
    finally:
        ticker.cancel()


class BlockingLLM(MockLLM):
    """A CustomLLM without async code of its own: its inherited ``acomplete`` blocks. Records
    the thread each call ran on."""

    threads: list[threading.Thread] = Field(default_factory=list, exclude=True)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.threads.append(threading.current_thread())
        time.sleep(2.0)
        return CompletionResponse(text="too late")


async def test_a_blocking_llm_neither_freezes_the_event_loop_nor_outlives_the_timeout(
    embed_model: HashEmbedding,
) -> None:
    config = PBRConfig(fusion="paper", llm_timeout_s=0.3, explain="all")
    llm = BlockingLLM()
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(), llm=llm, embed_model=embed_model, user_id="u1", config=config
    )
    got, ticks = await loop_ran_meanwhile(retriever.aretrieve(QUERY))
    explanation = got[0].node.metadata[EXPLANATION_KEY]
    assert explanation["degraded"] and "timed out" in explanation["dropped"]["utterances"]
    # the blocking calls ran off the event loop's thread, and the loop kept serving meanwhile
    assert llm.threads and threading.current_thread() not in llm.threads
    assert ticks >= 2


async def test_the_sync_path_needs_no_event_loop_of_its_own(base: PBRRetriever) -> None:
    # Called from inside a running loop (a notebook, an async server's sync handler), the sync
    # path must not start or nest an event loop: it uses threads, never asyncio.
    got = base.for_user("u1").retrieve(QUERY)
    assert got and not got[0].node.metadata[EXPLANATION_KEY]["degraded"]


# -- observability -------------------------------------------------------------------------------
def _span(spans: SimpleSpanHandler, name: str) -> Any:
    found = [s for s in spans.completed_spans if s.id_.startswith(name + "-")]
    assert found, f"no span {name}: {[s.id_ for s in spans.completed_spans]}"
    return found[-1]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_spans_and_events_nest_under_the_retrieval(
    base: PBRRetriever, instrumented: tuple[SimpleSpanHandler, EventCollector], mode: str
) -> None:
    spans, events = instrumented
    if mode == "sync":
        base.for_user("u1").retrieve(QUERY)
        outer, step, llm_call = "PBRRetriever._retrieve", "PBRRetriever._personalize", "complete"
    else:
        await base.for_user("u1").aretrieve(QUERY)
        # MockLLM's acomplete is CustomLLM's, which blocks: pbr runs complete in its executor
        outer, step, llm_call = "PBRRetriever._aretrieve", "PBRRetriever._apersonalize", "complete"
    retrieve = _span(
        spans, "PBRRetriever.aretrieve" if mode == "async" else "PBRRetriever.retrieve"
    )
    assert _span(spans, outer).parent_id == retrieve.id_
    personalize = _span(spans, step)
    assert personalize.parent_id == _span(spans, outer).id_
    llm_spans = [s for s in spans.completed_spans if s.id_.startswith(f"MockLLM.{llm_call}-")]
    assert len(llm_spans) == 2 and {s.parent_id for s in llm_spans} == {personalize.id_}
    # without a view filter pbr ranks the user's nodes itself: no index search runs
    assert not [s for s in spans.completed_spans if s.id_.startswith("VectorIndexRetriever.")]
    # one retrieval, one RetrievalEndEvent, its nodes explained (no inner retriever's event)
    (end,) = [e for e in events.events if isinstance(e, RetrievalEndEvent)]
    assert end.nodes and all("pbr" in n.node.metadata for n in end.nodes)
    pbr = [e for e in events.events if isinstance(e, PBREvent)]
    assert [e.name for e in pbr] == [
        "pbr.anchor",
        "pbr.pseudo_utterances",
        "pbr.reasoning",
        "pbr.fusion",
        "pbr.results",
    ]
    assert {e.span_id for e in pbr[:-1]} == {personalize.id_}
    assert pbr[-1].span_id == _span(spans, outer).id_  # after the ranking, in the retrieval
    assert [r["id"] for r in pbr[-1].data["results"]] == [n.node.node_id for n in end.nodes]
    fusion = pbr[-2].data
    assert fusion["user_id"] == "u1" and fusion["w1"] is not None and fusion["w2"] is not None
    assert pbr[0].data["anchor_items"] and pbr[1].data["pseudo_utterances"]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_legacy_callback_events_nest_under_retrieve(
    embed_model: HashEmbedding, mode: str
) -> None:
    recorder = Recorder()
    manager = CallbackManager([recorder])
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=ScriptedLLM(callback_manager=manager),  # MockLLM.acomplete logs a 2nd LLM event
        embed_model=HashEmbedding(dim=64, callback_manager=manager),
        user_id="u1",
        callback_manager=manager,
    )
    recorder.starts.clear()
    if mode == "sync":
        retriever.retrieve(QUERY)
    else:
        await retriever.aretrieve(QUERY)
    retrieve_id = next(i for t, i, _ in recorder.starts if t == CBEventType.RETRIEVE)
    parent = {i: p for _, i, p in recorder.starts}

    def under_retrieve(event_id: str) -> bool:
        while event_id in parent:
            event_id = parent[event_id]
            if event_id == retrieve_id:
                return True
        return False

    nested = [(t, i) for t, i, _ in recorder.starts if i != retrieve_id]
    assert {t for t, _ in nested} >= {CBEventType.LLM, CBEventType.EMBEDDING}
    assert all(under_retrieve(i) for _, i in nested)
    assert [t for t, _ in nested].count(CBEventType.LLM) == 2


# -- prompts -------------------------------------------------------------------------------------
def test_prompts_through_prompt_mixin(base: PBRRetriever) -> None:
    prompts = base.get_prompts()
    assert set(prompts) == {"utterances_prompt", "reasoning_prompt"}
    assert "{history}" in prompts["utterances_prompt"].get_template()
    u1 = base.for_user("u1")
    u1.update_prompts(
        {"utterances_prompt": PromptTemplate("Zebra notes:\n{history}\nAsked: {query}\n1.")}
    )
    got = u1.retrieve(QUERY)[0].node.metadata[EXPLANATION_KEY]["pseudo_utterances"]
    assert any("Zebra notes" in u for u in got)  # MockLLM echoes the prompt
    untouched = base.for_user("u1").retrieve(QUERY)[0].node.metadata[EXPLANATION_KEY]
    assert not any("Zebra" in u for u in untouched["pseudo_utterances"])
    with pytest.raises(ValueError, match="placeholder"):
        u1.update_prompts({"reasoning_prompt": PromptTemplate("no slots")})


def test_a_prompts_partial_values_and_variable_mappings_are_llamaindexs_own(
    base: PBRRetriever,
) -> None:
    """Only a template's raw string was kept: a ``partial_format`` value reached the LLM as the
    literal ``{tone}``, and a template naming the history ``{past}`` through
    ``template_var_mappings`` was refused as lacking ``{history}`` (from a review)."""
    u1 = base.for_user("u1")
    toned = PromptTemplate("Tone: {tone}.\n{history}\nAsked: {query}\n1.").partial_format(
        tone="formal"
    )
    mapped = PromptTemplate(
        "Past:\n{past}\nAsked: {query}\n1.", template_var_mappings={"history": "past"}
    )
    u1.update_prompts({"utterances_prompt": toned, "reasoning_prompt": mapped})
    explanation = u1.retrieve(QUERY)[0].node.metadata[EXPLANATION_KEY]
    assert any(u.startswith("Tone: formal.") for u in explanation["pseudo_utterances"])
    with pytest.raises(ValueError, match="does not fill"):
        u1.update_prompts({"reasoning_prompt": PromptTemplate("{mood} {history} {query}")})


# -- persistence ---------------------------------------------------------------------------------
def test_persist_and_load_round_trip(
    base: PBRRetriever, embed_model: HashEmbedding, tmp_path: Path
) -> None:
    food = MetadataFilters(filters=[MetadataFilter(key="topic", value="food")])
    u1 = base.for_user("u1", filters=food, config=PBRConfig(num_utterances=4))
    before = u1.retrieve(QUERY)
    u1.persist(tmp_path / "store")
    loaded = PBRRetriever.from_persist_dir(
        tmp_path / "store", llm=MockLLM(), embed_model=embed_model
    )
    assert (loaded.user_id, loaded.similarity_top_k) == ("u1", 3)
    assert loaded.filters == food and loaded.config.num_utterances == 4
    after = loaded.retrieve(QUERY)
    assert [(n.node.node_id, round(n.score or 0, 6)) for n in after] == [
        (n.node.node_id, round(n.score or 0, 6)) for n in before
    ]
    assert {_owner(n) for n in loaded.for_user("u2").retrieve(QUERY)} == {"u2"}


def test_a_retriever_save_and_a_history_save_never_share_a_folder(
    base: PBRRetriever, embed_model: HashEmbedding, tmp_path: Path
) -> None:
    """``PBRMemoryBlock.persist`` (a history save) into a retriever's folder took it over without
    a word, and its next save pruned the retriever's save away; the other way round too."""
    from pbr_core import HistoryStore, PersistenceError

    u1 = base.for_user("u1")
    u1.persist(tmp_path / "store")
    with pytest.raises(PersistenceError, match="another kind of save"):
        HistoryStore().save(tmp_path / "store")
    loaded = PBRRetriever.from_persist_dir(
        tmp_path / "store", llm=MockLLM(), embed_model=embed_model
    )
    assert loaded.user_id == "u1"
    HistoryStore().save(tmp_path / "memory")
    with pytest.raises(PersistenceError, match="another kind of save"):
        u1.persist(tmp_path / "memory")
    assert HistoryStore.load(tmp_path / "memory").users() == []


def test_a_load_that_two_saves_overtake_reads_the_new_save(
    base: PBRRetriever, embed_model: HashEmbedding, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each save keeps the newest two snapshots: two saves (another process) between a load's
    reading of CURRENT and of the snapshot prune it. That is no damage: the load reads the
    new one, as HistoryStore.load does."""
    import llamaindex_pbr.persistence as persistence

    u1 = base.for_user("u1")
    u1.persist(tmp_path / "store")
    verify, raced = persistence.verify_files, []

    def two_saves_meanwhile(*args: Any, **kwargs: Any) -> None:
        verify(*args, **kwargs)
        if not raced:
            raced.append(True)
            u1.persist(tmp_path / "store")
            u1.persist(tmp_path / "store")

    monkeypatch.setattr(persistence, "verify_files", two_saves_meanwhile)
    loaded = PBRRetriever.from_persist_dir(
        tmp_path / "store", llm=MockLLM(), embed_model=embed_model
    )
    assert raced and loaded.user_id == "u1"


def test_a_persist_that_fails_midway_leaves_a_lazily_loaded_history_readable(
    embed_model: HashEmbedding, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pbr_core import HistoryItem, HistoryStore

    saved = HistoryStore()
    text = "alice likes tea"
    saved.upsert("alice", [HistoryItem("a1", text)], [embed_model.get_text_embedding(text)])
    saved.save(tmp_path / "history")
    lazy = HistoryStore.load(tmp_path / "history", lazy=True)  # alice is not read yet
    index = VectorStoreIndex(
        [TextNode(text=text, id_="n1", metadata={"user_id": "alice"})], embed_model=embed_model
    )
    retriever = PBRRetriever(index, embed_model=embed_model, llm=MockLLM(), history=lazy)

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(index.storage_context, "persist", disk_full)
    with pytest.raises(OSError, match="disk full"):
        retriever.persist(tmp_path / "retriever")  # the histories were written, then this
    assert [it.text for it in lazy.get("alice").items] == [text]  # still read from its files


def test_persist_and_load_a_per_user_partition(embed_model: HashEmbedding, tmp_path: Path) -> None:
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=MockLLM(),
        embed_model=embed_model,
        user_id="u2",
        vector_store_factory=lambda user_id: SimpleVectorStore(),
    )
    before = [n.node.node_id for n in retriever.retrieve(QUERY)]
    retriever.persist(tmp_path / "p")
    loaded = PBRRetriever.from_persist_dir(tmp_path / "p", llm=MockLLM(), embed_model=embed_model)
    assert isinstance(loaded.index, dict) and set(loaded.index) == set(HISTORY)
    assert [n.node.node_id for n in loaded.retrieve(QUERY)] == before


def test_load_refuses_another_embedding_model(base: PBRRetriever, tmp_path: Path) -> None:
    base.persist(tmp_path / "store")

    class OtherEmbedding(HashEmbedding):
        model_name: str = "other-model"

    with pytest.raises(PersistenceError, match="other-model"):
        PBRRetriever.from_persist_dir(
            tmp_path / "store", llm=MockLLM(), embed_model=OtherEmbedding()
        )
    with pytest.raises(PersistenceError, match="not a saved PBRRetriever"):
        PBRRetriever.from_persist_dir(tmp_path, llm=MockLLM(), embed_model=HashEmbedding())


# -- composition ---------------------------------------------------------------------------------
def test_retriever_query_engine_end_to_end_with_mock_llm(base: PBRRetriever) -> None:
    engine = RetrieverQueryEngine.from_args(base.for_user("u2"), llm=MockLLM())
    response = engine.query(QUERY)
    assert response.source_nodes and {_owner(n) for n in response.source_nodes} == {"u2"}
    assert "pseudo_utterances" not in str(response)  # the explanation never reaches the LLM
    assert "bouchons" in str(response)  # MockLLM echoes the context it was given


async def test_retriever_query_engine_async(base: PBRRetriever) -> None:
    engine = RetrieverQueryEngine.from_args(base.for_user("u1"), llm=MockLLM())
    response = await engine.aquery(QUERY)
    assert {_owner(n) for n in response.source_nodes} == {"u1"}


def test_works_inside_query_fusion_retriever(base: PBRRetriever) -> None:
    fusion = QueryFusionRetriever(
        [base.for_user("u1")], llm=MockLLM(), num_queries=1, use_async=False, similarity_top_k=2
    )
    got = fusion.retrieve(QUERY)
    assert len(got) == 2 and {_owner(n) for n in got} == {"u1"}


class QueryWriter(CustomLLM):
    """Writes two fixed alternatives, as an LLM asked by QueryFusionRetriever would."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text="running shoes for a run\nshoes to run in\n")

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        raise NotImplementedError


@pytest.mark.parametrize("mode", ["reciprocal_rerank", "simple"])
def test_query_fusion_fuses_one_node_found_by_several_queries(
    base: PBRRetriever, mode: str
) -> None:
    # the explanation and scores pbr puts in each result's metadata are per query; the node's
    # hash, by which LlamaIndex fuses, must not be
    view = base.for_user("u1", similarity_top_k=3)
    queries = [QUERY, "running shoes for a run", "shoes to run in"]
    found = [{n.node.node_id: n.node.hash for n in view.retrieve(q)} for q in queries]
    union = set().union(*found)
    for node_id in union:  # the same node hashes the same whichever query found it
        assert len({f[node_id] for f in found if node_id in f}) == 1
    fusion = QueryFusionRetriever(
        [view], llm=QueryWriter(), num_queries=3, use_async=False, similarity_top_k=4, mode=mode
    )
    got = [n.node.node_id for n in fusion.retrieve(QUERY)]
    assert len(got) == min(4, len(union)) == len(set(got)) and set(got) <= union


async def test_a_query_bundle_embedding_is_the_query_vector(embed_model: HashEmbedding) -> None:
    from llama_index.core.schema import QueryBundle

    plain = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=MockLLM(),
        embed_model=embed_model,
        user_id="u1",
        similarity_top_k=1,
        config=PBRConfig(fusion="plain", search="dense"),
    )
    knee = embed_model.get_text_embedding("My knee hurts after hill repeats")
    bundle = QueryBundle(query_str=QUERY, embedding=knee)  # the caller's vector, not QUERY's
    for got in (plain.retrieve(bundle), await plain.aretrieve(bundle)):
        assert got[0].node.get_content() == "My knee hurts after hill repeats"
    assert plain.retrieve(QUERY)[0].node.get_content() != "My knee hurts after hill repeats"
    with pytest.raises(EmbeddingError, match="query_vector"):
        plain.retrieve(QueryBundle(query_str=QUERY, embedding=[1.0, 0.0]))  # wrong dimension


def test_llama_debug_handler_traces_the_llm_calls_under_retrieve(
    embed_model: HashEmbedding,
) -> None:
    from llama_index.core.callbacks import LlamaDebugHandler

    debug = LlamaDebugHandler()
    manager = CallbackManager([debug])
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=ScriptedLLM(callback_manager=manager),
        embed_model=HashEmbedding(dim=64, callback_manager=manager),
        user_id="u1",
        callback_manager=manager,
    )
    debug.flush_event_logs()
    traces: list[dict[str, list[str]]] = []
    original = debug.end_trace

    def keep(trace_id: str | None = None, trace_map: Any = None) -> None:
        traces.append(dict(trace_map or {}))
        original(trace_id, trace_map)

    debug.end_trace = keep  # type: ignore[method-assign]
    retriever.retrieve(QUERY)
    assert len(debug.get_event_pairs(CBEventType.LLM)) == 2
    (retrieve,) = debug.get_event_pairs(CBEventType.RETRIEVE)
    tree = traces[-1]
    below: list[str] = []
    todo = list(tree.get(retrieve[0].id_, []))
    while todo:
        below.append(todo.pop())
        todo.extend(tree.get(below[-1], []))
    llm_ids = {pair[0].id_ for pair in debug.get_event_pairs(CBEventType.LLM)}
    assert llm_ids <= set(below), (tree, llm_ids)


@pytest.mark.parametrize("own_manager", [True, False])
def test_legacy_handlers_see_the_llm_calls_only_through_the_llms_own_callback_manager(
    own_manager: bool,
) -> None:
    """#39 point 10, documented in docs/llamaindex.md: LlamaIndex logs a model's calls to the
    model's own ``callback_manager``; the retriever's manager alone gets its RETRIEVE event and
    not the calls of an LLM built without one."""
    from llama_index.core.callbacks import LlamaDebugHandler

    debug = LlamaDebugHandler()
    manager = CallbackManager([debug])
    llm = ScriptedLLM(callback_manager=manager) if own_manager else ScriptedLLM()
    retriever = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=llm,
        embed_model=HashEmbedding(dim=64),
        user_id="u1",
        callback_manager=manager,
    )
    debug.flush_event_logs()
    retriever.retrieve(QUERY)
    assert len(debug.get_event_pairs(CBEventType.RETRIEVE)) == 1
    assert len(debug.get_event_pairs(CBEventType.LLM)) == (2 if own_manager else 0)
    assert llm._calls  # the LLM was called either way


@pytest.mark.parametrize("explain", ["first", "none"])
def test_explain_says_which_nodes_carry_the_explanation(
    embed_model: HashEmbedding, explain: str
) -> None:
    r = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=MockLLM(),
        embed_model=embed_model,
        user_id="u1",
        similarity_top_k=4,
        config=PBRConfig(explain=explain),  # type: ignore[arg-type]
    )
    got = r.retrieve(QUERY)
    assert len(got) == 4 and all(n.score is not None for n in got)  # NodeWithScore keeps it
    carries = ["pbr" in n.node.metadata for n in got]
    assert carries == ([True, False, False, False] if explain == "first" else [False] * 4)
    assert all(("pbr_search" in n.node.metadata) == (explain == "first") for n in got)


def test_by_default_nodes_are_the_stored_ones_with_their_score_and_the_explanation_in_events(
    embed_model: HashEmbedding, instrumented: tuple[SimpleSpanHandler, EventCollector]
) -> None:
    _, events = instrumented
    r = PBRRetriever.from_defaults(
        nodes=_nodes(), llm=MockLLM(), embed_model=embed_model, user_id="u1", similarity_top_k=4
    )
    got = r.retrieve(QUERY)
    stored = {n.node_id: n.metadata for n in _nodes()}
    assert len(got) == 4 and all(n.score is not None for n in got)
    assert all(n.node.metadata == stored[n.node.node_id] for n in got)  # nothing per query
    pbr = {e.name: e.data for e in events.events if isinstance(e, PBREvent)}
    assert {"pbr.anchor", "pbr.pseudo_utterances", "pbr.fusion", "pbr.results"} <= set(pbr)
    rows = pbr["pbr.results"]["results"]
    assert [row["id"] for row in rows] == [n.node.node_id for n in got]
    assert [row["score"] for row in rows] == [n.score for n in got]
    assert all("pbr_search" in row for row in rows)


@pytest.mark.parametrize("explain", ["scores", "all"])
def test_scores_and_all_annotate_every_node(embed_model: HashEmbedding, explain: str) -> None:
    r = PBRRetriever.from_defaults(
        nodes=_nodes(),
        llm=MockLLM(),
        embed_model=embed_model,
        user_id="u1",
        similarity_top_k=4,
        config=PBRConfig(explain=explain),  # type: ignore[arg-type]
    )
    got = r.retrieve(QUERY)
    assert len(got) == 4
    assert all("pbr_search" in n.node.metadata for n in got)
    assert all(("pbr" in n.node.metadata) == (explain == "all") for n in got)


def test_an_item_added_through_the_personalizer_is_indexed_and_retrieved(
    base: PBRRetriever,
) -> None:
    # One corpus per store: the personalizer writes through the retriever's, so the item
    # reaches the index (it was once only in pbr's history: shown to the LLM, never retrieved).
    base.personalizer.add_texts("u3", ["Beetroot juice before every race"], ids=["u3-beet"])
    assert scoped_key("u3", "u3-beet") in base.index.vector_store.data.embedding_dict
    got = base.retrieve("beetroot juice before a race", user_id="u3")
    assert got[0].node.node_id == "u3-beet"
    base.personalizer.delete("u3", ["u3-beet"])
    assert scoped_key("u3", "u3-beet") not in base.index.vector_store.data.embedding_dict
    assert "u3-beet" not in [nws.node.node_id for nws in base.retrieve(QUERY, user_id="u3")]


def test_an_image_node_in_the_users_index_is_left_out_not_fatal(
    embed_model: HashEmbedding, caplog: pytest.LogCaptureFixture
) -> None:
    """A node without text (an ``ImageNode`` of a multimodal index, inserted around pbr) has
    nothing pbr can rank: it is left out with one warning, and the user's retrieves and deletes
    go on (before, each raised "item 'img' has empty text")."""
    from llama_index.core.schema import ImageNode

    index = VectorStoreIndex(
        [TextNode(text="alice likes green tea", id_="t", metadata={"user_id": "alice"})],
        embed_model=embed_model,
    )
    alice = PBRRetriever(
        index,
        llm=MockLLM(max_tokens=4),
        embed_model=embed_model,
        user_id="alice",
        config=PBRConfig(fusion="no_prf"),
    )
    image = ImageNode(
        image_url="http://example.com/cat.png",
        text="",
        id_="img",
        metadata={"user_id": "alice"},
        embedding=embed_model.get_text_embedding("cat"),
    )
    index.insert_nodes([image])
    with caplog.at_level(logging.WARNING, logger="pbr.corpus"):
        assert [n.node.node_id for n in alice.retrieve("green tea")] == ["t"]
    assert "has no text" in caplog.text
    alice.delete_nodes(["t"])
    assert alice.retrieve("green tea") == []


def test_answers_of_an_llm_that_declares_no_model_name_are_not_cached() -> None:
    """``MockLLM`` says ``model_name="unknown"``: its class name is all pbr knows, which two
    different models share, so its answers key no cache entry (before, they did)."""
    from llamaindex_pbr._bridge import LlamaIndexGenerator

    assert LlamaIndexGenerator(ScriptedLLM()).cacheable
    assert not LlamaIndexGenerator(MockLLM()).cacheable


def test_answers_of_an_llm_that_rewrites_its_prompts_are_not_cached() -> None:
    """A ``completion_to_prompt`` of the user's changes what the model reads, and the model
    name does not say so: two wrappers would share one cached answer (before, they did)."""
    from llamaindex_pbr import LocalGemmaLLM
    from llamaindex_pbr._bridge import LlamaIndexGenerator

    assert LlamaIndexGenerator(LocalGemmaLLM()).cacheable
    wrapped = LocalGemmaLLM(completion_to_prompt=lambda p: f"<start_of_turn>user\n{p}")
    assert not LlamaIndexGenerator(wrapped).cacheable
    assert not LlamaIndexGenerator(
        ScriptedLLM(completion_to_prompt=lambda p: "Answer briefly. " + p)
    ).cacheable
    # what HuggingFace-style LLMs apply in complete() too
    assert not LlamaIndexGenerator(ScriptedLLM(system_prompt="Answer in French.")).cacheable
    from llama_index.core.prompts import PromptTemplate

    french = PromptTemplate("Answer in French. {query_str}")
    assert not LlamaIndexGenerator(ScriptedLLM(query_wrapper_prompt=french)).cacheable
    # HuggingFaceLLM's default wrapper leaves the prompt as it is: still cached
    same = PromptTemplate("{query_str}")
    assert LlamaIndexGenerator(ScriptedLLM(query_wrapper_prompt=same)).cacheable


class OpaqueStore(BasePydanticVectorStore):
    """A store pbr cannot list (most hosted ones): it keeps no text and is no type pbr knows."""

    stores_text: bool = False
    _inner: SimpleVectorStore = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._inner = SimpleVectorStore()

    @property
    def client(self) -> None:
        return None

    def add(self, nodes: Any, **kwargs: Any) -> list[str]:
        return self._inner.add(nodes)

    def delete(self, ref_doc_id: str, **kwargs: Any) -> None:
        self._inner.delete(ref_doc_id)

    def delete_nodes(self, node_ids: Any = None, filters: Any = None, **kwargs: Any) -> None:
        self._inner.delete_nodes(node_ids, filters)

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return self._inner.query(query)


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_second_retriever_over_an_index_pbr_wrote_to_reads_its_nodes_back(
    partitioned: bool,
) -> None:
    """Over a store pbr cannot list, a new retriever (another worker, a restart) reads the
    docstore once: a node pbr wrote is its user's item of the id it was added under, deletable
    by it (before, the read refused the node's pbr_id metadata, and no retriever could be built
    over the index again)."""
    from llama_index.core import StorageContext

    embed_model = HashEmbedding(dim=64)
    index = VectorStoreIndex(
        [],
        storage_context=StorageContext.from_defaults(vector_store=OpaqueStore()),
        embed_model=embed_model,
    )
    source: Any = {"alice": index} if partitioned else index
    first = PBRRetriever.from_defaults(index=source, llm=MockLLM(), embed_model=embed_model)
    first.for_user("alice").add_nodes([TextNode(text="banana before my run", id_="n1")])
    second = PBRRetriever.from_defaults(index=source, llm=MockLLM(), embed_model=embed_model)
    assert [n.node.node_id for n in second.retrieve("banana", user_id="alice")] == ["n1"]
    second.for_user("alice").delete_nodes(["n1"])
    assert second.retrieve("banana", user_id="alice") == []
    assert index.index_struct.nodes_dict == {}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"vector_store_query_mode": "mmr"}, "would have no effect"),
        ({"callback_manager": CallbackManager([])}, "not arguments of"),
        ({"object_map": {}}, "not arguments of"),
    ],
)
def test_retriever_kwargs_that_could_not_work_are_refused_at_construction(
    kwargs: dict[str, Any], error: str
) -> None:
    """An MMR or sparse store mode would be re-ranked away by pbr (before, accepted with no
    effect); ``callback_manager`` / ``object_map`` pbr passes itself (before, accepted, then
    every filtered query raised TypeError)."""
    with pytest.raises(ValueError, match=error):
        PBRRetriever.from_defaults(
            nodes=_nodes(),
            llm=MockLLM(),
            embed_model=HashEmbedding(dim=64),
            retriever_kwargs=kwargs,
        )


@pytest.mark.parametrize("use_async", [False, True])
def test_a_query_bundles_custom_embedding_strings_are_what_is_embedded(use_async: bool) -> None:
    """``custom_embedding_strs`` (HyDE's hypothetical document) are embedded as
    ``VectorIndexRetriever`` embeds them (before, ignored: ``query_str`` was embedded)."""
    from llama_index.core.schema import QueryBundle

    embed_model = HashEmbedding(dim=64)
    texts = ["banana before my run", "leica film camera", "pasta night before race"]
    nodes = [
        TextNode(text=t, id_=f"n{i}", metadata={"user_id": "alice"}) for i, t in enumerate(texts)
    ]
    base = PBRRetriever.from_defaults(
        nodes=nodes, llm=MockLLM(), embed_model=embed_model, config=PBRConfig(search="dense")
    )
    alice = base.for_user("alice", similarity_top_k=3)
    bundle = QueryBundle(query_str="banana run", custom_embedding_strs=["leica film camera"])
    got = asyncio.run(alice.aretrieve(bundle)) if use_async else alice.retrieve(bundle)
    assert got[0].node.get_content() == "leica film camera"
    assert alice.retrieve("banana run")[0].node.get_content() == "banana before my run"


def test_a_loader_with_an_optional_second_parameter_is_called_with_the_folder_alone() -> None:
    """``FaissVectorStore.from_persist_dir(persist_dir, fs=None)`` and
    ``SimpleVectorStore.from_persist_dir`` take one folder (before, pbr passed the user id as
    their ``fs`` / ``namespace``); a required second parameter, or one named ``user_id``, gets
    the partition's user."""
    from llamaindex_pbr.persistence import _takes_two

    def faiss_like(persist_dir: str, fs: Any = None) -> Any: ...

    def by_user(folder: str, user_id: str | None = None) -> Any: ...

    def by_owner(folder: str, user: str | None = None) -> Any: ...

    assert not _takes_two(faiss_like) and not _takes_two(SimpleVectorStore.from_persist_dir)
    assert _takes_two(lambda folder, user: None) and _takes_two(by_user) and _takes_two(by_owner)
    assert not _takes_two(lambda folder: None)


def test_vectors_a_pipeline_wrote_around_the_docstore_are_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A SimpleVectorStore an IngestionPipeline filled keeps no text: its vectors have no node in
    the index's docstore, cannot be ranked, and pbr says so once (before, silently nothing)."""
    from llama_index.core import StorageContext
    from llama_index.core.ingestion import IngestionPipeline

    embed_model = HashEmbedding(dim=64)
    store = SimpleVectorStore()
    nodes = [TextNode(text=t, metadata={"user_id": "alice"}) for t in ("banana run", "pasta")]
    IngestionPipeline(transformations=[embed_model], vector_store=store).run(nodes=nodes)
    index = VectorStoreIndex(
        [],
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=embed_model,
    )
    retriever = PBRRetriever.from_defaults(index=index, llm=MockLLM(), embed_model=embed_model)
    with caplog.at_level(logging.WARNING, logger="pbr"):
        assert retriever.retrieve("banana", user_id="alice") == []
        retriever.retrieve("pasta", user_id="alice")
    assert caplog.text.count("docstore lacks") == 1


def test_a_node_indexed_around_pbr_then_updated_through_it_is_read_back_under_its_own_key() -> None:
    """The app indexed "n1" itself; pbr records it and rewrites it under "n1" on an update
    (its pbr_id then "n1" too): a second retriever holds it under "n1", ranks it and deletes it
    (a scoped key derived from its pbr_id named no record: it was hidden and undeletable)."""
    from llama_index.core import StorageContext

    embed_model = HashEmbedding(dim=64)
    own = [
        TextNode(text="banana before my run", id_="n1", metadata={"user_id": "alice"}),
        TextNode(text="kale salad", id_="n2", metadata={"user_id": "alice"}),
    ]
    index = VectorStoreIndex(
        own,
        storage_context=StorageContext.from_defaults(vector_store=OpaqueStore()),
        embed_model=embed_model,
    )
    config = PBRConfig(fusion="plain")
    first = PBRRetriever.from_defaults(
        index=index, llm=MockLLM(), embed_model=embed_model, config=config
    )
    first.for_user("alice").add_nodes([TextNode(text="banana bread before my run", id_="n1")])
    second = PBRRetriever.from_defaults(
        index=index, llm=MockLLM(), embed_model=embed_model, config=config
    )
    found = second.retrieve("banana", user_id="alice")
    assert [n.node.node_id for n in found] == ["n1", "n2"]
    second.for_user("alice").delete_nodes(["n1"])
    assert sorted(index.index_struct.nodes_dict) == ["n2"]


def test_a_retriever_can_be_copied_and_pickled() -> None:
    """Its locks are made anew by a copy or an unpickle (a refresh lock held by the shared
    state made both fail with "cannot pickle '_thread.lock' object")."""
    import copy
    import pickle

    from doubles import llamaindex_notes_retriever

    r = llamaindex_notes_retriever(["kale salad", "morning run"], PBRConfig(fusion="plain"), 2)
    for clone in (copy.deepcopy(r), pickle.loads(pickle.dumps(r))):
        assert clone.retrieve("run")[0].node.get_content() == "morning run"
        alice = clone.for_user("alice")
        assert alice.refresh_ref_docs([Document(text="oat porridge", id_="breakfast")]) == [True]


class UnreachableSimpleStore(SimpleVectorStore):
    """A store whose server refuses the connection on every write."""

    def add(self, nodes: Any, **kwargs: Any) -> list[str]:
        raise ConnectionRefusedError("connection refused")


def test_a_failed_from_defaults_of_documents_says_a_retry_would_add_them_again(
    embed_model: HashEmbedding,
) -> None:
    """The splitter gives documents' nodes new ids on every call, so a retry is not exact (the
    message said it was safe; ``add_documents`` said it right)."""
    from pbr_core import VectorStoreUnavailableError

    with pytest.raises(VectorStoreUnavailableError, match="1 of the items had no id") as info:
        PBRRetriever.from_defaults(
            documents=[Document(text="my note", metadata={"user_id": "alice"})],
            llm=MockLLM(),
            embed_model=embed_model,
            vector_store_factory=lambda user: UnreachableSimpleStore(),
        )
    assert "is safe" not in str(info.value) and "the vector store is not reachable" in str(
        info.value
    )
    with pytest.raises(VectorStoreUnavailableError, match="retrying the same call is safe"):
        PBRRetriever.from_defaults(  # nodes with their own ids: a retry is exact
            nodes=[TextNode(text="my note", id_="n1", metadata={"user_id": "alice"})],
            llm=MockLLM(),
            embed_model=embed_model,
            vector_store_factory=lambda user: UnreachableSimpleStore(),
        )


def _chained(user: str) -> list[TextNode]:
    """Three nodes of one document, linked as a splitter links them (prev / next)."""
    nodes = [
        TextNode(id_=f"{user}-{i}", text=t, metadata={"user_id": user})
        for i, t in enumerate(["cats sleep all day", "pasta cooking tips", "running shoes"])
    ]
    for a, b in itertools.pairwise(nodes):
        a.relationships[NodeRelationship.NEXT] = b.as_related_node_info()
        b.relationships[NodeRelationship.PREVIOUS] = a.as_related_node_info()
    return nodes


def test_a_views_docstore_resolves_the_relationships_its_results_name(
    embed_model: HashEmbedding,
) -> None:
    """A result's next_node names the user's own id; the index holds pbr's keys, so LlamaIndex's
    PrevNextNodePostprocessor over ``index.docstore`` failed ("doc_id ... not found"). Over the
    view's ``docstore`` it finds the neighbour, as it does over a plain index."""
    base = PBRRetriever.from_defaults(
        nodes=_chained("ann") + _chained("bob"),
        llm=MockLLM(),
        embed_model=embed_model,
        config=PBRConfig(fusion="plain", search="lexical"),
        similarity_top_k=1,
    )
    ann = base.for_user("ann")
    got = ann.retrieve("pasta cooking")
    assert [n.node.node_id for n in got] == ["ann-1"] and got[0].node.next_node.node_id == "ann-2"
    with pytest.raises(ValueError, match="not found"):
        PrevNextNodePostprocessor(docstore=base.index.docstore, num_nodes=1).postprocess_nodes(got)
    after = PrevNextNodePostprocessor(docstore=ann.docstore, num_nodes=1, mode="both")
    around = after.postprocess_nodes(got)
    assert sorted(n.node.node_id for n in around) == ["ann-0", "ann-1", "ann-2"]
    assert all(n.node.metadata == {"user_id": "ann"} for n in around)  # as results show them
    assert ann.docstore.get_node("bob-2", raise_error=False) is None  # only the user's own
    assert sorted(base.for_user("bob").docstore.docs) == ["bob-0", "bob-1", "bob-2"]
    with pytest.raises(TypeError, match="read-only"):
        ann.docstore.delete_document("ann-0")
    with pytest.raises(ValueError, match="view for one user"):
        base.docstore  # noqa: B018


@pytest.mark.parametrize("way", ["sync", "async"])
def test_nodes_the_corpus_would_refuse_are_not_embedded(way: str) -> None:
    """The corpus's rules run before the nodes are embedded (an embedder call costs, and may
    send the text to an API): they ran after, in the write."""
    embed_model = CountingEmbedding(dim=16)
    ann = PBRRetriever.from_defaults(
        nodes=[], llm=MockLLM(), embed_model=embed_model, user_id="ann"
    ).for_user("ann")
    bad = [
        TextNode(text="not mine", metadata={"user_id": "bob"}),
        TextNode(text="when", metadata={"at": object()}),
        TextNode(text="pbr's key", metadata={"pbr_id": "other"}),
    ]
    for node in bad:
        with pytest.raises(ValueError):
            if way == "sync":
                ann.add_nodes([node])
            else:
                asyncio.run(ann.aadd_nodes([node]))
    assert embed_model._texts == []


def test_a_filtered_view_lists_the_user_once_and_whole(
    embed_model: HashEmbedding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One listing of the user per filtered query, sync and async (the listing of the view
    read the user a second time), and a record pbr does not keep (a node without text, which
    another pipeline wrote for the user) is never a result. How many records the store's
    search is asked for is tests/core/test_listed_view.py's."""
    from llamaindex_pbr import stores

    texts = ["cats sleep", "cats purr", "cats play", "zebra stripes savanna"]
    nodes = [
        TextNode(id_=f"n{i}", text=t, metadata={"user_id": "ann", "kind": "note"})
        for i, t in enumerate(texts)
    ]
    base = PBRRetriever.from_defaults(
        nodes=nodes,
        llm=MockLLM(),
        embed_model=embed_model,
        config=PBRConfig(fusion="plain", search="lexical"),
        similarity_top_k=2,
    )
    view = base.for_user(
        "ann", filters=MetadataFilters(filters=[MetadataFilter(key="kind", value="note")])
    )
    assert [n.node.node_id for n in view.retrieve("zebra")][:1] == ["n3"]
    near = embed_model.get_query_embedding("zebra")  # the search's nearest record
    image = TextNode(id_="img", text="", embedding=near)
    image.metadata = {"user_id": "ann", "kind": "note"}
    base.index.insert_nodes([image])  # type: ignore[union-attr]
    listed: list[str] = []
    list_user = stores.IndexRecords.list_user

    def counted(self: Any, user_id: str) -> Any:
        listed.append(user_id)
        return list_user(self, user_id)

    monkeypatch.setattr(stores.IndexRecords, "list_user", counted)
    for got in (view.retrieve("zebra"), asyncio.run(view.aretrieve("zebra"))):
        ids = [n.node.node_id for n in got]
        assert ids[:1] == ["n3"] and "img" not in ids
    assert listed == ["ann", "ann"]  # one per query
    listed.clear()
    got = view.retrieve("cats")
    PrevNextNodePostprocessor(docstore=view.docstore, num_nodes=2, mode="both").postprocess_nodes(
        got
    )
    assert listed == ["ann"]  # the docstore's lookups read the request's snapshot


class SwitchableLLM(CustomLLM):
    """An LLM whose model the app switches at run time (``llm.model = ...``)."""

    model: str = "model-a"
    calls: list[str] = Field(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name=self.model, is_chat_model=True)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.calls.append(self.model)
        if "candidates" in prompt:
            return CompletionResponse(text=json.dumps({"candidates": [f"{self.model} says hi"]}))
        return CompletionResponse(text=f"{self.model} reasons about the question")

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        raise NotImplementedError


def test_async_requests_cache_answers_under_the_models_current_id(
    embed_model: HashEmbedding,
) -> None:
    """The async path used the generator made with the retriever, whose model id was fixed
    then: after ``llm.model = "model-b"`` it served model-a's cached answers, and stored
    model-b's under model-a's id (from a review). Sync read the current id."""
    from pbr_core import GenerationCache

    llm = SwitchableLLM()
    r = PBRRetriever.from_defaults(
        nodes=[TextNode(text=t, metadata={"user_id": "ann"}) for t in ("sushi", "Kyoto trip")],
        llm=llm,
        embed_model=embed_model,
        similarity_top_k=2,
        config=PBRConfig(fusion="paper", explain="first"),
        cache=GenerationCache(),
    ).for_user("ann")

    def said(nodes: list[NodeWithScore]) -> list[str]:
        return list(nodes[0].node.metadata["pbr"]["pseudo_utterances"])

    assert said(asyncio.run(r.aretrieve("where to eat?"))) == ["model-a says hi"]
    llm.model = "model-b"
    assert said(asyncio.run(r.aretrieve("where to eat?"))) == ["model-b says hi"]
    assert llm.calls.count("model-b") == 2


async def test_the_embedded_llms_async_chat_stream_leaves_the_event_loop_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``astream_chat`` was CustomLLM's, which runs the blocking decode on the event loop
    (from a review); the other async methods decode in a worker thread, and so does it."""
    from pbr_core.models import LocalGemmaGenerator

    threads: list[threading.Thread] = []

    def decode(self: Any, prompt: str) -> str:
        threads.append(threading.current_thread())
        time.sleep(0.4)  # the forward passes, without the weights
        return "a b c"

    monkeypatch.setattr(LocalGemmaGenerator, "generate", decode)
    llm = LocalGemmaLLM()

    async def chat() -> str:
        stream = await llm.astream_chat([ChatMessage(role="user", content="hi")])
        return "".join([r.delta or "" async for r in stream])

    text, ticks = await loop_ran_meanwhile(chat())
    assert text == "a b c"
    assert threads and threading.current_thread() not in threads and ticks >= 2


def test_filters_of_another_type_are_refused_when_given(base: PBRRetriever) -> None:
    """A LangChain-style dict or a lone MetadataFilter was kept and failed at the first query
    with an AttributeError (from a review)."""
    for bad in ({"topic": "food"}, MetadataFilter(key="topic", value="food")):
        with pytest.raises(TypeError, match="MetadataFilters"):
            base.for_user("u1", filters=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="MetadataFilters"):
            base.for_user("u1").filters = bad  # type: ignore[assignment]


def test_an_empty_partition_takes_settings_embed_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no index to take the model from, the documented order is Settings.embed_model,
    then the embedded MiniLM; PBRRetriever({}, vector_store_factory=...) skipped Settings."""
    from llama_index.core.vector_stores.simple import SimpleVectorStore

    mine = HashEmbedding(dim=64)
    monkeypatch.setattr(Settings, "_embed_model", mine)
    r = PBRRetriever({}, llm=MockLLM(), vector_store_factory=lambda user: SimpleVectorStore())
    assert r.embed_model is mine
