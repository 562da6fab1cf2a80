"""Benchmark loaders on the real data sets (skipped where ``$PBR_DATA_DIR`` is unset or absent)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pbr_bench import datasets
from pbr_bench.datasets import (
    Dataset,
    load_locomo,
    load_pbr_generations,
    load_personabench,
    load_prefeval,
    resolve_data_dir,
)

try:
    DATA_DIR: Path | None = resolve_data_dir()
    NO_DATA = ""
except FileNotFoundError as exc:
    DATA_DIR, NO_DATA = None, str(exc)

needs_data = pytest.mark.skipif(DATA_DIR is None, reason=f"benchmark data not available: {NO_DATA}")


def test_public_api_is_pinned() -> None:
    assert sorted(datasets.__all__) == [
        "DATA_DIR_ENV",
        "Dataset",
        "Doc",
        "LOCOMO_QUESTION_SETS",
        "PERSONABENCH_NOISE_LEVELS",
        "PREFEVAL_FORMS",
        "Query",
        "UserCorpus",
        "load_locomo",
        "load_named",
        "load_pbr_generations",
        "load_personabench",
        "load_prefeval",
        "resolve_data_dir",
    ]


# ---------------------------------------------------------------- data directory resolution


def test_explicit_data_dir_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PBR_DATA_DIR", str(tmp_path / "elsewhere"))
    assert resolve_data_dir(tmp_path) == tmp_path


def test_environment_variable_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PBR_DATA_DIR", str(tmp_path))
    assert resolve_data_dir() == tmp_path


def test_bad_locations_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory"):
        resolve_data_dir(tmp_path / "missing")
    monkeypatch.setenv("PBR_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match=r"PBR_DATA_DIR.*fix or unset"):
        resolve_data_dir()


def test_without_a_data_dir_the_error_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No guessing: a data folder beside the checkout or the current folder is not a default (the
    data live wherever the person running the harness put them)."""
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "checkout").mkdir()
    monkeypatch.chdir(tmp_path / "checkout")
    monkeypatch.delenv("PBR_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=r"set \$PBR_DATA_DIR.*--data-dir"):
        resolve_data_dir()


def test_a_data_dir_without_the_files_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"conversation_data_all\.json"):
        load_personabench("0.0", data_dir=tmp_path)


# ---------------------------------------------------------------- PersonaBench


@pytest.fixture(scope="module")
def personabench() -> Dataset:
    return load_personabench("0.0", data_dir=DATA_DIR)


@needs_data
def test_personabench_counts(personabench: Dataset) -> None:
    assert len(personabench.corpora) == 6
    assert personabench.num_docs == 527
    assert len(personabench.queries) == 263
    scored = personabench.scored_queries
    assert len(scored) == 230
    assert Counter(q.category for q in scored) == {
        "Basic information": 110,
        "Social": 53,
        "Preference-hard": 41,
        "Preference-easy": 26,
    }
    assert Counter(q.category for q in personabench.queries)["Subjective"] == 33


@needs_data
def test_personabench_documents_are_the_official_chunks(personabench: Dataset) -> None:
    corpus = personabench.corpora["Jennifer Moran"]
    first = corpus.docs[0]
    # compact JSON, key order kept, segment_id and session removed
    assert first.text.startswith('{"time":"2024/Oct/14/09:14 AM","target_name":"Samuel Mills",')
    assert '"segment_id"' not in first.text and '"session"' not in first.text
    assert first.timestamp == "2024/Oct/14/09:14 AM"
    parsed = json.loads(first.text)
    assert list(parsed) == ["time", "target_name", "conversation"]
    for corpus in personabench.corpora.values():
        assert len(set(corpus.ids)) == len(corpus)


@needs_data
def test_personabench_gold_points_into_the_users_corpus(personabench: Dataset) -> None:
    for q in personabench.queries:
        ids = set(personabench.corpora[q.user_id].ids)
        assert q.gold and all(alts and set(alts) <= ids for alts in q.gold), q.id
    q0 = personabench.queries[0]
    assert (q0.id, q0.user_id, q0.text) == (
        "000000000",
        "Jennifer Moran",
        "Where did I go to school?",
    )
    assert q0.gold == [["000000000100"]] and q0.answer == "Harvard University"


@needs_data
@pytest.mark.parametrize(("noise", "docs"), [("0.3", 751), ("0.5", 1054), (0.7, 1916)])
def test_personabench_noise_levels(noise: str | float, docs: int) -> None:
    ds = load_personabench(noise, data_dir=DATA_DIR)
    assert ds.num_docs == docs
    assert len(ds.queries) == 263 and len(ds.scored_queries) == 230


