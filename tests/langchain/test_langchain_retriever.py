"""PBRRetriever: behaviour with fakes (deterministic embeddings, scripted chat models)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, FakeEmbeddings
from langchain_core.language_models import BaseChatModel, FakeListLLM, ParrotFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import ConfigurableField, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from pydantic import Field, ValidationError

from langchain_pbr import LocalGemmaChatModel, PBRRetriever
from pbr_core import (
    GenerationCache,
    GenerationError,
    PBRConfig,
    PersistenceError,
    UnknownUserError,
)
from pbr_core.corpus import scoped_key

EMB = DeterministicFakeEmbedding(size=64)
ALICE = [
    "I cooked a lentil curry for my vegetarian book club on Sunday.",
    "My sister Ana visits in May; she is allergic to peanuts.",
    "Looking for a quiet vegan place near the river for lunch.",
    "Started marathon training: long run every Saturday morning.",
    "Bought a cast iron pan, seasoning it with flaxseed oil.",
]
BOB = [
    "Changed the oil of my 1998 Miata, the gearbox still whines.",
    "Fantasy football: I drafted two running backs in the first round.",
    "Looking for a cheap steakhouse for my brother's birthday.",
    "Our server rack needs a new UPS battery before winter.",
    "Watching the Monaco Grand Prix at my uncle's place.",
]
OWN = {"alice": set(ALICE), "bob": set(BOB)}
# What a chat model following PBR's chat prompts answers (one answer serves both calls).
ANSWER = json.dumps(
    {"candidates": ["I want something vegetarian and quick tonight", "Ana cannot eat peanuts"]}
)


class InFlight:
    """Counts calls running at the same time (to see that the two LLM calls overlap)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


class ScriptedChat(BaseChatModel):
    """A fake chat model: a fixed answer, a failure when the prompt contains ``fail_on``."""

    answer: str = ANSWER
    fail_on: str | None = None
    delay: float = 0.0
    in_flight: InFlight | None = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        if self.fail_on is not None and self.fail_on in messages[-1].text:
            raise RuntimeError("model overloaded")
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self.answer))])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if self.in_flight is not None:
            self.in_flight.enter()
        try:
            time.sleep(self.delay)
            return self._reply(messages)
        finally:
            if self.in_flight is not None:
                self.in_flight.leave()

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if self.in_flight is not None:
            self.in_flight.enter()
        try:
            await asyncio.sleep(self.delay)
            return self._reply(messages)
        finally:
            if self.in_flight is not None:
                self.in_flight.leave()


class Recorder(BaseCallbackHandler):
    """Records the runs and custom events of a request."""

    def __init__(self) -> None:
        self.retriever_runs: list[UUID] = []
        self.retriever_metadata: list[dict[str, Any]] = []
        self.llm_parents: list[UUID | None] = []
        self.llm_prompts: list[str] = []
        self.events: list[tuple[str, Any, UUID]] = []

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: UUID, metadata: Any = None, **kw: Any
    ) -> None:
        self.retriever_runs.append(run_id)
        self.retriever_metadata.append(dict(metadata or {}))

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kw: Any,
    ) -> None:
        self.llm_parents.append(parent_run_id)
        self.llm_prompts.append(messages[0][-1].text)

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        self.events.append((name, data, run_id))


def corpus() -> list[Document]:
    return [
        Document(page_content=text, metadata={"user_id": user, "n": i})
        for user, texts in (("alice", ALICE), ("bob", BOB))
        for i, text in enumerate(texts)
    ]


def make(store: bool = False, **kwargs: Any) -> PBRRetriever:
    """A retriever over both users' histories, searching the history or an InMemoryVectorStore."""
    params: dict[str, Any] = {
        "llm": ScriptedChat(),
        "embeddings": EMB,
        "k": 3,
        # the paper's fusion: these tests check every term's plumbing; hash vectors are nearly
        # orthogonal to the query, so the default "safe" fusion would (rightly) drop them all
        # explain="all": these tests read the explanation off the documents (the default puts
        # it in the request's events only)
        "config": PBRConfig(fusion="paper", explain="all"),
        **kwargs,
    }
    if store:
        params.setdefault("vectorstore", InMemoryVectorStore(EMB))
    return PBRRetriever.from_documents(corpus(), **params)


def per_user(retriever: PBRRetriever) -> Any:
    return retriever.configurable_fields(user_id=ConfigurableField(id="user_id"))


def cfg(user: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"user_id": user}, **extra}


def assert_own(docs: list[Document], user: str) -> None:
    assert docs, f"no documents for {user}"
    for doc in docs:
        assert doc.page_content in OWN[user], f"{user} got {doc.page_content!r}"
        assert doc.metadata["user_id"] == user
        if "pbr" in doc.metadata:  # explain="all": the explanation is the user's too
            related = [item["text"] for item in doc.metadata["pbr"]["related"]]
            assert set(related) <= OWN[user]
            assert doc.metadata["pbr"]["user_id"] == user


BOTH_PATHS = pytest.mark.parametrize("store", [False, True], ids=["history-index", "vectorstore"])


# -- the package ---------------------------------------------------------------------------------
def test_is_a_langchain_retriever() -> None:
    assert issubclass(PBRRetriever, BaseRetriever)


# -- per-request user and isolation --------------------------------------------------------------
@BOTH_PATHS
def test_two_users_back_to_back_sync(store: bool) -> None:
    r = make(store)
    for user in ("alice", "bob", "alice", "bob"):
        assert_own(r.invoke("where should we eat tonight?", user_id=user), user)
    configured = per_user(r)
    for user in ("bob", "alice"):
        assert_own(configured.invoke("where should we eat?", config=cfg(user)), user)


@BOTH_PATHS
async def test_two_users_back_to_back_async_and_interleaved(store: bool) -> None:
    r = make(store, llm=ScriptedChat(delay=0.01))
    configured = per_user(r)
    users = ["alice", "bob"] * 4
    results = await asyncio.gather(
        *(configured.ainvoke("where should we eat?", config=cfg(u)) for u in users)
    )
    for user, docs in zip(users, results):
        assert_own(docs, user)
    assert_own(await r.ainvoke("dinner plans", user_id="bob"), "bob")


