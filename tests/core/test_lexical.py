"""The per-user BM25 index (pbr_core.lexical): tokenization, stemming, scores, snapshots."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pbr_core.lexical as lexical
from pbr_core.lexical import (
    DEFAULT_B,
    DEFAULT_K1,
    ENGLISH_STOP_WORDS,
    LexicalIndex,
    analyze,
    query_terms,
    tokenize,
)

# A user's chat-like history, with what makes tokenizers disagree: apostrophes, hyphens, digits,
# an underscore, accents, upper case, an item of stop words only and an empty item.
CHAT = [
    "I finally saw Kamasi Washington live at the Blue Note in 2023!",
    "Can you recommend a good jazz record for a rainy Sunday?",
    "My sister's wedding is in June; we need a band that plays jazz standards.",
    "I'm training for a half-marathon, so I run 5 km every morning before work.",
    "What's a vegetarian recipe with lentils that my kids won't hate?",
    "Remind me to book the dentist for Thursday at 10:30.",
    "We're flying to Lisbon in October and I'd love a quiet café near the river.",
    "Is it worth upgrading my laptop's RAM from 8 to 16 GB for photo editing?",
    "My jazz piano lessons are on Tuesdays; the teacher said to practise scales daily.",
    "Naïve question: does the Python GIL matter for numpy_heavy code?",
    "Is it what it is?",
    "",
    "Lentil soup again, and the kids loved it this time. JAZZ on the radio too.",
]
QUERIES = [
    "jazz concert in Lisbon",
    "recipe with lentils for kids",
    "jazz jazz piano",
    "What should I do about my LAPTOP's RAM?",
    "café 2023 numpy_heavy naïve",
    "morning run km",
]


STEMMERS = [None, "english"]


def bm25s_stemmer(stemmer: str | None):  # type: ignore[no-untyped-def]
    if stemmer is None:
        return None
    return pytest.importorskip("Stemmer").Stemmer(stemmer).stemWords


def bm25s_scores(texts: list[str], query: str, stemmer: str | None = None) -> np.ndarray:
    bm25s = pytest.importorskip("bm25s")
    stop = list(ENGLISH_STOP_WORDS)
    stem = bm25s_stemmer(stemmer)
    retriever = bm25s.BM25(k1=DEFAULT_K1, b=DEFAULT_B, method="lucene")
    retriever.index(
        bm25s.tokenize(texts, stopwords=stop, stemmer=stem, show_progress=False),
        show_progress=False,
    )
    query_tokens = bm25s.tokenize(
        query, stopwords=stop, stemmer=stem, show_progress=False, return_ids=False
    )[0]
    return np.asarray(retriever.get_scores(query_tokens))


# --- tokenization -------------------------------------------------------------------------------


def test_tokenize_lowercases_drops_stop_words_and_single_letters_keeps_digits() -> None:
    assert tokenize("The Cat is on the MAT in 2023, isn't it? I'll see: a b c") == [
        "cat",
        "mat",
        "2023",
        "see",
    ]


def test_tokenize_keeps_repeats_in_order() -> None:
    assert tokenize("jazz, more JAZZ and jazz-rock") == ["jazz", "jazz", "jazz", "rock"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("मुझे हिन्दी संगीत पसंद है", ["मुझे", "हिन्दी", "संगीत", "पसंद", "है"]),  # vowel signs
        ("எனக்கு தமிழ் இசை", ["எனக்கு", "தமிழ்", "இசை"]),
        ("nai\u0308ve cafe\u0301", ["naïve", "café"]),  # decomposed: one term with composed
        ("Tôi thích âm nhạc", ["tôi", "thích", "âm", "nhạc"]),
    ],
)
def test_a_word_keeps_its_combining_marks_and_one_spelling(text: str, words: list[str]) -> None:
    """Marks are part of a word, and text is matched in NFC form (before, ``\\w`` cut words at
    every mark: "संगीत" was lost, and the fragments left set the lexical weight)."""
    assert tokenize(text) == words
    index = LexicalIndex.build([text, "something else entirely"])
    assert index.scores(words[-1])[0] > 0 and index.ceiling(words[-1]) > 0


def test_a_dotted_capital_i_meets_its_plain_lower_case() -> None:
    """ "İ".lower() is "i" and a combining dot, which the marks-aware pattern kept: "İstanbul"
    and "istanbul" were two terms, and BM25 scored 0 (from a review)."""
    assert tokenize("İstanbul trip in May") == ["istanbul", "trip", "may"]
    index = LexicalIndex.build(["Ankara meeting", "İstanbul trip in May"])
    assert index.scores("istanbul").tolist()[1] > 0 and index.scores("İSTANBUL").tolist()[1] > 0


def test_stop_words_cover_the_common_function_words() -> None:
    required = (
        "a an the and or of to in on at is are was were be i you he she it we they me my your "
        "what which who when where why how do did does have has had this that these those with "
        "for from by as not no"
    )
    assert set(required.split()) <= ENGLISH_STOP_WORDS
    assert all(w == w.lower() for w in ENGLISH_STOP_WORDS)
    assert 120 <= len(ENGLISH_STOP_WORDS) <= 200


@pytest.mark.parametrize("stemmer", STEMMERS)
def test_tokens_equal_bm25s_tokens(stemmer: str | None) -> None:
    # bm25s.tokenize lower-cases, applies the same pattern, drops the given stop words and then
    # stems what is left; no other splitting. Equal tokens make the score comparison fair.
    bm25s = pytest.importorskip("bm25s")
    got = bm25s.tokenize(
        [*CHAT, *QUERIES],
        stopwords=list(ENGLISH_STOP_WORDS),
        stemmer=bm25s_stemmer(stemmer),
        show_progress=False,
        return_ids=False,
    )
    assert got == [analyze(t, stemmer) for t in [*CHAT, *QUERIES]]  # type: ignore[arg-type]
    if stemmer is None:
        assert got == [tokenize(t) for t in [*CHAT, *QUERIES]]


def test_the_english_stemmer_makes_inflections_meet() -> None:
    texts = ["We visited Lisbon and loved the concerts", "Paris in spring"]
    stemmed = LexicalIndex.build(texts, stemmer="english")
    plain = LexicalIndex.build(texts, stemmer=None)
    assert stemmed.stemmer == "english" and plain.stemmer is None
    assert analyze("visiting visits visited concerts", "english") == ["visit"] * 3 + ["concert"]
    assert stemmed.scores("visiting a concert")[0] > 0 and not plain.scores("visiting")[0]
    # The query's words are stemmed by the index: words sharing a stem add their weights, and a
    # mapping's keys are words (as lexical_query makes them), never compared to stems unstemmed.
    np.testing.assert_array_equal(
        stemmed.scores({"visits": 1.0, "visited": 0.5}), stemmed.scores({"visit": 1.5})
    )
    assert stemmed.ceiling({"visits": 1.0, "visited": 0.5}) == stemmed.ceiling({"visit": 1.5})


def test_an_unknown_stemmer_is_refused() -> None:
    with pytest.raises(ValueError, match="stemmer must be one of"):
        LexicalIndex.build(CHAT, stemmer="porter")  # type: ignore[arg-type]


def test_an_index_pickled_before_stemming_reads_as_unstemmed() -> None:
    index = LexicalIndex.build(CHAT, stemmer=None)
    state = pickle.dumps(index)
    old = pickle.loads(state)
    del old.__dict__["stemmer"]  # what an index pickled by an earlier version holds
    assert old.stemmer is None
    np.testing.assert_array_equal(old.scores("lentils kids"), index.scores("lentils kids"))


# --- weighted queries ---------------------------------------------------------------------------


def test_query_terms_sum_weight_times_count() -> None:
    assert query_terms([("jazz", 1.0), ("jazz concert", 0.5)]) == {"jazz": 1.5, "concert": 0.5}
    assert query_terms([("the jazz JAZZ of jazz", 0.3)]) == {"jazz": 0.3 * 3}
    assert query_terms([]) == {}


def test_mapping_query_is_linear_in_the_weights() -> None:
    index = LexicalIndex.build(CHAT)
    jazz, lentils = index.scores({"jazz": 1.0}), index.scores({"lentils": 1.0})
    assert jazz.any() and lentils.any()
    np.testing.assert_allclose(
        index.scores({"jazz": 2.0, "lentils": -0.25}), 2.0 * jazz - 0.25 * lentils, rtol=1e-6
    )
    np.testing.assert_array_equal(
        index.scores("jazz jazz lentils"), index.scores({"jazz": 2.0, "lentils": 1.0})
    )
    np.testing.assert_array_equal(
        index.scores(query_terms([("jazz", 1.0), ("jazz piano", 0.5)])),
        index.scores({"jazz": 1.5, "piano": 0.5}),
    )


# --- scores -------------------------------------------------------------------------------------


def test_scores_by_hand() -> None:
    index = LexicalIndex.build(["jazz jazz concert", "rock concert", "jazz"], k1=1.2, b=0.5)
    # N = 3, dl = (3, 2, 1), avgdl = 2; df(jazz) = 2, df(concert) = 2.
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))

    def part(tf: float, dl: float) -> float:
        return tf / (tf + 1.2 * (1 - 0.5 + 0.5 * dl / 2))

    expected = [
        idf * part(2, 3) + 0.5 * idf * part(1, 3),
        0.5 * idf * part(1, 2),
        idf * part(1, 1),
    ]
    got = index.scores({"jazz": 1.0, "concert": 0.5})
    assert got.dtype == np.float32 and got.shape == (3,)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_ceiling_is_the_score_no_item_reaches_unknown_words_counted_as_unseen() -> None:
    index = LexicalIndex.build(["jazz jazz concert", "rock concert", "jazz"])
    seen = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # jazz, concert: df = 2 of N = 3
    unseen = math.log(1 + (3 - 0 + 0.5) / (0 + 0.5))  # df = 0
    terms = {"jazz": 1.0, "concert": 0.5, "opera": 2.0}
    assert index.ceiling(terms) == pytest.approx(1.5 * seen + 2.0 * unseen)
    assert index.ceiling("jazz concert") == pytest.approx(2 * seen)
    assert (index.scores(terms) < index.ceiling(terms)).all()
    assert index.ceiling("the of and") == 0.0


@pytest.mark.parametrize("stemmer", STEMMERS)
@pytest.mark.parametrize("query", QUERIES)
def test_scores_equal_bm25s_lucene(query: str, stemmer: str | None) -> None:
    expected = bm25s_scores(CHAT, query, stemmer)
    got = LexicalIndex.build(CHAT, stemmer=stemmer).scores(query)  # type: ignore[arg-type]
    assert expected.any()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_stop_words_and_case_are_ignored() -> None:
    index = LexicalIndex.build(CHAT)
    np.testing.assert_array_equal(
        index.scores("What is THE best Jazz for the Kids?"), index.scores("best jazz kids")
    )
    assert not index.scores("is it what it is? the, a, of").any()
    assert not index.scores("").any()
    assert not index.scores({"zzyzx": 1.0, "Jazz": 1.0}).any()  # mapping keys are not tokenized


def test_items_without_terms_score_zero_and_count_in_avgdl() -> None:
    with_empty = LexicalIndex.build(["jazz night", "", "the of it"], k1=1.5, b=0.75)
    scores = with_empty.scores("jazz")
    assert scores[1] == scores[2] == 0.0
    # dl = (2, 0, 0): avgdl = 2/3, so the one jazz item is 3 times longer than average.
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    assert scores[0] == pytest.approx(idf / (1 + 1.5 * (0.25 + 0.75 * 3)), rel=1e-6)


def test_empty_index() -> None:
    index = LexicalIndex.build([])
    assert len(index) == 0
    got = index.scores("jazz")
    assert got.dtype == np.float32 and got.shape == (0,)
    grown = index.derived([], ["jazz night"])
    assert len(grown) == 1 and grown.scores("jazz")[0] > 0
    assert len(grown.derived([], [])) == 0


def test_parameters_are_checked() -> None:
    with pytest.raises(ValueError):
        LexicalIndex.build(CHAT, k1=-1.0)
    with pytest.raises(ValueError):
        LexicalIndex.build(CHAT, b=1.5)


def test_pickle_round_trip() -> None:
    index = LexicalIndex.build(CHAT, k1=1.2, b=0.6, stemmer="english")
    copy = pickle.loads(pickle.dumps(index))
    assert (copy.k1, copy.b, copy.stemmer, len(copy)) == (1.2, 0.6, "english", len(CHAT))
    for query in QUERIES:
        np.testing.assert_array_equal(copy.scores(query), index.scores(query))
    np.testing.assert_array_equal(
        copy.derived([3, 1], ["jazz again"]).scores("jazz"),
        index.derived([3, 1], ["jazz again"]).scores("jazz"),
    )


# --- derived snapshots --------------------------------------------------------------------------


def test_derived_tokenizes_only_the_added_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    index = LexicalIndex.build(CHAT)
    seen: list[str] = []

    def counting(text: str) -> list[str]:
        seen.append(text)
        return tokenize(text)

    monkeypatch.setattr(lexical, "tokenize", counting)
    index.derived(range(len(CHAT)), ["a new jazz item"])
    assert seen == ["a new jazz item"]


def test_derived_checks_keep() -> None:
    index = LexicalIndex.build(CHAT)
    with pytest.raises(IndexError):
        index.derived([len(CHAT)], [])
    with pytest.raises(IndexError):
        index.derived([-1], [])
    with pytest.raises(TypeError):
        index.derived(np.ones(len(CHAT), dtype=bool), [])


def test_replacements_do_not_grow_the_vocabulary_without_bound() -> None:
    index = LexicalIndex.build(["seed"])
    for i in range(200):  # every step replaces the only item by one with new words
        index = index.derived([], [f"word{i} other{i}"])
    assert len(index) == 1 and index.scores("word199 other199")[0] > 0
    assert len(index._vocab) <= 4  # dead terms are dropped once they outnumber the live ones


WORDS = ["jazz", "Jazz", "rock", "concert", "piano", "lentil", "soup", "2023", "the", "is", "of"]
WORDS += ["concerts", "lentils", "rocking"]  # words that share a stem with another word
text_st = st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join)
QUERY_TERMS = sorted({w.lower() for w in WORDS})


def all_scores(index: LexicalIndex) -> list[np.ndarray]:
    weighted = {t: 1.0 + i / 7 for i, t in enumerate(QUERY_TERMS)}
    return [index.scores(t) for t in QUERY_TERMS] + [index.scores(weighted)]


@pytest.mark.parametrize("stemmer", STEMMERS)
@settings(max_examples=50, deadline=None)
@given(st.lists(text_st, max_size=8), st.data())
def test_derived_equals_build_on_the_same_texts(
    stemmer: str | None, initial: list[str], data: st.DataObject
) -> None:
    texts = list(initial)
    index = LexicalIndex.build(texts, stemmer=stemmer)  # type: ignore[arg-type]
    for _ in range(data.draw(st.integers(1, 4))):
        keep: list[int] = []  # reorders, repeats, drops
        if texts:
            keep = data.draw(st.lists(st.integers(0, len(texts) - 1), max_size=len(texts) + 2))
        added = data.draw(st.lists(text_st, max_size=3))
        before = all_scores(index)
        new_index = index.derived(keep, added)
        for was, now in zip(before, all_scores(index)):
            np.testing.assert_array_equal(now, was)  # the old snapshot is untouched
        texts = [texts[i] for i in keep] + added
        index = new_index
        assert len(index) == len(texts) and index.stemmer == stemmer
        rebuilt = LexicalIndex.build(texts, stemmer=stemmer)  # type: ignore[arg-type]
        for got, want in zip(all_scores(index), all_scores(rebuilt)):
            np.testing.assert_array_equal(got, want)  # to the bit, not approximately


def test_an_index_counts_the_bytes_of_a_large_vocabulary() -> None:
    """``nbytes`` within 5% of what the index allocates (tracemalloc) for 20,000 distinct
    terms: the vocabulary's column numbers are int objects too (before, ~20% short, and a
    cache budget overran by as much)."""
    import gc
    import tracemalloc

    texts = [" ".join(f"w{i}x{j}" for j in range(100)) for i in range(200)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = LexicalIndex.build(texts)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert abs(index.nbytes - held) / held < 0.05


def test_a_history_pickled_with_another_tokenizers_index_builds_it_again() -> None:
    """A BM25 index of the older tokenizer (words cut at their combining marks) is not read
    back from a pickle: its terms would miss the query's (an older pickle kept it, and derived
    every later index from it)."""
    import pickle

    from pbr_core import HistoryItem
    from pbr_core.snapshot import UserHistory

    texts = ["मुझे चाय पसंद है", "I like coffee"]
    items = [HistoryItem(f"i{n}", t) for n, t in enumerate(texts)]
    history = UserHistory("u", items, np.eye(2, dtype=np.float32), 1)
    history.lexical(None)
    state = history.__getstate__()
    state.pop("_tokenizer")  # as an older pbr pickled it
    older = UserHistory.__new__(UserHistory)
    older.__setstate__(state)
    assert not older.has_lexical(None)
    assert older.lexical(None).scores("चाय")[0] > 0
    again = pickle.loads(pickle.dumps(history))
    assert again.has_lexical(None)  # this tokenizer's: kept
