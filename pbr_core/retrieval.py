"""One request, run the same way for every entry point.

``Personalizer.search``, the LangChain and LlamaIndex retrievers, the LangGraph store and the
LlamaIndex memory block all answer a query with the same steps: read the user's history (checked
against the host store), narrow it to the request's view where the entry point has one,
personalize the query (the strict / plain rule for a user without history), ask the host store
for candidates only where pbr cannot rank all of the user's items itself (a view filter only the
host can evaluate), then rank with pbr: the dense leg on ``q*``, the lexical leg on the query's
words plus the LLM's, and time it.

The steps are one generator, :func:`_steps`, that yields the I/O it needs (an :class:`_Effect`)
and gets the result back; :func:`retrieve` and :func:`aretrieve` are drivers that perform that
I/O with blocking or awaited calls. Change the request there, never in one driver or one entry
point: entry points only translate their framework's objects into a :class:`Request` and the
:class:`Retrieval` back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .config import PBRConfig
from .corpus import Corpus, ScoredRecord
from .derived import derive, to_derive
from .fusion import MODE_TERMS
from .hybrid import host_candidates, lexical_query, lexical_terms, rank
from .prf import PromptSet
from .protocols import SearchHit, TextGenerator
from .rerank import rerank_by_salience
from .results import PersonalizedQuery, PseudoFeedback, explanation_payload
from .snapshot import UserHistory
from .vectors import as_unit_vector
from .view import NotServed, ScoredView, ranks_in_database

if TYPE_CHECKING:
    from .salience.protocol import LogProbScorer

__all__ = [
    "Candidates",
    "Request",
    "Retrieval",
    "UnknownUserPolicy",
    "aretrieve",
    "check_query",
    "check_score_threshold",
    "check_unknown_user",
    "rank_personalized",
    "retrieve",
]

#: What personalization does for a user with no history: raise, or search with ``q* = q``.
UnknownUserPolicy = Literal["raise", "plain"]
#: A host search's results: (store key, metadata, the store's own score) per record; the key
#: None where the store returns none (a LangChain ``Document.id`` is optional): the item is then
#: known by its id in the metadata.
Candidates = Sequence[tuple[str | None, Mapping[str, Any], float | None]]
#: ``q*`` and how many candidates → the host store's search within the request's view.
HostSearch = Callable[[np.ndarray, int], Candidates]
AsyncHostSearch = Callable[[np.ndarray, int], Awaitable[Candidates]]
#: The user's records within a view the entry point lists itself (e.g. a LangGraph filter).
HostFilter = Callable[[], Candidates]
#: ``q*`` and ``k`` → a caller's own final search (``Personalizer(vector_search=...)``).
FinalSearch = Callable[[np.ndarray, int], Sequence[SearchHit]]
AsyncFinalSearch = Callable[[np.ndarray, int], Awaitable[Sequence[SearchHit]]]
#: A context manager that translates the host store's errors (e.g. an unreachable server).
HostErrors = Callable[[], contextlib.AbstractContextManager[object]]
#: ``(user_id, query, **Request.personalize_kwargs(), query_vector=..., history=...)`` → the
#: personalized query (``Personalizer.personalize``'s keywords: a wrapper passes them on).
Personalize = Callable[..., PersonalizedQuery]
AsyncPersonalize = Callable[..., Awaitable[PersonalizedQuery]]


@dataclass(frozen=True)
class Request:
    """One user's query, as every entry point states it.

    Attributes:
        user_id, query: the request.
        k: results wanted (>= 1).
        config: the request's parameters, for personalization and ranking alike (its
            ``search`` mode ranks): an entry point passes its own (the personalizer's).
        generator, feedback, prompts, query_vector: as :meth:`Personalizer.personalize`.
        strict: raise instead of degrading (None: the personalizer's own setting).
        unknown_user: what a user without history gets; None = the one rule every adapter
            follows: ``"raise"`` when ``strict``, else ``"plain"`` (``q* = q``, no results).
        skip_unknown: a user without history gets no results and nothing is personalized (no
            LLM call): agent memory, where an empty memory is the normal state of a new user.
        view_filtered: the request's view has a filter only the host can evaluate, so pbr ranks
            the user's items within it: the ones the entry point lists (``host_filter``), else
            the ones the host's search lists (:func:`_listed_view`).
        score_threshold: keep the ranked results down to the first whose score is below this
            (the score's one documented meaning on every store: hybrid, the relevance in [0, 1]
            of :func:`pbr_core.hybrid.relevance`, comparable across queries and users; the cosine
            with ``q*`` in dense mode; BM25 in lexical mode); None keeps the ``k`` best. A cut of
            the ranked list, so no result is dropped while a lower-ranked one is kept.
            LangChain's ``search_kwargs={"score_threshold": ...}``, applied by pbr, so the same
            over every store. With a re-rank stage, applied after it.
        salience_scorer: the LM scorer of ``config.rerank="salience"``; None: the embedded
            Gemma 3 270M (:func:`pbr_core.salience.default_scorer`).
    """

    user_id: str
    query: str
    k: int
    config: PBRConfig = field(default_factory=PBRConfig)
    generator: TextGenerator | None = None
    feedback: PseudoFeedback | None = None
    prompts: PromptSet | None = None
    query_vector: Sequence[float] | np.ndarray | None = None
    strict: bool | None = None
    unknown_user: UnknownUserPolicy | None = None
    skip_unknown: bool = False
    view_filtered: bool = False
    score_threshold: float | None = None
    salience_scorer: LogProbScorer | None = None

    def __post_init__(self) -> None:
        check_query(self.query)  # for every user: a new user's empty answer included
        if self.unknown_user is not None:
            check_unknown_user(self.unknown_user)
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")
        check_score_threshold(self.score_threshold)

    @property
    def policy(self) -> UnknownUserPolicy:
        """:attr:`unknown_user`, or the rule it defaults to."""
        if self.unknown_user is not None:
            return self.unknown_user
        return "raise" if self.strict else "plain"

    def personalize_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`Personalizer.personalize` for this request."""
        return {
            "config": self.config,
            "generator": self.generator,
            "feedback": self.feedback,
            "strict": self.strict,
            "prompts": self.prompts,
            "unknown_user": self.policy,
            "query_vector": self.query_vector,
        }


@dataclass(frozen=True)
class Retrieval:
    """A request's personalized query and pbr's ranking of the user's items for it.

    ``query`` is None only when nothing was personalized: ``skip_unknown`` and a user without
    history, or a view that holds none of the user's items.
    """

    query: PersonalizedQuery | None
    results: list[ScoredRecord]
    mode: str

    def payload(self, **extra: Any) -> dict[str, Any]:
        """The request's JSON-ready explanation (:func:`~pbr_core.results.explanation_payload`)
        plus ``mode`` (how it was ranked) and the entry point's own ``extra`` keys."""
        assert self.query is not None, "nothing was personalized: no explanation"
        return {**explanation_payload(self.query.explanation), "mode": self.mode, **extra}


def check_query(query: object) -> str:
    """``query`` stripped, if it is a string with something in it: the one rule for queries,
    whatever the user holds (a blank query is refused for a user without history too)."""
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    return query.strip()


def check_unknown_user(value: object) -> UnknownUserPolicy:
    """``value`` if it is one of the :data:`UnknownUserPolicy` values."""
    if value not in ("raise", "plain"):
        raise ValueError(f"unknown_user must be 'raise' or 'plain', got {value!r}")
    return value


def check_score_threshold(value: object) -> float | None:
    """``value`` if it is None or a finite real number (not a bool): a score threshold."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise ValueError(
            f"score_threshold must be a finite number (a minimum of the results' score), got "
            f"{value!r}"
        )
    return float(value)


def _at_least(results: list[ScoredRecord], threshold: float | None) -> list[ScoredRecord]:
    """The ranked ``results`` down to the first scoring below ``threshold``: a cut of the list,
    never a hole in it (pbr's scores are non-increasing down the list, so this keeps exactly
    those at least the threshold; a caller's own search may return any order of scores)."""
    if threshold is None:
        return results
    kept = 0
    while kept < len(results) and results[kept].hit.score >= threshold:
        kept += 1
    return results[:kept]


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
    terms, own = _lexical_queries(pq, config)
    results = corpus.search(
        user_id,
        history,
        pq.vector,
        terms,
        k,
        mode=config.search,
        found=found,
        own_terms=own,
        context=config.lexical_context,
        stemmer=config.lexical_stemmer,
    )
    pq.explanation.timings_ms["search"] = (time.perf_counter() - start) * 1000.0
    return results


def _lexical_queries(
    pq: PersonalizedQuery, config: PBRConfig
) -> tuple[Mapping[str, float], Mapping[str, float]]:
    """The lexical leg's query (the user's words and the LLM's) and the user's own words."""
    terms = lexical_terms(pq.explanation, config.lexical_feedback_weight)
    return terms, lexical_query(pq.explanation.query)


# -- the steps of one request, once for both drivers -------------------------------------------
@dataclass(frozen=True)
class _ReadHistory:
    """The user's verified history (the host store is listed where it can be)."""


@dataclass(frozen=True)
class _Filter:
    """The user's records within the entry point's own view (``host_filter``)."""


@dataclass(frozen=True)
class _Personalize:
    """The request's personalized query (embedding and LLM calls); ``q``: the query's vector
    where the request has it already (a view tried first), so it is not embedded again;
    ``view``: personalize on it (:mod:`pbr_core.view`), giving None where it cannot serve;
    ``history``: the snapshot the request read, personalized on as it is ranked (None: the
    user has none; the personalizer reads again and applies the unknown-user rule)."""

    q: np.ndarray | None = None
    view: ScoredView | None = None
    history: UserHistory | None = None


@dataclass(frozen=True)
class _HostSearch:
    """The host store's ``n`` best candidates for ``vector`` within the request's view."""

    vector: np.ndarray
    n: int


@dataclass(frozen=True)
class _FinalSearch:
    """The caller's own final search for ``vector`` (it ranks; pbr does not)."""

    vector: np.ndarray
    k: int


@dataclass(frozen=True)
class _Rerank:
    """The ranked ``results`` re-ordered by the re-rank stage (LM calls)."""

    query: str
    results: list[ScoredRecord]


@dataclass(frozen=True)
class _EmbedQuery:
    """The query's unit vector (the request's ``query_vector``, or the embedder's)."""


@dataclass(frozen=True)
class _ReadView:
    """The user scored against ``q`` in the database (:meth:`Corpus.read_view`), or None;
    ``terms`` and ``k``: the request's words and number of results, whose likely results'
    texts are read with it."""

    q: np.ndarray
    anchor_key: Any
    terms: Mapping[str, float]
    k: int


@dataclass(frozen=True)
class _ShowItems:
    """The texts and metadata of the view's items at ``positions`` (the results), read from
    their rows in one statement: True, or False where a row is no longer the version the view
    ranked (the request then reads the user's rows)."""

    view: ScoredView
    positions: list[int]


_Effect = (
    _ReadHistory
    | _Filter
    | _Personalize
    | _HostSearch
    | _FinalSearch
    | _Rerank
    | _EmbedQuery
    | _ReadView
    | _ShowItems
)


def _show(effect: _ShowItems) -> bool:
    try:
        effect.view.items.many(effect.positions, read=True)
    except NotServed:
        return False
    return True


@dataclass(frozen=True)
class _Hosts:
    """Which of the optional host calls this request has."""

    search: bool
    filter: bool
    final: bool


def _steps(
    corpus: Corpus, request: Request, config: PBRConfig, hosts: _Hosts
) -> Generator[_Effect, Any, Retrieval]:
    user_id, k = request.user_id, request.k
    q: np.ndarray | None = None
    failed: Exception | None = None  # the embedder's error, raised once the user is known
    if _viewable(corpus, request, config, hosts):
        embedded: np.ndarray | Exception = yield _EmbedQuery()
        if isinstance(embedded, Exception):
            failed = embedded
        else:
            q = embedded
            served = yield from _view_steps(corpus, request, config, q)
            if served is not None:
                return served
    history: UserHistory | None = yield _ReadHistory()
    if failed is not None and history is not None:
        raise failed  # what personalizing would raise, without a second call of the embedder
    if history is None and request.skip_unknown:
        return Retrieval(None, [], config.search)
    within: Candidates | None = None
    if hosts.filter and history is not None:
        within = yield _Filter()
        if not within:  # nothing of the user's in the view: no LLM call for no result
            return Retrieval(None, [], config.search)
    # personalized on the snapshot it ranks: one read of the user for both
    pq: PersonalizedQuery = yield _Personalize(q, history=history)
    start = time.perf_counter()
    # the re-rank stage re-orders more candidates than it returns
    n = k if config.rerank == "none" else max(k, config.rerank_candidates)
    if hosts.final:
        hits: Sequence[SearchHit] = yield _FinalSearch(pq.vector, n)
        results = [ScoredRecord(hit=h, key=h.id, raw_score=h.score) for h in hits]
        pq.explanation.timings_ms["search"] = (time.perf_counter() - start) * 1000.0
    else:
        found = within
        if found is None and hosts.search and _needs_host(corpus, history, request.view_filtered):
            if request.view_filtered and config.search != "dense" and history:
                # the lexical leg finds what the store's best candidates for q* leave out; the
                # dense leg's best within the view are those candidates
                found = yield from _listed_view(pq.vector, len(history), host_candidates(n))
            else:
                found = yield _HostSearch(pq.vector, host_candidates(n))
        results = rank_personalized(corpus, user_id, history, pq, n, config, found, since=start)
    if config.rerank != "none" and results:
        # A fixed window, whatever k: the order of the first results does not depend on how
        # many are asked for, so pages (offset + limit) neither skip nor repeat an item.
        window = config.rerank_candidates
        start = time.perf_counter()
        reranked: list[ScoredRecord] = yield _Rerank(pq.explanation.query, results[:window])
        results = reranked + results[window:]  # the rest scores below the window: no cap
        pq.explanation.timings_ms["rerank"] = (time.perf_counter() - start) * 1000.0
    return Retrieval(pq, _at_least(results[:k], request.score_threshold), config.search)


#: The most records a filtered view's listing asks a store's search for (some refuse more:
#: Milvus takes at most 16,384): a larger view gets its best this many for ``q*``.
LISTING_MAX = 10_000


def _listed_view(
    vector: np.ndarray, items: int, candidates: int
) -> Generator[_Effect, Any, Candidates]:
    """The user's records within a filtered view that the entry point cannot list itself,
    through the host's own search for ``q*`` (``vector``), filtered as the request's is: as
    many as the user has ``items``, so that pbr ranks all of them, as it ranks a view an entry
    point lists (the store's best ``candidates`` for ``q*`` would leave out an item only the
    lexical leg finds), whatever filter syntax the store speaks.

    The search asks for one more record than the user has (never fewer than ``candidates``),
    and for twice as many while the store fills the request (it can hold records pbr does not
    keep: a node without text, a second record of one id), up to :data:`LISTING_MAX`, until it
    returns fewer, or no more than the time before. A store that caps what its search returns
    (LangChain's FAISS with a filter: its ``fetch_k`` nearest) still gives its best for ``q*``:
    never less than the candidates it would have given."""
    k, last = min(max(items + 1, candidates), LISTING_MAX), -1
    while True:
        found: Candidates = yield _HostSearch(vector, k)
        if len(found) < k or len(found) <= last or k >= LISTING_MAX:
            return found
        k, last = min(2 * k, LISTING_MAX), len(found)


def _viewable(corpus: Corpus, request: Request, config: PBRConfig, hosts: _Hosts) -> bool:
    """Whether the request may be ranked in the database (:mod:`pbr_core.view`), decided
    before anything is read: a user this worker has not read, over a host that scores, and a
    request that needs nothing but ``q``, the anchor and the BM25 index (no LLM term, no given
    feedback, no re-rank, no neighbour context, no view filter or caller's search, not agent
    memory's skip of a user without items)."""
    return (
        not (hosts.filter or hosts.final or request.view_filtered)
        and not request.skip_unknown  # agent memory: an empty memory costs no embedding
        and request.feedback is None
        and ranks_in_database(config)
        and corpus.may_view(request.user_id)
    )


def _view_steps(
    corpus: Corpus, request: Request, config: PBRConfig, q: np.ndarray
) -> Generator[_Effect, Any, Retrieval | None]:
    """The request ranked in the database for the query vector ``q``; None where the view
    cannot serve it (no state at the rows' change token, a row that is not the item the state
    says, a ``q*`` outside its span): the request then runs on the user's rows, as for any
    other store."""
    anchor_key = config.anchor_key if MODE_TERMS[config.fusion][0] else None
    # the personalizer normalises the vector it is given once more (float32: not always to the
    # same bits); scored and read ahead for that very vector, its related items are the ones
    # the view read
    view: ScoredView | None = yield _ReadView(
        as_unit_vector(q), anchor_key, lexical_query(request.query), request.k
    )
    if view is None:
        return None
    pq: PersonalizedQuery | None = yield _Personalize(q, view)
    if pq is None:
        return None
    start = time.perf_counter()
    terms, own = _lexical_queries(pq, config)
    try:
        ranked = rank(
            view,  # type: ignore[arg-type]
            pq.vector,
            terms,
            request.k,
            mode=config.search,
            own_terms=own,
            stemmer=config.lexical_stemmer,
        )
    except NotServed:
        return None
    # the results' texts: a read of the host, so a step of its own (off the event loop)
    shown: bool = yield _ShowItems(view, [r.position for r in ranked])
    if not shown:
        return None
    results = corpus.view_results(view, ranked)
    pq.explanation.timings_ms["search"] = (time.perf_counter() - start) * 1000.0
    return Retrieval(pq, _at_least(results, request.score_threshold), config.search)


def _needs_host(corpus: Corpus, history: UserHistory | None, view_filtered: bool) -> bool:
    # Nothing of the user's to search, or pbr ranks every item itself: no host search.
    return history is not None and not corpus.ranks_all(view_filtered)


def retrieve(
    corpus: Corpus,
    request: Request,
    personalize: Personalize,
    *,
    host_search: HostSearch | None = None,
    host_filter: HostFilter | None = None,
    final_search: FinalSearch | None = None,
    host_errors: HostErrors = contextlib.nullcontext,
) -> Retrieval:
    """Run ``request`` over ``corpus`` with blocking calls.

    Args:
        corpus: the owner of every user's items (the one the personalizer reads).
        request: the query and its parameters.
        personalize: ``Personalizer.personalize`` (or an entry point's wrapper of it, e.g. a
            tracing span), called with ``(user_id, query, **request.personalize_kwargs())``
            plus, where the request has them, ``query_vector`` (the query embedded already) and
            ``history`` (the snapshot or database view it ranks, personalized on the same): a
            wrapper takes ``**kwargs`` and passes them on.
        host_search: the host store's search within the request's view; None = no host store
            (pbr's own history is the record).
        host_filter: the user's records within a view the entry point lists itself; ranking is
            then restricted to them, and an empty view returns no result without an LLM call.
        final_search: a caller's own final search that ranks instead of pbr.
        host_errors: wraps every host store call (never the LLM's).
    """
    config = request.config
    steps = _steps(corpus, request, config, _hosts(host_search, host_filter, final_search))

    viewed = False

    def perform(effect: _Effect) -> Any:
        nonlocal viewed
        if isinstance(effect, _Personalize):
            kwargs = _kwargs(request, effect)
            if effect.view is None:
                return personalize(request.user_id, request.query, **kwargs)
            try:
                return personalize(request.user_id, request.query, **kwargs)
            except NotServed:
                return None
        if isinstance(effect, _Rerank):
            return rerank_by_salience(effect.query, effect.results, request.salience_scorer)
        if isinstance(effect, _EmbedQuery):
            try:
                return corpus.query_vector(request.query, request.query_vector)
            except Exception as exc:  # raised by the steps once the user is known to exist
                return exc
        with host_errors():
            if isinstance(effect, _ReadView):
                view = corpus.read_view(
                    request.user_id, effect.q, config, effect.anchor_key, effect.terms, effect.k
                )
                viewed = view is not None
                return view
            if isinstance(effect, _ShowItems):
                return _show(effect)
            if isinstance(effect, _ReadHistory):
                return corpus.history(request.user_id)
            if isinstance(effect, _Filter):
                assert host_filter is not None
                return host_filter()
            if isinstance(effect, _HostSearch):
                assert host_search is not None
                return host_search(effect.vector, effect.n)
            assert final_search is not None
            return final_search(effect.vector, effect.k)

    with corpus.in_use(request.user_id):  # not evicted between the request's reads
        effect = next(steps)
        while True:
            result = perform(effect)
            try:
                effect = steps.send(result)
            except StopIteration as done:
                retrieval: Retrieval = done.value
                break
    corpus.share_state(request.user_id)  # what a cold read derived, for other workers
    if viewed and corpus.may_view(request.user_id):
        corpus.read_later(request.user_id)  # the user's next request is served warm
    return retrieval


async def aretrieve(
    corpus: Corpus,
    request: Request,
    personalize: AsyncPersonalize,
    *,
    host_search: AsyncHostSearch | None = None,
    host_filter: Callable[[], Awaitable[Candidates]] | None = None,
    final_search: AsyncFinalSearch | None = None,
    host_errors: HostErrors = contextlib.nullcontext,
) -> Retrieval:
    """Async :func:`retrieve`: the same steps with awaited calls (a host listing runs in a
    worker thread; pbr's ranking is in-process and runs inline)."""
    config = request.config
    steps = _steps(corpus, request, config, _hosts(host_search, host_filter, final_search))

    viewed = False

    async def perform(effect: _Effect) -> Any:
        nonlocal viewed
        if isinstance(effect, _Personalize):
            kwargs = _kwargs(request, effect)
            if effect.view is None:
                return await personalize(request.user_id, request.query, **kwargs)
            try:
                return await personalize(request.user_id, request.query, **kwargs)
            except NotServed:
                return None
        if isinstance(effect, _Rerank):  # a CPU-bound LM pass: off the event loop
            return await asyncio.to_thread(
                rerank_by_salience, effect.query, effect.results, request.salience_scorer
            )
        if isinstance(effect, _EmbedQuery):
            try:
                return await corpus.aquery_vector(request.query, request.query_vector)
            except Exception as exc:  # raised by the steps once the user is known to exist
                return exc
        with host_errors():
            if isinstance(effect, _ReadView):
                view = await asyncio.to_thread(
                    corpus.read_view,
                    request.user_id,
                    effect.q,
                    config,
                    effect.anchor_key,
                    effect.terms,
                    effect.k,
                )
                viewed = view is not None
                return view
            if isinstance(effect, _ShowItems):
                return await asyncio.to_thread(_show, effect)
            if isinstance(effect, _ReadHistory):
                history = await corpus.ahistory(request.user_id)
                ranks = final_search is None  # else the caller's search ranks: no BM25 index
                if history is not None:
                    anchor, lexical = to_derive(history, config, ranks)
                    if anchor or lexical:  # a cold user's: CPU work (1.5 s at 10k items)
                        await asyncio.to_thread(derive, history, config, anchor, lexical)
                return history
            if isinstance(effect, _Filter):
                assert host_filter is not None
                return await host_filter()
            if isinstance(effect, _HostSearch):
                assert host_search is not None
                return await host_search(effect.vector, effect.n)
            assert final_search is not None
            return await final_search(effect.vector, effect.k)

    with corpus.in_use(request.user_id):  # not evicted between the request's reads
        effect = next(steps)
        while True:
            result = await perform(effect)
            try:
                effect = steps.send(result)
            except StopIteration as done:
                retrieval: Retrieval = done.value
                break
    if corpus.has_unshared(request.user_id):  # a write: off the event loop
        await asyncio.to_thread(corpus.share_state, request.user_id)
    if viewed and corpus.may_view(request.user_id):
        corpus.read_later(request.user_id)  # the user's next request is served warm
    return retrieval


def _kwargs(request: Request, effect: _Personalize) -> dict[str, Any]:
    """The personalizer's keyword arguments for ``request``, with the query vector where the
    request has embedded the query already, and the view or snapshot it personalizes on."""
    kwargs = request.personalize_kwargs()
    if effect.q is not None:
        kwargs["query_vector"] = effect.q
    if effect.view is not None:
        kwargs["history"] = effect.view
    elif effect.history is not None:
        kwargs["history"] = effect.history
    return kwargs


def _hosts(search: object, filter_: object, final: object) -> _Hosts:
    return _Hosts(search=search is not None, filter=filter_ is not None, final=final is not None)
