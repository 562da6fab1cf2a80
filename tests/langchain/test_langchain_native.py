"""LangChain idioms the per-user retriever honours (VectorStoreRetriever's search_kwargs, typos)."""

from __future__ import annotations

import itertools
import json
from typing import Any, ClassVar

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from pydantic import Field, ValidationError

from langchain_pbr import PBRRetriever
from langchain_pbr.stores import default_filter
from pbr_core import GenerationError

EMB = DeterministicFakeEmbedding(size=16)


def make(**kwargs: object) -> PBRRetriever:
    return PBRRetriever(llm=FakeListLLM(responses=["x"]), embeddings=EMB, **kwargs)


def filled(**kwargs: object) -> PBRRetriever:
    r = make(vectorstore=InMemoryVectorStore(EMB), **kwargs)
    for user in ("ann", "ben"):
        docs = [
            Document(page_content=f"{user} note {i}", metadata={"kind": "a" if i % 2 else "b"})
            for i in range(6)
        ]
        r.add_documents(docs, user_id=user)
    return r


@pytest.mark.parametrize(
    "typo",
    [{"embedding": EMB}, {"search_type": "mmr"}, {"config": {"fuson": "paper"}}],
    ids=["embedding", "search_type", "config-key"],
)
def test_a_misspelt_or_unsupported_argument_is_an_error_not_a_silent_default(
    typo: dict[str, object],
) -> None:
    with pytest.raises(ValidationError):
        make(**typo)


def test_search_kwargs_k_is_the_default_k_and_a_per_call_k_wins() -> None:
    r = filled(search_kwargs={"k": 2})
    assert len(r.invoke("note", user_id="ann")) == 2
    assert len(r.invoke("note", user_id="ann", k=5)) == 5


def test_a_filter_in_search_kwargs_narrows_the_users_results_and_never_widens_them() -> None:
    r = filled(search_kwargs={"k": 10, "filter": lambda doc: doc.metadata["kind"] == "a"})
    got = r.invoke("note", user_id="ann")
    assert len(got) == 3
    assert {d.metadata["kind"] for d in got} == {"a"}
    assert {d.metadata["user_id"] for d in got} == {"ann"}


class DictFilterStore(VectorStore):
    """Any store other than the in-memory one (Chroma, PGVector, ...): dict filters."""

    def add_texts(self, texts: Any, metadatas: Any = None, **kwargs: Any) -> list[str]:
        return []

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return []

    @classmethod
    def from_texts(cls, texts: Any, embedding: Any, metadatas: Any = None, **kw: Any) -> Any:
        return cls()


def test_a_dict_filter_is_anded_with_the_user_for_stores_like_chroma() -> None:
    store = DictFilterStore()
    assert default_filter(store, "user_id", "ann") == {"filter": {"user_id": "ann"}}
    assert default_filter(store, "user_id", "ann", {"kind": "a"}) == {
        "filter": {"$and": [{"user_id": "ann"}, {"kind": "a"}]}
    }
    with pytest.raises(ValueError, match="filter_builder"):
        default_filter(store, "user_id", "ann", lambda doc: True)


def test_score_threshold_keeps_only_results_scoring_at_least_it() -> None:
    everything = filled(config={"explain": "scores"}).invoke("ann note 1", user_id="ann", k=6)
    scores = [d.metadata["score"] for d in everything]
    # a threshold between two of the scores (they are non-increasing down the list)
    threshold = next((a + b) / 2 for a, b in itertools.pairwise(scores) if a > b)
    assert len(scores) == 6 and min(scores) < threshold <= max(scores)
    r = filled(config={"explain": "scores"}, search_kwargs={"score_threshold": threshold, "k": 6})
    got = r.invoke("ann note 1", user_id="ann")
    assert [d.metadata["score"] for d in got] == [s for s in scores if s >= threshold]
    assert {d.metadata["user_id"] for d in got} == {"ann"}


class ScoredStore(InMemoryVectorStore):
    """A store whose search by vector names a parameter of its own (as FAISS's ``fetch_k``)."""

    seen: ClassVar[list[int]] = []

    def similarity_search_with_score_by_vector(  # type: ignore[override]
        self, embedding: list[float], k: int = 4, filter: Any = None, fetch_k: int = 20
    ) -> list[tuple[Document, float]]:
        ScoredStore.seen.append(fetch_k)
        return super().similarity_search_with_score_by_vector(embedding, k=k, filter=filter)


