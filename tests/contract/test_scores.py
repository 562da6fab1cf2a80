"""A result's score means the same for every query: a threshold tells related from unrelated.

Hybrid search ranks by a rule scaled per query (every query's best item ~1.0); what a result
returns is its relevance (:func:`pbr_core.hybrid.relevance`), so a question about nothing the user
said scores below one about their own words, and each framework's own threshold (LangChain's
``score_threshold``, LlamaIndex's ``SimilarityPostprocessor(similarity_cutoff=...)``) keeps the
first and drops the second. Bag-of-words embedders make "shares words" a measurable cosine.
"""

from __future__ import annotations

from doubles import langchain_notes_retriever, llamaindex_notes_retriever

from pbr_core import PBRConfig

NOTES = [
    "my dentist appointment moved to Thursday at nine",
    "I bake sourdough bread every weekend",
    "we booked window seats for the Lisbon flight",
    "the jazz concert was on Friday night",
]
RELATED = "when is my dentist appointment"
UNRELATED = "explain quantum chromodynamics to me"
CONFIG = PBRConfig(fusion="plain", explain="scores")  # q* = q: no LLM in the way
CUT = 0.3  # between the two questions' best scores (asserted below, not assumed)


def test_langchain_score_threshold_keeps_a_related_question_and_drops_an_unrelated_one() -> None:
    everything = langchain_notes_retriever(NOTES, CONFIG, {"k": 4})
    related = [d.metadata["score"] for d in everything.invoke(RELATED, user_id="ann")]
    unrelated = [d.metadata["score"] for d in everything.invoke(UNRELATED, user_id="ann")]
    assert max(unrelated) < CUT < related[0]
    assert related == sorted(related, reverse=True)

    kept = langchain_notes_retriever(NOTES, CONFIG, {"k": 4, "score_threshold": CUT})
    got = kept.invoke(RELATED, user_id="ann")
    assert got and got[0].page_content == NOTES[0]
    assert [d.metadata["score"] for d in got] == [s for s in related if s >= CUT]
    assert kept.invoke(UNRELATED, user_id="ann") == []


def test_llamaindex_similarity_cutoff_keeps_a_related_question_and_drops_an_unrelated_one() -> None:
    from llama_index.core.postprocessor import SimilarityPostprocessor

    ann = llamaindex_notes_retriever(NOTES, CONFIG, 4)
    related, unrelated = ann.retrieve(RELATED), ann.retrieve(UNRELATED)
    scores = [n.score or 0.0 for n in related]
    assert max(n.score or 0.0 for n in unrelated) < CUT < scores[0]
    assert scores == sorted(scores, reverse=True)

    cutoff = SimilarityPostprocessor(similarity_cutoff=CUT)
    kept = cutoff.postprocess_nodes(related)
    assert kept and kept[0].node.get_content() == NOTES[0]
    assert [n.node.node_id for n in kept] == [n.node.node_id for n in related][: len(kept)]
    assert cutoff.postprocess_nodes(unrelated) == []
