"""A filtered view that only the host store can evaluate is listed through the store's own
search for ``q*`` (:func:`pbr_core.retrieval._listed_view`): one more record than the user has,
never fewer than the candidates a search would take, twice as many while the store fills the
request (it can hold records pbr does not keep), at most :data:`LISTING_MAX`.

The store is a fake that answers each search with a given number of records, so the rule is
read off the ``k`` it is asked for.
"""

from __future__ import annotations

import numpy as np
import pytest

from pbr_core.retrieval import LISTING_MAX, _HostSearch, _listed_view

Q = np.ones(4, dtype=np.float32)


def _asked(items: int, candidates: int, answers: list[int]) -> tuple[list[int], int]:
    """The ``k`` of each search the listing makes, and how many records it returns, for a store
    answering the n-th search with ``answers[n]`` records."""
    steps = _listed_view(Q, items, candidates)
    asked: list[int] = []
    effect = next(steps)
    try:
        for answer in answers:
            assert isinstance(effect, _HostSearch) and effect.vector is Q
            asked.append(effect.n)
            effect = steps.send([(f"k{i}", {}, 0.5) for i in range(answer)])
    except StopIteration as done:
        return asked, len(done.value)
    raise AssertionError(f"still listing after {asked}")


def test_a_view_the_store_returns_whole_takes_one_search_for_one_more_than_the_user_has() -> None:
    assert _asked(100, 40, [60]) == ([101], 60)


def test_never_fewer_than_the_candidates_a_search_would_take() -> None:
    assert _asked(3, 40, [3]) == ([40], 3)


def test_a_store_that_fills_the_request_is_asked_for_twice_as_many() -> None:
    # records pbr does not keep (a node without text) took places of the user's own
    assert _asked(100, 40, [101, 150]) == ([101, 202], 150)


def test_a_store_that_caps_its_search_is_not_asked_again_and_again() -> None:
    assert _asked(100, 40, [101, 101]) == ([101, 202], 101)


@pytest.mark.parametrize("items", [LISTING_MAX - 1, 5 * LISTING_MAX])
def test_no_more_than_listing_max_is_asked(items: int) -> None:
    asked, got = _asked(items, 40, [LISTING_MAX])
    assert asked == [LISTING_MAX] and got == LISTING_MAX