@BOTH_PATHS
def test_batch_with_a_user_per_input(store: bool) -> None:
    configured = per_user(make(store))
    users = ["alice", "bob", "bob", "alice"]
    results = configured.batch(["dinner?"] * 4, config=[cfg(u) for u in users])
    for user, docs in zip(users, results):
        assert_own(docs, user)


@BOTH_PATHS
async def test_abatch_with_a_user_per_input(store: bool) -> None:
    configured = per_user(make(store))
    users = ["bob", "alice", "alice", "bob"]
    results = await configured.abatch(
        ["dinner?"] * 4, config=[cfg(u, max_concurrency=4) for u in users]
    )
    for user, docs in zip(users, results):
        assert_own(docs, user)


def test_missing_user_names_both_ways() -> None:
    r = make()
    with pytest.raises(ValueError) as err:
        r.invoke("dinner?")
    assert "invoke(query, user_id=" in str(err.value)
    assert "{'configurable': {'user_id'" in str(err.value)
    assert "{'metadata': {'user_id'" in str(err.value)
    with pytest.raises(ValueError, match="user_id="):
        per_user(r).invoke("dinner?")


def test_fixed_user_field_and_k_kwarg() -> None:
    r = PBRRetriever(llm=ScriptedChat(), embeddings=EMB, history=make().history, user_id="bob")
    assert r.k == 4
    assert len(r.invoke("cars")) == 4
    docs = r.invoke("cars", k=2)
    assert len(docs) == 2
    assert_own(docs, "bob")
    assert_own(r.invoke("cars", user_id="alice"), "alice")  # the kwarg wins over the field
    single = PBRRetriever.from_documents(
        [Document(page_content=t) for t in ALICE], user_id="alice", embeddings=EMB
    )
    assert single.user_id == "alice" and single.history.users() == ["alice"]


def test_k_larger_than_the_history_returns_all_of_it() -> None:
    assert len(make().invoke("anything", user_id="alice", k=50)) == len(ALICE)


