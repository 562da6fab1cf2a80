"""Hybrid search over one user's items: dense and BM25 legs, fused per query, long items windowed.

The embedders here are small and exact on purpose: a bag-of-words embedder (a word's vector is
fixed by a hash of the word) makes "this window mentions the query's word" a measurable cosine,
so every expected ranking below follows from the math, not from a model.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pbr_core import (
    EmbeddingError,
    HistoryItem,
    HistoryStore,
    PBRConfig,
    PersistenceError,
    Personalizer,
)
from pbr_core.hybrid import (
    LEXICAL_CONTEXT,
    LEXICAL_SCALE,
    fuse,
    host_candidates,
    lexical_query,
    lexical_weight,
    rank,
    relevance,
    with_context,
)
from pbr_core.lexical import LexicalIndex, StemmerName
from pbr_core.snapshot import UserHistory, top_k
from pbr_core.windows import Window, split, window_of

DIM = 64


def word_vector(word: str) -> np.ndarray:
    seed = int(hashlib.sha256(word.lower().encode()).hexdigest(), 16) % 2**32
    return np.random.default_rng(seed).normal(size=DIM)


class BagOfWords:
    """Sum of per-word vectors: texts sharing words are close; reads ``max_words`` words only
    (like a model's window), and says so through ``window()``."""

    model_id = "test/bag-of-words"

    def __init__(self, max_words: int | None = None) -> None:
        self.max_words = max_words
        self.seen: list[str] = []

    def _embed(self, text: str) -> list[float]:
        words = text.split()[: self.max_words] if self.max_words else text.split()
        v = sum((word_vector(w) for w in words), np.zeros(DIM))
        return (v / (np.linalg.norm(v) or 1.0)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self._embed(text)

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self.seen.extend(texts)
        return [self._embed(t) for t in texts]

    def window(self) -> Window | None:
        if self.max_words is None:
            return None
        return Window(self.max_words, lambda text: len(text.split()))


ITEMS = [
    ("a", "we talked about jazz and the trip to Lisbon"),
    ("b", "my sister bakes sourdough every weekend"),
    ("c", "the dentist appointment moved to Thursday"),
    ("d", "I prefer window seats on long flights"),
]


def snapshot(items: Sequence[tuple[str, str]] = ITEMS, emb: BagOfWords | None = None):  # type: ignore[no-untyped-def]
    emb = emb or BagOfWords()
    store = HistoryStore()
    rows = [HistoryItem(id=i, text=t) for i, t in items]
    return store.upsert("u", rows, emb.embed_documents([t for _, t in items])), emb


# -- the fusion rule -----------------------------------------------------------------------------
def test_fuse_averages_the_two_legs_each_scaled_to_unit_range() -> None:
    fused = fuse(np.array([0.2, 0.6, 1.0]), np.array([4.0, 0.0, 2.0]))
    np.testing.assert_allclose(fused, [0.5 * 0 + 0.5 * 1, 0.5 * 0.5 + 0, 0.5 * 1 + 0.5 * 0.5])


def test_fuse_gives_the_lexical_leg_its_weight_and_stays_in_unit_range() -> None:
    fused = fuse(np.array([0.2, 0.6, 1.0]), np.array([4.0, 0.0, 2.0]), weight=0.25)
    np.testing.assert_allclose(fused, np.array([0 + 0.25, 0.5, 1 + 0.125]) / 1.25)
    np.testing.assert_allclose(fuse(np.array([0.1, 0.9]), np.array([3.0, 1.0]), 0.0), [0, 1])


def test_lexical_weight_is_one_and_a_half_times_the_best_items_coverage() -> None:
    assert lexical_weight(np.array([0.0, 2.0, 1.0]), 8.0) == pytest.approx(1.5 * 0.25)
    assert lexical_weight(np.zeros(3), 8.0) == 0.0  # no item holds a query word
    assert lexical_weight(np.array([1.0]), 0.0) == 0.0  # only stop words asked
    assert lexical_weight(np.array([9.0]), 8.0) == LEXICAL_SCALE == 1.5  # never above 1.5


def test_an_item_takes_half_the_mean_of_its_neighbours_lexical_scores() -> None:
    np.testing.assert_allclose(with_context(np.array([4.0, 0.0, 2.0, 0.0])), [4.0, 1.5, 2.0, 0.5])
    np.testing.assert_array_equal(with_context(np.array([3.0, 1.0]), 0.0), [3.0, 1.0])
    np.testing.assert_array_equal(with_context(np.array([3.0])), [3.0])  # no neighbour


def test_the_answer_after_a_question_is_found_by_the_questions_words() -> None:
    """A friend asks "did you paint at the lake?", the user answers "a sunrise, all orange": the
    answer holds none of the query's words. Two answers as close to the query in the dense leg
    (here: equal) are told apart by their neighbours' words; without context, by position."""
    items = [
        ("other", "a sunset, all purple"),
        *((f"f{i}", f"note {i} about the weather") for i in range(10)),
        ("asked", "did you paint at the lake?"),
        ("answer", "a sunrise, all orange"),
        *((f"g{i}", f"note {i} about the news") for i in range(10)),
    ]
    q = np.eye(DIM)[0]
    cos = np.array([0.5 if i in ("other", "answer") else 0.2 for i, _ in items])
    vectors = cos[:, None] * q + np.sqrt(1 - cos[:, None] ** 2) * np.eye(DIM)[1]
    history = HistoryStore().upsert(
        "u", [HistoryItem(id=i, text=t) for i, t in items], vectors.tolist()
    )
    terms = lexical_query("paint lake")

    def top(**kw: float) -> list[str]:
        return [history.items[r.position].id for r in rank(history, q, terms, 3, **kw)]

    with_neighbours = top(context=LEXICAL_CONTEXT)
    assert set(with_neighbours) == set(top()) == {"asked", "answer", "other"}
    assert with_neighbours.index("answer") < with_neighbours.index("other")
    assert top().index("other") < top().index("answer")  # the default: no context


def test_a_match_on_an_everyday_word_says_less_than_a_match_on_the_querys_rare_words() -> None:
    """Coverage decides the lexical leg's say. The dense favourite ("pref", the answer in other
    words) shares no word with the question; an item sharing only one everyday word of a
    question whose other words no item holds must not overtake it (the equal-weight rule let
    it), one holding all of the question's words must."""
    filler = [(f"f{i}", f"note {i} about the weather and the news") for i in range(30)]
    items = [
        ("pref", "I only eat plants"),
        ("common", "the weather"),
        ("rare", "Sapporo ramen bar"),
        *filler,
    ]
    rng = np.random.default_rng(0)
    q = np.eye(DIM)[0]
    noise = rng.normal(size=(len(items), DIM)) * 0.05
    cos = np.array([1.0, 0.3, 0.5, *([0.2] * len(filler))])  # each item's cosine with q
    vectors = cos[:, None] * q + np.sqrt(1 - cos[:, None] ** 2) * np.eye(DIM)[1] + noise
    history = HistoryStore().upsert(
        "u", [HistoryItem(id=i, text=t) for i, t in items], vectors.tolist()
    )
    index = history.lexical()

    def top(question: str, **kw: float) -> str:
        terms = lexical_query(question)
        if "weight" in kw:  # the rule as it was: both legs at equal weight
            fused = fuse(history.dense_scores(q), index.scores(terms), kw["weight"])
            return history.items[int(np.argmax(fused))].id
        return history.items[rank(history, q, terms, 1)[0].position].id

    def weight(question: str) -> float:
        return lexical_weight(index.scores(lexical_query(question)), index.ceiling(question))

    everyday, rare = "recommend a cosy bistro for rainy weather", "a Sapporo ramen bar"
    assert weight(everyday) < 0.3 < 0.6 < weight(rare)
    assert top(everyday) == "pref"
    assert top(everyday, weight=1.0) == "common"
    assert top(rare) == "rare"


def test_the_lexical_weight_is_read_from_the_users_own_words() -> None:
    """LLM feedback expands the lexical query; its many extra words must not lower the weight
    the user's own words earned."""
    history, emb = snapshot()
    index = history.lexical()
    q = np.asarray(emb.embed_query("dentist Thursday"))
    own = lexical_query("dentist Thursday")
    expanded = lexical_query(
        "dentist Thursday", ["a dentist visit", "teeth cleaning checkup appointment"], 0.25
    )
    w_own = lexical_weight(index.scores(own), index.ceiling(own))
    w_expanded = lexical_weight(index.scores(expanded), index.ceiling(expanded))
    assert w_own > w_expanded > 0
    dense, lexical = history.dense_scores(q), index.scores(expanded)
    for got, weight, words in (
        (rank(history, q, expanded, 4, own_terms=own), w_own, own),
        (rank(history, q, expanded, 4), w_expanded, expanded),  # no own_terms: the expanded
    ):
        order = list(top_k(fuse(dense, lexical, weight), 4))
        assert [r.position for r in got] == order
        covered = index.scores(words)[order]
        expected = relevance(dense[order], covered, weight, index.ceiling(words))
        assert [r.score for r in got] == pytest.approx(list(expected))


def test_llm_feedback_does_not_lower_a_results_relevance() -> None:
    """The score has one meaning across queries: an item's cosine and its coverage of the
    user's own words. Feedback words raise the lexical query's ceiling, so reading coverage
    against it made the same item score lower the more the LLM wrote (before: .92 → .79)."""
    history, emb = snapshot()
    question = "dentist appointment Thursday"
    q, own = np.asarray(emb.embed_query(question)), lexical_query(question)
    feedback = [
        "I always book my checkups early in the morning before work",
        "my calendar reminds me about every medical visit",
        "the waiting room music drives me crazy but the hygienist is kind",
    ]
    alone = rank(history, q, own, 1, own_terms=own)[0]
    for n in (1, 3):
        expanded = lexical_query(question, feedback[:n], 0.25)
        best = rank(history, q, expanded, 1, own_terms=own)[0]
        assert best.position == alone.position and best.dense == alone.dense
        assert best.score == pytest.approx(alone.score)


def test_items_the_query_and_the_llm_feedback_meet_under_one_stemmer() -> None:
    """The lexical query is words; the index stems them as it stemmed the items, the user's words
    and the LLM's feedback alike, and stemmer=None searches the words unstemmed."""
    history, emb = snapshot()
    q = np.asarray(emb.embed_query("unrelated words"))
    own = lexical_query("baking breads")  # no item holds "baking" or "breads" as written
    expanded = lexical_query("baking breads", ["she baked sourdoughs for the weekends"], 0.25)
    for terms in (own, expanded):
        assert not rank(history, q, terms, 1, mode="lexical", stemmer=None)[0].lexical
    hit = rank(history, q, expanded, 1, mode="lexical", stemmer="english")[0]
    assert history.items[hit.position].id == "b" and hit.lexical  # sourdough, weekend
    # each analyzer is its own index of the snapshot, built once and kept beside the other
    stemmed, unstemmed = history.lexical("english"), history.lexical(None)
    assert history.lexical("english") is stemmed and history.lexical(None) is unstemmed
    assert {i.stemmer for i in history.lexical_indexes()} == {"english", None}
    np.testing.assert_array_equal(
        stemmed.scores("trips jazz"),
        LexicalIndex.build([t for _, t in ITEMS], stemmer="english").scores("trips jazz"),
    )
    np.testing.assert_array_equal(
        unstemmed.scores("trip jazz"),
        LexicalIndex.build([t for _, t in ITEMS], stemmer=None).scores("trip jazz"),
    )
    with pytest.raises(ValueError, match="stemmer must be one of"):
        history.lexical("porter")  # type: ignore[arg-type]


def test_rank_analyzes_with_the_librarys_default_stemmer_unless_told() -> None:
    import inspect

    from pbr_core.lexical import DEFAULT_STEMMER

    assert inspect.signature(rank).parameters["stemmer"].default == DEFAULT_STEMMER
    history, _ = snapshot()
    assert history.lexical().stemmer == DEFAULT_STEMMER


# -- what a hybrid result returns: its relevance ------------------------------------------------
def test_relevance_is_a_noisy_or_of_the_cosine_and_the_items_weighted_coverage() -> None:
    got = relevance(np.array([0.8, 0.5, -0.3]), np.array([0.0, 4.0, 2.0]), 0.5, 8.0)
    # a = 1 - (1 - max(cos, 0)) * (1 - 0.5 * min(1, bm25 / 8)), then the running minimum
    np.testing.assert_allclose(got, [0.8, 1 - 0.5 * 0.75, 1 - 1.0 * 0.875])
    assert got[1] > 0.5  # a matched word raises the score above the cosine, never below it
    np.testing.assert_allclose(relevance(np.array([0.9, 0.2]), np.zeros(2), 0.0, 0.0), [0.9, 0.2])
    assert relevance(np.array([1.0]), np.array([99.0]), 1.0, 3.0)[0] == 1.0  # never above 1


def test_relevance_never_rises_down_the_ranked_list() -> None:
    """The fused rule may rank an item of lower own relevance above one of higher: its score is
    then capped by the one above, so a threshold cuts the list instead of punching a hole."""
    got = relevance(np.array([0.3, 0.9, 0.2, 0.6]), np.zeros(4), 0.0, 1.0)
    np.testing.assert_allclose(got, [0.3, 0.3, 0.2, 0.2])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(["jazz", "trip", "Lisbon", "dentist", "bread", "seat"]), max_size=5
        ),
        min_size=1,
        max_size=8,
    ),
    st.lists(
        st.sampled_from(["jazz", "Lisbon", "dentist", "ferry", "the"]), min_size=1, max_size=3
    ),
    st.integers(1, 8),
)
def test_hybrid_ranks_by_the_fused_rule_and_returns_each_results_relevance(
    texts: list[list[str]], words: list[str], k: int
) -> None:
    """The ranking is the fused rule's, exactly as before the score changed; the score returned is
    the relevance of :func:`relevance` in [0, 1], non-increasing down the list."""
    items = [(f"i{n}", " ".join(t) or "nothing") for n, t in enumerate(texts)]
    history, emb = snapshot(items)
    query = " ".join(words)
    q, terms = np.asarray(emb.embed_query(query)), lexical_query(query)
    index = history.lexical()
    dense, lexical = history.dense_scores(q), index.scores(terms)
    weight = lexical_weight(lexical, index.ceiling(terms))
    order = list(top_k(fuse(dense, lexical, weight), k))
    got = rank(history, q, terms, k)
    assert [r.position for r in got] == order
    scores = [r.score for r in got]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    expected = relevance(dense[order], lexical[order], weight, index.ceiling(terms))
    assert scores == pytest.approx(list(expected))


