"""The PBR pipeline: (user, query) → personalized query vector + explanation (spec §2).

:class:`Personalizer` owns a :class:`~pbr_core.history.HistoryStore` and talks to an embedder, a
text generator and optionally a host vector search through the protocols of
:mod:`pbr_core.protocols`. The two LLM calls of P-PRF run concurrently: one batched call when
the generator offers ``generate_batch`` (local models), threads for the sync API, and
``asyncio.gather`` for the async one.

Every LLM call goes through the personalizer's :class:`~pbr_core.executor.LLMExecutor`: at most
``PBRConfig.max_concurrent_llm_calls`` in flight, each given up after ``PBRConfig.llm_timeout_s``.
A failed, timed-out or unusable answer drops its term with the reason (``Explanation.dropped``)
and logs a warning on the ``"pbr.pipeline"`` logger (the user id hashed, the query left out);
``strict`` raises :class:`~pbr_core.errors.GenerationError` instead. Only answers that parsed
into something usable are written to the generation cache.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np

from .cache import GenerationCache
from .config import PBRConfig, as_config
from .corpus import Corpus, user_tag
from .errors import EmbeddingError, GenerationError, LLMTimeoutError, UnknownUserError
from .executor import LLMExecutor
from .fusion import MODE_TERMS, TERMS, FusionInputs, FusionResult, FusionRule, default_rule
from .generation import Answer, agenerate, executor_for, generate, timeout_for
from .history import HistoryStore
from .items import HistoryItem, copy_metadata
from .prf import (
    Parsed,
    PromptSet,
    PromptStyle,
    build_prompts,
    parse_reasoning,
    parse_utterances,
    prompts_for_style,
    resolve_prompt_style,
)
from .protocols import (
    Embedder,
    SearchHit,
    TextGenerator,
    VectorSearch,
    declared_model_id,
    model_id_of,
)
from .results import Explanation, PersonalizedQuery, PseudoFeedback, SearchResult
from .retrieval import (
    FinalSearch,
    Request,
    UnknownUserPolicy,
    aretrieve,
    check_query,
    check_unknown_user,
    retrieve,
)
from .snapshot import UserHistory, items_at
from .vectors import (
    aembed_documents,
    embed_documents,
)
from .view import NotServed, ScoredView

_log = logging.getLogger("pbr.pipeline")
#: How a reason the pre-generation gate dropped a term starts (``Explanation.dropped``).
PRE_GATE_REASON = "pre-generation gate"


class _Stopwatch:
    def __init__(self, timings: dict[str, float]) -> None:
        self.timings = timings
        self._t = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + (now - self._t) * 1000.0
        self._t = now


@dataclass
class _Request:
    """Per-request state: it lives on the stack, never on the shared Personalizer."""

    user_id: str
    query: str
    config: PBRConfig
    history: UserHistory
    explanation: Explanation
    watch: _Stopwatch
    started: float = field(default_factory=time.perf_counter)
    q: np.ndarray | None = None
    anchor: np.ndarray | None = None
    needs_llm: bool = False
    pre_gated: bool = False  # the pre-generation gate fired: no LLM, q* = q
    prompts: PromptSet | None = None
    generator: TextGenerator | None = None  # the LLM of this request, once it is called
    sent: tuple[str, str] | None = None  # the (utterance, reasoning) prompts sent to it
    style: PromptStyle = "chat"
    fresh: tuple[int, ...] = ()  # which answers came from the LLM now (not from the cache)


@dataclass(frozen=True)
class _ReadHistory:
    """Ask the driver for the user's current snapshot, checked against the host store where it
    lists (:meth:`Corpus.history`; None: no history): what a cached user has deleted through
    the store itself never reaches a prompt."""

    user_id: str


@dataclass(frozen=True)
class _EmbedQuery:
    """Ask the driver for the query's unit vector (``given``: the caller's own embedding)."""

    text: str
    given: Sequence[float] | np.ndarray | None


@dataclass(frozen=True)
class _Generate:
    """Ask the driver for the request's two P-PRF answers (a failure comes back, not raised)."""

    req: _Request


@dataclass(frozen=True)
class _EmbedFeedback:
    """Ask the driver for the pseudo-feedback texts' unit vectors."""

    texts: list[str]
    dim: int


_Effect = _ReadHistory | _EmbedQuery | _Generate | _EmbedFeedback


class _Options(NamedTuple):
    """:meth:`Personalizer.personalize`'s per-call arguments, as given."""

    config: PBRConfig | None
    generator: TextGenerator | None
    feedback: PseudoFeedback | None
    strict: bool | None
    prompts: PromptSet | None
    unknown_user: UnknownUserPolicy
    query_vector: Sequence[float] | np.ndarray | None
    history: UserHistory | ScoredView | None = None


