"""PBRConfig refuses a value of the wrong type or out of range when it is made, naming the field,
instead of failing at the first query (a float as a slice bound, NaN as a count)."""

from __future__ import annotations

import math

import pytest

from pbr_core import PBRConfig


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("k1", 2.5),
        ("k1", True),
        ("k2", math.nan),
        ("num_utterances", math.nan),
        ("max_item_chars", 2.5),
        ("pagerank_max_iter", 2.5),
        ("exact_knn_max_items", None),
        ("exact_knn_max_items", -5),
        ("top_anchor_items", math.nan),
        ("max_concurrent_llm_calls", 2.5),
        ("max_answer_chars", 2.5),
        ("pagerank_tol", math.nan),
        ("pagerank_tol", math.inf),
        ("theta", "0.5"),
        ("safe_history_gate", "no"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_when_the_config_is_made(
    field: str, value: object
) -> None:
    with pytest.raises(ValueError, match=rf"invalid PBRConfig: {field} must"):
        PBRConfig(**{field: value})
    with pytest.raises(ValueError, match=field):
        PBRConfig().with_(**{field: value})


def test_every_default_and_the_edges_of_the_counts_are_accepted() -> None:
    PBRConfig()
    PBRConfig(exact_knn_max_items=0, top_anchor_items=0, k1=1, safe_history_gate=False)


def test_every_entry_point_takes_a_dict_of_the_fields_checked_as_pbrconfig_checks_them(
    hash_embedder: object,
) -> None:
    """A dict of PBRConfig's fields is a config everywhere (LangChain's retriever took one; the
    core and LlamaIndex stored it unchecked and failed at the first query), with nothing coerced
    (pydantic read ``{"k1": "10"}`` as 10)."""
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models.fake import FakeListLLM
    from pydantic import ValidationError

    from langchain_pbr import PBRRetriever
    from pbr_core import Personalizer

    p = Personalizer(hash_embedder, config={"fusion": "plain"})  # type: ignore[arg-type]
    assert p.config == PBRConfig(fusion="plain")
    p.add_texts("u", ["alice likes green tea", "alice runs"])
    assert p.search("u", "tea", k=1, config={"fusion": "plain", "search": "dense"}).hits
    with pytest.raises(ValueError, match="k1 must be an integer"):
        Personalizer(hash_embedder, config={"k1": "10"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a PBRConfig or a dict"):
        Personalizer(hash_embedder, config="plain")  # type: ignore[arg-type]
    emb, llm = DeterministicFakeEmbedding(size=16), FakeListLLM(responses=["x"])
    made = PBRRetriever(llm=llm, embeddings=emb, config={"fusion": "plain"})
    assert made.config.fusion == "plain"
    with pytest.raises(ValidationError, match="k1 must be an integer"):
        PBRRetriever(llm=llm, embeddings=emb, config={"k1": "10"})


def test_a_user_without_history_gets_no_results_from_the_history_search_too(
    hash_embedder: object,
) -> None:
    """``unknown_user="plain"`` promises the plain query and no results; with pbr's own
    ``HistoryVectorSearch`` as the final search it raised UnknownUserError (before). An
    ``unknown_user`` that is neither policy is refused, not read as "plain"."""
    from pbr_core import HistoryStore, Personalizer
    from pbr_core.pipeline import HistoryVectorSearch

    store = HistoryStore()
    p = Personalizer(
        hash_embedder,
        store=store,
        vector_search=HistoryVectorSearch(store),  # type: ignore[arg-type]
        config=PBRConfig(fusion="plain"),
    )
    assert p.search("nobody", "tea", k=3, unknown_user="plain").hits == []
    with pytest.raises(ValueError, match="unknown_user must be"):
        p.search("nobody", "tea", k=3, unknown_user="bogus")
    with pytest.raises(ValueError, match="unknown_user must be"):
        p.personalize("nobody", "tea", unknown_user="bogus")  # type: ignore[arg-type]