def test_an_unrelated_questions_best_result_scores_below_a_related_ones() -> None:
    """Min-max scaling gave every query's best result ~1.0, so no threshold could tell a question
    about the user's items from one about nothing they said; the relevance can."""
    history, emb = snapshot()

    def best(question: str) -> float:
        return rank(history, np.asarray(emb.embed_query(question)), lexical_query(question), 4)[
            0
        ].score

    related = best("when is the dentist appointment on Thursday")
    unrelated = best("quantum chromodynamics lecture notes")
    assert unrelated < 0.3 < 0.5 < related
    unrelated_q = np.asarray(emb.embed_query("quantum chromodynamics lecture notes"))
    # the rule that ranks still gives the unrelated question's best item 1, as it did returned
    assert fuse(history.dense_scores(unrelated_q), np.zeros(len(history)), 0.0).max() == 1.0


def test_a_score_threshold_cuts_the_ranked_list_even_where_a_search_returns_rising_scores() -> None:
    """A caller's own final search may return scores in any order; the threshold keeps the results
    down to the first below it, never a lower-ranked one after a dropped one."""
    from pbr_core import SearchHit

    class OwnSearch:
        def search(self, user_id: str, vector: Sequence[float], k: int) -> list[SearchHit]:
            rising = (("a", 0.9), ("b", 0.2), ("c", 0.8))
            return [SearchHit(id=i, score=s, text=i) for i, s in rising]

    p = Personalizer(BagOfWords(), config=PBRConfig(fusion="plain"), vector_search=OwnSearch())
    p.add_texts("u", [t for _, t in ITEMS], ids=[i for i, _ in ITEMS])
    got = p.search("u", "dentist", k=3, score_threshold=0.5)
    assert [h.id for h in got.hits] == ["a"]
    assert [h.id for h in p.search("u", "dentist", k=3).hits] == ["a", "b", "c"]


