"""The ensemble baseline is LangChain's own rule: checked against a real ``EnsembleRetriever``."""

from __future__ import annotations

import random

import pytest
from langchain_classic.retrievers import EnsembleRetriever
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from pbr_bench.ensemble import RRF_C, rrf


class _Nothing(BaseRetriever):
    """A retriever the ensemble needs to exist; only its fusion rule is called here."""

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return []


@pytest.mark.parametrize("seed", range(20))
def test_rrf_orders_ids_as_langchains_ensemble_does(seed: int) -> None:
    rng = random.Random(seed)
    pool = [f"d{i}" for i in range(rng.randint(1, 30))]
    rankings = [rng.sample(pool, rng.randint(0, len(pool))) for _ in range(rng.randint(1, 3))]
    weights = [rng.choice([0.5, 0.25, 1.0, rng.random()]) for _ in rankings]
    ensemble = EnsembleRetriever(
        retrievers=[_Nothing() for _ in rankings], weights=weights, c=RRF_C, id_key="id"
    )
    theirs = ensemble.weighted_reciprocal_rank(
        [[Document(page_content="", metadata={"id": d}) for d in r] for r in rankings]
    )
    assert rrf(rankings, weights) == [doc.metadata["id"] for doc in theirs]


def test_equal_scores_keep_first_appearance() -> None:
    # d1 and d2 both sit at rank 1 of one list: the tie keeps the chained lists' order
    assert rrf([["d1"], ["d2"]], [0.5, 0.5]) == ["d1", "d2"]


def test_rankings_and_weights_must_pair_up() -> None:
    with pytest.raises(ValueError, match="2 rankings but 1 weights"):
        rrf([["a"], ["b"]], [1.0])
