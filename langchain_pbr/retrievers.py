"""PBRRetriever: Personalize Before Retrieve as a native LangChain retriever."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.prompts import BasePromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever, LangSmithRetrieverParams
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.vectorstores import VectorStore
from pydantic import ConfigDict, Field, field_validator, model_validator

from pbr_core import (
    Embedder,
    GenerationCache,
    HistoryItem,
    HistoryStore,
    PBRConfig,
    Personalizer,
    PromptSet,
)
from pbr_core.adapters_support import (
    check_positive_int,
    check_user_id,
    explanation_events,
    host_store_errors,
    model_id,
    owner_of,
    results_event,
)
from pbr_core.config import as_config
from pbr_core.corpus import Corpus
from pbr_core.items import is_no_id
from pbr_core.retrieval import Request, Retrieval, aretrieve, retrieve

from ._bridge import (
    LangChainGenerator,
    LanguageModelLike,
    check_prompt,
    default_llm,
    documents_of,
    generator_for,
    items_of,
    prompt_set,
    prompt_style_of,
)
from .stores import (
    PBR_SEARCH_KWARGS,
    Found,
    astore_search,
    check_search_kwargs,
    default_filter,
    host_records,
    store_search,
    view_lister,
    with_view_filter,
)

__all__ = ["PBRRetriever"]

_T = TypeVar("_T")

_MISSING_USER = (
    "PBRRetriever needs the user this request is for. Give it as run metadata, "
    "config={'metadata': {'user_id': 'alice'}}: the one way that works everywhere (invoke, "
    "batch with one config per input, chains, MultiQueryRetriever, EnsembleRetriever, "
    "ContextualCompressionRetriever, with_fallbacks), because child runs inherit it. Also "
    "accepted: retriever.invoke(query, user_id='alice'), and "
    "config={'configurable': {'user_id': 'alice'}} (chains and fallbacks, not inside "
    "wrappers that re-invoke the retriever with callbacks only)"
)
#: The run-metadata key a request's user may come in (inherited by child runs), and the
#: ``configurable`` key read as well.
USER_METADATA_KEY = "user_id"
#: The private keyword argument :meth:`PBRRetriever.invoke` passes the run's
#: ``config["configurable"]`` in: its user, and what the LLM's own run is given.
_CONFIGURABLE = "_pbr_configurable"


#: The corpora a retriever built, and for what (store, owner key, embeddings, by identity): a
#: configured copy of the retriever is given its default's corpus, which serves the copy only
#: if it was built for the same three.
_BUILT: weakref.WeakKeyDictionary[Corpus, tuple[int, str, int]] = weakref.WeakKeyDictionary()


def _check_corpus(
    corpus: Corpus, store: VectorStore | None, user_key: str, embeddings: object
) -> None:
    """ValueError where a corpus given as ``corpus=`` is not over the retriever's own store,
    owner key and embeddings: the retriever would list, rank and embed with the corpus's."""
    host_store = getattr(corpus.host, "store", None) if corpus.host is not None else None
    if (store is None) != (corpus.host is None) or (store is not None and host_store is not store):
        raise ValueError(
            "corpus= is over another vector store than vectorstore=: build it over the same "
            "one, Corpus(host_records(vectorstore, user_key), ...), or leave corpus out"
        )
    if corpus.user_key != user_key:
        raise ValueError(
            f"corpus= keeps the owner under {corpus.user_key!r}, the retriever under "
            f"{user_key!r}: give both the same user_key"
        )
    if embeddings is not None and corpus.embedder is not embeddings:
        raise ValueError(
            "corpus= embeds with another model than embeddings=: build it with "
            "Corpus(..., embedder=embeddings), or leave embeddings= out"
        )