@pytest.mark.parametrize(
    "kwargs",
    [{"fetch_k": 50}, {"lambda_mult": 0.5}, {"score_threshold": "high"}, {"k": 0}],
    ids=["fetch_k", "lambda_mult", "threshold-not-a-number", "k"],
)
def test_a_search_kwarg_the_store_cannot_honour_is_refused_at_construction(
    kwargs: dict[str, Any],
) -> None:
    with pytest.raises(ValidationError) as err:
        make(vectorstore=InMemoryVectorStore(EMB), search_kwargs=kwargs)
    (key,) = kwargs
    assert repr(key) in str(err.value) or key in str(err.value)


def test_a_search_kwarg_the_store_names_is_passed_to_it() -> None:
    r = make(vectorstore=ScoredStore(EMB), search_kwargs={"fetch_k": 50})
    r.add_documents([Document(page_content=f"note {i}") for i in range(3)], user_id="ann")
    ScoredStore.seen.clear()
    assert len(r.invoke("note", user_id="ann")) == 3
    assert ScoredStore.seen == [50]  # the store searched with it (a store argument: host search)


def test_search_kwargs_without_a_vector_store_are_refused() -> None:
    with pytest.raises(ValidationError, match="no vectorstore"):
        make(search_kwargs={"k": 2})


def _wrapped_models() -> dict[str, Any]:
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import ConfigurableField

    def chat() -> Any:
        return GenericFakeChatModel(messages=iter([AIMessage('["a note on running"]')] * 50))

    return {
        "with_retry": chat().with_retry(stop_after_attempt=2),
        "with_fallbacks": chat().with_fallbacks([chat()]),
        "bind": chat().bind(stop=["\n\n"]),
        "with_config": chat().with_config(tags=["pbr"]),
        "configurable_alternatives": chat().configurable_alternatives(
            ConfigurableField(id="llm"), other=chat()
        ),
    }


@pytest.mark.parametrize("kind", list(_wrapped_models()))
def test_an_llm_wrapped_in_a_runnable_is_used_as_it_is(kind: str) -> None:
    llm = _wrapped_models()[kind]
    r = PBRRetriever(
        llm=llm, embeddings=EMB, vectorstore=InMemoryVectorStore(EMB), config={"explain": "all"}
    )
    r.add_documents([Document(page_content=t) for t in ("runs daily", "likes tea")], user_id="a")
    docs = r.invoke("what do I do?", user_id="a")
    pbr = docs[0].metadata["pbr"]
    assert pbr["pseudo_utterances"] == ["a note on running"]  # the wrapped model answered


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_retriever_can_be_copied_and_pickled(how: str) -> None:
    import copy
    import pickle

    r = filled()
    before = [d.page_content for d in r.invoke("note", user_id="ann", k=3)]
    twin = copy.deepcopy(r) if how == "deepcopy" else pickle.loads(pickle.dumps(r))
    assert [d.page_content for d in twin.invoke("note", user_id="ann", k=3)] == before
    twin.add_documents([Document(page_content="only in the copy")], user_id="ann")
    assert len(r.invoke("note", user_id="ann", k=20)) == 6  # the original is untouched


def test_the_plain_fallback_stays_per_user_and_calls_no_llm() -> None:
    from langchain_core.runnables import RunnableLambda

    r = filled(config={"explain": "all"})

    def broken(_: Any) -> Any:
        raise RuntimeError("LLM down")

    failing = r.model_copy(update={"llm": RunnableLambda(broken), "strict": True})
    chain = failing.with_fallbacks([r.as_plain()])
    got = chain.invoke("note", user_id="ben")  # the user travels to the fallback
    assert got and {d.metadata["user_id"] for d in got} == {"ben"}
    assert got[0].metadata["pbr"]["used"] == ["query"]


def test_the_user_in_run_metadata_reaches_the_retriever_inside_compositions() -> None:
    from langchain_classic.retrievers import ContextualCompressionRetriever, MultiQueryRetriever
    from langchain_core.documents import BaseDocumentCompressor
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    class KeepTwo(BaseDocumentCompressor):
        def compress_documents(self, documents: Any, query: str, callbacks: Any = None) -> Any:
            return list(documents)[:2]

    r = filled()
    ccr = ContextualCompressionRetriever(base_compressor=KeepTwo(), base_retriever=r)
    got = ccr.invoke("note", config={"metadata": {"user_id": "ben"}})
    assert len(got) == 2 and {d.metadata["user_id"] for d in got} == {"ben"}
    queries = GenericFakeChatModel(messages=iter([AIMessage("ben notes\nben things")]))
    mqr = MultiQueryRetriever.from_llm(retriever=r, llm=queries)
    got = mqr.invoke("note", config={"metadata": {"user_id": "ann"}})
    assert got and {d.metadata["user_id"] for d in got} == {"ann"}
    with pytest.raises(ValueError, match="needs the user"):
        ccr.invoke("note")