def test_bad_arguments_are_refused_clearly() -> None:
    r = make()
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        r.invoke("q", user_id="alice", k=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*filter"):
        r.invoke("q", user_id="alice", filter={"user_id": "bob"})
    with pytest.raises(ValueError, match="filters with a callable"):  # at construction
        PBRRetriever(
            embeddings=EMB, vectorstore=InMemoryVectorStore(EMB), search_kwargs={"filter": {"n": 1}}
        )
    for k in (0, True, 2.0):  # one rule for k, whether given at construction or per request
        with pytest.raises(ValidationError, match="k must be an integer >= 1"):
            PBRRetriever(embeddings=EMB, k=k)
        with pytest.raises(ValueError, match="k must be an integer >= 1"):
            r.invoke("q", user_id="alice", k=k)


# -- results -------------------------------------------------------------------------------------
@BOTH_PATHS
def test_documents_carry_score_and_explanation(store: bool) -> None:
    docs = make(store).invoke("where should we eat tonight?", user_id="alice")
    scores = [d.metadata["score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)
    pbr = docs[0].metadata["pbr"]
    assert pbr["used"] == ["query", "anchor", "utterances", "reasoning"]
    assert pbr["pseudo_utterances"] == json.loads(ANSWER)["candidates"]
    assert pbr["w1"] is not None and pbr["w2"] is not None
    assert len(pbr["anchor_items"]) == 3
    assert pbr["degraded"] is False and pbr["missing"] == {}
    assert "search" in pbr["timings_ms"]
    assert docs[0].metadata["user_id"] == "alice" and "n" in docs[0].metadata
    json.dumps([d.metadata for d in docs])  # JSON-ready


def test_plain_fusion_makes_no_llm_call() -> None:
    rec = Recorder()
    docs = make(config={"fusion": "plain", "explain": "all"}).invoke(
        "dinner", user_id="alice", config={"callbacks": [rec]}
    )
    assert rec.llm_parents == []
    assert docs[0].metadata["pbr"]["used"] == ["query"]
    assert docs[0].metadata["pbr"]["degraded"] is False


def test_config_is_validated() -> None:
    assert make(config=PBRConfig(k1=2)).config.k1 == 2
    with pytest.raises(ValidationError, match="k1 must be an integer >= 1"):
        PBRRetriever(config={"k1": 0})


# -- callbacks and events ------------------------------------------------------------------------
def test_llm_runs_and_events_are_children_of_the_retriever_run() -> None:
    rec = Recorder()
    per_user(make(store=True)).invoke("dinner?", config=cfg("alice", callbacks=[rec]))
    (run_id,) = rec.retriever_runs
    assert rec.llm_parents == [run_id, run_id]
    names = [name for name, _, _ in rec.events]
    assert names == [
        "pbr.anchor",
        "pbr.pseudo_utterances",
        "pbr.reasoning",
        "pbr.fusion",
        "pbr.results",
    ]
    assert {rid for _, _, rid in rec.events} == {run_id}
    meta = rec.retriever_metadata[0]
    assert meta["ls_retriever_name"] == "pbr"
    assert meta["ls_vector_store_provider"] == "InMemoryVectorStore"
    assert meta["ls_embedding_provider"] == "DeterministicFakeEmbedding"


async def test_async_llm_runs_are_children_and_concurrent() -> None:
    rec, flight = Recorder(), InFlight()
    r = make(llm=ScriptedChat(delay=0.05, in_flight=flight))
    await r.ainvoke("dinner?", user_id="alice", config={"callbacks": [rec]})
    (run_id,) = rec.retriever_runs
    assert rec.llm_parents == [run_id, run_id]
    assert flight.peak == 2


def test_sync_llm_calls_are_concurrent() -> None:
    flight = InFlight()
    make(llm=ScriptedChat(delay=0.05, in_flight=flight)).invoke("dinner?", user_id="alice")
    assert flight.peak == 2


async def test_astream_events_shows_the_personalization() -> None:
    configured = per_user(make(store=True))
    events = [
        e async for e in configured.astream_events("dinner?", version="v2", config=cfg("alice"))
    ]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "on_retriever_start" and kinds[-1] == "on_retriever_end"
    retriever_run = events[0]["run_id"]
    llm_starts = [e for e in events if e["event"] == "on_chat_model_start"]
    assert len(llm_starts) == 2
    assert all(retriever_run in e["parent_ids"] for e in llm_starts)
    custom = {e["name"]: e["data"] for e in events if e["event"] == "on_custom_event"}
    assert set(custom) == {
        "pbr.anchor",
        "pbr.pseudo_utterances",
        "pbr.reasoning",
        "pbr.fusion",
        "pbr.results",
    }
    assert custom["pbr.pseudo_utterances"]["pseudo_utterances"] == json.loads(ANSWER)["candidates"]
    assert custom["pbr.reasoning"]["reasoning"]
    assert custom["pbr.fusion"]["w1"] is not None
    assert {i["text"] for i in custom["pbr.anchor"]["anchor_items"]} <= OWN["alice"]
    assert all(d["user_id"] == "alice" for d in custom.values())


# -- LCEL ----------------------------------------------------------------------------------------
def format_docs(docs: list[Document]) -> str:
    return "\n".join(d.page_content for d in docs)


def test_in_an_lcel_chain_per_user() -> None:
    prompt = PromptTemplate.from_template("Context:\n{context}\n\nAnswer for the user.")
    chain = per_user(make(store=True)) | format_docs | prompt | ParrotFakeChatModel()
    for user, other in (("alice", "bob"), ("bob", "alice")):
        answer = chain.invoke("where should we eat?", config=cfg(user)).text
        assert any(text in answer for text in OWN[user])
        assert not any(text in answer for text in OWN[other])
    rag = {
        "context": per_user(make()) | format_docs,
        "question": RunnablePassthrough(),
    } | PromptTemplate.from_template("{context}\nQ: {question}")
    outs = rag.batch(["dinner?", "dinner?"], config=[cfg("bob"), cfg("alice")])
    assert any(t in outs[0].to_string() for t in BOB)
    assert not any(t in outs[0].to_string() for t in ALICE)
    assert any(t in outs[1].to_string() for t in ALICE)


# -- degraded and strict -------------------------------------------------------------------------
def test_llm_failure_degrades_to_fewer_terms() -> None:
    rec = Recorder()
    # The chat reasoning prompt asks to "Work through the question": only that call fails.
    r = make(llm=ScriptedChat(fail_on="Work through"))
    docs = r.invoke("dinner?", user_id="alice", config={"callbacks": [rec]})
    assert len(docs) == 3
    pbr = docs[0].metadata["pbr"]
    assert pbr["used"] == ["query", "anchor", "utterances"]
    assert pbr["degraded"] is True
    assert "RuntimeError: model overloaded" in pbr["missing"]["reasoning"]
    degraded = [data for name, data, _ in rec.events if name == "pbr.degraded"]
    assert degraded == [{"user_id": "alice", "query": "dinner?", "missing": pbr["missing"]}]


async def test_unparseable_answers_degrade_async() -> None:
    docs = await make(llm=ScriptedChat(answer="Sure!")).ainvoke("dinner?", user_id="bob")
    pbr = docs[0].metadata["pbr"]
    assert set(pbr["missing"]) == {"utterances"}
    assert pbr["used"] == ["query", "anchor", "reasoning"]
    assert_own(docs, "bob")


def test_strict_mode_raises() -> None:
    with pytest.raises(GenerationError, match="model overloaded"):
        make(llm=ScriptedChat(fail_on="Work through"), strict=True).invoke("q", user_id="alice")
    with pytest.raises(GenerationError, match="utterances"):
        make(llm=ScriptedChat(answer="Sure!"), strict=True).invoke("q", user_id="alice")
    with pytest.raises(UnknownUserError, match="add_documents"):
        make(strict=True).invoke("q", user_id="carol")


async def test_strict_mode_raises_async() -> None:
    with pytest.raises(GenerationError):
        await make(llm=ScriptedChat(fail_on="JSON"), strict=True).ainvoke("q", user_id="bob")


def test_a_user_without_history_gets_the_plain_query() -> None:
    rec = Recorder()
    r = make(store=True)
    docs = r.invoke("notes", user_id="eve", config={"callbacks": [rec]})
    assert docs == []
    assert rec.llm_parents == []
    assert make().invoke("notes", user_id="eve") == []


def test_documents_added_through_the_store_itself_are_the_users_history() -> None:
    # The host store is the truth: a document tagged with its owner, written by anyone, is
    # part of that user's history at the next query (no re-adding through pbr).
    r = make(store=True)
    stranger = Document(page_content="Orphan note in the shared store", metadata={"user_id": "eve"})
    r.vectorstore.add_documents([stranger])  # type: ignore[union-attr]
    docs = r.invoke("notes", user_id="eve")
    assert [d.page_content for d in docs] == [stranger.page_content]
    assert [h["text"] for h in docs[0].metadata["pbr"]["related"]] == [stranger.page_content]
    assert "anchor needs 2" in docs[0].metadata["pbr"]["missing"]["anchor"]


# -- prompts -------------------------------------------------------------------------------------
def test_prompts_are_replaceable_templates() -> None:
    rec = Recorder()
    utter = PromptTemplate.from_template(
        'Past: {history}\nNow: {query}\n{m} lines as {{"candidates": [...]}} for {who}',
        partial_variables={"who": "a cook"},
    )
    reason = PromptTemplate.from_template("Why {query}? {history}", template_format="f-string")
    r = make(utterances_prompt=utter, reasoning_prompt=reason, config={"num_utterances": 4})
    r.invoke("dinner {tonight}?", user_id="alice", config={"callbacks": [rec]})
    sent = sorted(rec.llm_prompts)
    assert sent[0].startswith("Past: - ")
    assert 'Now: dinner {tonight}?\n4 lines as {"candidates": [...]} for a cook' in sent[0]
    assert sent[1].startswith("Why dinner {tonight}?? - ")
    assert sum(text in sent[0] for text in ALICE) >= 3
    assert [p.template for p in r.get_prompts()][1] == "Why {query}? {history}"


def test_mustache_templates_work_too() -> None:
    rec = Recorder()
    utter = PromptTemplate.from_template(
        "History:\n{{history}}\nQuery: {{query}} {json}", template_format="mustache"
    )
    make(utterances_prompt=utter).invoke("pasta?", user_id="bob", config={"callbacks": [rec]})
    assert any(
        p.startswith("History:\n- ") and p.endswith("Query: pasta? {json}") for p in rec.llm_prompts
    )


def test_a_prompt_without_history_or_with_unknown_variables_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"lacks \['history'\]"):
        PBRRetriever(utterances_prompt=PromptTemplate.from_template("{query}"))
    with pytest.raises(ValidationError, match=r"unknown variable\(s\) \['mood'\]"):
        PBRRetriever(reasoning_prompt=PromptTemplate.from_template("{history}{query}{mood}"))


def test_default_prompts_follow_the_llm_prompt_style() -> None:
    chat = PBRRetriever(llm=ParrotFakeChatModel()).get_prompts()
    assert "JSON" in chat[0].template
    completion = PBRRetriever(llm=LocalGemmaChatModel()).get_prompts()  # nothing is loaded
    assert all(p.template.endswith("1.") for p in completion)
    forced = PBRRetriever(llm=ParrotFakeChatModel(), prompt_style="completion").get_prompts()
    assert forced[0].template == completion[0].template


def test_a_text_completion_model_gets_the_numbered_list_prompts_as_in_llamaindex() -> None:
    # LangChain's BaseLLM is what LlamaIndex calls is_chat_model=False: the same default
    text_model = FakeListLLM(responses=["1. a"])
    prompts = PBRRetriever(llm=text_model).get_prompts()
    assert all(p.template.endswith("1.") for p in prompts)
    assert all(
        p.template.endswith("1.")
        for p in PBRRetriever(llm=text_model | StrOutputParser()).get_prompts()
    )
    chat = PBRRetriever(llm=text_model, prompt_style="chat").get_prompts()
    assert "JSON" in chat[0].template


# -- history management --------------------------------------------------------------------------
def test_add_and_delete_keep_history_and_store_in_step() -> None:
    store = InMemoryVectorStore(EMB)
    r = PBRRetriever(llm=ScriptedChat(), embeddings=EMB, vectorstore=store, k=10)
    docs = [Document(page_content=t) for t in ALICE]
    ids = r.add_documents(docs, user_id="alice")
    assert all("user_id" not in d.metadata for d in docs)  # the caller's documents are untouched
    keys = [scoped_key("alice", i) for i in ids]  # the store's keys are scoped to the user
    assert store.get_by_ids(keys[:1])[0].metadata["user_id"] == "alice"
    r.delete(ids[:2], user_id="alice")
    found = r.invoke("food", user_id="alice")
    assert {d.page_content for d in found} == set(ALICE[2:])
    assert store.get_by_ids(keys[:2]) == []
    assert len(r.history.get("alice")) == 3
    with pytest.raises(KeyError, match="no item"):
        r.delete(["nope"], user_id="alice")


async def test_async_add_and_delete() -> None:
    store = InMemoryVectorStore(EMB)
    r = await PBRRetriever.afrom_documents(
        corpus(), llm=ScriptedChat(), embeddings=EMB, vectorstore=store, k=10
    )
    ids = await r.aadd_documents(
        [Document(page_content="Bob's new note on tyres", id="tyres")], user_id="bob"
    )
    assert ids == ["tyres"]
    found = await r.ainvoke("q", user_id="bob")
    assert "Bob's new note on tyres" in {d.page_content for d in found}
    await r.adelete(["tyres"], user_id="bob")
    assert_own(await r.ainvoke("q", user_id="bob"), "bob")
    assert len(r.history.get("bob")) == len(BOB)


def test_existing_store_plus_history_documents() -> None:
    store = InMemoryVectorStore(EMB)
    store.add_documents(corpus())  # already tagged with user_id
    r = PBRRetriever(llm=ScriptedChat(), embeddings=EMB, vectorstore=store, k=10)
    for user in ("alice", "bob"):
        mine = [d for d in corpus() if d.metadata["user_id"] == user]
        r.add_documents(mine, user_id=user, add_to_vectorstore=False)
    assert len(store.store) == len(ALICE) + len(BOB)
    assert_own(r.invoke("q", user_id="bob"), "bob")


def test_a_key_of_another_users_record_cannot_be_claimed_as_already_in_the_store() -> None:
    """Over a store that lists, records added as already in the store are not recorded (the
    store is the truth, listed on the next read), so the ids given never become the user's
    keys: another user's key (a scoped key is derivable) cannot be claimed, then overwritten
    or deleted."""
    store = InMemoryVectorStore(EMB)
    r = PBRRetriever(llm=ScriptedChat(), embeddings=EMB, vectorstore=store, k=10)
    r.add_documents([Document(page_content="bob's bank pin is 4321")], user_id="bob", ids=["pin"])
    bobs = scoped_key("bob", "pin")
    r.add_documents(
        [Document(page_content="x")], user_id="mallory", ids=[bobs], add_to_vectorstore=False
    )
    r.add_documents([Document(page_content="mallory was here")], user_id="mallory", ids=[bobs])
    assert store.store[bobs]["text"] == "bob's bank pin is 4321"
    assert [d.page_content for d in r.invoke("pin", user_id="mallory")] == ["mallory was here"]
    r.delete([bobs], user_id="mallory")  # her item of that id, under her own key
    assert [d.page_content for d in r.invoke("pin", user_id="bob")] == ["bob's bank pin is 4321"]


def test_documents_of_another_user_are_refused() -> None:
    r = PBRRetriever(llm=ScriptedChat(), embeddings=EMB)
    with pytest.raises(ValueError, match="belongs to user 'bob'"):
        r.add_documents([Document(page_content="x", metadata={"user_id": "bob"})], user_id="alice")
    with pytest.raises(ValueError, match="document 0 has no 'user_id' metadata"):
        PBRRetriever.from_documents([Document(page_content="x")], embeddings=EMB)


def test_from_documents_user_id_tags_only_the_documents_that_name_no_user() -> None:
    docs = [
        Document(page_content="alice runs marathons"),
        Document(page_content="alice swims", metadata={"user_id": None}),  # names no user
        Document(page_content="bob plays jazz", metadata={"user_id": "bob"}),
    ]
    r = PBRRetriever.from_documents(docs, user_id="alice", llm=ScriptedChat(), embeddings=EMB)
    assert sorted(d.page_content for d in r.invoke("q", k=5)) == [
        "alice runs marathons",
        "alice swims",
    ]
    assert [d.page_content for d in r.invoke("q", user_id="bob", k=5)] == ["bob plays jazz"]


def test_filter_builder_is_called_per_request() -> None:
    calls: list[str] = []

    def only(uid: str) -> dict[str, Any]:
        calls.append(uid)
        return {"filter": lambda d: d.metadata["user_id"] == uid and d.metadata["n"] < 2}

    r = make(store=True, filter_builder=only, k=5)
    docs = r.invoke("q", user_id="bob")
    assert {d.page_content for d in docs} == set(BOB[:2])
    assert calls == ["bob"]


def test_a_search_kwargs_filter_is_anded_with_the_filter_builders_not_dropped() -> None:
    def owner(uid: str) -> dict[str, Any]:
        return {"filter": lambda d: d.metadata["user_id"] == uid}

    def first_two(d: Document) -> bool:
        return d.metadata["n"] < 2

    r = make(store=True, filter_builder=owner, search_kwargs={"filter": first_two}, k=5)
    assert {d.page_content for d in r.invoke("q", user_id="bob")} == set(BOB[:2])
    clash = make(store=True, filter_builder=owner, search_kwargs={"filter": {"n": 1}}, k=5)
    with pytest.raises(ValueError, match="cannot combine"):
        clash.invoke("q", user_id="bob")


def test_save_and_load_round_trip(tmp_path: Any) -> None:
    r = make()
    before = r.invoke("dinner?", user_id="alice")
    r.save(tmp_path / "hist")
    loaded = PBRRetriever.load(
        tmp_path / "hist", llm=ScriptedChat(), embeddings=EMB, k=3, config=r.config
    )
    after = loaded.invoke("dinner?", user_id="alice")
    assert [d.page_content for d in after] == [d.page_content for d in before]
    with pytest.raises(PersistenceError, match="DeterministicFakeEmbedding"):
        PBRRetriever.load(tmp_path / "hist", embeddings=FakeEmbeddings(size=64))
    with pytest.raises(PersistenceError, match="pass the embedder that made them"):
        PBRRetriever.load(tmp_path / "hist")  # queries would be embedded by the default MiniLM


def test_the_personalizer_writes_through_the_retrievers_vector_store() -> None:
    # One corpus per store: the Personalizer a retriever exposes adds to and deletes from the
    # vector store, not only pbr's history.
    store = InMemoryVectorStore(EMB)
    retriever = PBRRetriever(
        llm=ParrotFakeChatModel(),
        embeddings=EMB,
        vectorstore=store,
        config=PBRConfig(fusion="plain"),
    )
    retriever.add_documents([Document(ALICE[0])], user_id="alice", ids=["a0"])
    retriever.personalizer.add_texts("alice", [ALICE[1]], ids=["a1"])
    assert scoped_key("alice", "a1") in store.store
    docs = retriever.invoke("who visits in May?", user_id="alice", k=2)
    assert {d.id for d in docs} == {"a0", "a1"}
    retriever.personalizer.delete("alice", ["a1"])
    assert scoped_key("alice", "a1") not in store.store
    assert [d.id for d in retriever.invoke("who visits in May?", user_id="alice")] == ["a0"]


class StreamOnlyAsyncChat(BaseChatModel):
    """Natively async when streaming only: ``ainvoke`` runs the sync ``_generate`` (as many
    community integrations do); records the thread each answer is computed on."""

    threads: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "stream-only-async"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.threads.append(threading.current_thread().name)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=ANSWER))])

    async def _astream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):  # type: ignore[no-untyped-def]
        from langchain_core.messages import AIMessageChunk
        from langchain_core.outputs import ChatGenerationChunk

        yield ChatGenerationChunk(message=AIMessageChunk(content=ANSWER))


