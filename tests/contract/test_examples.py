"""The examples' wiring runs with real framework objects (the models faked: the real embedded
ones take minutes there; ``python examples/agent_memory.py`` runs them)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import FakeListChatModel
from llama_index.core.llms import MockLLM

from llamaindex_pbr.testing import HashEmbedding

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_langgraph_agent_recalls_only_each_users_memories() -> None:
    example = _load("agent_memory")
    answer = json.dumps({"candidates": ["something to cook"]})
    recalled = example.langgraph_agent(
        FakeListChatModel(responses=[answer]), DeterministicFakeEmbedding(size=64)
    )
    for user, facts in example.FACTS.items():
        assert recalled[user] and set(recalled[user]) <= set(facts)


@pytest.mark.usefixtures("closes_llamaindex_memories")
def test_the_llamaindex_agent_recalls_only_each_users_memories() -> None:
    example = _load("agent_memory")
    recalled = example.llamaindex_agent(MockLLM(max_tokens=4), HashEmbedding(dim=64))
    for user in example.FACTS:
        others = [f for u, fs in example.FACTS.items() if u != user for f in fs]
        assert recalled[user], user
        assert not any(other in text for text in recalled[user] for other in others)