def failing_copy(r: PBRRetriever) -> PBRRetriever:
    """``r`` with an LLM that always raises, in strict mode: every request fails."""
    from langchain_core.runnables import RunnableLambda

    def broken(_: Any) -> Any:
        raise RuntimeError("LLM down")

    return r.model_copy(update={"llm": RunnableLambda(broken), "strict": True})


def owners_and_terms(docs: list[Document]) -> tuple[set[str], set[tuple[str, ...]]]:
    return {d.metadata["user_id"] for d in docs}, {tuple(d.metadata["pbr"]["used"]) for d in docs}


PLAIN_FOR_BEN = ({"ben"}, {("query",)})


def test_fallbacks_and_as_plain_keep_the_per_request_user_in_both_forms() -> None:
    from langchain_core.runnables import ConfigurableField

    r = filled(config={"explain": "all"})
    failing = failing_copy(r)
    per_user = failing.configurable_fields(user_id=ConfigurableField(id="user_id"))
    ben = {"configurable": {"user_id": "ben"}}
    # the configurable form: the fallback gets the request's user, not the primary's error
    assert owners_and_terms(per_user.with_fallbacks([r.as_plain()]).invoke("q", ben)) == (
        PLAIN_FOR_BEN
    )
    assert owners_and_terms(per_user.with_fallbacks([per_user.as_plain()]).invoke("q", ben)) == (
        PLAIN_FOR_BEN
    )
    # per_user.as_plain() still takes the user per request, one per input in a batch
    plain = per_user.as_plain()
    assert owners_and_terms(plain.invoke("q", ben)) == PLAIN_FOR_BEN
    users = [{"configurable": {"user_id": u}} for u in ("ann", "ben")]
    assert [owners_and_terms(d)[0] for d in plain.batch(["q", "q"], users)] == [{"ann"}, {"ben"}]
    # the constructor form
    fixed = failing.model_copy(update={"user_id": "ben"})
    assert owners_and_terms(fixed.with_fallbacks([fixed.as_plain()]).invoke("q")) == PLAIN_FOR_BEN
    with pytest.raises(GenerationError):  # strict and no fallback: the primary's error
        per_user.invoke("q", ben)


def test_run_metadata_gives_the_user_in_chains_and_inside_every_wrapper() -> None:
    import asyncio

    from langchain_classic.retrievers import (
        ContextualCompressionRetriever,
        EnsembleRetriever,
        MultiQueryRetriever,
    )
    from langchain_core.documents import BaseDocumentCompressor
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnablePassthrough

    class KeepTwo(BaseDocumentCompressor):
        def compress_documents(self, documents: Any, query: str, callbacks: Any = None) -> Any:
            return list(documents)[:2]

    r = filled()
    ben: Any = {"metadata": {"user_id": "ben"}}  # the one way, the same in every line below
    queries = GenericFakeChatModel(messages=iter([AIMessage("ben notes\nben things")] * 2))
    compositions: dict[str, Any] = {
        "retriever": r,
        "chain": RunnablePassthrough() | r,
        "multi-query": MultiQueryRetriever.from_llm(retriever=r, llm=queries),
        "ensemble": EnsembleRetriever(retrievers=[r, r.as_plain()]),
        "compression": ContextualCompressionRetriever(base_compressor=KeepTwo(), base_retriever=r),
        "fallbacks": failing_copy(r).with_fallbacks([r.as_plain()]),
    }
    for name, runnable in compositions.items():
        got = runnable.invoke("note", config=ben)
        assert got and {d.metadata["user_id"] for d in got} == {"ben"}, name
    async_got = asyncio.run(compositions["multi-query"].ainvoke("note", config=ben))
    assert {d.metadata["user_id"] for d in async_got} == {"ben"}
    users = [{"metadata": {"user_id": u}} for u in ("ann", "ben")]
    assert [{d.metadata["user_id"] for d in ds} for ds in r.batch(["n", "n"], users)] == [
        {"ann"},
        {"ben"},
    ]
    with pytest.raises(ValueError, match="needs the user") as err:
        r.invoke("note")
    message = str(err.value)  # the error names the one way first
    assert message.index("{'metadata': {'user_id'") < message.index("user_id='alice')")