async def test_a_model_async_only_when_streaming_runs_in_pbrs_executor_not_asyncios() -> None:
    llm = StreamOnlyAsyncChat()
    retriever = PBRRetriever(llm=llm, embeddings=EMB, config=PBRConfig(fusion="paper"))
    retriever.add_documents([Document(t) for t in ALICE], user_id="alice")
    docs = await retriever.ainvoke("what should I cook?", user_id="alice")
    assert docs and len(llm.threads) == 2
    # pbr's own bounded threads, never the application's default executor ("asyncio_N")
    assert all(name.startswith("pbr-llm-") for name in llm.threads), llm.threads


def test_adding_no_documents_adds_nothing_for_new_and_known_users() -> None:
    retriever = PBRRetriever(llm=ParrotFakeChatModel(), embeddings=EMB)
    assert retriever.add_documents([], user_id="newcomer") == []
    retriever.add_documents([Document(ALICE[0])], user_id="alice")
    assert retriever.add_documents([], user_id="alice") == []
    assert asyncio.run(retriever.aadd_documents([], user_id="alice")) == []
    assert len(retriever.invoke("lentil curry", user_id="alice")) == 1


class UnreachableStore(VectorStore):
    """A vector store whose server is down: every write is refused at the socket."""

    def add_texts(self, texts: Any, metadatas: Any = None, **kwargs: Any) -> list[str]:
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return []

    @classmethod
    def from_texts(cls, texts: Any, embedding: Any, metadatas: Any = None, **kw: Any) -> Any:
        return cls()


