"""LlamaIndex models as pbr_core protocols, and where the adapter finds them.

:class:`LlamaIndexEmbedder` and :class:`LlamaIndexGenerator` only translate calls: every call
still goes through the host object's public API (``get_query_embedding``, ``complete``, ...), so
the host's callbacks, instrumentation spans, caches and rate limiters all apply.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.llms.llm import default_completion_to_prompt
from llama_index.core.schema import QueryBundle
from llama_index.core.vector_stores import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from pbr_core.adapters_support import host_store_errors
from pbr_core.prf import PROMPT_STYLES, PromptStyle, resolve_prompt_style


def embed_model_id(embed_model: BaseEmbedding) -> str:
    """The id recorded with stored vectors: the model name, else the class name.

    It matches :class:`pbr_core.models.MiniLMEmbedder`'s ``model_id`` for the embedded model, so
    a history saved by pbr_core loads here and the other way round.
    """
    name = embed_model.model_name
    return name if name and name != "unknown" else type(embed_model).__name__


def llm_model_id(llm: LLM) -> str:
    """The generation-cache key of an LLM: its model name, else its class name."""
    return declared_llm_model_id(llm) or llm.class_name()


def declared_llm_model_id(llm: LLM) -> str | None:
    """The model name an LLM's metadata declares; None where it declares none ("unknown"):
    its class name, which two models share, keys no cached answer."""
    name = llm.metadata.model_name
    return name if name and name != "unknown" else None


def rewrites_prompts(llm: LLM) -> bool:
    """Whether ``llm.complete`` may send the model something other than the prompt it is
    given: a ``completion_to_prompt`` other than LlamaIndex's default (which returns it
    unchanged), or a ``system_prompt`` or ``query_wrapper_prompt`` (which LLMs such as
    ``HuggingFaceLLM`` apply in ``complete``)."""
    wrapper = getattr(llm, "completion_to_prompt", None)
    if wrapper is not None and wrapper is not default_completion_to_prompt:
        return True
    if getattr(llm, "system_prompt", None):
        return True
    template = getattr(llm, "query_wrapper_prompt", None)
    if template is None:
        return False
    try:  # HuggingFaceLLM's default, "{query_str}", leaves the prompt as it is
        return bool(template.format(query_str=_PROMPT_PROBE) != _PROMPT_PROBE)
    except Exception:  # a template this probe cannot fill: assume it rewrites
        return True


#: A prompt no template leaves unchanged by chance (see :func:`rewrites_prompts`).
_PROMPT_PROBE = "pbr prompt probe 7f3a"


def llm_prompt_style(llm: LLM, override: PromptStyle | None = None) -> PromptStyle:
    """Which P-PRF prompts suit ``llm``.

    An explicit ``override`` wins, then the LLM's own ``prompt_style`` attribute (the embedded
    :class:`~llamaindex_pbr.LocalGemmaLLM` says ``"completion"``), then its metadata: chat models
    get the JSON prompts, completion models the numbered-list prompts.
    """
    declared = getattr(llm, "prompt_style", None)
    if override is None and declared not in PROMPT_STYLES:  # only then read the metadata
        return "chat" if llm.metadata.is_chat_model else "completion"
    return resolve_prompt_style(declared, override)


class LlamaIndexEmbedder:
    """A LlamaIndex ``BaseEmbedding`` as a :class:`pbr_core.protocols.AsyncEmbedder`."""

    def __init__(self, embed_model: BaseEmbedding) -> None:
        self.embed_model = embed_model
        self.model_id = embed_model_id(embed_model)

    def __repr__(self) -> str:
        return f"LlamaIndexEmbedder({self.model_id!r})"

    def embed_query(self, text: str) -> list[float]:
        return self.embed_model.get_query_embedding(text)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_model.get_text_embedding_batch(list(texts))

    async def aembed_query(self, text: str) -> list[float]:
        return await self.embed_model.aget_query_embedding(text)

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await self.embed_model.aget_text_embedding_batch(list(texts))


class LlamaIndexGenerator:
    """A LlamaIndex ``LLM`` as a :class:`pbr_core.protocols.AsyncTextGenerator`.

    The sync pipeline runs its two LLM calls in worker threads, which start with an empty
    ``contextvars`` context: the LLM's spans and legacy callback events would lose their parent.
    :meth:`bound` returns a per-request generator that runs each call in a copy of the caller's
    context, so the calls nest under the retrieval that made them. (The async pipeline needs no
    binding: ``asyncio`` tasks copy the context themselves.)
    """

    def __init__(
        self,
        llm: LLM,
        prompt_style: PromptStyle | None = None,
        *,
        context: contextvars.Context | None = None,
    ) -> None:
        self.llm = llm
        self.prompt_style: PromptStyle = llm_prompt_style(llm, prompt_style)
        self._context = context

    # Read from the model on every request, not when the generator was made: a model whose
    # name or settings change (``llm.model = ...``) caches and times out as what it is now.
    @property
    def in_process(self) -> bool:
        """Whether the model runs in this process (see pbr's ``llm_timeout_s``)."""
        return bool(getattr(self.llm, "in_process", False))

    @property
    def model_id(self) -> str:
        return llm_model_id(self.llm)

    @property
    def cacheable(self) -> bool:
        """Whether the model declares an id its answers may be cached under, and sends the
        prompt as pbr wrote it: a ``completion_to_prompt`` of the user's rewrites it with code
        the id does not name, so two wrappers' answers would share one cache entry."""
        return declared_llm_model_id(self.llm) is not None and not rewrites_prompts(self.llm)

    def __repr__(self) -> str:
        return f"LlamaIndexGenerator({self.model_id!r}, prompt_style={self.prompt_style!r})"

    def bound(self, context: contextvars.Context) -> LlamaIndexGenerator:
        """A copy whose sync calls run in (a copy of) ``context``; cheap, one per request."""
        return type(self)(self.llm, self.prompt_style, context=context)

    def _complete(self, prompt: str) -> str:
        return self.llm.complete(prompt).text

    def generate(self, prompt: str) -> str:
        if self._context is None:
            return self._complete(prompt)
        # A Context can be entered by one thread at a time; each call gets its own copy.
        return self._context.copy().run(self._complete, prompt)


class AsyncLlamaIndexGenerator(LlamaIndexGenerator):
    """A :class:`LlamaIndexGenerator` for an LLM whose ``acomplete`` is its own async code: the
    async pipeline awaits it on the event loop (and cancels it at the timeout)."""

    async def agenerate(self, prompt: str) -> str:
        return (await self.llm.acomplete(prompt)).text


def llamaindex_generator(llm: LLM, prompt_style: PromptStyle | None = None) -> LlamaIndexGenerator:
    """The generator for ``llm``: async only where ``acomplete`` is natively async.

    ``CustomLLM.acomplete`` (every ``CustomLLM`` that does not override it: ``MockLLM``, most
    local models) runs the blocking ``complete`` *on the event loop*; offering it as
    ``agenerate`` would freeze the loop for the whole call and make the timeout unenforceable.
    Without ``agenerate`` the async pipeline runs ``complete`` in pbr's LLM executor instead.
    """
    return (AsyncLlamaIndexGenerator if natively_async(llm) else LlamaIndexGenerator)(
        llm, prompt_style
    )


def natively_async(llm: LLM) -> bool:
    """Whether ``llm.acomplete`` is the model's own async code (not its sync code, blocking)."""
    from llama_index.core.llms.custom import CustomLLM

    owner = next((c for c in type(llm).__mro__ if "acomplete" in c.__dict__), None)
    return owner is not None and owner is not CustomLLM


def settings_llm() -> LLM | None:
    """``Settings.llm`` if the user set it, without resolving the default (which is OpenAI)."""
    llm: LLM | None = Settings._llm
    return Settings.llm if llm is not None else None


def settings_embed_model() -> BaseEmbedding | None:
    """``Settings.embed_model`` if the user set it, without resolving the OpenAI default."""
    model: BaseEmbedding | None = Settings._embed_model
    return Settings.embed_model if model is not None else None


def split_index(
    index: object,
) -> tuple[VectorStoreIndex | None, dict[str, VectorStoreIndex] | None]:
    """One shared index, or a per-user partition ``{user_id: index}``, checked."""
    if isinstance(index, VectorStoreIndex):
        return index, None
    if isinstance(index, Mapping):
        per_user: dict[str, VectorStoreIndex] = {}
        for user, value in index.items():
            if not isinstance(user, str) or not user:
                raise ValueError(f"per-user index keys must be user ids (strings), got {user!r}")
            if not isinstance(value, VectorStoreIndex):
                raise TypeError(
                    f"index[{user!r}] must be a VectorStoreIndex, got {type(value).__name__}"
                )
            per_user[user] = value
        return None, per_user
    raise TypeError(
        "index must be a VectorStoreIndex, or a mapping user_id → VectorStoreIndex for a "
        f"per-user partition; got {type(index).__name__}"
    )


def default_llm(callback_manager: CallbackManager) -> LLM:
    from .llms import LocalGemmaLLM

    return LocalGemmaLLM(callback_manager=callback_manager)


def default_embed_model(callback_manager: CallbackManager) -> BaseEmbedding:
    from .embeddings import LocalMiniLMEmbedding

    return LocalMiniLMEmbedding(callback_manager=callback_manager)


def and_user(key: str, user_id: str, filters: MetadataFilters | None) -> MetadataFilters:
    """The user's filter AND the view's filters, flat when possible (some stores cannot nest)."""
    mine = MetadataFilter(key=key, value=user_id, operator=FilterOperator.EQ)
    if filters is None or not filters.filters:
        return MetadataFilters(filters=[mine])
    if is_flat_and(filters):
        return MetadataFilters(filters=[mine, *filters.filters], condition=FilterCondition.AND)
    return MetadataFilters(filters=[mine, filters], condition=FilterCondition.AND)


def is_flat_and(filters: MetadataFilters) -> bool:
    """Whether ``filters`` is a plain AND of single conditions (so one more can be appended)."""
    return filters.condition in (None, FilterCondition.AND) and not any(
        isinstance(f, MetadataFilters) for f in filters.filters
    )


def bundle_for(query: str, vector: np.ndarray) -> QueryBundle:
    # With ``embedding`` set, the host retriever searches with q* as is (no re-embedding).
    return QueryBundle(query_str=query, embedding=[float(x) for x in vector])


@contextlib.contextmanager
def search_errors(store: object, partitioned: bool) -> Iterator[None]:
    """A search's host errors: an unreachable server names its URL; "cannot filter" becomes
    advice (pbr never post-filters)."""
    try:
        with host_store_errors(store, "search"):
            yield
    except (ValueError, NotImplementedError) as exc:
        if "filter" not in str(exc).lower():
            raise
        if partitioned:
            advice = "remove filters= from this retriever; the partition already isolates users"
        else:
            advice = (
                "give PBRRetriever one index per user instead: "
                "PBRRetriever.from_defaults(index={'u1': index_u1, ...}) or "
                "from_defaults(nodes=..., vector_store_factory=lambda user_id: ...)"
            )
        raise ValueError(
            f"the vector store cannot apply the metadata filter ({exc}); {advice}"
        ) from exc


def with_keys(keys: Sequence[str], *extra: str) -> list[str]:
    """``keys`` plus those of ``extra`` it lacks (excluded-metadata key lists)."""
    return [*keys, *(k for k in extra if k not in keys)]
