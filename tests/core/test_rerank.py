"""The opt-in re-rank stage (``PBRConfig(rerank="salience")``): ranked candidates by salience.

The scorer is a fake LM (the salience math is pinned in test_salience.py): an item that holds the
word "secret" makes every query 5 nats more likely, any other item changes nothing, so which item
the stage must put first follows from the rule, not from a model.
"""

from __future__ import annotations

import asyncio

import pytest
from doubles import SecretScorer

from pbr_core import PBRConfig, Personalizer
from pbr_core.rerank import rerank_by_salience

NOTES = [f"note {i} about the garden" for i in range(11)] + ["the secret code is 4321"]
QUERY = "a note about the garden"


def personalizer(hash_embedder: object) -> Personalizer:
    p = Personalizer(hash_embedder, config=PBRConfig(fusion="plain"))  # type: ignore[arg-type]
    p.add_texts("u", NOTES, ids=[f"n{i}" for i in range(len(NOTES))])
    return p


RERANK = PBRConfig(fusion="plain", rerank="salience", rerank_candidates=12)


def test_rerank_puts_the_most_salient_candidate_first_and_returns_k(hash_embedder: object) -> None:
    p, scorer = personalizer(hash_embedder), SecretScorer()
    plain = p.search("u", QUERY, k=12)
    before = [h.id for h in plain.hits].index("n11") + 1
    assert before > 3  # the ranking alone does not return the secret in the top 3
    got = p.search("u", QUERY, k=3, config=RERANK, salience_scorer=scorer)
    assert got.hits[0].id == "n11" and len(got.hits) == 3
    assert got.hits[0].legs is not None and got.hits[0].legs["rank_before_rerank"] == before
    assert got.hits[0].legs["salience"] == pytest.approx(5.0)
    assert len(scorer.calls) == 1 and len(scorer.calls[0]) == 13  # 12 candidates + empty slot
    # the others keep the ranking's order (equal salience), and the scores never rise
    assert [h.id for h in got.hits[1:]] == [h.id for h in plain.hits if h.id != "n11"][:2]
    scores = [h.score for h in got.hits]
    assert scores == sorted(scores, reverse=True)
    assert "rerank" in got.personalized.explanation.timings_ms


def test_the_rerank_window_is_fixed_so_the_first_results_never_depend_on_k(
    hash_embedder: object,
) -> None:
    """The stage re-orders the ``rerank_candidates`` best, whatever ``k``: a larger ``k`` gets
    the rest in the ranking's order after them, so every ``k`` returns the first ``k`` of the
    same list and pages (``offset + limit``, as the LangGraph store asks) neither skip nor
    repeat an item (before, the window grew with ``k`` and each page re-ordered anew)."""
    p = personalizer(hash_embedder)
    config = RERANK.with_(rerank_candidates=4)
    plain = [h.id for h in p.search("u", QUERY, k=12).hits]
    assert plain.index("n11") >= 4  # the secret is outside the window
    scorer = SecretScorer()
    full = [h.id for h in p.search("u", QUERY, k=12, config=config, salience_scorer=scorer).hits]
    assert full == plain  # the window holds no secret: the ranking's order
    for k in range(1, 13):
        got = p.search("u", QUERY, k=k, config=config, salience_scorer=scorer)
        assert [h.id for h in got.hits] == full[:k]
    assert {len(call) for call in scorer.calls} == {5}  # 4 candidates + the empty slot, every k


def test_async_search_reranks_the_same_way(hash_embedder: object) -> None:
    p = personalizer(hash_embedder)
    sync = p.search("u", QUERY, k=4, config=RERANK, salience_scorer=SecretScorer())
    got = asyncio.run(p.asearch("u", QUERY, k=4, config=RERANK, salience_scorer=SecretScorer()))
    assert [h.id for h in got.hits] == [h.id for h in sync.hits]
    assert [h.score for h in got.hits] == [h.score for h in sync.hits]


def test_a_threshold_after_rerank_still_cuts_the_list(hash_embedder: object) -> None:
    p = personalizer(hash_embedder)
    full = p.search("u", QUERY, k=6, config=RERANK, salience_scorer=SecretScorer())
    cut = full.hits[2].score
    got = p.search(
        "u", QUERY, k=6, config=RERANK, salience_scorer=SecretScorer(), score_threshold=cut
    )
    assert [h.id for h in got.hits] == [h.id for h in full.hits if h.score >= cut]
    assert [h.id for h in got.hits] == [h.id for h in full.hits][: len(got.hits)]


def test_no_candidates_call_no_model() -> None:
    assert rerank_by_salience(QUERY, [], scorer=None) == []  # None would load Gemma


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("rerank", "cross-encoder", "rerank must be one of"), ("rerank_candidates", 0, ">= 1")],
)
def test_config_refuses_an_unknown_rerank_stage(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PBRConfig(**{field: value})  # type: ignore[arg-type]
    assert PBRConfig().rerank == "none"
