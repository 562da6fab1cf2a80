"""Ranking metrics against hand-computed cases and the official PersonaBench rule."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pbr_bench import metrics
from pbr_bench.metrics import (
    best_over_combinations,
    dcg_at_k,
    evaluate,
    hit_at_k,
    mrr,
    ndcg_at_k,
    recall_any_at_k,
    recall_at_k,
)

L2, L3, L4, L5, L6 = (1 / math.log2(n) for n in (2, 3, 4, 5, 6))  # discounts of ranks 1..5


def test_public_api_is_pinned() -> None:
    assert sorted(metrics.__all__) == [
        "best_over_combinations",
        "dcg_at_k",
        "evaluate",
        "hit_at_k",
        "mrr",
        "ndcg_at_k",
        "recall_any_at_k",
        "recall_at_k",
    ]


def test_recall_counts_relevant_in_top_k_over_gold_size() -> None:
    assert recall_at_k(["a", "b", "c"], {"a", "c", "d"}, k=2) == pytest.approx(1 / 3)
    assert recall_at_k(["a", "b", "c"], {"a", "c", "d"}, k=3) == pytest.approx(2 / 3)


def test_ndcg_uses_log2_rank_plus_one_discount() -> None:
    # hits at ranks 2 and 4; ideal: two hits at ranks 1 and 2
    got = ndcg_at_k(["x", "a", "y", "b"], {"a", "b"}, k=5)
    assert dcg_at_k(["x", "a", "y", "b"], {"a", "b"}, k=5) == pytest.approx(L3 + L5)
    assert got == pytest.approx((L3 + L5) / (L2 + L3))
    assert got == pytest.approx(0.650921, abs=1e-6)


def test_ideal_dcg_is_over_min_of_gold_size_and_k() -> None:
    gold = {f"g{i}" for i in range(7)}
    ranking = ["g0", "g1", "g2", "g3", "g4"]
    assert ndcg_at_k(ranking, gold, k=5) == pytest.approx(1.0)
    assert recall_at_k(ranking, gold, k=5) == pytest.approx(5 / 7)


def test_ranking_is_cut_at_k_and_shorter_rankings_are_scored_as_is() -> None:
    assert recall_at_k(["x", "y", "a"], {"a"}, k=2) == 0.0
    assert ndcg_at_k(["a"], {"a", "b"}, k=5) == pytest.approx(1 / (L2 + L3))


def test_repeated_ids_in_a_ranking_gain_once() -> None:
    assert recall_at_k(["a", "a", "b"], {"a", "b"}, k=2) == pytest.approx(0.5)
    assert ndcg_at_k(["a", "a", "b"], {"a", "b"}, k=2) == pytest.approx(1 / (L2 + L3))
    assert mrr(["x", "x", "a"], {"a"}) == pytest.approx(1 / 3)


def test_empty_gold_scores_zero() -> None:
    assert recall_at_k(["a"], set(), k=5) == 0.0
    assert ndcg_at_k(["a"], set(), k=5) == 0.0
    assert best_over_combinations(["a"], [], k=5) == (0.0, 0.0)


def test_k_must_be_positive() -> None:
    with pytest.raises(ValueError, match="k must be >= 1"):
        recall_at_k(["a"], {"a"}, k=0)


def test_hit_and_mrr() -> None:
    assert hit_at_k(["x", "a"], {"a"}, k=1) == 0.0
    assert hit_at_k(["x", "a"], {"a"}, k=2) == 1.0
    assert mrr(["x", "y", "b"], {"b", "z"}) == pytest.approx(1 / 3)
    assert mrr(["x", "y", "b"], {"b"}, k=2) == 0.0
    assert mrr(["x"], {"b"}) == 0.0


def test_best_over_combinations_picks_the_best_alternative_per_element() -> None:
    # combos {a,b}: both found (ranks 1, 3); {a,c}: only a.
    recall, ndcg = best_over_combinations(["a", "x", "b"], [["a"], ["b", "c"]], k=5)
    assert recall == pytest.approx(1.0)
    assert ndcg == pytest.approx((L2 + L4) / (L2 + L3))
    assert ndcg == pytest.approx(0.919721, abs=1e-6)


def test_best_over_combinations_collapses_a_document_shared_by_two_elements() -> None:
    # One session supports both answer elements: the official scorer takes set(combination), so
    # the gold set is {a}: recall 1/1, ideal DCG over one item.
    recall, ndcg = best_over_combinations(["x", "a"], [["a"], ["a"]], k=5)
    assert recall == pytest.approx(1.0)
    assert ndcg == pytest.approx(L3)


def test_best_over_combinations_prefers_the_collapsed_combination_when_better() -> None:
    # {a} (a chosen twice) beats {a, c} and {b, a}.
    assert best_over_combinations(["a", "p", "q"], [["a", "b"], ["a", "c"]], k=5) == (1.0, 1.0)


def _official_rule(retrieved: list[str], gold: list[list[str]], k: int) -> tuple[float, float]:
    """Independent restatement of PersonaBench's scorer, for the property test."""
    top = retrieved[:k]
    best_r = best_n = 0.0
    for combo in itertools.product(*gold):
        g = set(combo)
        r = len(set(top) & g) / len(g)
        dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(top) if d in g)
        idcg = sum(1 / math.log2(i + 2) for i in range(min(len(g), k)))
        best_r, best_n = max(best_r, r), max(best_n, dcg / idcg)
    return best_r, best_n