def test_a_query_without_any_lexical_match_ranks_by_the_dense_leg() -> None:
    dense = np.array([0.1, 0.9, 0.5])
    assert list(np.argsort(-fuse(dense, np.zeros(3)))) == [1, 2, 0]


def test_host_candidates_leave_pbrs_ranking_room_in_every_mode() -> None:
    """More than ``k`` in dense mode too: a store whose distance is not the cosine (Chroma's
    ``ip`` over vectors written around pbr) ranks its own top ``k`` unlike pbr (before: ``k``)."""
    assert host_candidates(5) == 40 and host_candidates(20) == 80


# -- ranking one user's items ---------------------------------------------------------------------
def test_dense_mode_is_the_exact_cosine_ranking() -> None:
    history, emb = snapshot()
    q = np.asarray(emb.embed_query("sourdough bread recipe"))
    got = rank(history, q, lexical_query("sourdough bread recipe"), 4, mode="dense")
    assert [r.position for r in got] == [p for p, _ in history.search(q, 4)]
    assert [r.score for r in got] == [r.dense for r in got]


def test_lexical_mode_puts_items_with_the_query_words_first() -> None:
    history, emb = snapshot()
    q = np.asarray(emb.embed_query("when is the dentist"))
    got = rank(history, q, lexical_query("when is the dentist"), 4, mode="lexical")
    assert history.items[got[0].position].id == "c"
    assert got[0].lexical_rank == 1 and all(r.lexical_rank is None for r in got[1:])


