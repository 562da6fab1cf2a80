"""llamaindex_pbr.PBRMemoryBlock: a long-term memory block inside LlamaIndex's real ``Memory``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ImageBlock, TextBlock
from llama_index.core.llms import (
    ChatMessage,
    CompletionResponse,
    CompletionResponseGen,
    CustomLLM,
    LLMMetadata,
)
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.memory import BaseMemoryBlock, Memory
from pydantic import PrivateAttr

from llamaindex_pbr import PBRMemoryBlock
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import HistoryStore, PBRConfig, PersistenceError

# each Memory's chat store closed after its test (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("closes_llamaindex_memories")

FILLER = [
    "I went for a walk in the park this morning",
    "We talked about the weather and the weekend",
    "My favourite breakfast is toast with butter",
    "The meeting moved to Thursday afternoon",
    "I am reading a novel about the sea",
    "My brother is visiting next month",
    "I should water the plants on the balcony",
    "The train was late again today",
]
#: The assistant's answers, all different (a repeated answer would match its stored copies).
ANSWERS = [
    "Okay.",
    "Got it.",
    "Sure thing.",
    "Understood.",
    "Right.",
    "Makes sense.",
    "Interesting!",
    "Good to know.",
    "Alright.",
    "Fair enough.",
]


class ListLLM(CustomLLM):
    """A completion model answering every prompt with a numbered list; counts its calls."""

    text: str = "1. my sourdough starter needs feeding\n2. I bake bread on Sundays"
    _calls: list[str] = PrivateAttr(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=False, model_name="list-llm")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._calls.append("sync")
        return CompletionResponse(text=self.text)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        self._calls.append("async")
        return CompletionResponse(text=self.text)

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        raise NotImplementedError


def block_for(user_id: str, **kwargs: Any) -> PBRMemoryBlock:
    return PBRMemoryBlock(user_id=user_id, embed_model=HashEmbedding(dim=256), **kwargs)


def memory_for(block: PBRMemoryBlock, session_id: str) -> Memory:
    # A small short-term budget: a few turns in, the oldest messages flush into the block.
    memory = Memory.from_defaults(
        session_id=session_id,
        memory_blocks=[block],
        token_limit=120,
        chat_history_token_ratio=0.5,
        token_flush_size=30,
    )
    return memory


def chat(memory: Memory, facts: list[str]) -> None:
    """An agent-style loop: each user turn, then the assistant's answer."""
    for i, fact in enumerate(facts):
        memory.put(ChatMessage(role="user", content=fact))
        memory.put(ChatMessage(role="assistant", content=ANSWERS[i % len(ANSWERS)]))


def memory_text(messages: list[ChatMessage]) -> str:
    """The text of the system message ``Memory`` builds from its blocks ('' if none)."""
    for m in messages:
        if m.role.value == "system":
            return "".join(b.text for b in m.blocks if isinstance(b, TextBlock))
    return ""


def short_term_text(messages: list[ChatMessage]) -> str:
    return " ".join(m.content or "" for m in messages if m.role.value != "system")


def test_is_a_memory_block_with_vector_block_defaults() -> None:
    block = block_for("alice")
    assert isinstance(block, BaseMemoryBlock)
    assert block.similarity_top_k == 2
    assert block.name == "PBRMemory"
    assert block.config == PBRConfig(fusion="plain")  # no llm: no LLM call, hybrid search
    assert block.config.search == "hybrid"


def test_flushed_messages_are_recalled_through_memory_get() -> None:
    block = block_for("alice")
    memory = memory_for(block, "alice-session")
    facts = ["My cat is called Pistachio and she is ginger", *FILLER]
    chat(memory, facts)

    history = block.history()
    assert history is not None  # the oldest turns flushed from short-term into the block
    stored = [item.text for item in history.items]
    assert facts[0] in stored
    roles = {item.metadata["role"] for item in history.items}
    assert roles == {"user", "assistant"}
    assert "Pistachio" not in short_term_text(memory.get())  # no longer short-term

    out = memory.get(input="what is the name of my cat Pistachio?")
    recalled = memory_text(out)
    assert "<PBRMemory>" in recalled
    assert "<message role='user'>My cat is called Pistachio and she is ginger</message>" in recalled
    assert recalled.count("<message ") <= 2  # similarity_top_k