ids = st.sampled_from([f"d{i}" for i in range(12)])


@settings(max_examples=100, deadline=None)
@given(
    retrieved=st.lists(ids, min_size=1, max_size=8, unique=True),
    gold=st.lists(st.lists(ids, min_size=1, max_size=3), min_size=1, max_size=4),
    k=st.integers(1, 6),
)
def test_matches_the_official_rule_on_unique_rankings(
    retrieved: list[str], gold: list[list[str]], k: int
) -> None:
    got = best_over_combinations(retrieved, gold, k)
    assert got == pytest.approx(_official_rule(retrieved, gold, k))


def test_evaluate_micro_averages_overall_and_per_category() -> None:
    rankings = {"q1": ["a", "x"], "q2": ["x", "b"], "q3": ["y"]}
    gold = {"q1": [["a"]], "q2": [["b"]], "q3": [["c"], ["d"]]}
    cats = {"q1": "A", "q2": "A", "q3": "B"}
    out = evaluate(rankings, gold, ks=(1, 5), categories=cats)
    assert out["Overall"]["n"] == 3
    assert out["Overall"]["R@1"] == pytest.approx(1 / 3)
    assert out["Overall"]["R@5"] == pytest.approx(2 / 3)
    assert out["A"]["N@5"] == pytest.approx((1.0 + L3) / 2)
    assert out["A"]["MRR"] == pytest.approx((1.0 + 0.5) / 2)
    assert out["B"] == {
        "n": 1.0,
        **{
            m: 0.0
            for m in ("R@1", "N@1", "Hit@1", "recall_any@1", "R@5", "N@5", "Hit@5", "recall_any@5")
        },
        "MRR": 0.0,
    }


def test_evaluate_scores_only_gold_queries_and_requires_their_rankings() -> None:
    out = evaluate({"q1": ["a"], "extra": ["z"]}, {"q1": [["a"]]})
    assert out["Overall"]["n"] == 1
    with pytest.raises(KeyError, match="no ranking"):
        evaluate({}, {"q1": [["a"]]})


def test_recall_any_counts_a_question_found_when_any_gold_item_is_in_the_top_k() -> None:
    gold = [["a"], ["b", "c"], ["d"]]  # three evidence items, the second with an alternative
    assert recall_any_at_k(["x", "c", "y"], gold, k=2) == 1.0  # one of three is enough
    assert recall_any_at_k(["x", "y", "d"], gold, k=2) == 0.0  # found, but below the cut
    assert recall_any_at_k([], gold, k=5) == 0.0 and recall_any_at_k(["a"], [], k=5) == 0.0
    assert best_over_combinations(["x", "c", "y"], gold, k=2)[0] == pytest.approx(1 / 3)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from("abcdefg"), max_size=8),
    st.lists(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=2), max_size=3),
    st.integers(1, 6),
)
def test_recall_any_bounds_recall_and_equals_hit_over_all_gold(
    ranking: list[str], gold: list[list[str]], k: int
) -> None:
    any_ = recall_any_at_k(ranking, gold, k)
    assert any_ >= best_over_combinations(ranking, gold, k)[0]
    assert any_ == hit_at_k(ranking, {d for alts in gold for d in alts}, k)
    if len(gold) == 1 and len(gold[0]) == 1:  # one gold item: the two recalls agree
        assert any_ == best_over_combinations(ranking, gold, k)[0]


def test_evaluate_reports_recall_any_beside_recall_and_ndcg() -> None:
    gold = {"q1": [["a"], ["b"]], "q2": [["c"]]}
    out = evaluate({"q1": ["a", "x"], "q2": ["x", "y"]}, gold, ks=(1, 5))["Overall"]
    assert out["R@5"] == pytest.approx(0.25) and out["recall_any@5"] == pytest.approx(0.5)
    assert out["recall_any@1"] == pytest.approx(0.5) and out["n"] == 2
