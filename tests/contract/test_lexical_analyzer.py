"""``PBRConfig.lexical_stemmer`` reaches both frameworks' searches: one config, one analyzer for
the items and the query, whichever retriever runs it.

Lexical mode (BM25 only) with ``explain="scores"``: a question asking about "paint" matches the
note that says "painted" only when the lexical leg stems, and each result's ``pbr_search`` legs
say so.
"""

from __future__ import annotations

from typing import Any

import pytest
from doubles import langchain_notes_retriever, llamaindex_notes_retriever

from pbr_core import PBRConfig

NOTES = [
    "I painted the kitchen blue last spring",
    "my dentist appointment moved to Thursday",
    "we booked window seats for the Lisbon trip",
]
QUESTION = "what colour did I paint"
PLAIN = PBRConfig(fusion="plain", search="lexical", explain="scores")
STEMMED = PLAIN.with_(lexical_stemmer="english")


def _langchain(config: PBRConfig) -> list[tuple[str, dict[str, Any]]]:
    retriever = langchain_notes_retriever(NOTES, config, {"k": 1})
    return [
        (d.page_content, d.metadata["pbr_search"])
        for d in retriever.invoke(QUESTION, user_id="ann")
    ]


def _llamaindex(config: PBRConfig) -> list[tuple[str, dict[str, Any]]]:
    retriever = llamaindex_notes_retriever(NOTES, config, 1)
    return [
        (n.node.get_content(), n.node.metadata["pbr_search"]) for n in retriever.retrieve(QUESTION)
    ]


@pytest.mark.parametrize("search", [_langchain, _llamaindex], ids=["langchain", "llamaindex"])
def test_the_configured_stemmer_analyzes_items_and_query_alike(search: Any) -> None:
    ((_, plain),) = search(PLAIN)
    assert plain["lexical"] == 0.0  # "paint" is not "painted" as written
    ((text, stemmed),) = search(STEMMED)
    assert text == NOTES[0] and stemmed["lexical"] > 0.0