def test_equal_scores_keep_item_order_at_the_cut_so_k_results_begin_k_plus_one() -> None:
    from pbr_core.history import top_k

    assert list(top_k(np.array([0.0, 0.0, 1.0, 1.0]), 1)) == [2]
    items = [("a", "jazz in Lisbon"), ("b", "sourdough"), ("c", "dentist Thursday")]
    history, emb = snapshot([*items, ("d", "dentist Thursday")])  # d is a copy of c
    q = np.asarray(emb.embed_query("dentist"))
    for mode in ("hybrid", "dense", "lexical"):
        one, two = (rank(history, q, lexical_query("dentist"), k, mode=mode) for k in (1, 2))
        assert [r.position for r in one] == [r.position for r in two][:1] == [2], mode
        assert [r.dense_rank for r in two] == [1, 2], mode  # the ranks agree with the order


def test_lexical_ranks_follow_the_order_lexical_mode_ranks_by() -> None:
    history, emb = snapshot([("a", "jazz sourdough"), ("b", "jazz dentist"), ("c", "ferry")])
    q = np.asarray(emb.embed_query("jazz dentist appointment"))
    got = rank(history, q, lexical_query("jazz"), 3, mode="lexical")
    assert got[0].lexical == got[1].lexical  # one word, in both: a BM25 tie ...
    assert [r.lexical_rank for r in got] == [1, 2, None]  # ... ranked as the list is ordered