def test_a_configurable_user_reaches_a_retriever_without_configurable_fields() -> None:
    from langchain_core.runnables import RunnablePassthrough

    r = filled()
    ben: Any = {"configurable": {"user_id": "ben"}}
    assert {d.metadata["user_id"] for d in r.invoke("note", config=ben)} == {"ben"}
    assert {d.metadata["user_id"] for d in (RunnablePassthrough() | r).invoke("n", ben)} == {"ben"}
    assert {d.metadata["user_id"] for d in r.invoke("note", config=ben, user_id="ann")} == {"ann"}


def test_a_request_whose_sources_name_two_users_is_refused_not_answered_for_one() -> None:
    """The retriever's user_id, the run's ``configurable`` and its metadata must agree; the
    per-call ``user_id=`` chooses (before, the field silently won over a request naming
    another user, and ``configurable`` over the metadata: one user's notes answered another's
    request)."""
    r = filled()
    fixed = r.model_copy(update={"user_id": "ann"})
    ben: Any = {"configurable": {"user_id": "ben"}}
    with pytest.raises(ValueError, match=r"more than one user.*'ann'.*'ben'"):
        fixed.invoke("note", config=ben)
    with pytest.raises(ValueError, match="more than one user"):
        fixed.invoke("note", config={"metadata": {"user_id": "ben"}})
    with pytest.raises(ValueError, match="more than one user"):
        r.invoke(
            "note", config={"configurable": {"user_id": "ann"}, "metadata": {"user_id": "ben"}}
        )
    assert {d.metadata["user_id"] for d in fixed.invoke("note", config=ben, user_id="ben")} == {
        "ben"
    }
    agreeing: Any = {"configurable": {"user_id": "ann"}, "metadata": {"user_id": "ann"}}
    assert {d.metadata["user_id"] for d in fixed.invoke("note", config=agreeing)} == {"ann"}


class HungChat(BaseChatModel):
    """A chat model with sync code only, stuck until released."""

    release: Any = None
    threads: list[str] = Field(default_factory=list)  # where each call ran

    @property
    def _llm_type(self) -> str:
        return "hung"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        import threading

        from langchain_core.messages import AIMessage
        from langchain_core.outputs import ChatGeneration, ChatResult

        self.threads.append(threading.current_thread().name)
        self.release.wait(30)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content='["late"]'))])


async def test_hung_sync_llms_under_asyncio_leave_the_default_executor_free() -> None:
    import asyncio
    import threading

    from pbr_core import PBRConfig

    release = threading.Event()
    hung = HungChat(release=release)
    r = PBRRetriever(
        llm=hung,
        embeddings=EMB,
        vectorstore=InMemoryVectorStore(EMB),
        config=PBRConfig(llm_timeout_s=0.3, pre_gate=None, explain="all"),
    )
    r.add_documents([Document(page_content=t) for t in ("runs", "tea", "jazz")], user_id="a")
    try:
        results = await asyncio.gather(*(r.ainvoke("what?", user_id="a") for _ in range(8)))
        assert all(d[0].metadata["pbr"]["degraded"] for d in results)
        assert "timed out" in results[0][0].metadata["pbr"]["missing"]["utterances"]
        # 16 hung calls, none in asyncio's default executor (6 threads on 2 cores): it still
        # serves an unrelated task at once.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), timeout=2.0) == 42
        assert hung.threads and not any(name.startswith("asyncio") for name in hung.threads)
    finally:
        release.set()


def test_loading_with_an_embedder_of_another_dimension_fails_at_load(tmp_path: Any) -> None:
    from pbr_core import PersistenceError

    r = make()
    r.add_documents([Document(page_content=t) for t in ("runs", "tea")], user_id="a")
    r.save(tmp_path / "pbr")
    with pytest.raises(PersistenceError, match="dimension 16"):
        PBRRetriever.load(tmp_path / "pbr", embeddings=DeterministicFakeEmbedding(size=8))
    loaded = PBRRetriever.load(tmp_path / "pbr", embeddings=EMB, llm=FakeListLLM(responses=["x"]))
    assert len(loaded.invoke("q", user_id="a")) == 2


def test_explain_first_puts_one_copy_of_the_explanation_on_the_top_document() -> None:
    docs = filled(config={"explain": "first"}).invoke("note", user_id="ann", k=5)
    assert "pbr" in docs[0].metadata and not any("pbr" in d.metadata for d in docs[1:])
    assert all("score" in d.metadata and "pbr_search" in d.metadata for d in docs)
    full = filled(config={"explain": "all"}).invoke("note", user_id="ann", k=5)
    size = [len(json.dumps([d.metadata for d in ds], default=str)) for ds in (docs, full)]
    assert size[0] < size[1] / 2


