"""Agents that remember each user, with the embedded models (offline, CPU): LangGraph + LlamaIndex.

LangGraph: a ``StateGraph`` whose nodes recall the user's memories through the injected store
(``langchain_pbr.PBRStore`` over an ``InMemoryStore``: pbr ranks them, personalizing the search
with the embedded Gemma), answer with the embedded Gemma, and store the new message.

LlamaIndex: a ``SimpleChatEngine`` whose ``Memory`` has a ``llamaindex_pbr.PBRMemoryBlock`` per
user: messages flushed out of the short-term window become that user's long-term memories, and
each turn recalls the best ones for the latest messages.

    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    pip install 'personalize-before-retrieve[langchain,langgraph,llamaindex,local]'
    python examples/agent_memory.py                  # a few minutes on 2 CPU cores
    python examples/agent_memory.py --max-tokens 16  # shorter answers, faster

Gemma 3 270M is a tiny base model: its answers are rough, its recall is the point. Swap in your
own chat model / LLM and embeddings where the comments say so.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any, TypedDict

FACTS = {
    "alice": [
        "I am vegetarian and I cook a lot of lentils.",
        "My sister Ana is allergic to peanuts.",
        "I run along the river every Sunday.",
    ],
    "bob": [
        "I love grilling steak on Fridays.",
        "I play bass in a jazz band.",
        "My dog Rex is afraid of thunder.",
    ],
}
QUESTION = "What should I cook for dinner with my family?"


class State(TypedDict):
    message: str
    recalled: list[str]
    answer: str


def langgraph_agent(llm: Any, embeddings: Any = None) -> dict[str, list[str]]:
    """Each user's recalled memories for the question, through a LangGraph agent answering with
    the chat model ``llm`` (which also personalizes the store's searches); ``embeddings=None``:
    the embedded MiniLM."""
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.store.base import BaseStore
    from langgraph.store.memory import InMemoryStore

    from langchain_pbr import PBRStore

    def namespace(config: RunnableConfig) -> tuple[str, str]:
        return ("memories", config["configurable"]["user_id"])  # the user: the last element

    def recall(state: State, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
        found = store.search(namespace(config), query=state["message"], limit=2)
        return {"recalled": [item.value["content"] for item in found]}

    def answer(state: State) -> dict[str, Any]:
        facts = "\n".join(f"- {fact}" for fact in state["recalled"])
        prompt = f"Facts about the user:\n{facts}\n\nUser: {state['message']}\nAssistant:"
        return {"answer": llm.invoke(prompt).text.strip()}

    def remember(state: State, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
        store.put(namespace(config), uuid.uuid4().hex, {"content": state["message"]})
        return {}

    graph = StateGraph(State)
    for name, node in (("recall", recall), ("answer", answer), ("remember", remember)):
        graph.add_node(name, node)
    graph.add_edge(START, "recall")
    graph.add_edge("recall", "answer")
    graph.add_edge("answer", "remember")
    graph.add_edge("remember", END)
    store = PBRStore(InMemoryStore(), embeddings, llm=llm)  # llm: personalizes each search
    app = graph.compile(checkpointer=InMemorySaver(), store=store)

    recalled = {}
    for user, facts in FACTS.items():
        config = {"configurable": {"thread_id": f"thread-{user}", "user_id": user}}
        for fact in facts:  # earlier turns: each message is remembered
            app.invoke({"message": fact, "recalled": [], "answer": ""}, config)
        out = app.invoke({"message": QUESTION, "recalled": [], "answer": ""}, config)
        recalled[user] = out["recalled"]
        print(f"[LangGraph] {user}: recalled {out['recalled']}\n  answer: {out['answer']!r}")
    return recalled


def llamaindex_agent(llm: Any, embed_model: Any) -> dict[str, list[str]]:
    """Each user's recalled memories for the question, through a LlamaIndex chat engine
    answering with ``llm``."""
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.memory import Memory

    from llamaindex_pbr import PBRMemoryBlock

    recalled: dict[str, list[str]] = {}
    for user, facts in FACTS.items():
        # One block per user (there is no shared default namespace); llm=None: recall by pbr's
        # hybrid search alone, llm=llm would personalize it too (two more LLM calls per turn).
        block = PBRMemoryBlock(user_id=user, embed_model=embed_model)
        memory = Memory.from_defaults(
            session_id=f"session-{user}",
            memory_blocks=[block],
            token_limit=60,  # a small short-term window, so earlier turns flush into the block
            chat_history_token_ratio=0.5,
            token_flush_size=20,
        )
        engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
        for fact in facts:
            engine.chat(fact)
        reply = engine.chat(QUESTION)
        explanation = block.last_explanation() or {"results": []}
        ids = {result["id"] for result in explanation["results"]}
        history = block.history()
        recalled[user] = [i.text for i in history.items if i.id in ids] if history else []
        print(f"[LlamaIndex] {user}: recalled {recalled[user]!r}\n  answer: {str(reply)!r}")
    return recalled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=48,
        help="tokens per Gemma answer: the agents' replies and the LangGraph store's pseudo "
        "feedback (pbr's own default is 96; fewer is faster and personalizes less)",
    )
    args = parser.parse_args(argv)
    from langchain_pbr import LocalGemmaChatModel
    from llamaindex_pbr import LocalGemmaLLM, LocalMiniLMEmbedding

    langgraph_agent(LocalGemmaChatModel(max_tokens=args.max_tokens))  # or your chat model
    llamaindex_agent(LocalGemmaLLM(max_new_tokens=args.max_tokens), LocalMiniLMEmbedding())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