def test_dense_mode_does_not_claim_the_lexical_leg_found_nothing() -> None:
    history, emb = snapshot()
    q = np.asarray(emb.embed_query("jazz"))
    got = rank(history, q, lexical_query("jazz"), 4, mode="dense")
    assert all(r.lexical is None and r.lexical_rank is None for r in got)  # not computed
    assert got[0].legs()["lexical"] is None


def test_hybrid_finds_a_named_item_the_dense_leg_ranks_low() -> None:
    """A question that shares one rare word (a name) with an item and many words with another."""
    items = [
        ("x", "the trip and the plan and the talk about the trip"),
        ("y", "Lisbon"),
        ("z", "groceries for the week"),
    ]
    history, emb = snapshot(items)
    query = "the plan for the trip to Lisbon"
    q = np.asarray(emb.embed_query(query))
    dense = rank(history, q, lexical_query(query), 3, mode="dense")
    hybrid = rank(history, q, lexical_query(query), 3, mode="hybrid")
    assert history.items[dense[0].position].id == "x"
    ids = [history.items[r.position].id for r in hybrid]
    assert ids.index("y") < ids.index("z")
    assert all(0.0 <= r.score <= 1.0 for r in hybrid)
    assert [r.dense_rank for r in sorted(hybrid, key=lambda r: -r.dense)] == [1, 2, 3]


def test_candidates_restrict_the_ranking_to_a_host_searchs_results() -> None:
    history, emb = snapshot()
    q = np.asarray(emb.embed_query("dentist"))
    got = rank(history, q, lexical_query("dentist"), 4, candidates=[0, 1, 3])
    assert sorted(r.position for r in got) == [0, 1, 3]


def test_an_empty_history_or_k_zero_ranks_nothing() -> None:
    history, emb = snapshot()
    q = np.asarray(emb.embed_query("x"))
    assert rank(history, q, {}, 0) == [] and rank(history, q, {}, 3, candidates=[]) == []


def test_feedback_words_count_at_their_weight_next_to_the_users_own() -> None:
    terms = lexical_query("jazz trip", ["jazz concert in Lisbon"], feedback_weight=0.25)
    assert terms == {"jazz": 1.25, "trip": 1.0, "concert": 0.25, "lisbon": 0.25}
    assert lexical_query("jazz trip", ["concert"], feedback_weight=0.0) == {
        "jazz": 1.0,
        "trip": 1.0,
    }


def test_config_names_the_search_mode_and_refuses_unknown_ones() -> None:
    assert PBRConfig().search == "hybrid"
    with pytest.raises(ValueError, match="search must be one of"):
        PBRConfig(search="bm42")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lexical_feedback_weight"):
        PBRConfig(lexical_feedback_weight=-1)


def test_personalizer_search_reports_both_legs_for_every_hit() -> None:
    p = Personalizer(BagOfWords(), config=PBRConfig(fusion="plain"))
    p.add_texts("u", [t for _, t in ITEMS], ids=[i for i, _ in ITEMS])
    res = p.search("u", "dentist on Thursday", k=4)
    assert res.hits[0].id == "c"
    assert all(
        set(h.legs or {}) == {"dense", "dense_rank", "lexical", "lexical_rank"} for h in res.hits
    )
    dense = p.search(
        "u", "dentist on Thursday", k=4, config=PBRConfig(fusion="plain", search="dense")
    )
    assert [h.score for h in dense.hits] == sorted((h.score for h in dense.hits), reverse=True)


# -- the lexical index follows the snapshots ------------------------------------------------------
ANALYZERS: list[StemmerName | None] = [None, "english"]