class Events(BaseCallbackHandler):
    """The custom events of the requests it sees: name -> data."""

    def __init__(self) -> None:
        self.got: dict[str, Any] = {}

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.got[name] = data


def long_notes(user: str) -> list[Document]:
    """Ten notes of ~900 characters, like the issue's (a chunked document)."""
    return [
        Document(page_content=f"{user} note {i}: " + "walked the dog by the river " * 32)
        for i in range(10)
    ]


def test_results_are_the_stored_documents_and_the_explanation_goes_to_callbacks() -> None:
    r = make(vectorstore=InMemoryVectorStore(EMB), k=10)
    r.add_documents(long_notes("ann"), user_id="ann", ids=[f"n{i}" for i in range(10)])
    events = Events()
    docs = r.invoke("the dog?", user_id="ann", config={"callbacks": [events]})
    assert len(docs) == 10
    assert all(d.metadata == {"user_id": "ann"} for d in docs)  # as stored, nothing per query
    # the whole explanation and every result's scores reach the callbacks, once per request
    assert set(events.got) >= {"pbr.anchor", "pbr.pseudo_utterances", "pbr.fusion", "pbr.results"}
    rows = events.got["pbr.results"]["results"]
    assert [row["id"] for row in rows] == [d.id for d in docs]
    assert all({"score", "store_score", "pbr_search"} <= set(row) for row in rows)
    assert {"trust", "llm_calls", "degraded"} <= set(events.got["pbr.fusion"])
    # and on request, on the documents
    explained = r.model_copy(update={"config": r.config.with_(explain="all")})
    full = explained.invoke("the dog?", user_id="ann")
    assert all("pbr" in d.metadata and "score" in d.metadata for d in full)
    size = [len(json.dumps([d.metadata for d in ds], default=str)) for ds in (docs, full)]
    assert size[0] < 300 < 20_000 < size[1]


def test_a_huge_query_is_never_copied_into_results_or_events() -> None:
    r = filled(config={"explain": "all"})
    events = Events()
    query = "note " * 200_000  # 1 MB
    docs = r.invoke(query, user_id="ann", k=5, config={"callbacks": [events]})
    metadata = len(json.dumps([d.metadata for d in docs], default=str))
    assert metadata < 5 * 4_000  # the explanation shows the query's first 1000 characters, not 1 MB
    assert all(len(data["query"]) <= 1000 for data in events.got.values())
    plain = filled().invoke(query, user_id="ann", k=5)
    assert len(json.dumps([d.metadata for d in plain])) < 200


def multi_query_over(r: PBRRetriever) -> list[Document]:
    from langchain_classic.retrievers import MultiQueryRetriever
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    queries = GenericFakeChatModel(messages=iter([AIMessage("ann notes\nann things\nnote")]))
    got = MultiQueryRetriever.from_llm(retriever=r, llm=queries).invoke(
        "note", config={"metadata": {"user_id": "ann"}}
    )
    assert {d.metadata["user_id"] for d in got} == {"ann"}
    return got


def test_multi_query_retriever_returns_each_item_once_without_settings() -> None:
    got = multi_query_over(filled())
    assert len(got) == len({d.id for d in got})  # 4 per query (of 6 notes), each note once
    # per-result annotations, asked for, keep the copies of one item apart (LangChain's merge
    # is by Document equality): the default is what makes it work
    annotated = multi_query_over(filled(config={"explain": "scores"}))
    assert len(annotated) > len({d.id for d in annotated})


def test_ensemble_retriever_merges_the_personalized_and_plain_results_into_stored_documents() -> (
    None
):
    from langchain_classic.retrievers import EnsembleRetriever

    r = filled()
    ensemble = EnsembleRetriever(retrievers=[r, r.as_plain()], weights=[0.5, 0.5])
    got = ensemble.invoke("note", config={"metadata": {"user_id": "ben"}})
    assert len(got) == len({d.page_content for d in got}) == 4
    assert all(
        d.metadata["user_id"] == "ben" and set(d.metadata) == {"user_id", "kind"} for d in got
    )
    by_id = EnsembleRetriever(retrievers=[r, r.as_plain()], id_key="kind")  # one per kind
    assert len(by_id.invoke("note", config={"metadata": {"user_id": "ben"}})) == 2


