"""The three things pbr_core needs from its host, as structural protocols.

pbr_core never imports a framework. A LangChain ``Embeddings`` already satisfies
:class:`Embedder`; the adapters wrap chat models / LLMs as :class:`TextGenerator` and vector
stores as :class:`VectorSearch`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Embedder(Protocol):
    """Text to vectors. Output need not be normalised: pbr_core L2-normalises every vector."""

    def embed_query(self, text: str) -> Sequence[float]: ...

    def embed_documents(self, texts: list[str]) -> Sequence[Sequence[float]]: ...


@runtime_checkable
class AsyncEmbedder(Embedder, Protocol):
    """An :class:`Embedder` with native async methods (used by the async pipeline when present)."""

    async def aembed_query(self, text: str) -> Sequence[float]: ...

    async def aembed_documents(self, texts: list[str]) -> Sequence[Sequence[float]]: ...


@runtime_checkable
class TextGenerator(Protocol):
    """Prompt in, text out. ``model_id`` keys the on-disk generation cache.

    ``prompt_style`` tells which default prompts suit the model: ``"chat"`` for
    instruction-following models (JSON answers), ``"completion"`` for base models that continue a
    document (numbered lists). Generators without the attribute are treated as ``"chat"``.
    An optional ``cacheable = False`` says no one ``model_id`` names the model that answers (it
    is chosen per call, or the id is only a class name): its answers are never cached.
    """

    @property
    def model_id(self) -> str: ...  # an attribute or a property read per request

    def generate(self, prompt: str) -> str: ...


@runtime_checkable
class AsyncTextGenerator(TextGenerator, Protocol):
    """A :class:`TextGenerator` with a native async method."""

    async def agenerate(self, prompt: str) -> str: ...


@dataclass(frozen=True)
class SearchHit:
    """One search result: an item of one user's corpus and its score (a cosine / inner product;
    pbr's hybrid search: the relevance of :func:`pbr_core.hybrid.relevance`)."""

    id: str
    score: float
    text: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    #: How a hybrid search ranked it (:mod:`pbr_core.hybrid`): ``dense`` (cosine), ``dense_rank``,
    #: ``lexical`` (BM25), ``lexical_rank`` (None: no query word); None for a host's search.
    legs: Mapping[str, Any] | None = None


@runtime_checkable
class VectorSearch(Protocol):
    """Nearest-neighbour search within one user's items (a pre-filter, never a post-filter)."""

    def search(self, user_id: str, vector: Sequence[float], k: int) -> list[SearchHit]: ...


def declared_model_id(obj: object) -> str | None:
    """The id a model declares: its ``model_id``, ``model_name`` or ``model`` string attribute;
    None where it declares none (its class name is then all pbr knows, which two different
    models can share)."""
    for attr in ("model_id", "model_name", "model"):
        value = getattr(obj, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


def model_id_of(obj: object) -> str:
    """A model's identity, as pbr keys caches and records stores with it.

    Its ``model_id``, ``model_name`` or ``model`` string attribute, else its class name.
    """
    return declared_model_id(obj) or type(obj).__qualname__