def _same_as_a_rebuild(history: UserHistory, stemmer: StemmerName | None) -> None:
    built = LexicalIndex.build([it.text for it in history.items], stemmer=stemmer)
    for query in ("jazz", "bread again", "thursday 3", "start", "flights"):
        np.testing.assert_array_equal(history.lexical(stemmer).scores(query), built.scores(query))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "replace", "delete"]),
            st.integers(0, 7),
            st.sampled_from(["jazz trip", "sourdough bread", "dentist thursday", "seat flight"]),
            st.sampled_from([(), (None,), ("english",), (None, "english")]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_each_snapshots_lexical_index_equals_one_built_from_its_texts(ops) -> None:  # type: ignore[no-untyped-def]
    """Under each analyzer, derived incrementally through adds, replaces and deletes (queried
    after some changes with one analyzer, both or none: chains of pending changes, one analyzer
    built while the other is pending or dropped), the index equals a rebuild to the bit."""
    emb = BagOfWords()
    store = HistoryStore()
    history = store.upsert(
        "u", [HistoryItem(id="i0", text="start here")], emb.embed_documents(["start here"])
    )
    history.lexical()
    history.lexical("english")
    for op, n, text, queried in ops:
        item_id = f"i{n}"
        if op == "delete":
            if history.position(item_id) is not None and len(history) > 1:
                history = store.delete("u", [item_id])
        else:
            body = f"{text} {n}" if op == "add" else f"{text} again {n}"
            history = store.upsert(
                "u", [HistoryItem(id=item_id, text=body)], emb.embed_documents([body])
            )
        for stemmer in queried:
            _same_as_a_rebuild(history, stemmer)
    for stemmer in ANALYZERS:
        _same_as_a_rebuild(history, stemmer)


def test_an_analyzer_the_queries_stopped_asking_for_is_not_held() -> None:
    """A stemmed index built for one query is not carried along every later snapshot (and
    counted against the cache budget) once the queries after a change use another analyzer;
    through a run of changes without a query, every analyzer stays derivable."""
    emb = BagOfWords()
    store = HistoryStore()

    def add(n: int) -> UserHistory:
        text = f"note {n} about flights and trips"
        return store.upsert("u", [HistoryItem(id=f"i{n}", text=text)], emb.embed_documents([text]))

    history = add(0)
    history.lexical()
    history.lexical("english")
    history = add(1)
    history = add(2)  # no query in between: both analyzers chained
    assert set(history._lexical_parents) == {None, "english"}
    history.lexical()  # a query asking for the default analyzer only
    history = add(3)
    assert set(history._lexical_parents) == {None}  # the stemmed index is let go
    _same_as_a_rebuild(history, "english")  # and built in full when asked for again


# -- long items ----------------------------------------------------------------------------------
def test_split_cuts_a_long_text_into_windows_of_about_equal_size_that_fit() -> None:
    window = Window(5, lambda text: len(text.split()))
    text = "one two\nthree four five\nsix\n" + " ".join(f"w{i}" for i in range(12))  # 18 words
    parts = split(text, window)
    assert [len(p.split()) for p in parts] == [4, 5, 5, 4]  # 4 windows, no short remainder
    assert all(window.fits(p) for p in parts)
    assert parts[0] == "one two\nthree four"  # the text's own line breaks kept
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())  # nothing lost
    assert split("short text", window) == ["short text"]
    assert split("a b c d e f", Window(1, lambda t: len(t.split()))) == list("abcdef")


def test_text_without_spaces_is_cut_into_windows_that_fit() -> None:
    window = Window(10, len)  # counts characters, like a tokenizer on Chinese text
    text = "我们昨天在车站见面然后一起去了渡口买了去丹吉尔的船票" * 3  # no space at all
    parts = split(text, window)
    assert len(parts) > 1 and all(window.fits(p) for p in parts)
    assert "".join(parts) == text  # nothing lost
    url = "see https://example.com/" + "x" * 40 + " for details"
    assert all(window.fits(p) for p in split(url, window))


class CountingWindow:
    """A window that counts characters (one token each, as on Chinese text) and records how
    many characters its tokenizer was asked to read."""

    def __init__(self, max_tokens: int) -> None:
        self.read = 0
        self.window = Window(max_tokens, self._count)

    def _count(self, text: str) -> int:
        self.read += len(text)
        return len(text)


@pytest.mark.parametrize("kind", ["no spaces", "spaces", "spaces and long runs"])
def test_splitting_reads_the_text_a_bounded_number_of_times_whatever_its_length(kind: str) -> None:
    # Linear, not quadratic: a 1 MB item once took minutes (each cut re-read the whole rest).
    rng = np.random.default_rng(0)
    ratios = []
    for size in (20_000, 80_000):
        letters = rng.choice(list("天地人和风云山水"), size)
        if kind != "no spaces":
            gaps = rng.random(size) < (0.2 if kind == "spaces" else 0.0005)
            letters[gaps] = " "
        text = "".join(letters)
        counting = CountingWindow(50)
        parts = split(text, counting.window)
        assert all(counting.window.fits(p) for p in parts)
        assert "".join(parts).replace(" ", "") == text.replace(" ", "")
        ratios.append(counting.read / size)
    assert ratios[1] <= 6 and ratios[1] <= 1.5 * ratios[0], ratios  # per character: flat


