"""A result carries the same metadata keys in both frameworks, for every ``explain`` mode: the
rule is :func:`pbr_core.adapters_support.result_metadata` with the request's
:meth:`~pbr_core.retrieval.Retrieval.payload`, one for both adapters (LangChain's explanation
once lacked the ``mode`` LlamaIndex's carried)."""

from __future__ import annotations

from typing import Any

import pytest
from doubles import langchain_notes_retriever, llamaindex_notes_retriever

from pbr_core import PBRConfig

NOTES = [
    "my dentist appointment moved to Thursday at nine",
    "I bake sourdough bread every weekend",
    "we booked window seats for the Lisbon flight",
]
QUESTION = "when is my dentist appointment"


def _langchain(config: PBRConfig) -> list[dict[str, Any]]:
    retriever = langchain_notes_retriever(NOTES, config, {"k": 2})
    return [d.metadata for d in retriever.invoke(QUESTION, user_id="ann")]


def _llamaindex(config: PBRConfig) -> list[dict[str, Any]]:
    return [
        n.node.metadata for n in llamaindex_notes_retriever(NOTES, config, 2).retrieve(QUESTION)
    ]


def _shape(value: Any) -> Any:
    """Keys, nested, without the values (the two doubles embed differently)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return type(value).__name__


@pytest.mark.parametrize("explain", ["none", "scores", "first", "all"])
def test_both_frameworks_give_a_result_the_same_keys(explain: str) -> None:
    config = PBRConfig(fusion="plain", explain=explain)  # type: ignore[arg-type]
    langchain, llamaindex = _langchain(config), _llamaindex(config)
    assert len(langchain) == len(llamaindex) == 2
    for ours, theirs in zip(langchain, llamaindex):
        # a LangChain Document has no score of its own: it carries it in its metadata, where
        # LlamaIndex keeps it in NodeWithScore.score (docs/configuration.md, explain)
        assert ("score" in ours) == (explain != "none")
        assert _shape({k: v for k, v in ours.items() if k != "score"}) == _shape(theirs)
    if explain in ("first", "all"):
        assert langchain[0]["pbr"]["mode"] == llamaindex[0]["pbr"]["mode"] == "hybrid"