class NoIdStore(VectorStore):
    """A store that cannot list and returns its search results without ``Document.id``
    (optional in LangChain): pbr knows each result by the user's id in its metadata."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, dict[str, Any], list[float]]] = {}
        self.asked: list[int] = []  # the k of each search

    def add_texts(self, texts: Any, metadatas: Any = None, **kwargs: Any) -> list[str]:
        ids = list(kwargs["ids"])
        for i, text, meta in zip(ids, texts, metadatas, strict=True):
            self.rows[i] = (text, dict(meta), EMB.embed_query(text))
        return ids

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, filter: Any = None
    ) -> list[tuple[Document, float]]:
        self.asked.append(k)
        mine = [r for r in self.rows.values() if all(r[1].get(a) == b for a, b in filter.items())]
        scored = [
            (Document(page_content=t, metadata=m), float(sum(x * y for x, y in zip(v, embedding))))
            for t, m, v in mine
        ]
        return sorted(scored, key=lambda pair: -pair[1])[:k]

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return []

    @classmethod
    def from_texts(cls, texts: Any, embedding: Any, metadatas: Any = None, **kw: Any) -> Any:
        return cls()


def test_results_without_a_document_id_are_found_by_the_users_id() -> None:
    """Before, a result without ``Document.id`` was keyed "None", taken for a shadowed
    duplicate of the item this process wrote, and dropped: no results at all (and results
    again after a restart, when pbr knew no keys)."""
    retriever = PBRRetriever(
        llm=ParrotFakeChatModel(),
        embeddings=EMB,
        vectorstore=NoIdStore(),
        config=PBRConfig(fusion="no_prf"),
    )
    docs = [Document(ALICE[0], id="a0"), Document(ALICE[1], id="a1")]
    retriever.add_documents(docs, user_id="alice")
    got = retriever.invoke(ALICE[0], user_id="alice")
    assert sorted(d.id or "" for d in got) == ["a0", "a1"] and got[0].id == "a0"
    assert asyncio.run(retriever.ainvoke(ALICE[0], user_id="alice"))[0].id == "a0"


@pytest.mark.parametrize("store", ["pbr", "in-memory"])
def test_an_empty_or_none_id_is_no_id_and_gets_a_new_one_as_in_langchains_stores(
    store: str,
) -> None:
    """``InMemoryVectorStore`` reads an empty id as none; pbr stored the item under "" (and
    ``None`` as the string "None"), where ``Document(id="")`` already got a new one."""
    host = InMemoryVectorStore(EMB) if store == "in-memory" else None
    retriever = PBRRetriever(llm=ParrotFakeChatModel(), embeddings=EMB, vectorstore=host, k=4)
    docs = [Document(ALICE[0]), Document(ALICE[1]), Document(ALICE[2], id="")]
    added = retriever.add_documents(docs, user_id="alice", ids=["", None, "a2"])  # type: ignore[list-item]
    assert added[2] == "a2" and len(set(added)) == 3
    assert all(new not in ("", "None") for new in added)
    found = retriever.invoke(ALICE[0], config={"metadata": {"user_id": "alice"}})
    assert {doc.id for doc in found} == set(added)
    assert retriever.add_documents([Document(ALICE[0], id="")], user_id="alice")[0] != ""


def test_a_failed_add_says_a_retry_is_exact_only_when_every_document_has_an_id() -> None:
    from pbr_core import VectorStoreUnavailableError

    retriever = PBRRetriever(
        llm=ParrotFakeChatModel(), embeddings=EMB, vectorstore=UnreachableStore()
    )
    with pytest.raises(VectorStoreUnavailableError, match="retrying the same call is safe"):
        retriever.add_documents([Document(ALICE[0])], user_id="alice", ids=["a0"])
    with pytest.raises(VectorStoreUnavailableError, match="retrying the same call is safe"):
        retriever.add_documents([Document(ALICE[0], id="a0")], user_id="alice")
    with pytest.raises(VectorStoreUnavailableError, match="1 of the items had no id") as info:
        retriever.add_documents([Document(ALICE[0], id="a0"), Document(ALICE[1])], user_id="alice")
    assert "is safe" not in str(info.value) and "Document.id" in str(info.value)
    # an empty Document.id is no id either: the document gets a new one on every try
    with pytest.raises(VectorStoreUnavailableError, match="1 of the items had no id"):
        retriever.add_documents([Document(ALICE[0], id="")], user_id="alice")
    # nor is an empty or None entry of ids
    with pytest.raises(VectorStoreUnavailableError, match="2 of the items had no id"):
        retriever.add_documents(
            [Document(ALICE[0]), Document(ALICE[1]), Document(ALICE[2])],
            user_id="alice",
            ids=["", None, "a2"],  # type: ignore[list-item]
        )
    with pytest.raises(VectorStoreUnavailableError, match="1 of the items had no id"):
        PBRRetriever.from_documents(
            [Document(ALICE[0], id="")],
            user_id="alice",
            llm=ParrotFakeChatModel(),
            embeddings=EMB,
            vectorstore=UnreachableStore(),
        )


class SyncOnlyChat(ScriptedChat):
    """A chat model without native async: its ``ainvoke`` would run ``_generate`` in asyncio's
    default executor."""

    _agenerate = BaseChatModel._agenerate  # type: ignore[assignment]
    model_name: str = "sync-only"


def test_a_chain_around_a_sync_model_runs_in_pbrs_bounded_executor_under_its_id() -> None:
    """``model | StrOutputParser()`` is found to hold the model: a sync-only one runs in pbr's
    own executor (bounded, counted), not in asyncio's default pool, and caches answers under the
    model's id (before, any chain counted as natively async and was keyed "RunnableSequence")."""
    from langchain_core.output_parsers import StrOutputParser

    from langchain_pbr._bridge import LangChainGenerator, generator_for

    chain = SyncOnlyChat() | StrOutputParser()
    generator = generator_for(chain, None, "chat")
    assert type(generator) is LangChainGenerator and generator.model_id == "sync-only"
    assert generator.cacheable and generator.generate("hi") == ANSWER