def test_a_long_item_is_found_by_its_end_not_only_its_beginning() -> None:
    emb = BagOfWords(max_words=6)  # reads 6 words, like a model's 256 word pieces
    long = "we met at the station early\n" * 5 + "and then we booked the ferry to Tangier"
    p = Personalizer(emb, config=PBRConfig(fusion="plain", search="dense"))
    p.add_texts("u", [long, "ferry schedule to Tangier posted"], ids=["long", "short"])
    history = p.store.get("u")
    assert set(history.windows) == {"long"} and len(history.windows["long"]) == 7  # 38 words
    q = np.asarray(emb.embed_query("booked the ferry to Tangier"))
    windowed = history.dense_scores(q)[history.position("long")]
    truncated = float(history.vectors[history.position("long")] @ q)
    assert windowed > truncated + 0.3  # its best window is its end
    assert p.search("u", "booked the ferry to Tangier", k=1).hits[0].id == "long"


def test_windows_are_embedded_once_and_dropped_with_the_text_they_came_from() -> None:
    emb = BagOfWords(max_words=4)
    p = Personalizer(emb, config=PBRConfig(fusion="plain"))
    text = "alpha beta gamma delta epsilon zeta eta theta"
    p.add_texts("u", [text], ids=["x"])
    embedded = len(emb.seen)
    p.add_texts("u", [text], ids=["x"])  # the same text again: nothing re-embedded
    assert len(emb.seen) == embedded
    p.add_texts("u", ["now short"], ids=["x"])
    assert p.store.get("u").windows == {}


def test_an_embedder_without_a_readable_window_gets_no_windows() -> None:
    assert window_of(BagOfWords()) is None
    assert window_of(object()) is None
    found = window_of(type("Wrapper", (), {"embed_model": BagOfWords(max_words=9)})())
    assert found is not None and found.max_tokens == 9


def test_snapshots_with_windows_pickle() -> None:
    emb = BagOfWords(max_words=3)
    p = Personalizer(emb, config=PBRConfig(fusion="plain"))
    p.add_texts("u", ["one two three four five six"], ids=["x"])
    history = pickle.loads(pickle.dumps(p.store.get("u")))
    assert len(history.windows["x"]) == 2


def test_a_snapshot_pickled_before_the_analyzers_reads_back_with_its_indexes() -> None:
    """An earlier version kept one BM25 index (``_lexical``), the other analyzers' indexes hung
    on it (``_others``), and one pending parent (``_lexical_parent``): unpickled, each index is
    kept under its analyzer, nothing hangs on an index any more, and the next change derives
    from the pending parent."""
    history, _ = snapshot()
    plain = history.lexical(None)
    held = history.nbytes()  # what the earlier version counted: the index it knew of
    stemmed = LexicalIndex.build([item.text for item in history.items], stemmer="english")
    state = history.__getstate__()
    assert state["_counted"][1] == held
    old_index = pickle.loads(pickle.dumps(plain))
    old_index.__dict__["_others"] = {"english": stemmed}
    state.update(_lexical=old_index, _lexical_parent=None)
    del state["_lexical_parents"]
    old = UserHistory.__new__(UserHistory)
    old.__setstate__(pickle.loads(pickle.dumps(state)))
    assert {i.stemmer for i in old.lexical_indexes()} == {None, "english"}
    assert all("_others" not in i.__dict__ for i in old.lexical_indexes())
    assert old.nbytes() == held + stemmed.nbytes  # the budget counts both
    for stemmer in ANALYZERS:
        _same_as_a_rebuild(old, stemmer)
    # a pending parent of the earlier layout is what the next snapshot derives from
    state.update(_lexical=None, _lexical_parent=(old_index, np.arange(len(ITEMS))))
    pending = UserHistory.__new__(UserHistory)
    pending.__setstate__(pickle.loads(pickle.dumps(state)))
    assert set(pending._lexical_parents) == {None} and not pending.lexical_indexes()
    _same_as_a_rebuild(pending, None)


def test_window_vectors_survive_a_save_and_a_lazy_load(tmp_path: Path) -> None:
    emb = BagOfWords(max_words=3)
    p = Personalizer(emb, config=PBRConfig(fusion="plain"))
    p.add_texts("u", ["one two three four five six", "short one"], ids=["x", "y"])
    p.add_texts("v", ["seven eight nine ten"], ids=["z"])
    p.store.save(tmp_path / "saved")
    for lazy in (False, True):
        loaded = HistoryStore.load(tmp_path / "saved", lazy=lazy)
        for user in ("u", "v"):
            want, got = p.store.get(user).windows, loaded.get(user).windows
            assert set(got) == set(want)
            for item_id in want:
                np.testing.assert_array_equal(got[item_id], want[item_id])
    # a lazily loaded user that is saved again without being read keeps its windows
    lazy_store = HistoryStore.load(tmp_path / "saved", lazy=True)
    lazy_store.save(tmp_path / "again")
    assert set(HistoryStore.load(tmp_path / "again").get("u").windows) == {"x"}