def test_two_users_memories_never_leak() -> None:
    alice, bob = block_for("alice"), block_for("bob")
    alice_memory, bob_memory = memory_for(alice, "s-alice"), memory_for(bob, "s-bob")
    chat(alice_memory, ["My locker code is zanzibar seven", *FILLER])
    chat(bob_memory, ["My locker code is quokka nine", *FILLER])

    assert alice.corpus.users() == ["alice"]
    assert bob.corpus.users() == ["bob"]
    alice_texts = " ".join(i.text for i in alice.history().items)  # type: ignore[union-attr]
    bob_texts = " ".join(i.text for i in bob.history().items)  # type: ignore[union-attr]
    assert "zanzibar" in alice_texts and "quokka" not in alice_texts
    assert "quokka" in bob_texts and "zanzibar" not in bob_texts

    # Each asks for the other's secret word: neither ever gets the other's message.
    for question in ("what is my locker code zanzibar", "what is my locker code quokka"):
        a, b = (
            memory_text(alice_memory.get(input=question)),
            memory_text(bob_memory.get(input=question)),
        )
        assert "quokka" not in a and "zanzibar" in a
        assert "zanzibar" not in b and "quokka" in b


def test_a_rare_word_question_recalls_its_message() -> None:
    block = block_for("alice")
    memory = memory_for(block, "s1")
    facts = [FILLER[0], "The plumber recommended a thermostatic mixing valve", *FILLER[1:]]
    chat(memory, facts)

    history = block.history()
    assert history is not None and any("thermostatic" in i.text for i in history.items)
    assert "thermostatic" not in short_term_text(memory.get())  # flushed: long-term only
    out = memory.get(input="which thermostatic thing did he recommend?")
    assert "thermostatic mixing valve" in memory_text(out)
    explanation = block.last_explanation()
    assert explanation is not None
    assert explanation["user"] == "alice" and explanation["mode"] == "hybrid"
    history = block.history()
    assert history is not None
    valve = next(i.id for i in history.items if "thermostatic" in i.text)
    found = {r["id"]: r for r in explanation["results"]}
    assert found[valve]["lexical"] > 0  # BM25 matched the rare word (hybrid, not dense alone)


def test_keys_by_user_never_by_session() -> None:
    """LlamaIndex#22701: a later session must not be pinned to the first session's id."""
    block = block_for("alice")
    first = memory_for(block, "session-1")
    chat(first, ["My passport expires in October", *FILLER])
    assert block.history() is not None
    assert {i.metadata.get("session_id") for i in block.history().items} == {"session-1"}  # type: ignore[union-attr]

    second = memory_for(block, "session-2")  # same user, a new session
    recalled = memory_text(second.get(input="when does my passport expire?"))
    assert "passport expires in October" in recalled
    chat(second, ["I moved to Porto last spring", *FILLER])
    third = memory_for(block, "session-3")
    assert "Porto" in memory_text(third.get(input="where did I move, Porto?"))


def test_skips_empty_and_non_text_messages() -> None:
    block = block_for("alice")
    image = ChatMessage(role="user", blocks=[ImageBlock(url="https://example.com/cat.png")])
    asyncio.run(
        block.aput(
            [
                ChatMessage(role="user", content=""),
                ChatMessage(role="assistant", content="   "),
                image,
                ChatMessage(role="user", content="Only this one has text"),
            ]
        )
    )
    history = block.history()
    assert history is not None
    assert [(i.text, i.metadata["role"]) for i in history.items] == [
        ("Only this one has text", "user")
    ]
    assert asyncio.run(block.aget([])) == ""
    assert asyncio.run(block.aget([image])) == ""


def test_empty_block_recalls_nothing() -> None:
    block = block_for("alice")
    assert block.history() is None
    memory = memory_for(block, "s1")
    out = memory.get(input="anything at all")
    assert memory_text(out) == ""


@pytest.mark.parametrize("bad", ["", None, 3, ("alice",)])
def test_user_id_must_be_a_non_empty_string(bad: object) -> None:
    with pytest.raises(ValueError, match="user_id"):
        PBRMemoryBlock(user_id=bad, embed_model=HashEmbedding())


def test_user_id_is_required_and_frozen() -> None:
    with pytest.raises(ValueError, match="user_id"):
        PBRMemoryBlock(embed_model=HashEmbedding())  # type: ignore[call-arg]
    block = block_for("alice")
    with pytest.raises(ValueError, match="frozen"):
        block.user_id = "bob"
    assert block.user_id == "alice"


