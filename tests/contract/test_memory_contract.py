"""The data-ownership contract of the agent-memory adapters, on every backend.

The memory adapters keep the retrievers' contract (test_ownership_contract.py, beside this file)
where a memory API has the verb: ``langchain_pbr.PBRStore`` over LangGraph's ``InMemoryStore`` and
over ``PostgresStore`` on a real server, and ``llamaindex_pbr.PBRMemoryBlock`` with its own store
and with one store shared by several users' blocks. One suite, adapter-neutral verbs: users sharing
keys stay apart, a forget removes only the caller's memory, prompts hold only the caller's memories,
the store is the truth (a memory removed behind the adapter's back is never recalled nor prompted),
a second worker over the same store sees the first one's writes, a missing user is an error, and a
score means the same everywhere."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("langgraph")

from doubles import BagOfWords
from langgraph.store.memory import InMemoryStore
from llama_index.core.base.llms.types import ChatMessage
from test_ownership_contract import RecordingLC, RecordingLI

from langchain_pbr import PBRStore
from llamaindex_pbr import PBRMemoryBlock
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import HistoryStore, PBRConfig

BACKENDS = ("store-memory", "store-postgres", "block-own", "block-shared")
#: Every query calls the LLM (no gate), so the prompts show what reaches it.
ALWAYS_CALL = PBRConfig(fusion="full", pre_gate=None)


@dataclass
class Recalled:
    key: str
    text: str
    score: float
    legs: dict[str, Any] = field(default_factory=dict)


class MemoryHarness:
    """The adapter-neutral verbs of the memory contract."""

    prompts: list[str]

    def remember(self, user: str, key: str, text: str) -> None: ...
    def forget(self, user: str, key: str) -> None: ...
    def recall(self, user: str, query: str, k: int = 10) -> list[Recalled]: ...
    def remove_behind(self, user: str, key: str) -> None: ...  # through the store itself
    def second_worker(self) -> MemoryHarness: ...
    def bad_user(self) -> None: ...  # must raise ValueError


class StoreHarness(MemoryHarness):
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.llm = RecordingLC(responses=["x"])
        self.prompts = self.llm.prompts
        self.store = PBRStore(inner, BagOfWords(), llm=self.llm, config=ALWAYS_CALL)

    def remember(self, user: str, key: str, text: str) -> None:
        self.store.put(("memories", user), key, {"content": text})

    def forget(self, user: str, key: str) -> None:
        self.store.delete(("memories", user), key)

    def recall(self, user: str, query: str, k: int = 10) -> list[Recalled]:
        found = self.store.search(("memories", user), query=query, limit=k)
        explained = self.store.last_explanation(("memories", user)) or {"results": []}
        legs = {r["key"]: r for r in explained["results"]}
        return [
            Recalled(i.key, i.value["content"], float(i.score or 0), legs[i.key]) for i in found
        ]

    def remove_behind(self, user: str, key: str) -> None:
        self.inner.delete(("memories", user), key)

    def second_worker(self) -> MemoryHarness:
        return StoreHarness(self.inner)

    def bad_user(self) -> None:
        self.store.search(("memories", ""), query="anything")


class BlockHarness(MemoryHarness):
    """One ``PBRMemoryBlock`` per user; ``store`` shared by all of them, or one store each."""

    def __init__(self, shared: HistoryStore | None) -> None:
        self.shared = shared
        self.llm = RecordingLI()
        self.prompts = self.llm._prompts
        self.blocks: dict[str, PBRMemoryBlock] = {}
        self.keys: dict[tuple[str, str], str] = {}  # (user, contract key) -> the block's item id

    def block(self, user: str) -> PBRMemoryBlock:
        if user not in self.blocks:
            self.blocks[user] = PBRMemoryBlock(
                user_id=user,
                embed_model=HashEmbedding(dim=32),
                llm=self.llm,
                config=ALWAYS_CALL,
                similarity_top_k=10,
                store=self.shared if self.shared is not None else HistoryStore(),
            )
        return self.blocks[user]

    def _ids(self, user: str) -> set[str]:
        history = self.block(user).history()
        return {it.id for it in history.items} if history is not None else set()

    def remember(self, user: str, key: str, text: str) -> None:
        before = self._ids(user)
        asyncio.run(self.block(user)._aput([ChatMessage(role="user", content=text)]))
        (new,) = self._ids(user) - before
        self.keys[(user, key)] = new

    def forget(self, user: str, key: str) -> None:
        self.block(user).corpus.delete(user, [self.keys[(user, key)]])

    def recall(self, user: str, query: str, k: int = 10) -> list[Recalled]:
        block = self.block(user)
        block.similarity_top_k = k
        asyncio.run(block._aget([ChatMessage(role="user", content=query)]))
        explained = block.last_explanation() or {"results": []}
        history = block.history()
        text = {it.id: it.text for it in history.items} if history is not None else {}
        key = {v: c for (u, c), v in self.keys.items() if u == user}
        return [
            Recalled(key.get(r["id"], r["id"]), text[r["id"]], r["score"], r)
            for r in explained["results"]
        ]

    def remove_behind(self, user: str, key: str) -> None:
        store = self.block(user).corpus.cache  # the HistoryStore itself, not the block
        store.delete(user, [self.keys[(user, key)]])

    def second_worker(self) -> MemoryHarness:
        if self.shared is None:
            pytest.skip("each block has its own store: nothing is shared with a second worker")
        other = BlockHarness(self.shared)
        other.keys = self.keys
        return other

    def bad_user(self) -> None:
        PBRMemoryBlock(user_id="", embed_model=HashEmbedding(dim=32))


@pytest.fixture(params=BACKENDS)
def memory(request: pytest.FixtureRequest) -> Iterator[MemoryHarness]:
    if request.param == "store-memory":
        yield StoreHarness(InMemoryStore())
    elif request.param == "store-postgres":
        yield StoreHarness(request.getfixturevalue("postgres"))
    elif request.param == "block-own":
        yield BlockHarness(None)
    else:
        yield BlockHarness(HistoryStore())


ALICE = {"x": "alice pin is 4321", "y": "alice likes green tea", "z": "alice runs on sundays"}
BOB = {"x": "bob plays jazz piano", "y": "bob hates mornings", "z": "bob cooks ramen"}


def fill(memory: MemoryHarness) -> None:
    for user, notes in (("alice", ALICE), ("bob", BOB)):
        for key, text in notes.items():
            memory.remember(user, key, text)


def texts(found: list[Recalled]) -> list[str]:
    return sorted(r.text for r in found)


# -- users stay apart ------------------------------------------------------------------------------
def test_two_users_sharing_keys_recall_only_their_own(memory: MemoryHarness) -> None:
    fill(memory)
    assert texts(memory.recall("alice", "pin")) == sorted(ALICE.values())
    assert texts(memory.recall("bob", "jazz")) == sorted(BOB.values())


def test_a_forget_removes_only_the_callers_memory(memory: MemoryHarness) -> None:
    fill(memory)
    memory.forget("alice", "x")
    assert texts(memory.recall("alice", "pin")) == sorted([ALICE["y"], ALICE["z"]])
    assert texts(memory.recall("bob", "jazz")) == sorted(BOB.values())


def test_prompts_hold_only_the_callers_memories(memory: MemoryHarness) -> None:
    fill(memory)
    memory.prompts.clear()
    memory.recall("alice", "what do I like?")
    assert memory.prompts  # the LLM was asked, with the related memories
    joined = "\n".join(memory.prompts)
    assert any(text in joined for text in ALICE.values())
    assert not any(text in joined for text in BOB.values())


# -- the store is the truth ------------------------------------------------------------------------
def test_a_memory_removed_behind_the_adapter_is_never_recalled_nor_prompted(
    memory: MemoryHarness,
) -> None:
    fill(memory)
    assert "alice pin is 4321" in texts(memory.recall("alice", "pin"))  # cached by pbr now
    memory.remove_behind("alice", "x")
    memory.prompts.clear()
    found = memory.recall("alice", "pin")
    assert "alice pin is 4321" not in texts(found)
    assert memory.prompts and not any("4321" in p for p in memory.prompts)


def test_a_second_worker_over_the_same_store_sees_the_first_ones_writes(
    memory: MemoryHarness,
) -> None:
    memory.remember("alice", "x", ALICE["x"])
    second = memory.second_worker()
    assert texts(second.recall("alice", "pin")) == [ALICE["x"]]
    memory.remember("alice", "y", ALICE["y"])
    memory.forget("alice", "x")
    assert texts(second.recall("alice", "tea")) == [ALICE["y"]]


def test_a_missing_user_is_an_error_never_a_shared_default(memory: MemoryHarness) -> None:
    with pytest.raises(ValueError):
        memory.bad_user()


# -- one meaning of score --------------------------------------------------------------------------
def test_scores_mean_the_same_on_every_backend(memory: MemoryHarness) -> None:
    """Hybrid by default: the fused score in [0, 1], best first; the item holding the query's
    word is first in the lexical leg, the others hold no query word."""
    fill(memory)
    found = memory.recall("alice", "pin")
    scores = [r.score for r in found]
    assert len(found) == 3 and scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert found[0].text == "alice pin is 4321" and found[0].legs["lexical_rank"] == 1
    assert all(r.legs["lexical_rank"] is None for r in found[1:])
    assert sorted(r.legs["dense_rank"] for r in found) == [1, 2, 3]
