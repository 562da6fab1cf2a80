"""PBRStore: pbr as a LangGraph long-term memory store, over real LangGraph objects, offline."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any, TypedDict, TypeVar

import pytest

pytest.importorskip("langgraph")

from doubles import BagOfWords
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from langchain_pbr import PBRStore
from langchain_pbr.memory_store import item_key, scope_id
from pbr_core import PBRConfig

ALICE = [
    ("m1", "I enjoy long walks with my dog in the park"),
    ("m2", "My favourite dish is a spicy ramen from Sapporo"),
    ("m3", "I work as a nurse on night shifts"),
    ("m4", "I am learning to play the cello"),
]
BOB = [
    ("m1", "Bob's note: I collect vintage cameras"),
    ("m2", "I am allergic to peanuts"),
]


S = TypeVar("S", bound=BaseStore)


def filled(store: S) -> S:
    for key, text in ALICE:
        store.put(("memories", "alice"), key, {"content": text, "kind": "fact"})
    for key, text in BOB:
        store.put(("memories", "bob"), key, {"content": text, "kind": "fact"})
    return store


def keys(items: list[SearchItem]) -> list[str]:
    return [i.key for i in items]


# -- delegation ---------------------------------------------------------------------------------
def test_non_query_operations_equal_the_wrapped_store() -> None:
    plain = InMemoryStore()
    wrapped = PBRStore(InMemoryStore(), BagOfWords())
    for store in (plain, wrapped):
        filled(store)
        store.put(("memories", "alice", "prefs"), "p1", {"content": "dark mode", "n": 1})
        store.put(("other",), "x", {"no_text": True})
        store.put(("memories", "alice"), "m3", {"content": "I changed jobs", "kind": "news"})
        store.delete(("memories", "bob"), "m2")

    def view(store: BaseStore) -> Any:
        return {
            "get": [
                (it.namespace, it.key, it.value) if it else None
                for it in (
                    store.get(("memories", "alice"), "m3"),
                    store.get(("memories", "bob"), "m2"),
                    store.get(("other",), "x"),
                )
            ],
            "namespaces": store.list_namespaces(),
            "prefixed": store.list_namespaces(prefix=("memories",), max_depth=2),
            "search": [
                (i.namespace, i.key, i.value, i.score)
                for i in store.search(("memories",), limit=100)
            ],
            "filtered": [
                i.key for i in store.search(("memories", "alice"), filter={"kind": "news"})
            ],
            "paged": [i.key for i in store.search(("memories",), limit=2, offset=1)],
        }

    assert view(wrapped) == view(plain)


# -- pbr's query search -------------------------------------------------------------------------
def test_query_search_is_per_user_and_hybrid() -> None:
    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    got = store.search(("memories", "alice"), query="Sapporo")
    assert got[0].key == "m2"  # the one rare word the query shares
    assert {i.namespace for i in got} == {("memories", "alice")}
    assert sorted(keys(got)) == sorted(k for k, _ in ALICE)
    scores = [i.score for i in got if isinstance(i, SearchItem) and i.score is not None]
    assert len(scores) == len(got) and scores == sorted(scores, reverse=True)
    assert got[0].value == {"content": ALICE[1][1], "kind": "fact"}  # the value, untouched

    explained = store.last_explanation(("memories", "alice"))
    assert explained is not None
    assert explained["user"] == "alice" and explained["mode"] == "hybrid"
    assert explained["fusion"] == "plain" and explained["llm_calls"] == 0
    assert [r["key"] for r in explained["results"]] == keys(got)
    assert explained["results"][0]["lexical_rank"] == 1
    assert store.last_explanation(("memories", "bob")) is None


def test_each_result_carries_how_pbr_ranked_it() -> None:
    from langchain_pbr.memory_store import PBRSearchItem

    plain = filled(InMemoryStore())
    store = PBRStore(plain, BagOfWords())
    got = store.search(("memories", "alice"), query="Sapporo")
    explained = store.last_explanation(("memories", "alice"))
    assert all(isinstance(i, PBRSearchItem) and isinstance(i, SearchItem) for i in got)
    top = got[0]
    assert isinstance(top, PBRSearchItem)
    assert top.pbr["result"]["key"] == "m2" and top.pbr["result"]["score"] == top.score
    assert top.pbr["result"]["lexical_rank"] == 1 and "dense_rank" in top.pbr["result"]
    assert top.pbr["explanation"] == explained  # the request's, shared by its results
    # what a tool shows an LLM is LangGraph's own dict: the memory, not pbr's bookkeeping
    stored = plain.get(("memories", "alice"), "m2")
    assert stored is not None
    assert top.dict() == {**stored.dict(), "score": top.score}


def test_limit_offset_and_filter() -> None:
    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    ns = ("memories", "alice")
    store.put(ns, "m5", {"content": "Sapporo beer with ramen friends", "kind": "event"})
    everything = keys(store.search(ns, query="ramen Sapporo", limit=10))
    assert everything[:2] == ["m2", "m5"] or everything[:2] == ["m5", "m2"]
    assert keys(store.search(ns, query="ramen Sapporo", limit=2)) == everything[:2]
    assert keys(store.search(ns, query="ramen Sapporo", limit=2, offset=1)) == everything[1:3]
    assert store.search(ns, query="ramen Sapporo", limit=0) == []
    # filter restricts the candidates before ranking: the best "fact" comes first
    facts = keys(store.search(ns, query="ramen Sapporo", filter={"kind": "fact"}))
    assert facts[0] == "m2" and "m5" not in facts and len(facts) == 4
    events = keys(store.search(ns, query="cello", filter={"kind": "event"}))
    assert events == ["m5"]
    assert store.search(ns, query="cello", filter={"kind": "nothing"}) == []
    # LangGraph's comparison operators work, as the wrapped store evaluates them
    assert keys(store.search(ns, query="ramen", filter={"kind": {"$ne": "fact"}})) == ["m5"]


def test_two_users_with_the_same_keys_never_see_each_other() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords())
    store.put(("memories", "alice"), "k", {"content": "alice secret: the vault code is 1234"})
    store.put(("memories", "bob"), "k", {"content": "bob secret: the boat is blue"})
    for user, other in (("alice", "bob"), ("bob", "alice")):
        for query in ("vault code", "boat blue", "secret"):
            got = store.search(("memories", user), query=query)
            assert [(i.namespace, i.key) for i in got] == [(("memories", user), "k")]
            assert other not in got[0].value["content"]
    # a prefix that is a string prefix of another user is another user
    store.put(("memories", "alic"), "k", {"content": "alic item"})
    assert [i.value["content"] for i in store.search(("memories", "alice"), query="item")] == [
        "alice secret: the vault code is 1234"
    ]


def test_items_without_text_are_not_ranked_but_still_listed() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords())
    ns = ("memories", "alice")
    store.put(ns, "text", {"content": "the cello lesson is on Friday"})
    store.put(ns, "number", {"content": 42})
    store.put(ns, "blank", {"content": "   "})
    store.put(ns, "other", {"note": "cello"})
    assert keys(store.search(ns, query="cello")) == ["text"]
    assert sorted(keys(store.search(ns))) == ["blank", "number", "other", "text"]
    custom = PBRStore(store.inner, BagOfWords(), text_key="note")
    assert keys(custom.search(ns, query="cello")) == ["other"]


def test_vectors_are_cached_by_key_and_text() -> None:
    embedder = BagOfWords()
    store = filled(PBRStore(InMemoryStore(), embedder))
    store.search(("memories", "alice"), query="ramen")
    assert embedder.documents == len(ALICE)
    for _ in range(3):
        store.search(("memories", "alice"), query="cello")
    assert embedder.documents == len(ALICE)  # repeated searches embed only their query
    store.put(("memories", "alice"), "m3", {"content": "I now work as a cellist", "kind": "fact"})
    assert store.search(("memories", "alice"), query="cellist")[0].key == "m3"
    assert embedder.documents == len(ALICE) + 1  # only the changed item


def test_the_wrapped_store_is_the_truth() -> None:
    inner = InMemoryStore()
    store = filled(PBRStore(inner, BagOfWords()))
    assert store.search(("memories", "alice"), query="cello")[0].key == "m4"
    inner.delete(("memories", "alice"), "m4")  # behind pbr's back
    inner.put(("memories", "alice"), "m9", {"content": "my cello teacher moved away"})
    got = keys(store.search(("memories", "alice"), query="cello"))
    assert "m4" not in got and got[0] == "m9"


def test_its_personalizer_refuses_writes_and_points_to_put() -> None:
    """A write through the store's corpus (``store.personalizer.add_texts``) stored only the
    text, dropping the metadata, under a key its own delete could not name (from a review): a
    memory is a value written with ``put``."""
    inner = InMemoryStore()
    store = PBRStore(inner, BagOfWords())
    with pytest.raises(ValueError, match=r"writes nothing: write memories with store\.put"):
        store.personalizer.add_texts(
            json.dumps(["memories", "alice"]), ["my dog is Rex"], metadatas=[{"kind": "pet"}]
        )
    assert inner.search(("memories", "alice")) == []
    assert store.search(("memories", "alice"), query="dog") == []


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_staleness_window_never_hides_this_stores_own_puts_and_deletes(
    asynchronous: bool,
) -> None:
    inner = InMemoryStore()
    store = filled(PBRStore(inner, BagOfWords(), max_staleness_s=3600))
    alice = ("memories", "alice")
    assert store.search(alice, query="cello")[0].key == "m4"  # alice's view is now cached
    if asynchronous:
        asyncio.run(store.adelete(alice, "m4"))
        asyncio.run(store.aput(alice, "m9", {"content": "my cello teacher moved away"}))
    else:
        store.delete(alice, "m4")
        store.put(alice, "m9", {"content": "my cello teacher moved away"})
    got = keys(store.search(alice, query="cello"))
    assert "m4" not in got and got[0] == "m9"
    history = store.corpus.history(scope_id(alice))  # what a personalized prompt is built from
    assert history is not None and item_key(alice, "m4") not in {i.id for i in history.items}
    assert item_key(alice, "m9") in {i.id for i in history.items}
    inner.put(alice, "m8", {"content": "cello strings ordered"})  # another writer: may wait
    assert "m8" not in keys(store.search(alice, query="cello"))


async def test_an_async_put_expires_views_off_the_event_loop_and_only_its_own_prefixes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    store = filled(
        PBRStore(InMemoryStore(), BagOfWords(), max_staleness_s=3600, cross_user_search=True)
    )
    for prefix in (("memories", "alice"), ("memories", "bob"), ("memories",)):
        await store.asearch(prefix, query="cello")
    expired: list[tuple[str, bool]] = []
    real = store.corpus.expire

    def spy(user_ids: Any) -> None:
        ids = list(user_ids)
        on_loop = threading.current_thread() is threading.main_thread()
        expired.extend((i, on_loop) for i in ids)
        real(ids)

    monkeypatch.setattr(store.corpus, "expire", spy)
    await store.aput(("memories", "alice"), "m9", {"content": "new cello bow"})
    # a search's listing thread may hold the user's lock while it waits on the loop: the
    # expiry (which takes that lock) must not run on the loop
    assert expired and not any(on_loop for _, on_loop in expired)
    assert sorted(i for i, _ in expired) == sorted(['["memories", "alice"]', '["memories"]'])


def test_an_item_rewritten_unsaveably_loses_its_old_text_too() -> None:
    inner = InMemoryStore()
    store = PBRStore(inner, BagOfWords())
    alice = ("memories", "alice")
    store.put(alice, "pw", {"content": "my password is hunter2"})
    store.put(alice, "tea", {"content": "I like green tea"})
    assert "pw" in keys(store.search(alice, query="password"))
    inner.put(alice, "pw", {"content": "rotated \udc80 password"})  # unsaveable new version
    assert "pw" not in keys(store.search(alice, query="password"))
    history = store.corpus.history(scope_id(alice))
    assert history is not None and all("hunter2" not in it.text for it in history.items)


def test_an_unsaveable_item_in_the_store_is_left_out_and_the_namespace_still_searches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = InMemoryStore()
    store = filled(PBRStore(inner, BagOfWords()))
    alice = ("memories", "alice")
    inner.put(alice, "bad", {"content": "my cello \udc80 bow"})  # a lone surrogate, by someone else
    with caplog.at_level(logging.WARNING, logger="pbr"):
        got = keys(store.search(alice, query="cello"))
        keys(store.search(alice, query="cello"))  # warned once, not per query
    assert got[0] == "m4" and "bad" not in got
    warned = [r.getMessage() for r in caplog.records if "cannot be saved" in r.getMessage()]
    assert len(warned) == 1 and "alice" not in warned[0]
    inner.put(alice, "bad", {"content": "my cello bow, fixed"})  # rewritten: taken in again
    assert "bad" in keys(store.search(alice, query="bow"))


def test_a_populated_store_needs_no_re_adding_and_pages_are_exhausted() -> None:
    inner = InMemoryStore()
    for i in range(25):
        inner.put(("memories", "carol"), f"k{i}", {"content": f"note number {i} word{i}"})
    store = PBRStore(inner, BagOfWords(), page_size=4)
    got = store.search(("memories", "carol"), query="word17", limit=30)
    assert len(got) == 25 and got[0].key == "k17"


@pytest.mark.parametrize(
    ("namespace", "user_index"),
    [((), -1), (("memories",), 1), (("memories", ""), -1), (("memories", "alice"), -3)],
)
def test_a_namespace_without_its_user_raises(namespace: tuple[str, ...], user_index: int) -> None:
    store = filled(PBRStore(InMemoryStore(), BagOfWords(), user_index=user_index))
    with pytest.raises(ValueError):  # LangGraph's own check refuses an empty label first
        store.search(namespace, query="cello")
    with pytest.raises(ValueError, match="user"):  # pbr's, for ops given to batch directly
        store.batch([SearchOp(namespace, None, 10, 0, "cello")])
    with pytest.raises(ValueError, match="user"):
        asyncio.run(store.abatch([SearchOp(namespace, None, 10, 0, "cello")]))


def test_a_search_above_the_user_level_raises_unless_cross_user_search_is_asked() -> None:
    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    with pytest.raises(ValueError, match="would mix users") as err:
        store.search(("memories",), query="peanuts")
    assert "('memories', 'alice')" in str(err.value) and "cross_user_search=True" in str(err.value)
    with pytest.raises(ValueError, match="would mix users"):
        asyncio.run(store.abatch([SearchOp(("memories",), None, 10, 0, "peanuts")]))
    assert store.last_explanation(("memories",)) is None  # nothing was ranked
    assert keys(store.search(("memories", "bob"), query="peanuts")) == ["m2", "m1"]
    shared = filled(PBRStore(InMemoryStore(), BagOfWords(), cross_user_search=True))
    found = shared.search(("memories",), query="peanuts", limit=10)
    assert {i.namespace for i in found} == {("memories", "alice"), ("memories", "bob")}


def test_a_users_sub_namespace_needs_a_user_index_counted_from_the_start() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords())
    store.put(("memories", "alice"), "a", {"content": "alice likes tea"})
    store.put(("memories", "alice", "work"), "w", {"content": "alice drinks tea at work"})
    with pytest.raises(ValueError, match="user_index=1"):  # 'work' could be another user
        store.search(("memories", "alice"), query="tea")
    assert keys(store.search(("memories", "alice", "work"), query="tea")) == ["w"]
    by_start = PBRStore(store.inner, BagOfWords(), user_index=1)
    assert set(keys(by_start.search(("memories", "alice"), query="tea"))) == {"a", "w"}


def test_user_index_picks_the_user_element() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords(), user_index=1)
    store.put(("memories", "alice", "prefs"), "a", {"content": "alice likes tea"})
    store.put(("memories", "bob", "prefs"), "b", {"content": "bob likes tea"})
    assert keys(store.search(("memories", "alice"), query="tea")) == ["a"]
    assert keys(store.search(("memories", "alice", "prefs"), query="tea")) == ["a"]
    assert store.user_of(("memories", "bob", "prefs")) == "bob"
    with pytest.raises(ValueError, match="user"):
        store.search(("memories",), query="tea")


def test_search_modes_and_a_fusion_without_llm() -> None:
    inner = filled(InMemoryStore())
    dense = PBRStore(inner, BagOfWords(), config=PBRConfig(fusion="plain", search="dense"))
    assert dense.search(("memories", "alice"), query="Sapporo ramen")[0].key == "m2"
    explained = dense.last_explanation(("memories", "alice"))
    assert explained is not None and explained["mode"] == "dense"
    anchored = PBRStore(inner, BagOfWords(), config=PBRConfig(fusion="no_prf"))
    assert anchored.search(("memories", "alice"), query="Sapporo ramen")[0].key == "m2"
    with pytest.raises(ValueError, match="calls an LLM"):
        PBRStore(inner, BagOfWords(), config=PBRConfig(fusion="full"))


def test_an_llm_personalizes_the_query() -> None:
    from langchain_core.language_models import GenericFakeChatModel

    answers = [
        AIMessage('{"candidates": ["I love a bowl of noodles", "ramen in Sapporo"]}'),
        AIMessage("The user likes Japanese noodle dishes."),
    ] * 4
    llm = GenericFakeChatModel(messages=iter(answers))
    store = filled(
        PBRStore(InMemoryStore(), BagOfWords(), llm=llm, config=PBRConfig(fusion="full"))
    )
    got = store.search(("memories", "alice"), query="what should I eat tonight?")
    assert got and {i.namespace for i in got} == {("memories", "alice")}
    explained = store.last_explanation(("memories", "alice"))
    assert explained is not None and explained["fusion"] == "full"
    assert explained["llm_calls"] == 2 and "utterances" in explained["used"]
    assert explained["pseudo_utterances"] == ["I love a bowl of noodles", "ramen in Sapporo"]


def test_a_filter_matching_only_items_without_text_returns_nothing_without_an_llm_call() -> None:
    from langchain_core.language_models import GenericFakeChatModel

    llm = GenericFakeChatModel(messages=iter([AIMessage('{"candidates": ["x"]}')] * 4))
    store = PBRStore(InMemoryStore(), BagOfWords(), llm=llm, config=PBRConfig(fusion="full"))
    ns = ("memories", "alice")
    store.put(ns, "a1", {"content": "alice likes cats", "tag": "x"})
    store.put(ns, "a2", {"note": "no text to rank", "tag": "y"})
    assert store.search(ns, query="cats", filter={"tag": "y"}) == []
    assert store.last_explanation(ns) is None  # nothing was personalized: no LLM call
    assert len(list(llm.messages)) == 4  # none of its answers was taken


# -- inside a LangGraph graph -------------------------------------------------------------------
class State(TypedDict):
    note: str
    query: str
    found: list[str]


def remember_and_recall(state: State, config: RunnableConfig, *, store: BaseStore) -> dict:
    user = config["configurable"]["user_id"]
    namespace = ("memories", user)
    store.put(namespace, uuid.uuid4().hex, {"content": state["note"]})
    found = store.search(namespace, query=state["query"], limit=10)
    return {"found": [i.value["content"] for i in found]}


def graph(store: BaseStore, checkpointer: Any = None) -> Any:
    builder = StateGraph(State)
    builder.add_node("memory", remember_and_recall)
    builder.add_edge(START, "memory")
    builder.add_edge("memory", END)
    return builder.compile(checkpointer=checkpointer or InMemorySaver(), store=store)


#: What each user tells the graph, turn by turn (the graph tests interleave the two users).
NOTES = {
    "alice": ["alice walks the dog", "alice plays cello", "alice eats ramen"],
    "bob": ["bob repairs cameras", "bob avoids peanuts", "bob eats ramen"],
}


def test_a_state_graph_keeps_users_apart() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords())
    app = graph(store)
    notes = NOTES
    seen: dict[str, list[str]] = {"alice": [], "bob": []}
    for turn in range(3):
        for user in ("alice", "bob"):  # the two users' threads interleaved
            cfg: RunnableConfig = {"configurable": {"thread_id": f"t-{user}", "user_id": user}}
            out = app.invoke({"note": notes[user][turn], "query": "ramen", "found": []}, cfg)
            assert len(out["found"]) == turn + 1
            assert all(text.startswith(user) for text in out["found"])  # zero cross-user
            seen[user] = out["found"]
    assert seen["alice"][0] == "alice eats ramen" and seen["bob"][0] == "bob eats ramen"
    assert sorted(store.list_namespaces()) == [("memories", "alice"), ("memories", "bob")]
    snapshot = app.get_state({"configurable": {"thread_id": "t-alice"}})
    assert snapshot.values["note"] == "alice eats ramen"


async def test_a_state_graph_async() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords())
    app = graph(store)
    runs = [
        app.ainvoke(
            {"note": f"{user} note {i} about tea", "query": "tea", "found": []},
            {"configurable": {"thread_id": f"a-{user}", "user_id": user}},
        )
        for i in range(2)
        for user in ("alice", "bob")
    ]
    for out in await asyncio.gather(*runs):
        users = {text.split()[0] for text in out["found"]}
        assert len(users) == 1
    for user in ("alice", "bob"):  # answered by pbr, through LangGraph's async store path
        explained = store.last_explanation(("memories", user))
        assert explained is not None and explained["user"] == user


# -- async ----------------------------------------------------------------------------------
async def test_async_put_search_get_delete() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords())
    ns = ("memories", "alice")
    await store.aput(ns, "a", {"content": "the cello lesson is on Friday"})
    await store.aput(ns, "b", {"content": "buy oat milk"})
    await store.aput(("memories", "bob"), "a", {"content": "bob cello"})
    got = await store.asearch(ns, query="cello lesson")
    assert keys(got) == ["a", "b"] and got[0].namespace == ns
    assert (await store.aget(ns, "b")).value == {"content": "buy oat milk"}  # type: ignore[union-attr]
    await store.adelete(ns, "a")
    assert keys(await store.asearch(ns, query="cello")) == ["b"]
    assert sorted(keys(await store.asearch(ns))) == ["b"]
    assert await store.alist_namespaces() == await store.inner.alist_namespaces()


# -- faults ---------------------------------------------------------------------------------
class Flaky(InMemoryStore):
    """An InMemoryStore whose ``batch`` raises on one chosen call."""

    def __init__(self, fail_on: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_on = fail_on

    def batch(self, ops: Any) -> list[Result]:
        self.calls += 1
        if self.calls == self.fail_on:
            raise ConnectionError("the store went away")
        return super().batch(ops)


def test_a_failing_listing_raises_and_a_retry_succeeds() -> None:
    inner = Flaky(fail_on=10**9)
    store = filled(PBRStore(inner, BagOfWords()))
    inner.fail_on = inner.calls + 1  # the next call: the search's listing
    with pytest.raises(ConnectionError):
        store.search(("memories", "alice"), query="cello")
    got = store.search(("memories", "alice"), query="cello")
    assert got[0].key == "m4" and len(got) == len(ALICE)


def test_a_failure_after_ranking_raises_and_a_retry_succeeds() -> None:
    inner = Flaky(fail_on=10**9)
    store = filled(PBRStore(inner, BagOfWords()))
    inner.fail_on = inner.calls + 2  # listing succeeds, reading the results back fails
    with pytest.raises(ConnectionError):
        store.search(("memories", "alice"), query="cello")
    assert store.search(("memories", "alice"), query="cello")[0].key == "m4"


def test_a_failing_write_batch_leaves_consistent_state() -> None:
    inner = Flaky(fail_on=2)
    store = PBRStore(inner, BagOfWords())
    ns = ("memories", "alice")
    store.put(ns, "a", {"content": "first note about tea"})  # call 1
    ops: list[Op] = [
        PutOp(ns, k, {"content": t})
        for k, t in (("b", "second note about coffee"), ("c", "third note about tea"))
    ]
    with pytest.raises(ConnectionError):
        store.batch(ops)  # call 2
    assert keys(store.search(ns, query="tea")) == ["a"]
    store.batch(ops)  # the retry
    got = keys(store.search(ns, query="tea"))
    assert sorted(got) == ["a", "b", "c"] and got[-1] == "b"
    assert len(store.search(ns, limit=10)) == 3


class LostReply(InMemoryStore):
    """An InMemoryStore whose next write lands and then raises (a reply lost after commit)."""

    fail_next = False

    def _lost(self) -> None:
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("connection lost after commit")

    def batch(self, ops: Any) -> list[Result]:
        out = super().batch(ops)
        self._lost()
        return out

    async def abatch(self, ops: Any) -> list[Result]:
        out = await super().abatch(ops)
        self._lost()
        return out


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_write_that_landed_before_failing_is_seen_by_the_next_search(asynchronous: bool) -> None:
    """However fresh the view may be (``max_staleness_s``), a put or delete that raised may
    have landed: the next search lists again, so a deleted memory never reaches the LLM and
    a landed one is found (before, a failed write expired nothing)."""
    inner = LostReply()
    store = PBRStore(inner, BagOfWords(), max_staleness_s=3600)
    ns = ("memories", "alice")
    store.put(ns, "a", {"content": "I drink green tea every morning"})
    store.put(ns, "old", {"content": "my tea kettle is red"})
    assert sorted(keys(store.search(ns, query="tea"))) == ["a", "old"]
    put = PutOp(ns, "b", {"content": "I switched to black tea"})
    for write in (put, PutOp(ns, "old", None)):  # a put, then a delete
        inner.fail_next = True
        with pytest.raises(ConnectionError):
            if asynchronous:
                asyncio.run(store.abatch([write]))
            else:
                store.batch([write])
    assert sorted(keys(store.search(ns, query="tea"))) == ["a", "b"]
    history = store.corpus.history(scope_id(ns))
    assert history is not None and item_key(ns, "old") not in {i.id for i in history.items}


def test_the_latest_explanation_is_never_an_earlier_searchs() -> None:
    """A search that personalizes nothing (the user's last memory deleted, ``limit=0``) leaves
    no explanation: an earlier one, which names a deleted memory and its text, is not served
    as the latest (before, it was)."""
    store = PBRStore(InMemoryStore(), BagOfWords())
    ns = ("memories", "alice")
    store.put(ns, "secret", {"content": "my bank PIN is 4321"})
    assert keys(store.search(ns, query="bank PIN")) == ["secret"]
    assert store.last_explanation(ns) is not None
    store.search(ns, query="bank PIN", limit=0)
    assert store.last_explanation(ns) is None
    store.search(ns, query="bank PIN")
    store.delete(ns, "secret")
    assert store.search(ns, query="bank PIN") == []
    assert store.last_explanation(ns) is None


@pytest.mark.parametrize("query", ["   ", 5])
def test_a_query_that_is_not_text_is_refused_whatever_the_user_holds(query: Any) -> None:
    """One rule for every user (the core request's): before, a new user got ``[]`` and a user
    with memories a ``ValueError``. An empty query stays LangGraph's listing."""
    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    for ns in (("memories", "alice"), ("memories", "nobody")):
        with pytest.raises(ValueError, match="query must be a non-empty string"):
            store.search(ns, query=query)
    assert len(store.search(("memories", "alice"), query="")) == len(ALICE)


def test_a_mixed_batch_answers_in_order() -> None:
    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    ns = ("memories", "alice")
    results = store.batch(
        [
            GetOp(ns, "m1"),
            SearchOp(ns, None, 2, 0, "cello"),
            PutOp(ns, "m9", {"content": "cello strings to buy"}),
            SearchOp(ns, None, 10, 0, None),
            ListNamespacesOp(),
        ]
    )
    got, ranked, put, listed, _ = results
    assert isinstance(got, Item) and got.value["content"] == ALICE[0][1]
    assert isinstance(ranked, list) and isinstance(ranked[0], SearchItem)
    assert ranked[0].key == "m4"
    assert put is None
    assert isinstance(listed, list) and "m9" not in [getattr(i, "key", None) for i in listed]
    assert store.search(ns, query="cello strings")[0].key == "m9"


def test_langchain_pbr_imports_without_langgraph() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['langgraph'] = None; import langchain_pbr\n"
        "try:\n    langchain_pbr.PBRStore\nexcept ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "[langgraph]" in done.stdout


# -- LangMem ------------------------------------------------------------------------------------
def test_langmems_search_tool_ranks_with_pbr_per_user() -> None:
    langmem = pytest.importorskip("langmem")
    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    tool = langmem.create_search_memory_tool(
        namespace=("memories", "{langgraph_user_id}"), store=store, response_format="content"
    )
    for user, secret, other in (("alice", "cello", "cameras"), ("bob", "peanuts", "cello")):
        config = {"configurable": {"langgraph_user_id": user}}
        found = tool.invoke({"query": f"what about {secret} and {other}?"}, config=config)
        assert secret in found and other not in found  # the user's own memories only
        assert store.last_explanation(("memories", user)) is not None  # pbr answered


def test_an_unfilled_placeholder_namespace_is_an_error_never_a_shared_one() -> None:
    langmem = pytest.importorskip("langmem")
    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    template = ("memories", "{langgraph_user_id}")
    manage = langmem.create_manage_memory_tool(namespace=template, store=store)
    from langmem.errors import ConfigurationError  # a BaseException, not an Exception

    with pytest.raises(ConfigurationError, match="langgraph_user_id"):  # LangMem's own check
        manage.invoke({"content": "a shared secret", "action": "create"}, config={})
    # pbr's, whoever forgets to fill the template (older LangMem filled in the literal):
    with pytest.raises(ValueError, match="unfilled placeholder"):
        store.put(template, "k", {"content": "a shared secret"})
    with pytest.raises(ValueError, match="unfilled placeholder"):
        store.search(template, query="secret")
    with pytest.raises(ValueError, match="unfilled placeholder"):
        asyncio.run(store.aput(template, "k", {"content": "a shared secret"}))
    namespaces = {i.namespace for i in store.inner.search(("memories",), limit=100)}
    assert namespaces == {("memories", "alice"), ("memories", "bob")}  # nothing shared written


def test_langmems_missing_user_error_escapes_except_exception() -> None:
    """#39 point 10, documented in docs/agent-memory.md: ``except Exception`` misses it."""
    langmem = pytest.importorskip("langmem")
    from langmem.errors import ConfigurationError

    store = filled(PBRStore(InMemoryStore(), BagOfWords()))
    tool = langmem.create_search_memory_tool(
        namespace=("memories", "{langgraph_user_id}"), store=store
    )
    assert not issubclass(ConfigurationError, Exception)
    with pytest.raises(ConfigurationError):
        try:
            tool.invoke({"query": "cello"}, config={"configurable": {}})
        except Exception:  # what an app would write; it does not catch LangMem's error
            pytest.fail("LangMem's missing-user error became an Exception: update the docs")


def test_a_label_that_only_has_braces_is_a_namespace_not_a_placeholder() -> None:
    store = PBRStore(InMemoryStore(), BagOfWords())
    ns = ("memories", '{"id": 1}')  # e.g. a JSON-encoded user key
    store.put(ns, "k", {"content": "my cello lesson"})
    assert keys(store.search(ns, query="cello")) == ["k"]
    with pytest.raises(ValueError, match="unfilled placeholder"):
        store.put(("memories", "{user_id}"), "k", {"content": "x"})


def test_a_search_keeps_its_user_in_the_cache_while_another_users_search_would_evict_it() -> None:
    """Under a budget that holds one user, bob's search while alice's is under way does not
    evict alice between her request's reads (before, it did: her ranking then mapped her items
    to keys the eviction forgot, and PBRStore dropped every result)."""
    import threading

    inside, resume = threading.Event(), threading.Event()

    class Pausing(BagOfWords):
        def embed_query(self, text: str) -> list[float]:
            if text.startswith("PAUSE "):  # alice's query: after her history read
                inside.set()
                resume.wait(10)
                text = text.removeprefix("PAUSE ")
            return super().embed_query(text)

    inner = InMemoryStore()
    for user in ("alice", "bob"):
        for i in range(5):
            inner.put(("memories", user), f"k{i}", {"content": f"{user} note {i} about kale salad"})
    store = PBRStore(inner, Pausing(), max_cache_bytes=1)  # at most the user being read
    alone = [it.key for it in store.search(("memories", "alice"), query="salad", limit=3)]
    got: dict[str, list[str]] = {}
    alice = threading.Thread(
        target=lambda: got.setdefault(
            "alice",
            [it.key for it in store.search(("memories", "alice"), query="PAUSE salad", limit=3)],
        )
    )
    alice.start()
    assert inside.wait(10)
    bob = [it.key for it in store.search(("memories", "bob"), query="salad", limit=3)]
    resume.set()
    alice.join(10)
    assert got["alice"] == alone and len(bob) == 3


def test_memories_langmems_manager_writes_are_ranked_by_their_text() -> None:
    """LangMem's memory manager stores ``{"kind": "Memory", "content": {"content": ...}}``, and a
    custom schema its fields: ranked by the inner text, else the fields' JSON (before, such
    items were silently never ranked, and the manager re-created them on every run)."""
    inner = InMemoryStore()
    ns = ("memories", "alice")
    inner.put(ns, "m1", {"kind": "Memory", "content": {"content": "alice is allergic to peanuts"}})
    inner.put(ns, "m2", {"kind": "Pref", "content": {"food": "sushi", "when": "fridays"}})
    inner.put(ns, "m3", {"kind": "Memory", "content": {"content": "alice runs marathons"}})
    store = PBRStore(inner, BagOfWords())
    assert store.search(ns, query="peanuts allergy", limit=1)[0].key == "m1"
    assert store.search(ns, query="sushi on fridays", limit=1)[0].key == "m2"


def test_the_pages_of_one_search_with_a_sampling_llm_neither_repeat_nor_skip() -> None:
    """Each page (``offset`` / ``limit``) is a search of its own: with an llm, PBRStore keeps
    the last answers in memory by default, so every page ranks with the same ones (before, a
    sampling LLM answered each page anew, and pages repeated and skipped items)."""
    import itertools
    import random

    from langchain_core.language_models import BaseChatModel
    from langchain_core.outputs import ChatGeneration, ChatResult

    topics = [
        "tea",
        "coffee",
        "running",
        "cycling",
        "bread",
        "pasta",
        "cats",
        "dogs",
        "films",
        "books",
        "gardens",
        "chess",
    ]
    rng = random.Random(1)

    class Sampling(BaseChatModel):  # any temperature > 0 chat model
        model_name: str = "sampling"

        @property
        def _llm_type(self) -> str:
            return "sampling"

        def _generate(self, messages: Any, stop: Any = None, **kwargs: Any) -> ChatResult:
            picks = [f"I love {rng.choice(topics)}", f"I often think of {rng.choice(topics)}"]
            answer = json.dumps({"candidates": picks, "reasoning": f"about {rng.choice(topics)}"})
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=answer))])

    store = PBRStore(InMemoryStore(), BagOfWords(), llm=Sampling(), config=PBRConfig(fusion="full"))
    ns = ("memories", "alice")
    for i, (a, b) in enumerate(itertools.islice(itertools.permutations(topics, 2), 30)):
        store.put(ns, f"m{i:02d}", {"content": f"I like {a} and {b}"})
    pages: list[str] = []
    for offset in range(0, 30, 5):
        pages += [
            it.key for it in store.search(ns, query="what do I enjoy?", limit=5, offset=offset)
        ]
    assert sorted(pages) == [f"m{i:02d}" for i in range(30)]


def test_last_explanations_are_kept_for_the_most_recently_searched_prefixes(monkeypatch) -> None:
    """One explanation per prefix held for good would grow with every user a service sees
    (outside max_cache_bytes): PBRStore keeps the EXPLAINED_PREFIXES most recent ones."""
    import langchain_pbr.memory_store as memory_store

    monkeypatch.setattr(memory_store, "EXPLAINED_PREFIXES", 2)
    inner = InMemoryStore()
    for user in ("ann", "ben", "cai"):
        inner.put(("memories", user), "k", {"content": f"{user} likes kale salad"})
    store = PBRStore(inner, BagOfWords())
    for user in ("ann", "ben", "cai"):
        store.search(("memories", user), query="salad")
    assert store.last_explanation(("memories", "ann")) is None
    assert store.last_explanation(("memories", "cai")) is not None
    assert store.last_explanation(("memories", "ben")) is not None