def test_a_fallback_decides_as_much_as_the_primary_how_pbr_calls_and_bounds_the_model() -> None:
    """A ``SimpleChatModel`` is sync (its ``_agenerate`` runs ``_generate`` in asyncio's default
    pool; before, it counted as async). ``with_fallbacks``: natively async only if every model
    that may answer is (before, an
    async primary's sync fallback ran in asyncio's default pool, where hung calls filled it and
    every later async request hung), and in-process (no timeout) only if every one is (before,
    the embedded model's remote fallback was never timed out)."""
    from langchain_core.language_models import SimpleChatModel
    from langchain_core.output_parsers import StrOutputParser

    from langchain_pbr._bridge import AsyncLangChainGenerator, LangChainGenerator, generator_for
    from pbr_core.generation import timeout_for

    class InProcess(ScriptedChat):
        in_process: bool = True

    class Simple(SimpleChatModel):  # its _agenerate runs _generate in asyncio's default pool
        @property
        def _llm_type(self) -> str:
            return "simple"

        def _call(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> str:
            return ANSWER

    config = PBRConfig(llm_timeout_s=0.3)
    assert type(generator_for(ScriptedChat(), None, "chat")) is AsyncLangChainGenerator
    assert type(generator_for(Simple(), None, "chat")) is LangChainGenerator
    mixed = ScriptedChat().with_fallbacks([SyncOnlyChat()])
    assert type(generator_for(mixed, None, "chat")) is LangChainGenerator
    both = ScriptedChat().with_fallbacks([ScriptedChat()])
    assert type(generator_for(both, None, "chat")) is AsyncLangChainGenerator
    assert timeout_for(generator_for(InProcess(), None, "chat"), config) is None
    local_then_remote = InProcess().with_fallbacks([ScriptedChat()])
    assert timeout_for(generator_for(local_then_remote, None, "chat"), config) == 0.3
    chain = InProcess().with_fallbacks([InProcess()]) | StrOutputParser()
    assert timeout_for(generator_for(chain, None, "chat"), config) is None


def test_answers_are_cached_only_under_an_id_that_names_the_answering_model(
    tmp_path: Any,
) -> None:
    """Two models that declare no id share their class name, a ``bind(model=...)`` answers with
    another model than the one it wraps, and ``with_fallbacks`` with whichever did not fail: none
    of them is cached (before, each was cached under one shared id and served for the other)."""
    from langchain_pbr._bridge import generator_for

    named = SyncOnlyChat()
    assert generator_for(named, None, "chat").cacheable
    assert generator_for(named.with_config(tags=["x"]), None, "chat").cacheable
    assert not generator_for(ScriptedChat(), None, "chat").cacheable  # no id: class name only
    assert not generator_for(named.bind(model="another"), None, "chat").cacheable
    assert not generator_for(named.with_fallbacks([SyncOnlyChat()]), None, "chat").cacheable
    path = tmp_path / "gen.jsonl"
    answers = []
    for answer in ("first model's answer", "second model's answer"):
        retriever = PBRRetriever(
            llm=ScriptedChat(answer=json.dumps({"candidates": [answer]})),
            embeddings=EMB,
            cache=GenerationCache(path),
            config=PBRConfig(fusion="paper", explain="first"),
        )
        retriever.add_documents([Document(t) for t in ALICE], user_id="alice")
        docs = retriever.invoke("where should we eat tonight?", user_id="alice")
        answers.append(docs[0].metadata["pbr"]["pseudo_utterances"])
    assert answers == [["first model's answer"], ["second model's answer"]]
    assert len(GenerationCache(path)) == 0


def test_a_model_chosen_by_the_input_or_a_chain_of_two_models_is_not_cached() -> None:
    """A ``RunnableBranch`` picks its model per input and a chain of two models answers with
    the last: both were cached under the first model found (a branch's default, the chain's
    first), so one model's answers were served for the other (from a review)."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.runnables import RunnableBranch

    from langchain_pbr._bridge import answering_models, generator_for

    small, big = SyncOnlyChat(model_name="small"), SyncOnlyChat(model_name="big")
    router = RunnableBranch((lambda prompt: "history" in str(prompt), big), small)
    assert not generator_for(router, None, "chat").cacheable
    assert {id(m) for m in answering_models(router)} == {id(small), id(big)}
    assert not generator_for(small | StrOutputParser() | big, None, "chat").cacheable
    assert generator_for(small | StrOutputParser(), None, "chat").cacheable


def test_a_chain_that_rewrites_the_prompt_or_the_answer_is_not_cached() -> None:
    """A step before the model changes what it reads, one after it what pbr gets: two such
    chains around one model shared its cached answers (the LlamaIndex sibling, a
    ``completion_to_prompt`` of the user's, was fixed first; from a review)."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate
    from langchain_core.runnables import RunnableLambda

    from langchain_pbr._bridge import generator_for

    model = SyncOnlyChat(model_name="acme-7b")
    french = RunnableLambda(lambda p: "Answer in French. " + str(p)) | model
    shout = model | StrOutputParser() | RunnableLambda(lambda text: text.upper())
    templated = PromptTemplate.from_template("Be brief. {q}") | model
    for chain in (french, shout, templated):
        generator = generator_for(chain, None, "chat")
        assert generator.model_id == "acme-7b" and not generator.cacheable

    class Upper(StrOutputParser):
        def parse(self, text: str) -> str:
            return text.upper()

    # bind() arguments change the answer too (a stop string cuts it): not under the bare name
    for rewriting in (model | Upper(), model.bind(stop=["."]), model.bind(temperature=0.0)):
        assert not generator_for(rewriting, None, "chat").cacheable
    plain = (model, model.with_retry(), model | StrOutputParser(), model.with_config(tags=["x"]))
    for chain in (*plain, model | StrOutputParser().with_config(run_name="text")):
        assert generator_for(chain, None, "chat").cacheable


@pytest.mark.parametrize("how", ["invoke", "ainvoke", "chain"])
def test_the_runs_configurable_picks_the_model_that_writes_the_feedback(how: str) -> None:
    """``config={"configurable": {"llm": "other"}}`` reaches the LLM's run, as it reaches any
    child run: the model it picks answers (before, the default one did, silently)."""
    from langchain_core.runnables import ConfigurableField, RunnableLambda

    def model(name: str) -> ScriptedChat:
        return ScriptedChat(answer=json.dumps({"candidates": [f"{name} answered"]}))

    retriever = PBRRetriever(
        llm=model("default").configurable_alternatives(
            ConfigurableField(id="llm"), other=model("other")
        ),
        embeddings=EMB,
        config=PBRConfig(fusion="paper", explain="first"),
    )
    retriever.add_documents([Document(t) for t in ALICE], user_id="alice")
    config: Any = {"configurable": {"llm": "other", "user_id": "alice"}}
    query = "where should we eat tonight?"
    if how == "invoke":
        docs = retriever.invoke(query, config=config)
    elif how == "ainvoke":
        docs = asyncio.run(retriever.ainvoke(query, config=config))
    else:
        docs = (RunnableLambda(lambda q: q) | retriever).invoke(query, config=config)
    assert docs[0].metadata["pbr"]["pseudo_utterances"] == ["other answered"]
    assert retriever.invoke(query, user_id="alice")[0].metadata["pbr"]["pseudo_utterances"] == [
        "default answered"
    ]


def test_answers_of_a_model_chosen_at_run_time_are_not_cached(tmp_path: Any) -> None:
    """With ``configurable_fields`` / ``configurable_alternatives`` no one id names the model that
    answers: its answers are not cached (before, they were cached under the default model's id
    and served when the run picked another model)."""
    from langchain_core.runnables import ConfigurableField

    from langchain_pbr._bridge import generator_for

    picked = ScriptedChat().configurable_alternatives(
        ConfigurableField(id="llm"), other=ScriptedChat(answer="another model's answer")
    )
    assert not generator_for(picked, None, "chat").cacheable
    assert generator_for(SyncOnlyChat(), None, "chat").cacheable
    retriever = PBRRetriever(
        llm=picked,
        embeddings=EMB,
        cache=GenerationCache(tmp_path / "gen.jsonl"),
        config=PBRConfig(fusion="paper"),
    )
    retriever.add_documents([Document(ALICE[0])], user_id="alice")
    retriever.invoke("dinner", user_id="alice")
    assert len(GenerationCache(tmp_path / "gen.jsonl")) == 0


def test_a_vector_store_retrievers_search_type_is_refused_saying_what_pbr_ranks_by() -> None:
    """``search_type="mmr"`` (VectorStoreRetriever's) names ``PBRConfig.search`` (before:
    pydantic's bare "Extra inputs are not permitted")."""
    with pytest.raises(ValidationError, match=r"no search_type.*PBRConfig"):
        PBRRetriever(embeddings=EMB, search_type="mmr")  # type: ignore[call-arg]


@pytest.mark.parametrize("use_async", [False, True])
def test_a_filtered_view_the_store_can_list_is_ranked_whole(use_async: bool) -> None:
    """InMemoryVectorStore (and Chroma) list a filtered view exactly: pbr ranks all of it, so a
    filter that keeps every document changes nothing, and a document only the lexical leg
    finds is still found (before, pbr ranked the store's 40 best candidates for q* only)."""
    import random

    from langchain_core.embeddings import DeterministicFakeEmbedding

    rng = random.Random(0)
    words = [
        "tea",
        "coffee",
        "run",
        "bike",
        "swim",
        "bread",
        "rice",
        "pasta",
        "cat",
        "dog",
        "film",
        "book",
        "garden",
        "paris",
        "rome",
    ]
    docs = [Document(" ".join(rng.sample(words, 4)), id=f"d{i}") for i in range(400)]
    docs.append(Document("my sister lives in lisbon and drinks oolong", id="target"))
    emb = DeterministicFakeEmbedding(size=64)
    store = InMemoryVectorStore(emb)
    config = PBRConfig(fusion="plain", explain="scores")
    plain = PBRRetriever(embeddings=emb, vectorstore=store, k=5, config=config)
    plain.add_documents(docs, user_id="alice")
    keep_all = PBRRetriever(
        embeddings=emb, vectorstore=store, k=5, config=config, search_kwargs={"filter": bool}
    )

    def ids(r: PBRRetriever, query: str) -> list[str | None]:
        got = asyncio.run(r.ainvoke(query, user_id="alice")) if use_async else None
        got = got if got is not None else r.invoke(query, user_id="alice")
        return [d.id for d in got]

    for query in ("oolong", "sister lisbon"):
        assert ids(keep_all, query) == ids(plain, query) and ids(plain, query)[0] == "target"
    nobody = PBRRetriever(
        embeddings=emb, vectorstore=store, k=5, search_kwargs={"filter": lambda d: False}
    )
    assert nobody.invoke("oolong", user_id="alice") == []


def _garden_notes_view(store: VectorStore, odd_one: str, search: str, n: int) -> PBRRetriever:
    """Alice's ``n`` garden notes and ``odd_one`` in ``store``, in a view of her notes that only
    the store can evaluate (a filter_builder's filter), returning the best one."""

    def notes_of(user: str) -> dict[str, Any]:
        return {"filter": {"user_id": user, "kind": "note"}}

    retriever = PBRRetriever(
        llm=ParrotFakeChatModel(),
        embeddings=EMB,
        vectorstore=store,
        filter_builder=notes_of,
        config=PBRConfig(fusion="plain", search=search),  # type: ignore[arg-type]
        k=1,
    )
    notes = [Document(f"note {i} about the garden", metadata={"kind": "note"}) for i in range(n)]
    notes.append(Document(odd_one, metadata={"kind": "note"}))
    retriever.add_documents(notes, user_id="alice", ids=[f"n{i}" for i in range(n + 1)])
    return retriever


def test_a_filtered_view_of_a_store_pbr_cannot_list_ranks_every_document_in_it() -> None:
    """Over a store without a lister of pbr's (here one that cannot list at all), a filtered
    view's documents are listed through the store's own filtered search, so the one document
    holding the question's word is found however far it is in the dense leg (pbr ranked the
    store's best 40 for q*, as LlamaIndex did)."""
    retriever = _garden_notes_view(NoIdStore(), "a zebra escaped from the zoo", "lexical", 400)
    store: NoIdStore = retriever.vectorstore  # type: ignore[assignment]
    zebra = ["a zebra escaped from the zoo"]
    assert [d.page_content for d in retriever.invoke("zebra", user_id="alice")] == zebra
    assert store.asked == [402]  # all of her 401 notes, and one more
    store.asked.clear()
    dense = retriever.model_copy(update={"config": PBRConfig(search="dense")})
    dense.invoke("zebra", user_id="alice")
    assert store.asked == [40]  # dense search: the best candidates, the dense leg's best
    assert [
        d.page_content for d in asyncio.run(retriever.ainvoke("zebra", user_id="alice"))
    ] == zebra


class CappedStore(NoIdStore):
    """LangChain FAISS's search semantics: with a filter, its ``fetch_k`` nearest rows are
    filtered, then ``k`` of them returned; so it never returns more than ``fetch_k``."""

    def similarity_search_with_score_by_vector(
        self, embedding: list[float], k: int = 4, filter: Any = None, fetch_k: int = 20
    ) -> list[tuple[Document, float]]:
        return super().similarity_search_with_score_by_vector(embedding, min(k, fetch_k), filter)


def test_a_filtered_view_of_a_store_that_caps_its_search_gets_its_best_for_the_query() -> None:
    """A store whose filtered search returns at most its ``fetch_k`` nearest: the listing asks
    for all of the user's records and gets those nearest the vector it searches with. That is
    ``q*``: a listing from one of the user's own vectors ranked the same fixed subset for
    every question, and the note holding the question's words was never in it."""
    retriever = _garden_notes_view(CappedStore(), "zebra zoo", "hybrid", 200)
    assert [d.page_content for d in retriever.invoke("zebra zoo", user_id="alice")] == ["zebra zoo"]