class PBRRetriever(BaseRetriever):
    """Personalize Before Retrieve (PBR): a per-user retriever over your LangChain objects.

    Before searching, PBR rewrites the *query vector* for the requesting user: two LLM calls
    write pseudo utterances and a pseudo reasoning in the user's style from their most related
    history (P-PRF), a PageRank over the user's history gives its centre (P-Anchor), and a
    query-adaptive fusion combines both with the query. The search then runs in your
    ``VectorStore`` with a per-user filter, or, without one, in pbr's own exact per-user search.

    Per-request state (user, ``k``) never lives on the instance: one retriever serves any
    number of users, sync, async, batched and inside chains. Every user's items are owned by
    :attr:`corpus` (:mod:`pbr_core.corpus`): ids are the user's own, and a store that can list
    its records (``InMemoryVectorStore``, Chroma) is the truth that each query is checked
    against, so deletes through the store and other worker processes are seen at once.

    Setup:
        .. code-block:: bash

            pip install 'personalize-before-retrieve[langchain]'
            # offline defaults (MiniLM embedder, Gemma 3 270M LLM):
            pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
            pip install 'personalize-before-retrieve[langchain,local]'

    Instantiate:
        .. code-block:: python

            from langchain_core.vectorstores import InMemoryVectorStore
            from langchain_openai import ChatOpenAI, OpenAIEmbeddings
            from langchain_pbr import PBRRetriever

            embeddings = OpenAIEmbeddings()
            retriever = PBRRetriever(
                llm=ChatOpenAI(model="gpt-4o-mini"),
                embeddings=embeddings,
                vectorstore=InMemoryVectorStore(embeddings),
                k=4,
            )

    Add Documents:
        .. code-block:: python

            retriever.add_documents(alice_docs, user_id="alice")
            retriever.add_documents(bob_docs, user_id="bob")
            # or: PBRRetriever.from_documents(docs_with_user_id_metadata, llm=..., ...)

    Choose the user:
        .. code-block:: python

            # run metadata: the one way that works in invoke, batch, chains and inside every
            # wrapper (MultiQueryRetriever, EnsembleRetriever, compression, with_fallbacks)
            alice = {"metadata": {"user_id": "alice"}}
            retriever.invoke("what should I cook tonight?", config=alice)

            # also accepted: a direct call's keyword, and configurable (chains, fallbacks)
            retriever.invoke("what should I cook tonight?", user_id="alice", k=3)
            retriever.invoke("...", config={"configurable": {"user_id": "alice"}})

            from langchain_core.runnables import ConfigurableField

            per_user = retriever.configurable_fields(user_id=ConfigurableField(id="user_id"))
            per_user.invoke("...", config={"configurable": {"user_id": "alice"}})
            per_user.batch(
                ["q1", "q2"],
                config=[{"configurable": {"user_id": u}} for u in ("alice", "bob")],
            )

    Async:
        .. code-block:: python

            docs = await per_user.ainvoke("...", config={"configurable": {"user_id": "bob"}})

    Inspect:
        .. code-block:: python

            # By default a document is the stored one (as VectorStoreRetriever returns it) and
            # the explanation goes to the callbacks' custom events (pbr.anchor ... pbr.fusion,
            # pbr.results with each result's scores); ask for it on the documents:
            explained = PBRRetriever(llm=..., embeddings=..., config={"explain": "all"})
            doc = explained.invoke("what should I cook tonight?", user_id="alice")[0]
            doc.id                                     # the user's own id of the item
            doc.metadata["score"]                      # hybrid: relevance in [0, 1]
            doc.metadata["store_score"]                # the store's own (Chroma: a distance)
            doc.metadata["pbr"]["pseudo_utterances"]   # what the LLM wrote for this user
            doc.metadata["pbr"]["w1"], doc.metadata["pbr"]["anchor_items"]
            doc.metadata["pbr"]["degraded"]            # True if a term had to be dropped

    Use as Retriever:
        .. code-block:: python

            chain = (
                {"context": per_user | format_docs, "question": RunnablePassthrough()}
                | prompt
                | llm
            )
            chain.invoke("...", config={"configurable": {"user_id": "alice"}})
    """

    llm: LanguageModelLike | None = None
    """The model for the two P-PRF calls (a chat model, an LLM, or a Runnable around one such as
    ``chat.with_retry()`` / ``.with_fallbacks([...])`` / ``.bind(...)``); None = the embedded
    Gemma 3 270M."""
    embeddings: Embeddings | Embedder | None = None
    """Embeds history and queries: LangChain ``Embeddings`` or any pbr_core ``Embedder`` (e.g.
    ``pbr_core.models.MiniLMEmbedder``); None = ``vectorstore.embeddings``, else the embedded
    MiniLM. Must be the model the vector store was filled with."""
    vectorstore: VectorStore | None = None
    """The final search and the record of every user's items; None = pbr's own store."""
    user_id: str | None = None
    """A fixed user; None = given per request (``invoke(..., user_id=...)`` or configurable)."""
    k: int = Field(default=4, ge=1)
    """Number of documents returned."""
    config: PBRConfig = Field(default_factory=PBRConfig)
    """PBR's parameters (a :class:`~pbr_core.PBRConfig` or a dict of its fields)."""
    utterances_prompt: PromptTemplate | None = None
    """Template of the pseudo-utterance call, over ``{history}``, ``{query}`` and ``{m}``;
    None = the default for the prompt style (see :meth:`get_prompts`)."""
    reasoning_prompt: PromptTemplate | None = None
    """Template of the pseudo-reasoning call, over ``{history}`` and ``{query}``."""
    prompt_style: Literal["chat", "completion"] | None = None
    """``"chat"`` (JSON answers, instruction-following models) or ``"completion"`` (numbered
    lists, base models); None = the LLM's ``prompt_style`` attribute, else ``"chat"``."""
    filter_builder: Callable[[str], dict[str, Any]] | None = None
    """user id → keyword arguments of the vector store's search that keep it to that user;
    None = ``{"filter": <callable on Document>}`` for ``InMemoryVectorStore`` and
    ``{"filter": {user_key: user_id}}`` for other stores."""
    user_key: str = "user_id"
    """Metadata key naming a document's owner in the vector store."""
    search_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of every vector-store search, as for ``VectorStoreRetriever``: ``k``
    (the default ``k``), ``filter`` (ANDed with the per-user filter, never replacing it),
    ``score_threshold`` (the results down to the first whose ``score`` is below this, applied
    by pbr on every store; hybrid's score is the relevance in [0, 1], the same meaning for every
    query) and the parameters the store's search by vector names (e.g. ``fetch_k`` for FAISS,
    ``where_document`` for Chroma); any other key is refused at construction
    (:func:`~langchain_pbr.stores.check_search_kwargs`). Needs a ``vectorstore``."""
    strict: bool = False
    """Raise ``GenerationError`` / ``UnknownUserError`` instead of degrading."""
    history: HistoryStore = Field(default_factory=HistoryStore)
    """pbr's per-user vectors and anchors: the record without a vector store, else a cache
    checked against the store; shared by configured copies of this retriever."""
    cache: GenerationCache | None = None
    """Optional cache of LLM answers keyed by (model, prompt)."""
    corpus: Corpus | None = None
    """Owner of every user's items (:class:`pbr_core.corpus.Corpus`): built from
    ``vectorstore``, ``history`` and ``embeddings``; shared by configured copies that keep
    those three (one that changes the store, ``user_key`` or ``embeddings`` gets its own). Pass
    your own to tune it, over the retriever's own store, owner key and embeddings (else
    refused), e.g. ``Corpus(host_records(store, "user_id"), embedder=embeddings,
    max_staleness_s=1.0)``."""

    model_config = ConfigDict(extra="forbid")  # a typo (`embedding=`, `search_type=`) fails

    @model_validator(mode="before")
    @classmethod
    def _no_search_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and "search_type" in data:
            raise ValueError(
                f"PBRRetriever has no search_type (got {data['search_type']!r}): pbr ranks the "
                "user's items itself, by config=PBRConfig(search='hybrid' | 'dense' | "
                "'lexical'); a score threshold is search_kwargs={'score_threshold': ...}"
            )
        return data

    @model_validator(mode="after")
    def _own_corpus(self) -> PBRRetriever:
        if self.search_kwargs and self.vectorstore is None:
            raise ValueError(
                "search_kwargs are the vector store's search arguments, but this retriever has "
                "no vectorstore (it searches pbr's own store); pass vectorstore= or drop them"
            )
        if "k" in self.search_kwargs:  # the VectorStoreRetriever idiom for k: read as k
            wanted = check_positive_int(self.search_kwargs["k"], "search_kwargs['k']")
            if "k" in self.model_fields_set and self.k != wanted:
                raise ValueError(
                    f"k={self.k} and search_kwargs['k']={wanted} disagree; give one of them"
                )
            self.k = wanted  # a configured copy's own k (configurable_fields) then applies
            self.search_kwargs = {key: v for key, v in self.search_kwargs.items() if key != "k"}
        if self.vectorstore is not None:
            check_search_kwargs(self.vectorstore, self.search_kwargs)
            extra = self.search_kwargs.get("filter")
            if extra is not None and self.filter_builder is None:  # refused now, not at a query
                default_filter(self.vectorstore, self.user_key, "any user", extra)
        store, embedder = self.vectorstore, self._embedder()
        made_for = (id(store), self.user_key, id(embedder))
        built = _BUILT.get(self.corpus) if self.corpus is not None else None
        if self.corpus is not None and built is not None and built != made_for:
            if self.history is not self.corpus.cache:
                # a corpus another retriever built, given as corpus= (a configured copy
                # comes with its default's history too): refused as any corpus over another
                # store, owner key or embeddings is
                _check_corpus(self.corpus, store, self.user_key, embedder)
            # a configured copy (configurable_fields) of a retriever whose corpus pbr built,
            # for another store, owner key or embeddings: that corpus lists the other store
            # under the other key; this copy gets its own, over a history of its own
            self.corpus, self.history = None, HistoryStore()
        if self.corpus is None:
            host = host_records(store, self.user_key) if store is not None else None
            self.corpus = Corpus(
                host, embedder=embedder, cache=self.history, user_key=self.user_key
            )
            _BUILT[self.corpus] = made_for
        else:  # your own Corpus (e.g. with max_staleness_s): its cache is the history
            if built is None:
                _check_corpus(self.corpus, store, self.user_key, self.embeddings)
            self.history = self.corpus.cache
        return self

    _check_prompts = field_validator("utterances_prompt", "reasoning_prompt")(
        classmethod(lambda cls, prompt: check_prompt(prompt))
    )
    # before pydantic's coercion: True or 2.0 is refused, as for a request's k
    _check_k = field_validator("k", mode="before")(
        classmethod(lambda cls, k: check_positive_int(k, "k"))
    )
    # a dict of PBRConfig's fields checked as PBRConfig checks them, before pydantic's lax
    # coercion ({"k1": "10"} refused, not read as 10)
    _check_config = field_validator("config", mode="before")(
        classmethod(lambda cls, config: as_config(config))
    )

    # -- the pieces of one request -------------------------------------------------------------
    def _llm(self) -> LanguageModelLike:
        return self.llm if self.llm is not None else default_llm()

    def _embedder(self) -> Embeddings | Embedder | None:
        if self.embeddings is not None:
            return self.embeddings
        return self.vectorstore.embeddings if self.vectorstore is not None else None

    def _style(self) -> Literal["chat", "completion"]:
        return prompt_style_of(self._llm(), self.prompt_style)

    def _prompts(self) -> PromptSet:
        return prompt_set(self._style(), self.utterances_prompt, self.reasoning_prompt)

    def _corpus(self) -> Corpus:
        assert self.corpus is not None  # set by the validator
        return self.corpus

    def _personalizer(self) -> Personalizer:
        # A per-request view over the shared corpus: it holds this copy's prompts, config and
        # strictness, so nothing per request is written to a shared object.
        return Personalizer(
            corpus=self._corpus(),
            config=self.config,
            prompts=self._prompts(),
            cache=self.cache,
            strict=self.strict,
        )

    @property
    def personalizer(self) -> Personalizer:
        """The pbr_core :class:`~pbr_core.Personalizer` of this retriever: the method over
        :attr:`corpus`, so its writes (``add_texts``, ``delete``) reach the vector store."""
        return self._personalizer()

    def _request(
        self,
        query: str,
        user_id: str | None,
        k: int | None,
        kwargs: dict[str, Any],
        run: CallbackManagerForRetrieverRun | AsyncCallbackManagerForRetrieverRun,
    ) -> Request:
        kwargs.pop("verbose", None)  # LangChain's own invoke option, not ours
        configurable: dict[str, Any] = kwargs.pop(_CONFIGURABLE, None) or {}
        if kwargs:
            raise TypeError(
                f"PBRRetriever got unexpected keyword argument(s) {sorted(kwargs)}; per-request "
                "arguments are user_id and k (fixed search arguments go in search_kwargs, the "
                "per-user filter in filter_builder)"
            )
        # search_kwargs["k"] was read into k when the retriever was made (an unvalidated
        # model_copy(update={"search_kwargs": ...}) may still hold one)
        default = self.search_kwargs.get("k", self.k)
        if user_id is None:
            # The field, config={"configurable": {"user_id": ...}} (no configurable_fields
            # needed, so as_plain() copies and fallbacks keep it), the run's metadata (inherited
            # by child runs, it reaches this retriever inside compositions that re-invoke it with
            # callbacks only: ContextualCompressionRetriever, MultiQueryRetriever, ...): where
            # two name different users, the request is refused, never answered for either.
            user_id = _one_user(
                {
                    "the retriever's user_id": self.user_id,
                    "config['configurable']['user_id']": configurable.get(USER_METADATA_KEY),
                    "the run's metadata['user_id']": (getattr(run, "metadata", None) or {}).get(
                        USER_METADATA_KEY
                    ),
                }
            )
        return Request(
            self._user(user_id),
            query,
            check_positive_int(default if k is None else k, "k"),
            config=self.config,
            generator=self._generator(run.get_child(), configurable),
            strict=self.strict,
            view_filtered=self._view_filtered(),
            score_threshold=self.search_kwargs.get("score_threshold"),
        )

    def _user(self, user_id: str | None) -> str:
        uid = user_id if user_id is not None else self.user_id
        if uid is None:
            raise ValueError(_MISSING_USER)
        return check_user_id(uid)

    def _search_kwargs(self, user_id: str) -> dict[str, Any]:
        assert self.vectorstore is not None
        kwargs = {k: v for k, v in self.search_kwargs.items() if k not in PBR_SEARCH_KWARGS}
        extra = self.search_kwargs.get("filter")
        if self.filter_builder is not None:
            return {**kwargs, **with_view_filter(self.filter_builder(user_id), extra)}
        return {**kwargs, **default_filter(self.vectorstore, self.user_key, user_id, extra)}

    def _generator(
        self, callbacks: Callbacks, configurable: dict[str, Any] | None = None
    ) -> LangChainGenerator:
        return generator_for(self._llm(), callbacks, self._style(), configurable)

    def _view_filtered(self) -> bool:
        # a filter or a store argument shapes the store's search; k and score_threshold do not
        pbr_only = {"k", "score_threshold"}
        return self.filter_builder is not None or not set(self.search_kwargs) <= pbr_only

    def _host_errors(self) -> contextlib.AbstractContextManager[None]:
        return host_store_errors(self.vectorstore, "search")

    def _host_search(self, search: Callable[..., _T], user_id: str) -> Callable[..., _T] | None:
        """``store_search`` / ``astore_search`` over this retriever's store, filtered to the user
        (the filter is built when the host is searched, not before)."""
        store = self.vectorstore
        if store is None:
            return None
        return lambda v, m: search(store, v.tolist(), m, self._search_kwargs(user_id))

    def _host_filter(self, user_id: str) -> Callable[[], Found] | None:
        """Where the request's view is filtered and the store lists it exactly (stores.
        :func:`~langchain_pbr.stores.view_lister`), what lists it: pbr then ranks every
        document of the view, not the store's best candidates for ``q*`` (which would leave
        out a document only the lexical leg finds)."""
        if self.vectorstore is None or not self._view_filtered():
            return None
        return view_lister(self.vectorstore, self._search_kwargs(user_id))

    @staticmethod
    def _events(got: Retrieval) -> list[tuple[str, dict[str, Any]]]:
        assert got.query is not None  # the request does not skip: always personalized
        expl = got.query.explanation
        return [*explanation_events(expl), results_event(expl, got.results, got.mode)]

    def _documents(self, got: Retrieval) -> list[Document]:
        return documents_of(got, self.config.search, self.config.explain)

    # -- retrieval: the steps are pbr_core.retrieval's, this translates ------------------------
    def invoke(  # the user of config['configurable'], then BaseRetriever's
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        return super().invoke(input, config, **_with_configurable(config, kwargs))

    async def ainvoke(
        self, input: str, config: RunnableConfig | None = None, **kwargs: Any
    ) -> list[Document]:
        return await super().ainvoke(input, config, **_with_configurable(config, kwargs))

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        user_id: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        request = self._request(query, user_id, k, kwargs, run_manager)
        got = retrieve(
            self._corpus(),
            request,
            self._personalizer().personalize,
            host_search=self._host_search(store_search, request.user_id),
            host_filter=self._host_filter(request.user_id),
            host_errors=self._host_errors,
        )
        if got.query is None:  # a view that holds none of the user's documents
            return []
        child = run_manager.get_child()
        for name, data in self._events(got):
            child.on_custom_event(name, data, run_id=run_manager.run_id)
        return self._documents(got)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        user_id: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        request = self._request(query, user_id, k, kwargs, run_manager)
        listed = self._host_filter(request.user_id)
        got = await aretrieve(
            self._corpus(),
            request,
            self._personalizer().apersonalize,
            host_search=self._host_search(astore_search, request.user_id),
            host_filter=None if listed is None else functools.partial(asyncio.to_thread, listed),
            host_errors=self._host_errors,
        )
        if got.query is None:  # a view that holds none of the user's documents
            return []
        child = run_manager.get_child()
        for name, data in self._events(got):
            await child.on_custom_event(name, data, run_id=run_manager.run_id)
        return self._documents(got)

    # -- the users' corpora: pbr_core.corpus owns every rule, this only translates --------------
    def add_documents(
        self,
        documents: Sequence[Document],
        *,
        user_id: str,
        ids: Sequence[str] | None = None,
        add_to_vectorstore: bool = True,
    ) -> list[str]:
        """Add documents to a user's corpus (in the vector store, tagged with the user).

        Args:
            documents: the user's items; ``metadata["timestamp"]`` (POSIX seconds) orders them.
            user_id: whose corpus they join.
            ids: one per document; default ``Document.id``, else a new uuid4 hex (an empty or
                None id is none, as in LangChain's stores). Ids are the
                user's own: another user's item with the same id is another item. An id the
                user already has replaces that item.
            add_to_vectorstore: False only for a store that cannot list its records (see
                :mod:`langchain_pbr.stores`) and already holds these documents: under their
                ``Document.id`` where they have one (as read back from the store), else under
                their ids. Without ``ids``, a document pbr wrote is the user's item of the id
                its metadata names, as LlamaIndex's ``add_nodes(..., insert=False)`` reads it.

        Returns:
            The ids, which :meth:`delete` takes.

        Raises:
            ValueError / EmbeddingError: an invalid document; nothing was written.
            VectorStoreUnavailableError: the store's server did not answer; retrying the same
                call is safe (writes are upserts by a key derived from user and id).
        """
        uid = self._user(user_id)
        items = items_of(documents, uid, ids, self.user_key, held=not add_to_vectorstore)
        new_ids = _new_ids(documents, ids)
        held = _held_keys(uid, documents, ids, add_to_vectorstore)
        with host_store_errors(self.vectorstore, "add", new_ids=new_ids):
            added = self._corpus().add_many(
                {uid: items}, write_host=add_to_vectorstore, held_keys=held
            )
        return added.get(uid, [])

    async def aadd_documents(
        self,
        documents: Sequence[Document],
        *,
        user_id: str,
        ids: Sequence[str] | None = None,
        add_to_vectorstore: bool = True,
    ) -> list[str]:
        """Async :meth:`add_documents` (native async embeddings when they exist)."""
        uid = self._user(user_id)
        items = items_of(documents, uid, ids, self.user_key, held=not add_to_vectorstore)
        new_ids = _new_ids(documents, ids)
        held = _held_keys(uid, documents, ids, add_to_vectorstore)
        with host_store_errors(self.vectorstore, "add", new_ids=new_ids):
            added = await self._corpus().aadd_many(
                {uid: items}, write_host=add_to_vectorstore, held_keys=held
            )
        return added.get(uid, [])

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Remove the user's documents; ``KeyError`` (nothing removed) for an id they lack."""
        with host_store_errors(self.vectorstore, "delete"):
            self._corpus().delete(self._user(user_id), ids)

    async def adelete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Async :meth:`delete`."""
        with host_store_errors(self.vectorstore, "delete"):
            await self._corpus().adelete(self._user(user_id), ids)

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Document],
        *,
        user_id: str | None = None,
        add_to_vectorstore: bool = True,
        **kwargs: Any,
    ) -> PBRRetriever:
        """A retriever holding these documents, added as one validated batch.

        Each document's user is its ``metadata[user_key]``, else ``user_id`` (which also becomes
        the retriever's default user); ``kwargs`` are the retriever's fields.
        """
        retriever = cls(**kwargs) if user_id is None else cls(user_id=user_id, **kwargs)
        new_ids = _new_ids(documents)
        with host_store_errors(retriever.vectorstore, "add", new_ids=new_ids):
            groups = retriever._groups(documents, user_id, held=not add_to_vectorstore)
            retriever._corpus().add_many(groups, write_host=add_to_vectorstore)
        return retriever

    @classmethod
    async def afrom_documents(
        cls,
        documents: Sequence[Document],
        *,
        user_id: str | None = None,
        add_to_vectorstore: bool = True,
        **kwargs: Any,
    ) -> PBRRetriever:
        """Async :meth:`from_documents`."""
        retriever = cls(**kwargs) if user_id is None else cls(user_id=user_id, **kwargs)
        new_ids = _new_ids(documents)
        with host_store_errors(retriever.vectorstore, "add", new_ids=new_ids):
            groups = retriever._groups(documents, user_id, held=not add_to_vectorstore)
            await retriever._corpus().aadd_many(groups, write_host=add_to_vectorstore)
        return retriever

    def _groups(
        self, documents: Sequence[Document], user_id: str | None, *, held: bool = False
    ) -> dict[str, list[HistoryItem]]:
        by_user: dict[str, list[Document]] = {}
        for i, doc in enumerate(documents):
            fix = f"pass user_id=... or set metadata[{self.user_key!r}] on every document"
            uid = owner_of(doc.metadata, user_id, self.user_key, f"document {i}", fix)
            by_user.setdefault(uid, []).append(doc)
        return {
            uid: items_of(docs, uid, None, self.user_key, held=held)
            for uid, docs in by_user.items()
        }

    # -- persistence and introspection ---------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write pbr's per-user vectors and anchors to the folder ``path`` (atomically)."""
        self.history.save(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> PBRRetriever:
        """A retriever over a folder written by :meth:`save`; ``kwargs`` are its fields.

        Refuses embeddings of another model than the one that made the saved vectors. With a
        vector store that can list, the saved state is a cache checked against the store.
        """
        embedder = kwargs.get("embeddings")
        if embedder is None and kwargs.get("vectorstore") is not None:
            embedder = kwargs["vectorstore"].embeddings
        store = Corpus.load(path, embedder).cache
        return cls(**{**kwargs, "history": store})

    def as_plain(self) -> PBRRetriever:
        """The same per-user retriever without personalization (``fusion="plain"``: no LLM call).

        The fallback to use in ``with_fallbacks([...])`` or as the second member of an
        ``EnsembleRetriever``: ``vectorstore.as_retriever()`` would search *every* user's
        documents, this keeps the per-user filter and the user's own ids.
        """
        return self.model_copy(update={"config": dataclasses.replace(self.config, fusion="plain")})

    def get_prompts(self, config: RunnableConfig | None = None) -> list[BasePromptTemplate]:
        """The two P-PRF prompt templates in effect: ``[utterances, reasoning]``."""
        prompts = self._prompts()
        return [
            PromptTemplate.from_template(prompts.utterances),
            PromptTemplate.from_template(prompts.reasoning),
        ]

    def _get_ls_params(self, **kwargs: Any) -> LangSmithRetrieverParams:
        kwargs.pop(_CONFIGURABLE, None)
        params = super()._get_ls_params(**kwargs)
        if self.vectorstore is not None:
            params["ls_vector_store_provider"] = type(self.vectorstore).__name__
        embedder = self._embedder()
        if embedder is not None:
            params["ls_embedding_provider"] = type(embedder).__name__
            params["ls_embedding_model"] = model_id(embedder)
        return params


def _new_ids(documents: Sequence[Document], ids: Sequence[str] | None = None) -> int:
    """How many documents this call gives a new id (no ``ids``, no ``Document.id`` of their own,
    an empty one included; an empty or None entry of ``ids`` too): a retry would add those
    again (the failed add's message says so)."""
    given = list(ids) if ids is not None else [doc.id for doc in documents]
    return sum(is_no_id(g) for g in given)


def _held_keys(
    user_id: str, documents: Sequence[Document], ids: Sequence[str] | None, written: bool
) -> dict[str, list[str | None]] | None:
    """For documents the store holds already (``add_to_vectorstore=False``), the keys the store
    holds them under: their ``Document.id`` (read back from the store, that is its key, pbr's
    scoped one for a document pbr wrote), whether their item ids are ``ids`` or their own."""
    if written:
        return None
    return {user_id: [doc.id or None for doc in documents]}


def _one_user(named: dict[str, Any]) -> str | None:
    """The one user the request's sources name (None: none does); ValueError naming them where
    two name different users."""
    given = {source: user for source, user in named.items() if user is not None}
    if len(set(given.values())) > 1:
        said = ", ".join(f"{source} is {user!r}" for source, user in given.items())
        raise ValueError(
            f"the request names more than one user ({said}); pbr answers for one user only: "
            "make them agree, or pass user_id= to invoke to choose"
        )
    return next(iter(given.values()), None)


def _with_configurable(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` plus ``config["configurable"]``, if any: the config the call was given merged
    with the one LCEL passes down to a step (``ensure_config``), so a chain's or a fallback's
    configurable user reaches a plain retriever too, and the LLM's run gets the same
    ``configurable`` a child run of the retriever would (a model picked by
    ``configurable_alternatives`` answers)."""
    configurable = ensure_config(config).get("configurable") or {}
    return {**kwargs, _CONFIGURABLE: dict(configurable)} if configurable else kwargs