def test_personabench_rejects_unknown_noise() -> None:
    with pytest.raises(ValueError, match="noise must be one of"):
        load_personabench("0.2")


@needs_data
def test_pbr_generations_cover_every_question(personabench: Dataset) -> None:
    gens = load_pbr_generations(DATA_DIR)
    assert set(gens) == {q.id for q in personabench.queries}
    fakes, reason = gens["000000000"]
    assert len(fakes) == 10 and all(isinstance(f, str) and f for f in fakes)
    assert "school" in reason.lower()


# ---------------------------------------------------------------- LoCoMo


@needs_data
def test_locomo_turn_level() -> None:
    ds = load_locomo("turn", data_dir=DATA_DIR)
    assert len(ds.corpora) == 10 and ds.num_docs == 5882
    assert len(ds.queries) == 1536
    assert Counter(q.category for q in ds.queries) == {
        "cat1": 282,
        "cat2": 321,
        "cat3": 92,
        "cat4": 841,
    }
    turn = ds.corpora["conv-26"].docs[0]
    assert (turn.id, turn.text) == (
        "D1:1",
        "Caroline: Hey Mel! Good to see you! How have you been?",
    )
    photo = next(d for d in ds.corpora["conv-26"].docs if d.id == "D1:5")
    assert photo.text.endswith(
        "[shared photo: a photo of a dog walking past a wall with a painting of a woman]"
    )
    for q in ds.queries:
        ids = set(ds.corpora[q.user_id].ids)
        assert q.gold and all(len(alts) == 1 and alts[0] in ids for alts in q.gold), q.id


@needs_data
def test_locomo_malformed_evidence_is_repaired_or_dropped() -> None:
    ds = load_locomo("turn", data_dir=DATA_DIR)
    by_id = {q.id: q for q in ds.queries}
    assert by_id["conv-26/q37"].gold[-2:] == [["D8:6"], ["D9:17"]]  # "D8:6; D9:17"
    assert ["D11:26"] in by_id["conv-43/q18"].gold  # "D:11:26"
    assert ["D30:5"] in by_id["conv-50/q69"].gold  # "D30:05"
    fixed = {(f["sample"], f["qa"]) for f in ds.info["evidence_fixes"]}
    assert {("conv-42", 58), ("conv-47", 38), ("conv-42", 88)} <= fixed  # dropped ids


@needs_data
def test_locomo_session_level() -> None:
    ds = load_locomo("session", data_dir=DATA_DIR)
    assert ds.num_docs == 272 and len(ds.queries) == 1536
    s1 = ds.corpora["conv-26"].docs[0]
    assert s1.id == "S1" and s1.text.startswith("1:56 pm on 8 May, 2023\nCaroline: Hey Mel!")
    q = next(q for q in ds.queries if q.id == "conv-26/q37")
    assert q.gold[-2:] == [["S8"], ["S9"]]
    for q in ds.queries:
        ids = [a[0] for a in q.gold]
        assert len(ids) == len(set(ids))


@needs_data
@pytest.mark.parametrize("level", ["turn", "session"])
def test_locomo_all_questions_add_the_adversarial_category_with_its_evidence(level: str) -> None:
    # The question set published memory-system numbers use (memini: 1,981 / 1,982): every
    # question with evidence. The default set is the same questions without category 5.
    every = load_locomo(level, data_dir=DATA_DIR, questions="all")  # type: ignore[arg-type]
    default = load_locomo(level, data_dir=DATA_DIR)  # type: ignore[arg-type]
    assert every.name == f"locomo-{level}-all" and default.name == f"locomo-{level}"
    assert len(every.scored_queries) == 1982 and len(default.scored_queries) == 1536
    assert Counter(q.category for q in every.queries) == {
        "cat1": 282,
        "cat2": 321,
        "cat3": 92,
        "cat4": 841,
        "cat5": 446,
    }
    assert [q for q in every.queries if q.category != "cat5"] == default.queries
    assert every.corpora.keys() == default.corpora.keys()
    adversarial = next(q for q in every.queries if q.category == "cat5")
    assert adversarial.gold and adversarial.answer  # the adversarial answer, for the record
    ids = set(every.corpora[adversarial.user_id].ids)
    assert all(alts[0] in ids for alts in adversarial.gold)
    assert every.info["questions"] == "all" and default.info["questions"] == "no-adversarial"


def test_locomo_rejects_an_unknown_question_set() -> None:
    with pytest.raises(ValueError, match="questions must be one of"):
        load_locomo("turn", questions="adversarial")  # type: ignore[arg-type]