def test_bad_arguments_raise() -> None:
    for bad in (0, True, 2.0):  # the rule of the retrievers' k, before pydantic's coercion
        with pytest.raises(ValueError, match="similarity_top_k must be an integer >= 1"):
            block_for("alice", similarity_top_k=bad)
        with pytest.raises(ValueError, match="retrieval_context_window must be an integer"):
            block_for("alice", retrieval_context_window=bad)
    with pytest.raises(ValueError, match="no llm"):
        block_for("alice", config=PBRConfig(fusion="safe"))


def test_async_path() -> None:
    async def run() -> tuple[str, str]:
        block = block_for("alice")
        memory = memory_for(block, "s-async")
        for i, fact in enumerate(["My bike is a green Raleigh roadster", *FILLER]):
            await memory.aput(ChatMessage(role="user", content=fact))
            await memory.aput(ChatMessage(role="assistant", content=ANSWERS[i]))
        out = await memory.aget(input="what colour is my Raleigh bike?")
        direct = await block.aget([ChatMessage(role="user", content="Raleigh roadster")])
        return memory_text(out), direct

    recalled, direct = asyncio.run(run())
    assert "green Raleigh roadster" in recalled
    assert direct.startswith("<message role='user'>My bike is a green Raleigh roadster")


def test_llm_personalizes_the_recall() -> None:
    llm = ListLLM()
    assert block_for("alice", llm=llm).config == PBRConfig()  # with an llm: pbr's default
    block = block_for("alice", llm=llm, config=PBRConfig(fusion="full"), similarity_top_k=1)
    memory = memory_for(block, "s1")
    chat(memory, [FILLER[0], "I keep a sourdough starter in the fridge", *FILLER[1:]])
    out = asyncio.run(memory.aget(input="what do I keep in the fridge?"))
    assert "sourdough starter" in memory_text(out)
    assert llm._calls  # pbr's P-PRF calls went through the LlamaIndex LLM
    explanation = block.last_explanation()
    assert explanation is not None and explanation["fusion"] == "full"
    assert "utterances" in explanation["used"]
    assert len(explanation["pseudo_utterances"]) == 2
    assert "sourdough" in explanation["pseudo_utterances"][0]


def test_a_persisted_block_resumes_the_users_memories(tmp_path: Any) -> None:
    emb = HashEmbedding(dim=64)
    alice = PBRMemoryBlock(user_id="alice", embed_model=emb)
    chat(memory_for(alice, "s1"), ["My locker code is zanzibar seven", *FILLER])
    alice.persist(tmp_path / "mem")
    bob = PBRMemoryBlock(user_id="bob", embed_model=emb, store=alice.corpus.cache)
    assert bob.history() is None  # one store, two users: bob sees none of alice's items

    resumed = PBRMemoryBlock.from_persist_dir(tmp_path / "mem", user_id="alice", embed_model=emb)
    memory = memory_for(resumed, "s2")  # a later session, a new process's Memory
    out = memory_text(memory.get(input="what is my locker code zanzibar"))
    assert "zanzibar seven" in out
    other = PBRMemoryBlock.from_persist_dir(tmp_path / "mem", user_id="bob", embed_model=emb)
    assert other.history() is None
    with pytest.raises(PersistenceError):
        PBRMemoryBlock.from_persist_dir(
            tmp_path / "mem", user_id="alice", embed_model=HashEmbedding(dim=32)
        )


def test_a_block_built_without_a_store_exposes_the_one_it_writes_to(tmp_path: Any) -> None:
    emb = HashEmbedding(dim=64)
    alice = PBRMemoryBlock(user_id="alice", embed_model=emb)
    assert alice.store is not None and alice.store is alice.corpus.cache
    bob = PBRMemoryBlock(user_id="bob", embed_model=emb, store=alice.store)
    chat(memory_for(bob, "s1"), ["My bike lock code is kilimanjaro nine", *FILLER])
    alice.persist(tmp_path / "mem")  # one store: bob's memories are in alice's save
    resumed = PBRMemoryBlock.from_persist_dir(tmp_path / "mem", user_id="bob", embed_model=emb)
    out = memory_text(memory_for(resumed, "s2").get(input="what is my bike lock code"))
    assert "kilimanjaro nine" in out