class Personalizer:
    """Personalize Before Retrieve for many users.

    Args:
        embedder: any :class:`~pbr_core.protocols.Embedder` (a LangChain ``Embeddings`` works
            as is). Default: the embedded all-MiniLM-L6-v2, loaded on first use.
        generator: any :class:`~pbr_core.protocols.TextGenerator`. Default: the embedded Gemma 3
            270M, loaded on first use, and only if a fusion mode needs the LLM.
        config: the method's parameters.
        store: an existing history store (e.g. loaded from disk); pbr's own store is then the
            record of every user's items.
        corpus: the :class:`~pbr_core.corpus.Corpus` the caller owns (an adapter's, over its
            host store): this personalizer reads, writes and embeds through it, so there is one
            write path per store. Its cache is :attr:`store` and its embedder the one items and
            queries are embedded by; pass neither ``store`` nor another ``embedder`` with it.
        prompts: the P-PRF prompt templates; by default chosen from the generator's
            ``prompt_style`` (``"chat"`` → JSON prompts, ``"completion"`` → list prompts).
        cache: a :class:`GenerationCache` or a path to its JSONL file; no cache when None.
        vector_search: the final search; default is the store's own per-user faiss index.
        strict: raise :class:`GenerationError` when the LLM fails or its answer is unusable,
            instead of dropping the term.
        llm_executor: the :class:`~pbr_core.executor.LLMExecutor` the LLM calls go through
            (threads for sync calls, a limit on calls in flight). Default: one shared by every
            personalizer over the same ``store`` (the adapters' per-request personalizers),
            sized by ``config.max_concurrent_llm_calls`` when first made; a personalizer with
            its own store (or its own executor) is never slowed by another one's stuck LLM.
        fusion_rule: how ``q*`` is made from the query, anchor and P-PRF vectors
            (:data:`pbr_core.fusion.FusionRule`); default :func:`pbr_core.fusion.default_rule`,
            the spec's fusion in ``config.fusion`` mode. The place to try another rule without
            touching the rest of the pipeline.
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        generator: TextGenerator | None = None,
        *,
        config: PBRConfig | None = None,
        store: HistoryStore | None = None,
        corpus: Corpus | None = None,
        prompts: PromptSet | None = None,
        cache: GenerationCache | str | os.PathLike[str] | None = None,
        vector_search: VectorSearch | None = None,
        strict: bool = False,
        llm_executor: LLMExecutor | None = None,
        fusion_rule: FusionRule = default_rule,
    ) -> None:
        self._generator = generator
        self.fusion_rule = fusion_rule
        self.config = as_config(config)  # a dict of its fields too, checked
        if corpus is None:
            # pbr's own store as the record; the corpus holds the embedder too, so items and
            # queries are embedded by the same model.
            store = store if store is not None else HistoryStore()  # an empty store is falsy
            corpus = Corpus(None, embedder=embedder, cache=store)
        elif store is not None and store is not corpus.cache:
            raise ValueError("pass store= or corpus= (whose cache is the store), not both")
        elif embedder is not None and embedder is not corpus.embedder:
            raise ValueError("pass embedder= or corpus= (which embeds with its own), not both")
        #: The one read and write path for items (validation, ownership, the host store).
        self.corpus = corpus
        self.store = corpus.cache
        self.prompts = prompts
        self.cache = GenerationCache(cache) if isinstance(cache, str | os.PathLike) else cache
        self.vector_search = vector_search
        self.strict = strict
        self._llm_executor = llm_executor

    # -- collaborators -------------------------------------------------------------------------
    @property
    def embedder(self) -> Embedder:
        """The corpus's embedder (the embedded MiniLM, loaded on first use, when none given)."""
        return self.corpus.resolved_embedder()

    @property
    def generator(self) -> TextGenerator:
        if self._generator is None:
            from .models import default_generator

            self._generator = default_generator()
        return self._generator

    @property
    def llm_executor(self) -> LLMExecutor:
        """Where this personalizer's LLM calls run (see the ``llm_executor`` argument)."""
        if self._llm_executor is None:
            self._llm_executor = executor_for(self.store, self.config.max_concurrent_llm_calls)
        return self._llm_executor

    def prompts_for(self, generator: TextGenerator) -> PromptSet:
        """The prompt set used with ``generator``: the explicit one, else by its prompt style."""
        if self.prompts is not None:
            return self.prompts
        return prompts_for_style(resolve_prompt_style(getattr(generator, "prompt_style", None)))

    # -- history: the corpus's, here for convenience -----------------------------------------
    def add_texts(self, user_id: str, texts: Sequence[str], **kwargs: Any) -> list[str]:
        """:meth:`Corpus.add_texts` (``ids``, ``metadatas``, ``timestamps``): embed and store."""
        return self.corpus.add_texts(user_id, texts, **kwargs)

    async def aadd_texts(self, user_id: str, texts: Sequence[str], **kwargs: Any) -> list[str]:
        """Async :meth:`add_texts`."""
        return await self.corpus.aadd_texts(user_id, texts, **kwargs)

    def add_items(
        self, user_id: str, items: Sequence[HistoryItem], *, vectors: Any = None
    ) -> list[str]:
        """:meth:`Corpus.add`: store items, embedding only those whose (id, text) is new;
        ``vectors`` are the items' embeddings where the caller has them (checked, normalised)."""
        return self.corpus.add(user_id, list(items), vectors=vectors)

    async def aadd_items(self, user_id: str, items: Sequence[HistoryItem]) -> list[str]:
        """Async :meth:`add_items`."""
        return (await self.corpus.aadd_many({user_id: list(items)})).get(user_id, [])

    def delete(self, user_id: str, ids: Sequence[str]) -> None:
        """Remove items (``KeyError`` for an id the user lacks; nothing removed)."""
        self.corpus.delete(user_id, ids)

    def save(self, path: str | os.PathLike[str]) -> None:
        """:meth:`HistoryStore.save` of :attr:`store`."""
        self.store.save(path)

    @classmethod
    def load(
        cls,
        path: str,
        embedder: Embedder | None = None,
        *,
        lazy: bool = False,
        max_cache_bytes: int | None = None,
        **kwargs: Any,
    ) -> Personalizer:
        """A personalizer over a saved store (:meth:`Corpus.load`: refuses an embedder of
        another model; ``lazy=True`` reads each user's files on first use, and then
        ``max_cache_bytes`` bounds the users held in memory). A save holds the items and their
        vectors only: pass ``config=`` (and ``cache=``, ``generator=``) again in ``kwargs``, or
        the defaults apply."""
        corpus = Corpus.load(path, embedder, lazy=lazy, max_cache_bytes=max_cache_bytes)
        return cls(corpus=corpus, **kwargs)

    def _history(self, user_id: str) -> UserHistory:
        """The user's current snapshot (:meth:`Corpus.history`: checked against the host store
        where it lists, so an item deleted through the store is gone; one the cache evicted
        under its budget read back)."""
        history = self.corpus.history(user_id)
        if history is None:
            raise UnknownUserError(user_id)
        return history

    def _config(self, given: PBRConfig | Mapping[str, Any] | None) -> PBRConfig:
        """A call's config: the personalizer's, or the one given (a dict of its fields too)."""
        return self.config if given is None else as_config(given)

    # -- the method ----------------------------------------------------------------------------
    def anchor_items(self, user_id: str, config: PBRConfig | None = None) -> list[SearchHit]:
        """The user's most central history items by PageRank (the P-Anchor), most central first."""
        cfg = self._config(config)
        history = self._history(user_id)
        result = history.anchor(cfg)
        if result is None:
            return []
        return _hits(history, result.top_items(cfg.top_anchor_items))

    def personalize(
        self,
        user_id: str,
        query: str,
        *,
        config: PBRConfig | None = None,
        generator: TextGenerator | None = None,
        feedback: PseudoFeedback | None = None,
        strict: bool | None = None,
        prompts: PromptSet | None = None,
        unknown_user: UnknownUserPolicy = "raise",
        query_vector: Sequence[float] | np.ndarray | None = None,
        history: UserHistory | ScoredView | None = None,
    ) -> PersonalizedQuery:
        """The personalized query vector for ``user_id`` and ``query``.

        Args:
            config: per-call parameters (default: the personalizer's).
            generator: per-call generator, e.g. one that carries this request's callbacks.
            feedback: ready-made pseudo utterances / reasoning; no LLM call is made.
            strict: per-call override of :attr:`strict`.
            prompts: per-call prompt templates (default: :meth:`prompts_for` the generator).
            unknown_user: ``"raise"`` :class:`UnknownUserError` for a user with no history, or
                ``"plain"``: return ``q* = q`` with the reason in ``explanation.dropped``
                (what a retriever wants for a brand-new user).
            query_vector: the query's embedding when the caller already has it (e.g. LlamaIndex's
                ``QueryBundle.embedding``), by the same model as the history; checked (finite,
                the history's dimension) and normalised, and the query is not embedded again.
            history: the user's snapshot the request already read (``pbr_core.retrieval``:
                one snapshot for personalizing and ranking); default: the current one.
        """
        opts = _Options(
            config, generator, feedback, strict, prompts, unknown_user, query_vector, history
        )
        return self._drive(self._steps(user_id, query, opts))

    async def apersonalize(
        self,
        user_id: str,
        query: str,
        *,
        config: PBRConfig | None = None,
        generator: TextGenerator | None = None,
        feedback: PseudoFeedback | None = None,
        strict: bool | None = None,
        prompts: PromptSet | None = None,
        unknown_user: UnknownUserPolicy = "raise",
        query_vector: Sequence[float] | np.ndarray | None = None,
        history: UserHistory | ScoredView | None = None,
    ) -> PersonalizedQuery:
        """Async :meth:`personalize`: native async embedder/LLM calls when they exist.

        A generator's native ``agenerate`` is awaited on the event loop and cancelled after
        ``config.llm_timeout_s``; a sync-only generator (and a local model with
        ``generate_batch``) runs in the :attr:`llm_executor`'s own threads, never in asyncio's
        default executor. Cancelling the awaiting task frees it at once.
        """
        opts = _Options(
            config, generator, feedback, strict, prompts, unknown_user, query_vector, history
        )
        return await self._adrive(self._steps(user_id, query, opts))

    # -- the steps of one request, once for both entry points ----------------------------------
    def _steps(
        self, user_id: str, query: str, opts: _Options
    ) -> Generator[_Effect, Any, PersonalizedQuery]:
        """The spec's §2 for one request, in order: embed the query, related history (§2.1) and
        anchor (§2.3), the pre-generation gate, the two P-PRF answers, parsed and embedded
        (§2.2), fuse (§2.4, §2.5). It yields what needs I/O (an :class:`_Effect`) and gets the
        result back, so :meth:`personalize` and :meth:`apersonalize` are drivers over one
        implementation."""
        check_unknown_user(opts.unknown_user)
        if opts.history is not None:
            if opts.history.user_id != user_id:
                raise ValueError(
                    f"history is user {opts.history.user_id!r}'s, not {user_id!r}'s: pass the "
                    "requesting user's own snapshot, or none"
                )
            if not isinstance(opts.history, UserHistory) and self.fusion_rule is not default_rule:
                # a rule of the caller's may read what only a snapshot in memory has
                raise NotServed("a custom fusion rule is given the user's history in memory")
        history = opts.history
        if history is None:
            history = yield _ReadHistory(user_id)
        try:
            req = self._start(user_id, query, opts.config, opts.prompts, history)
        except UnknownUserError as exc:
            if opts.unknown_user == "raise":
                raise
            q = yield _EmbedQuery(query, opts.query_vector)
            return _unpersonalized(user_id, query, q, self._config(opts.config), str(exc))
        req.q = yield _EmbedQuery(req.query, opts.query_vector)
        req.watch.lap("embed_query")
        _related_and_anchor(req)
        texts: tuple[str | BaseException | None, str | BaseException | None]
        feedback = opts.feedback
        if feedback is not None:
            texts = _feedback_texts(feedback)
        elif req.needs_llm:
            self._bind_llm(req, opts.generator or self.generator)
            texts = yield _Generate(req)
        else:
            texts = (None, None)
        if not req.pre_gated:
            req.watch.lap("llm")
        parsed = self._parse(req, texts, feedback, opts.strict)
        feedback_texts = [*parsed[0].items, *parsed[1].items]
        vecs = yield _EmbedFeedback(feedback_texts, req.q.shape[0])
        req.watch.lap("embed_feedback")
        return _finish(req, parsed, vecs, self.fusion_rule)

    def _drive(self, steps: Generator[_Effect, Any, PersonalizedQuery]) -> PersonalizedQuery:
        """Run :meth:`_steps` with blocking calls."""
        try:
            effect = next(steps)
            while True:
                effect = steps.send(self._blocking(effect))
        except StopIteration as done:
            return done.value

    def _blocking(self, effect: _Effect) -> Any:
        """What one step asks for, by a blocking call (:meth:`_drive`, :meth:`feedback_prompts`)."""
        if isinstance(effect, _ReadHistory):
            return self.corpus.history(effect.user_id)
        if isinstance(effect, _EmbedQuery):
            return self.corpus.query_vector(effect.text, effect.given)
        if isinstance(effect, _Generate):
            return self._generate(effect.req)
        return embed_documents(self.embedder, effect.texts, dim=effect.dim)

    async def _adrive(self, steps: Generator[_Effect, Any, PersonalizedQuery]) -> PersonalizedQuery:
        """Run :meth:`_steps` with awaited calls (native async embedder / LLM where they exist)."""
        try:
            effect = next(steps)
            while True:
                if isinstance(effect, _ReadHistory):
                    result: Any = await self.corpus.ahistory(effect.user_id)
                elif isinstance(effect, _EmbedQuery):
                    result = await self.corpus.aquery_vector(effect.text, effect.given)
                elif isinstance(effect, _Generate):
                    result = await self._agenerate(effect.req)
                else:
                    result = await aembed_documents(self.embedder, effect.texts, dim=effect.dim)
                effect = steps.send(result)
        except StopIteration as done:
            return done.value

    def feedback_prompts(
        self,
        user_id: str,
        query: str,
        *,
        config: PBRConfig | None = None,
        generator: TextGenerator | None = None,
        prompts: PromptSet | None = None,
    ) -> tuple[str, str] | None:
        """The (utterance, reasoning) prompts :meth:`personalize` would send, or ``None`` when it
        would make no LLM call (a mode without P-PRF, an empty related history).

        Why: offline jobs (benchmarks, nightly re-indexing) can generate many queries' feedback in
        large batches and fill the generation cache; ``personalize`` then only reads the cache.
        """
        steps = self._steps(
            user_id, query, _Options(config, generator, None, None, prompts, "raise", None)
        )
        try:  # the request's own steps, up to the LLM call
            effect = next(steps)
            while isinstance(effect, _ReadHistory | _EmbedQuery):
                effect = steps.send(self._blocking(effect))
            return effect.req.sent if isinstance(effect, _Generate) else None
        finally:
            steps.close()

    def search(self, user_id: str, query: str, k: int = 5, **kwargs: Any) -> SearchResult:
        """Personalize, then search the user's corpus with ``q*`` (keyword args as
        :meth:`personalize`, but ``history``: a search reads the user's corpus itself): the one
        request of :mod:`pbr_core.retrieval`."""
        request = self._request(user_id, query, k, kwargs)
        final = self._final_search(user_id)
        got = retrieve(self.corpus, request, self.personalize, final_search=final)
        assert got.query is not None  # a request that does not skip is always personalized
        return SearchResult([r.hit for r in got.results], got.query)

    async def asearch(self, user_id: str, query: str, k: int = 5, **kwargs: Any) -> SearchResult:
        """Async :meth:`search` (a given ``vector_search`` runs in a worker thread)."""
        request = self._request(user_id, query, k, kwargs)
        final = self._final_search(user_id)
        afinal = None
        if final is not None:
            search = final  # a host call: off the event loop, as a store's search would be

            async def afinal(vector: np.ndarray, n: int) -> Sequence[SearchHit]:
                return await asyncio.to_thread(search, vector, n)

        got = await aretrieve(self.corpus, request, self.apersonalize, final_search=afinal)
        assert got.query is not None
        return SearchResult([r.hit for r in got.results], got.query)

    def _final_search(self, user_id: str) -> FinalSearch | None:
        """The given :class:`VectorSearch` as the request's final search (None: pbr ranks)."""
        search = self.vector_search
        if search is None:
            return None
        return lambda vector, k: search.search(user_id, vector.tolist(), k)

    def _request(self, user_id: str, query: str, k: int, kwargs: dict[str, Any]) -> Request:
        """:meth:`search`'s arguments as the core's request (a user without history raises
        :class:`UnknownUserError` unless ``unknown_user="plain"``)."""
        unknown = kwargs.pop("unknown_user", "raise")
        config = self._config(kwargs.pop("config", None))
        if "history" in kwargs:  # a search reads the user's corpus itself (the one request)
            raise TypeError(
                "search() takes no history=: it reads the user's current history from the "
                "corpus; personalize(user_id, query, history=...) takes a snapshot of yours"
            )
        return Request(user_id, query, k, config=config, unknown_user=unknown, **kwargs)

    # -- steps ---------------------------------------------------------------------------------
    def _start(
        self,
        user_id: str,
        query: str,
        config: PBRConfig | None,
        prompts: PromptSet | None,
        history: UserHistory | ScoredView | None,
    ) -> _Request:
        """The request's state over ``history``, the snapshot it read (None: the user has none,
        :class:`UnknownUserError`)."""
        query = check_query(query)
        cfg = self._config(config)
        # A view ranks in the database (pbr_core.view) and answers what a request reads of a
        # snapshot: it stands in for one here.
        if history is None:
            raise UnknownUserError(user_id)
        snapshot = cast(UserHistory, history)
        explanation = Explanation(user_id=user_id, query=query, fusion=cfg.fusion)
        return _Request(
            user_id=user_id,
            query=query,
            config=cfg,
            history=snapshot,
            explanation=explanation,
            watch=_Stopwatch(explanation.timings_ms),
            prompts=prompts,
        )

    def _prompt_pair(self, req: _Request, generator: TextGenerator) -> tuple[str, str]:
        prompts = req.prompts or self.prompts_for(generator)
        cfg = req.config
        history_texts = [h.text for h in req.explanation.related]
        return build_prompts(
            prompts,
            req.query,
            history_texts,
            m=cfg.num_utterances,
            max_chars=cfg.max_item_chars,
            max_query_chars=cfg.max_query_chars,
        )

    def _bind_llm(self, req: _Request, generator: TextGenerator) -> None:
        req.generator = generator
        req.sent = self._prompt_pair(req, generator)
        req.style = (req.prompts or self.prompts_for(generator)).style

    # -- LLM calls -----------------------------------------------------------------------------
    def _generate(self, req: _Request) -> tuple[Answer, Answer]:
        """Both P-PRF answers (the cache's, else the LLM's within the timeout); a failure is
        returned, not raised."""
        assert req.generator is not None and req.sent is not None
        outs, todo = _from_cache(self.cache, req)
        timeout = timeout_for(req.generator, req.config)
        outs.update(generate(req.generator, req.sent, todo, self.llm_executor, timeout))
        _keep(self.cache, req, outs)
        return outs[0], outs[1]

    async def _agenerate(self, req: _Request) -> tuple[Answer, Answer]:
        assert req.generator is not None and req.sent is not None
        outs, todo = _from_cache(self.cache, req)
        timeout = timeout_for(req.generator, req.config)
        outs.update(await agenerate(req.generator, req.sent, todo, self.llm_executor, timeout))
        if _to_keep(self.cache, req, outs):  # file I/O: off the event loop
            await asyncio.to_thread(_keep, self.cache, req, outs)
        return outs[0], outs[1]

    # -- parsing and fusion --------------------------------------------------------------------
    def _parse(
        self,
        req: _Request,
        texts: tuple[str | BaseException | None, str | BaseException | None],
        feedback: PseudoFeedback | None,
        strict: bool | None,
    ) -> tuple[Parsed, Parsed]:
        cfg, expl = req.config, req.explanation
        _, want_f, want_r = MODE_TERMS[cfg.fusion]
        strict = self.strict if strict is None else strict
        terms = (("utterances", want_f, texts[0]), ("reasoning", want_r, texts[1]))
        results: list[Parsed] = []
        failures: dict[str, tuple[str, BaseException | None]] = {}
        for index, (term, wanted, text) in enumerate(terms):
            if not wanted:
                if term not in expl.dropped:
                    expl.dropped[term] = f"switched off by fusion mode {cfg.fusion!r}"
                results.append(Parsed(()))
            elif term in expl.dropped:
                results.append(Parsed(()))
            elif isinstance(text, BaseException):
                failures[term] = (_failure(text), text)
                results.append(Parsed(()))
            elif feedback is not None:  # given texts are used as they are, not parsed
                got = _given(feedback, term, cfg.num_utterances)
                if not got.items:
                    failures[term] = (got.problem or f"no {term} were given", None)
                results.append(got)
            else:
                got = _parse_answer(req, index, text)
                if not got.items:
                    failures[term] = (got.problem or "nothing usable in the LLM answer", None)
                results.append(got)
        if failures and strict:
            term, (reason, cause) = next(iter(failures.items()))
            if isinstance(cause, LLMTimeoutError):
                raise LLMTimeoutError(f"{term}: {reason}", cause.timeout_s) from cause
            raise GenerationError(f"{term}: {reason}") from cause
        for term, (reason, _) in failures.items():
            expl.dropped[term] = reason
        if failures and feedback is None:
            _warn_degraded(req, {term: reason for term, (reason, _) in failures.items()})
        expl.pseudo_utterances = list(results[0].items)
        expl.reasoning = results[1].items[0] if results[1].items else None
        req.watch.lap("parse")
        return results[0], results[1]