def test_locomo_rejects_unknown_level() -> None:
    with pytest.raises(ValueError, match="level must be"):
        load_locomo("utterance")  # type: ignore[arg-type]


# ---------------------------------------------------------------- PrefEval


@needs_data
@pytest.mark.parametrize(("n", "per_topic", "items"), [(10, None, 1000), (300, 3, 60)])
def test_prefeval_histories_hide_one_preference_among_n_fillers(
    n: int, per_topic: int | None, items: int
) -> None:
    ds = load_prefeval(n, data_dir=DATA_DIR, max_per_topic=per_topic)
    assert len(ds.queries) == items and len(ds.corpora) == items
    for q in ds.queries[:60]:
        corpus = ds.corpora[q.user_id]
        assert len(corpus) == n + 1 and len(set(corpus.ids)) == n + 1
        assert q.gold == [["pref-0"]]
    first = ds.queries[0]
    pref = next(d for d in ds.corpora[first.user_id].docs if d.id == "pref-0")
    raw = json.loads(
        (DATA_DIR / "prefeval/benchmark_dataset/explicit_preference/education_learning_styles.json")  # type: ignore[operator]
        .read_text()
    )[0]
    assert pref.text == raw["preference"] and first.text == raw["question"]


@needs_data
def test_prefeval_is_deterministic_and_seeded() -> None:
    a = load_prefeval(50, data_dir=DATA_DIR, max_per_topic=3)
    b = load_prefeval(50, data_dir=DATA_DIR, max_per_topic=3)
    c = load_prefeval(50, data_dir=DATA_DIR, max_per_topic=3, seed=1)
    assert a.corpora == b.corpora
    assert a.corpora != c.corpora
    positions = [a.corpora[q.user_id].ids.index("pref-0") for q in a.queries]
    assert len(set(positions)) > 1  # the preference is not always in the same slot


@needs_data
def test_prefeval_topic_selection_does_not_change_other_histories() -> None:
    full = load_prefeval(10, data_dir=DATA_DIR, max_per_topic=2)
    one = load_prefeval(10, data_dir=DATA_DIR, topics=["travel_hotel"], max_per_topic=2)
    assert [q.user_id for q in one.queries] == ["travel_hotel/0", "travel_hotel/1"]
    for uid, corpus in one.corpora.items():
        assert full.corpora[uid] == corpus


@needs_data
def test_prefeval_user_only_fillers_by_default_all_roles_on_request() -> None:
    users = load_prefeval(300, data_dir=DATA_DIR, max_per_topic=1)
    both = load_prefeval(600, data_dir=DATA_DIR, max_per_topic=1, roles="all")
    assert len(users.corpora["travel_hotel/0"]) == 301
    assert len(both.corpora["travel_hotel/0"]) == 601
    with pytest.raises(ValueError, match=r"n_filler must be in \[0, 316\]"):
        load_prefeval(400, data_dir=DATA_DIR)


@needs_data
@pytest.mark.parametrize(("form", "n_pref"), [("implicit_choice", 2), ("implicit_persona", None)])
def test_prefeval_implicit_forms_mark_the_whole_exchange(form: str, n_pref: int | None) -> None:
    ds = load_prefeval(10, data_dir=DATA_DIR, form=form, max_per_topic=2)  # type: ignore[arg-type]
    assert len(ds.queries) == 40
    for q in ds.queries:
        (alts,) = q.gold
        assert alts[0] == "pref-0" and (n_pref is None or len(alts) == n_pref)
        ids = ds.corpora[q.user_id].ids
        start = ids.index("pref-0")
        assert ids[start : start + len(alts)] == alts  # the exchange stays contiguous


@needs_data
def test_prefeval_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown PrefEval topics"):
        load_prefeval(10, data_dir=DATA_DIR, topics=["cooking"])
    with pytest.raises(ValueError, match="form must be one of"):
        load_prefeval(10, data_dir=DATA_DIR, form="mcq")  # type: ignore[arg-type]


@needs_data
@pytest.mark.parametrize(
    "name",
    [
        "personabench-0.7",
        "locomo-session",
        "locomo-turn-all",
        "prefeval-explicit-n50",
        "prefeval-implicit_choice-n10",
    ],
)
def test_a_data_set_reloads_from_its_name(name: str) -> None:
    ds = datasets.load_named(name)
    assert ds.name == name
    assert ds.queries


@pytest.mark.parametrize("name", ["personabench-0.9", "locomo", "prefeval-explicit", "lamp-1"])
def test_an_unknown_data_set_name_is_refused_with_the_known_forms(name: str) -> None:
    with pytest.raises(ValueError, match="expected personabench-<noise>"):
        datasets.load_named(name)