def test_a_store_holding_another_models_vectors_is_refused_before_anything_is_written(
    tmp_path: Any,
) -> None:
    """A shared (``store=block.store``) or loaded store whose vectors one model made takes no
    block of another: queries and new items would be compared with vectors of another space
    (before, both were accepted, and the save then refused the model that embedded bob's)."""
    alice = PBRMemoryBlock(user_id="alice", embed_model=HashEmbedding(dim=64))
    asyncio.run(alice.aput([ChatMessage(role="user", content="My locker code is zanzibar")]))
    other = HashEmbedding(dim=64, model_name="another-model")
    with pytest.raises(PersistenceError, match="another-model"):
        PBRMemoryBlock(user_id="bob", embed_model=other, store=alice.store)
    alice.persist(tmp_path / "mem")
    with pytest.raises(PersistenceError, match="another-model"):
        PBRMemoryBlock(user_id="bob", embed_model=other, store=HistoryStore.load(tmp_path / "mem"))
    # two blocks over one empty store: the first write records its model, the other's refused
    first = PBRMemoryBlock(user_id="carol", embed_model=HashEmbedding(dim=64))
    second = PBRMemoryBlock(user_id="dave", embed_model=other, store=first.store)
    asyncio.run(first.aput([ChatMessage(role="user", content="carol plays chess")]))
    with pytest.raises(PersistenceError, match="another-model"):
        asyncio.run(second.aput([ChatMessage(role="user", content="dave plays go")]))
    assert second.history() is None


def test_a_messages_text_blocks_are_joined_as_chat_message_content_joins_them() -> None:
    """Words at the edge of two text blocks stay apart, in what is stored and in the query, as
    in ``ChatMessage.content`` (before, "Rex" and "Pistachio" became "RexPistachio")."""
    block = block_for("alice")
    two = ChatMessage(
        role="user", blocks=[TextBlock(text="My dog is called Rex"), TextBlock(text="Pistachio")]
    )
    asyncio.run(block.aput([two]))
    history = block.history()
    assert history is not None and [i.text for i in history.items] == [two.content]


def test_a_recall_that_finds_nothing_leaves_no_earlier_explanation() -> None:
    block = block_for("alice")
    asyncio.run(block.aput([ChatMessage(role="user", content="my bank PIN is 4321")]))
    assert asyncio.run(block.aget([ChatMessage(role="user", content="bank PIN")]))
    assert block.last_explanation() is not None
    assert asyncio.run(block.aget([ChatMessage(role="user", content="   ")])) == ""
    assert block.last_explanation() is None


def test_a_message_that_is_not_utf8_does_not_stop_memory_from_flushing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lone surrogate (bytes decoded with ``surrogateescape``) is stored as U+FFFD with a
    warning: ``Memory`` flushes on its own and retries on every later ``put``, so refusing the
    flush made every later ``put`` of the conversation raise and nothing reach the block."""
    block = block_for("bob")
    memory = Memory.from_defaults(
        session_id="s",
        memory_blocks=[block],
        token_limit=40,
        chat_history_token_ratio=0.5,
        token_flush_size=20,
    )
    turns = ["My cat is called Pistachio and she is lovely", "bad \ud800 text", *FILLER[:4]]
    with caplog.at_level("WARNING", logger="pbr.memory"):
        for i, turn in enumerate(turns):
            memory.put(ChatMessage(role="user" if i % 2 == 0 else "assistant", content=turn))
    history = block.history()
    assert history is not None
    texts = [item.text for item in history.items]
    assert turns[0] in texts and "bad \ufffd text" in texts
    assert "not UTF-8" in caplog.text


def test_the_latest_message_is_the_query_so_a_topic_switch_finds_its_fact() -> None:
    """#39 point 7: with the latest 5 messages as the query, the recent talk about trains and a
    novel drowned "what is my dog called?" and "My dog is called Rex" was not recalled."""
    block = block_for("alice")
    stored = ["My dog is called Rex", *FILLER]
    asyncio.run(block.aput([ChatMessage(role="user", content=t) for t in stored]))
    recent = [
        ChatMessage(role="user", content="Was the train late again today?"),
        ChatMessage(role="assistant", content="Yes, the train was late again today."),
        ChatMessage(role="user", content="Am I still reading that novel about the sea?"),
        ChatMessage(role="assistant", content="You are reading a novel about the sea."),
        ChatMessage(role="user", content="what is my dog called?"),
    ]
    recalled = asyncio.run(block.aget(recent))
    assert "My dog is called Rex" in recalled
    explanation = block.last_explanation()
    assert explanation is not None and explanation["query"] == "what is my dog called?"