def test_a_store_or_owner_key_chosen_per_request_is_the_one_searched() -> None:
    """A configured copy (``configurable_fields``) was given its default's corpus, built over
    the default's store and owner key: a per-tenant store answered from the other tenant's
    store, and a per-request ``user_key`` returned a document whose owner under it is another
    user (from a review)."""
    from langchain_core.runnables import ConfigurableField

    alice = {"metadata": {"user_id": "alice"}}
    store_a, store_b = InMemoryVectorStore(EMB), InMemoryVectorStore(EMB)
    store_a.add_documents([Document("tenant A: alice likes pasta", metadata={"user_id": "alice"})])
    store_b.add_documents([Document("tenant B: alice likes sushi", metadata={"user_id": "alice"})])
    llm = FakeListLLM(responses=["x"] * 20)
    per_tenant = PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store_a).configurable_fields(
        vectorstore=ConfigurableField(id="store")
    )
    got = per_tenant.invoke("alice", config={**alice, "configurable": {"store": store_b}})
    assert [d.page_content for d in got] == ["tenant B: alice likes sushi"]
    got = per_tenant.invoke("alice", config=alice)
    assert [d.page_content for d in got] == ["tenant A: alice likes pasta"]

    shared = InMemoryVectorStore(EMB)
    shared.add_documents(
        [
            Document("bob's pin is 4321", metadata={"owner": "bob", "user_id": "alice"}),
            Document("alice's note", metadata={"owner": "alice"}),
        ]
    )
    per_key = PBRRetriever(llm=llm, embeddings=EMB, vectorstore=shared).configurable_fields(
        user_key=ConfigurableField(id="user_key")
    )
    got = per_key.invoke("pin", config={**alice, "configurable": {"user_key": "owner"}})
    assert [d.page_content for d in got] == ["alice's note"]


def test_a_corpus_given_over_another_store_key_or_embeddings_is_refused() -> None:
    from langchain_pbr.stores import host_records
    from pbr_core.corpus import Corpus

    store, other = InMemoryVectorStore(EMB), InMemoryVectorStore(EMB)
    llm = FakeListLLM(responses=["x"])
    fine = Corpus(host_records(store, "user_id"), embedder=EMB)
    assert PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store, corpus=fine).corpus is fine
    for corpus, says in (
        (Corpus(host_records(other, "user_id"), embedder=EMB), "another vector store"),
        (Corpus(host_records(store, "owner"), embedder=EMB, user_key="owner"), "keeps the owner"),
        (Corpus(host_records(store, "user_id")), "another model"),
    ):
        with pytest.raises(ValidationError, match=says):
            PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store, corpus=corpus)


def test_a_corpus_another_retriever_built_is_shared_or_refused_never_swapped() -> None:
    """Given another retriever's corpus over another store, a retriever silently built one of
    its own (the rule meant for configured copies): sharing looked done and was not (from a
    review). Over the same store it is shared; over another, refused."""
    store, other = InMemoryVectorStore(EMB), InMemoryVectorStore(EMB)
    llm = FakeListLLM(responses=["x"])
    first = PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store)
    shared = PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store, corpus=first.corpus)
    assert shared.corpus is first.corpus
    with pytest.raises(ValidationError, match="another vector store"):
        PBRRetriever(llm=llm, embeddings=EMB, vectorstore=other, corpus=first.corpus)


def test_search_kwargs_k_is_read_as_k_and_a_configured_k_applies() -> None:
    """``search_kwargs["k"]`` overrode ``k`` silently, a configured ``k`` too (from a review):
    it is read as ``k``, refused where it disagrees with a ``k`` given too."""
    from langchain_core.runnables import ConfigurableField

    store = InMemoryVectorStore(EMB)
    store.add_documents([Document(f"note {i}", metadata={"user_id": "ann"}) for i in range(8)])
    llm = FakeListLLM(responses=["x"] * 20)
    r = PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store, search_kwargs={"k": 2})
    assert r.k == 2 and len(r.invoke("note", user_id="ann")) == 2
    per_k = r.configurable_fields(k=ConfigurableField(id="k"))
    assert len(per_k.invoke("note", config={"configurable": {"user_id": "ann", "k": 6}})) == 6
    with pytest.raises(ValidationError, match=r"k=5 and search_kwargs\['k'\]=2 disagree"):
        PBRRetriever(llm=llm, embeddings=EMB, vectorstore=store, k=5, search_kwargs={"k": 2})
