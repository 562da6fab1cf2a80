"""One personalized retrieval, in the order every adapter takes it.

The LangChain and LlamaIndex retrievers, the LangGraph store and the LlamaIndex memory block all
do the same steps: read the user's history (checked against the host store), personalize the
query, ask the host store for candidates only where pbr cannot rank all of the user's items
itself (a view filter only the host can evaluate), then rank with pbr: the dense leg on ``q*``,
the lexical leg on the query's words plus the LLM's. The steps are written here once, so the
adapters only translate their framework's objects to and from these calls.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import PBRConfig
from .corpus import Corpus, ScoredRecord
from .history import UserHistory
from .hybrid import host_candidates, lexical_query, lexical_terms

if TYPE_CHECKING:  # the pipeline ranks with this module too
    from .pipeline import PersonalizedQuery

__all__ = ["Candidates", "Retrieval", "aretrieve", "rank_personalized", "retrieve"]

#: A host search's results: (store key, metadata, the store's own score) per record.
Candidates = Sequence[tuple[str, Mapping[str, Any], float | None]]
#: ``q*`` and how many candidates → the host store's search within the request's view.
HostSearch = Callable[[np.ndarray, int], Candidates]
AsyncHostSearch = Callable[[np.ndarray, int], Awaitable[Candidates]]
#: A context manager that translates the host store's errors (e.g. an unreachable server).
HostErrors = Callable[[], contextlib.AbstractContextManager[object]]


@dataclass(frozen=True)
class Retrieval:
    """A request's personalized query and pbr's ranking of the user's items for it."""

    query: PersonalizedQuery
    results: list[ScoredRecord]


def rank_personalized(
    corpus: Corpus,
    user_id: str,
    history: UserHistory | None,
    pq: PersonalizedQuery,
    k: int,
    config: PBRConfig,
    found: Candidates | None = None,
    *,
    since: float | None = None,
) -> list[ScoredRecord]:
    """The user's ``k`` best items for ``pq`` in ``config.search`` mode: all of them, or within
    a host search's ``found``. Records ``timings_ms["search"]`` (ms since ``since``, default
    now: the host search is included when the caller timed it)."""
    start = time.perf_counter() if since is None else since
    terms = lexical_terms(pq.explanation, config.lexical_feedback_weight)
    own = lexical_query(pq.explanation.query)
    results = corpus.search(
        user_id, history, pq.vector, terms, k, mode=config.search, found=found, own_terms=own
    )
    pq.explanation.timings_ms["search"] = (time.perf_counter() - start) * 1000.0
    return results


def _needs_host(corpus: Corpus, history: UserHistory | None, view_filtered: bool) -> bool:
    # Nothing of the user's to search, or pbr ranks every item itself: no host search.
    return history is not None and not corpus.ranks_all(view_filtered)


def retrieve(
    corpus: Corpus,
    user_id: str,
    k: int,
    config: PBRConfig,
    personalize: Callable[[], PersonalizedQuery],
    *,
    host_search: HostSearch | None = None,
    view_filtered: bool = False,
    host_errors: HostErrors = contextlib.nullcontext,
) -> Retrieval:
    """Read ``user_id``'s history, call ``personalize``, search the host where needed, rank.

    Args:
        corpus: the owner of every user's items.
        k: results wanted.
        config: the request's parameters (``search``, ``lexical_feedback_weight``).
        personalize: makes the request's :class:`PersonalizedQuery` (the LLM calls).
        host_search: the host store's search within the request's view; None = no host store
            (pbr's own is the record).
        view_filtered: whether the request's view has a filter only the host can evaluate.
        host_errors: wraps every host store call (never the LLM's).
    """
    with host_errors():
        history = corpus.history(user_id)
    pq = personalize()
    start = time.perf_counter()
    found = None
    with host_errors():
        if host_search is not None and _needs_host(corpus, history, view_filtered):
            found = host_search(pq.vector, host_candidates(k, config.search))
        results = rank_personalized(corpus, user_id, history, pq, k, config, found, since=start)
    return Retrieval(pq, results)


async def aretrieve(
    corpus: Corpus,
    user_id: str,
    k: int,
    config: PBRConfig,
    personalize: Callable[[], Awaitable[PersonalizedQuery]],
    *,
    host_search: AsyncHostSearch | None = None,
    view_filtered: bool = False,
    host_errors: HostErrors = contextlib.nullcontext,
) -> Retrieval:
    """Async :func:`retrieve` (pbr's ranking is in-process: it runs inline)."""
    with host_errors():
        history = await corpus.ahistory(user_id)
    pq = await personalize()
    start = time.perf_counter()
    found = None
    with host_errors():
        if host_search is not None and _needs_host(corpus, history, view_filtered):
            found = await host_search(pq.vector, host_candidates(k, config.search))
        results = rank_personalized(corpus, user_id, history, pq, k, config, found, since=start)
    return Retrieval(pq, results)