@pytest.mark.parametrize(
    ("windows", "error"),
    [
        ({"a": [[np.nan, 0, 0, 0], [1, 2, 3, 4]]}, "contain NaN or inf"),
        ({"a": [[0, 0, 0, 0]]}, "all zeros"),
        ({"a": np.ones((2, 7))}, "dimension 7"),
        ({"a": np.ones((0, 4))}, "no window vectors"),
        ({"elsewhere": np.ones((1, 4))}, "not in this batch"),
    ],
    ids=["nan", "zero", "dimension", "empty", "stray-id"],
)
def test_bad_window_vectors_are_refused_before_anything_changes(
    tmp_path: Path, windows: dict[str, object], error: str
) -> None:
    store = HistoryStore()
    store.upsert("bob", [HistoryItem("b", "bob text")], np.ones((1, 4)))
    with pytest.raises((EmbeddingError, ValueError), match=error):
        store.upsert("alice", [HistoryItem("a", "a long text")], np.ones((1, 4)), windows=windows)
    assert store.users() == ["bob"]  # alice was never stored
    store.save(tmp_path / "saved")
    assert HistoryStore.load(tmp_path / "saved").users() == ["bob"]  # the folder still loads


def test_window_vectors_are_normalised_like_item_vectors() -> None:
    store = HistoryStore()
    store.upsert("u", [HistoryItem("a", "a text")], np.ones((1, 4)), windows={"a": [[3, 4, 0, 0]]})
    np.testing.assert_allclose(store.get("u").windows["a"], [[0.6, 0.8, 0, 0]], rtol=1e-6)


def test_a_damaged_windows_file_is_named(tmp_path: Path) -> None:
    emb = BagOfWords(max_words=3)
    p = Personalizer(emb, config=PBRConfig(fusion="plain"))
    p.add_texts("u", ["one two three four five six"], ids=["x"])
    folder = p.store.save(tmp_path / "saved")
    (damaged,) = list(Path(folder).rglob("*.windows.npz"))
    damaged.write_bytes(b"not a zip")
    with pytest.raises(PersistenceError, match=r"\.windows\.npz"):
        HistoryStore.load(tmp_path / "saved").get("u")


def test_a_requests_config_asks_for_the_neighbours_context_and_it_is_off_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PBRConfig.lexical_context`` reaches the ranking of a request (the one path every entry
    point takes); 0 by default, since a host store read cold may not give the items' order."""
    seen: list[float] = []
    real = rank

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(float(kwargs.get("context", 0.0)))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("pbr_core.corpus.rank", spy)
    p = Personalizer(BagOfWords(), config=PBRConfig(fusion="plain"))
    p.add_texts("u", [t for _, t in ITEMS], ids=[i for i, _ in ITEMS])
    p.search("u", "dentist on Thursday", k=2)
    p.search("u", "dentist on Thursday", k=2, config=PBRConfig(fusion="plain", lexical_context=0.5))
    assert seen == [0.0, 0.5]
    for bad in (-0.1, float("inf"), float("nan")):  # inf: inf * 0 = NaN dropped the leg
        with pytest.raises(ValueError, match="lexical_context must be a finite number >= 0"):
            PBRConfig(lexical_context=bad)
    with pytest.raises(ValueError, match="lexical_feedback_weight must be a finite number"):
        PBRConfig(lexical_feedback_weight=float("inf"))


def test_a_requests_config_chooses_the_lexical_analyzer_and_stemming_is_off_by_default() -> None:
    """``PBRConfig.lexical_stemmer`` reaches the ranking of a request (the one path every entry
    point takes): "flights" matches "flight" only when stemmed, and the user's history then
    holds one BM25 index per analyzer it was searched with."""
    p = Personalizer(BagOfWords(), config=PBRConfig(fusion="plain", search="lexical"))
    p.add_texts("u", [t for _, t in ITEMS], ids=[i for i, _ in ITEMS])
    plain = p.search("u", "flight", k=1)
    assert (plain.hits[0].legs or {})["lexical"] == 0.0  # no item holds "flight" as written
    stemmed_config = PBRConfig(fusion="plain", search="lexical", lexical_stemmer="english")
    stemmed = p.search("u", "flight", k=1, config=stemmed_config)
    assert stemmed.hits[0].id == "d" and (stemmed.hits[0].legs or {})["lexical"] > 0.0
    history = p.store.get("u")
    assert {index.stemmer for index in history.lexical_indexes()} == {None, "english"}
    assert PBRConfig().lexical_stemmer is None
    with pytest.raises(ValueError, match="lexical_stemmer must be one of"):
        PBRConfig(lexical_stemmer="porter")  # type: ignore[arg-type]