class HistoryVectorSearch:
    """:class:`~pbr_core.protocols.VectorSearch` over a :class:`HistoryStore` (per-user faiss)."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store

    def search(self, user_id: str, vector: Sequence[float], k: int) -> list[SearchHit]:
        """The user's ``k`` nearest items; none for a user the store does not hold (what
        ``unknown_user="plain"`` promises: the plain query, no results)."""
        history = self.store.get(user_id) if user_id in self.store else None
        if history is None:
            return []
        return _hits(history, history.search(np.asarray(vector), k))


# -- the steps that need no personalizer -----------------------------------------------------
def _related_and_anchor(req: _Request) -> None:
    cfg, history, expl = req.config, req.history, req.explanation
    assert req.q is not None
    want_anchor, want_f, want_r = MODE_TERMS[cfg.fusion]
    related = _hits(history, history.search(req.q, cfg.k1))
    expl.related = related
    req.watch.lap("related_history")
    # It predicts the history gate, so it is only on where that gate is.
    gate = cfg.pre_gate if cfg.fusion == "safe" and cfg.safe_history_gate else None
    if gate is not None and related and related[0].score >= gate:
        # Decided before any LLM call: the query is already clear for this user, so the
        # history gate would almost surely keep the plain query after paying for both
        # calls. Given feedback is ignored alike, so the result never depends on its source.
        why = (
            f"{PRE_GATE_REASON}: safe fusion kept the plain query without calling the LLM: "
            f"the user's closest history item (cosine {related[0].score:.2f}) is at or above "
            f"pre_gate {gate:.2f}"
        )
        req.pre_gated = True
        for term in TERMS:
            expl.dropped[term] = why
            expl.skipped[term] = why
    if want_anchor:
        if len(history) < 2:
            expl.dropped["anchor"] = f"the history has {len(history)} item(s); an anchor needs 2"
        else:
            result = history.anchor(cfg)
            assert result is not None
            req.anchor = result.vector
            expl.anchor_items = _hits(history, result.top_items(cfg.top_anchor_items))
    req.watch.lap("anchor")
    if (want_f or want_r) and not req.pre_gated:
        if not related:
            for term, wanted in (("utterances", want_f), ("reasoning", want_r)):
                if wanted:
                    expl.dropped[term] = "the user has no history to imitate"
        else:
            req.needs_llm = True


def _from_cache(
    cache: GenerationCache | None, req: _Request
) -> tuple[dict[int, Answer], list[int]]:
    """The cached answers that still parse, and which prompts the LLM must answer now.

    A cached answer that does not parse (written by an older version, or by hand) is ignored
    and generated again, never raised."""
    outs: dict[int, Answer] = {0: None, 1: None}
    # only the terms the fusion mode uses: a term switched off is neither asked nor waited for
    wanted = [i for i, want in enumerate(MODE_TERMS[req.config.fusion][1:]) if want]
    if cache is not None and _cacheable(req.generator):
        assert req.generator is not None and req.sent is not None
        model_id = model_id_of(req.generator)
        for i in wanted:
            text = cache.get(model_id, req.sent[i])
            if text is not None and _parse_answer(req, i, text).items:
                outs[i] = text
            elif text is not None:
                _log.debug("ignoring a cached LLM answer that does not parse; asking again")
    todo = [i for i in wanted if outs[i] is None]
    req.fresh = tuple(todo)
    req.explanation.llm_calls = len(todo)
    req.explanation.llm_cached = len(wanted) - len(todo)
    return outs, todo


def _to_keep(cache: GenerationCache | None, req: _Request, outs: Mapping[int, Answer]) -> bool:
    """Whether :func:`_keep` has anything to write: a cache, a cacheable generator, and an
    answer generated now."""
    if cache is None or req.generator is None or req.sent is None:
        return False
    return _cacheable(req.generator) and any(isinstance(outs[i], str) for i in req.fresh)


def _keep(cache: GenerationCache | None, req: _Request, outs: Mapping[int, Answer]) -> None:
    """Cache the answers generated now that parse into at least one usable item."""
    if not _to_keep(cache, req, outs):
        return
    assert cache is not None and req.generator is not None and req.sent is not None
    model_id = model_id_of(req.generator)
    for i in req.fresh:
        text = outs[i]
        if isinstance(text, str) and _parse_answer(req, i, text).items:
            cache.put(model_id, req.sent[i], text)


def _cacheable(generator: TextGenerator | None) -> bool:
    """Whether ``generator``'s answers may be cached under its ``model_id``: not where the
    model answering is chosen per run (its optional ``cacheable`` attribute is False), nor
    where it declares no id (its class name would key two different models' answers alike)."""
    return bool(getattr(generator, "cacheable", True)) and declared_model_id(generator) is not None


def _parse_answer(req: _Request, index: int, text: str | None) -> Parsed:
    """One LLM answer parsed; never raises (an exception becomes the reason)."""
    cfg = req.config
    prompt = req.sent[index] if req.sent is not None else None
    try:
        if index == 0:
            return parse_utterances(
                text,
                limit=cfg.num_utterances,
                style=req.style,
                prompt=prompt,
                max_chars=cfg.max_answer_chars,
            )
        return parse_reasoning(text, style=req.style, prompt=prompt, max_chars=cfg.max_answer_chars)
    except Exception as exc:  # RecursionError from deep JSON, or anything else
        return Parsed((), f"the LLM answer could not be parsed: {_describe(exc)}")


def _warn_degraded(req: _Request, failures: dict[str, str]) -> None:
    """One warning per degraded request; the user id hashed, the query left out."""
    model = model_id_of(req.generator) if req.generator is not None else "?"
    details = "; ".join(f"{term}: {_short(reason)}" for term, reason in failures.items())
    _log.warning(
        "PBR request degraded (user %s, model %s): %s dropped: %s",
        user_tag(req.user_id),
        model,
        " and ".join(failures),
        details,
    )


def _finish(
    req: _Request, parsed: tuple[Parsed, Parsed], vecs: np.ndarray, rule: FusionRule
) -> PersonalizedQuery:
    """Fuse (spec §2.4, §2.5) and record why ``q*`` is what it is."""
    assert req.q is not None
    n_f = len(parsed[0].items)
    f_avg = vecs[:n_f].mean(axis=0) if n_f else None
    r = vecs[n_f] if parsed[1].items else None
    history = req.history
    related = tuple(
        pos for pos in (history.position(h.id) for h in req.explanation.related) if pos is not None
    )
    result: FusionResult = rule(
        FusionInputs(
            q=req.q,
            anchor=req.anchor,
            f_avg=f_avg,
            r=r,
            config=req.config,
            history=history,
            related=related,
            best_history_cos=(
                req.explanation.related[0].score if req.explanation.related else None
            ),
        )
    )
    expl = req.explanation
    expl.used, expl.w1, expl.w2 = result.used, result.w1, result.w2
    for term in result.used:  # what the rule used is not dropped, whatever a gate said (a
        expl.dropped.pop(term, None)  # rule of the caller's may use the anchor the
        expl.skipped.pop(term, None)  # pre-generation gate reported dropped)
    expl.trust = dict(result.trust)
    if result.fallback is not None:
        # A deliberate choice, not a failure: "skipped" (and, as ever, "dropped") says why.
        why = f"safe fusion kept the plain query: {result.fallback}"
        for term in TERMS:
            if term not in expl.dropped:
                expl.dropped[term] = why
                expl.skipped[term] = why
    norm = float(np.linalg.norm(result.vector))
    if not np.isfinite(norm) or norm == 0.0:
        raise EmbeddingError("the personalized query vector is zero or not finite")
    vector = (result.vector / norm).astype(np.float32)
    req.watch.lap("fusion")
    expl.timings_ms["total"] = (time.perf_counter() - req.started) * 1000.0
    return PersonalizedQuery(vector=vector, query_vector=req.q, explanation=expl)


# -- helpers ---------------------------------------------------------------------------------------
def _unpersonalized(
    user_id: str, query: str, q: np.ndarray, config: PBRConfig, reason: str
) -> PersonalizedQuery:
    """``q* = q`` for a request that cannot be personalized, ``reason`` recorded per wanted term."""
    query = check_query(query)
    wanted = dict(zip(TERMS, MODE_TERMS[config.fusion], strict=True))
    reason = f"{reason}; searched with the plain query"
    explanation = Explanation(
        user_id=user_id,
        query=query,
        fusion=config.fusion,
        used=("query",),
        dropped={term: reason for term in TERMS if wanted[term]},
    )
    vector = np.asarray(q, dtype=np.float32)
    return PersonalizedQuery(vector=vector, query_vector=vector, explanation=explanation)


def _hits(history: UserHistory, scored: Sequence[tuple[int, float]]) -> list[SearchHit]:
    """Items at positions, with their scores, as hits (metadata: the caller's, not pbr's)."""
    items = items_at(history, [pos for pos, _ in scored])
    return [
        SearchHit(id=it.id, score=float(s), text=it.text, metadata=copy_metadata(it.metadata))
        for it, (_, s) in zip(items, scored)
    ]


def _feedback_texts(fb: PseudoFeedback) -> tuple[str | None, str | None]:
    return ("\n".join(fb.utterances) or None), fb.reasoning


def _given(fb: PseudoFeedback, term: str, limit: int) -> Parsed:
    if term == "utterances":
        items = tuple(t for t in fb.utterances if t and t.strip())[:limit]
    else:
        items = (fb.reasoning,) if fb.reasoning and fb.reasoning.strip() else ()
    return Parsed(items, None if items else f"no {term} were given")


def _failure(exc: BaseException) -> str:
    if isinstance(exc, LLMTimeoutError):
        return str(exc)
    return f"the LLM call failed: {_describe(exc)}"


def _describe(exc: BaseException) -> str:
    return _short(f"{type(exc).__name__}: {exc}")


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
