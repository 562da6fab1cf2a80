"""Personalize Before Retrieve as a LlamaIndex long-term memory block.

:class:`PBRMemoryBlock` is a ``BaseMemoryBlock[str]`` for ``llama_index.core.memory.Memory``:
messages that ``Memory`` flushes out of its short-term queue are stored, one item per message,
in *one user's* corpus through pbr's core (:class:`~pbr_core.corpus.Corpus` over pbr's own
:class:`~pbr_core.HistoryStore`: no host vector store), and every ``Memory.get()`` recalls the
``similarity_top_k`` items pbr ranks best (hybrid dense + BM25 by default, optionally
personalized by an ``llm``) for a query made from the latest message.

One block serves one user: its ``user_id`` is required, checked and frozen. ``Memory`` passes
its ``session_id`` to every block; this block never keys, filters or partitions by it (the
class of bug of run-llama/llama_index#22701, where ``VectorMemoryBlock`` pinned every later
session to the first session's filter): a session id is at most recorded as provenance in an
item's metadata.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any, Literal

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.bridge.pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
)
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.prompts import BasePromptTemplate, PromptTemplate, RichPromptTemplate

from pbr_core import GenerationCache, HistoryItem, HistoryStore, PBRConfig, Personalizer
from pbr_core.adapters_support import check_positive_int, memory_config
from pbr_core.corpus import Corpus, check_user_id
from pbr_core.retrieval import Request, aretrieve
from pbr_core.snapshot import UserHistory

from ._bridge import (
    LlamaIndexEmbedder,
    LlamaIndexGenerator,
    default_embed_model,
    llamaindex_generator,
    settings_embed_model,
)

_log = logging.getLogger("pbr.memory")

__all__ = ["PBRMemoryBlock"]

#: How many items a block recalls per ``get`` (as ``VectorMemoryBlock``).
DEFAULT_MEMORY_TOP_K = 2
#: How many of the latest messages make the query: the latest alone. Measured on LoCoMo
#: (``benchmarks/agent_memory.py --windows``, the chat before a question simulated as the earlier
#: questions and their answers): R@5 0.518 with 1 message against 0.199 with the last 5
#: (``VectorMemoryBlock``'s default, this block's before #39), 625 wins / 68 losses, sign test
#: p = 1e-113; chosen on the tuning split (1 > 2 > 3 > 5), the same order on the test split.
DEFAULT_CONTEXT_WINDOW = 1
#: The metadata key of a stored message's role.
ROLE_KEY = "role"
#: The metadata key of the session a message was flushed from (provenance only, never a key).
SESSION_KEY = "session_id"

DEFAULT_MEMORY_TEMPLATE = RichPromptTemplate("{{ text }}")


def message_text(message: ChatMessage) -> str:
    """The text of a message: its text blocks joined by newlines, as ``ChatMessage.content``
    joins them (images, audio, tool calls dropped)."""
    return "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock))


def _storable(text: str) -> str:
    """``text`` as it can be saved (UTF-8): a lone surrogate (bytes decoded with
    ``errors="surrogateescape"``) becomes U+FFFD, with a warning. ``Memory`` flushes on its own
    and would retry the same messages on every later ``put``: refusing the flush, as an explicit
    add is refused, would make every later ``put`` of the conversation fail."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _log.warning("pbr: a message held text that is not UTF-8; stored with U+FFFD in its place")
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


class PBRMemoryBlock(BaseMemoryBlock[str]):
    """A long-term memory block whose recall is pbr's, for one user.

    Args:
        user_id: whose memory this block is (a non-empty string, required, frozen). Make one
            block (and one ``Memory``) per user; there is no shared default namespace.
        name: the block's name in ``Memory``'s template (default ``"PBRMemory"``).
        embed_model: embeds messages and queries; None = ``Settings.embed_model`` if set, else
            the embedded all-MiniLM-L6-v2 (needs the ``local`` extra).
        llm: the model of pbr's two P-PRF calls; None (default) = no LLM call, and ``config``
            defaults to ``PBRConfig(fusion="plain")``: a pure hybrid search of the user's items.
        config: pbr's parameters; default ``PBRConfig()`` with an ``llm``, else
            ``PBRConfig(fusion="plain")``. ``config.search`` picks ``"hybrid"`` (default),
            ``"dense"`` or ``"lexical"`` ranking.
        similarity_top_k: how many items one ``get`` recalls (default 2).
        retrieval_context_window: how many of the latest messages make the query, their text
            joined by spaces (default 1: the latest message alone, chosen by measurement; with
            ``VectorMemoryBlock``'s 5 the recent chat drowned the question: "what is my dog
            called?" after talk of trains missed "My dog is called Rex"; see
            :data:`DEFAULT_CONTEXT_WINDOW`).
        format_template: formats the recalled text (variable ``text``).
        prompt_style: ``"chat"`` / ``"completion"``; None = the llm's own.
        strict: raise instead of degrading when an LLM call fails.
        cache: optional cache of LLM answers.
        store: pbr's store of the items; None = a new, empty one. One store may hold several
            users' blocks (each block reads and writes its own user only).
        priority / accept_short_term_memory / description: ``BaseMemoryBlock``'s.

    Each recalled item is rendered as ``<message role='...'>text</message>``; items are joined
    by a blank line. The items live in process memory (``block.corpus``), one per message;
    :meth:`persist` saves them (atomically) and :meth:`from_persist_dir` resumes a user's block.
    """

    name: str = Field(default="PBRMemory", description="The name of the memory block.")
    user_id: str = Field(frozen=True, description="The one user this block stores and recalls.")
    embed_model: BaseEmbedding | None = Field(
        default=None, description="Embeds messages and queries (None: Settings or MiniLM)."
    )
    llm: LLM | None = Field(default=None, description="pbr's P-PRF model; None: no LLM call.")
    config: PBRConfig | None = Field(default=None, description="pbr's parameters.")
    similarity_top_k: int = Field(default=DEFAULT_MEMORY_TOP_K, description="Items per get.")
    retrieval_context_window: int = Field(
        default=DEFAULT_CONTEXT_WINDOW,
        description="How many of the latest messages make the query (default: the latest).",
    )
    format_template: BasePromptTemplate = Field(
        default=DEFAULT_MEMORY_TEMPLATE, description="Formats the recalled text (``text``)."
    )
    prompt_style: Literal["chat", "completion"] | None = Field(default=None)
    strict: bool = Field(default=False)
    cache: GenerationCache | None = Field(default=None, exclude=True)
    store: HistoryStore | None = Field(
        default=None,
        exclude=True,
        description="pbr's store of the items (None: a new one); see persist / from_persist_dir.",
    )

    _corpus: Corpus = PrivateAttr()
    _personalizer: Personalizer = PrivateAttr()
    _generator: LlamaIndexGenerator | None = PrivateAttr(default=None)
    _explanation: dict[str, Any] | None = PrivateAttr(default=None)

    @field_validator("user_id", mode="before")
    @classmethod
    def _check_user(cls, value: Any) -> str:
        return check_user_id(value)

    @field_validator("similarity_top_k", "retrieval_context_window", mode="before")
    @classmethod
    def _check_positive(cls, value: Any, info: ValidationInfo) -> int:
        # before pydantic's coercion: True or 2.0 is refused, as everywhere else
        return check_positive_int(value, str(info.field_name))

    @field_validator("format_template", mode="before")
    @classmethod
    def _template(cls, value: Any) -> Any:
        if isinstance(value, str):
            return RichPromptTemplate(value) if "{{" in value else PromptTemplate(value)
        return value

    def model_post_init(self, __context: Any) -> None:
        cfg = self.config = memory_config(self.config, self.llm is not None, "PBRMemoryBlock")
        if self.embed_model is None:
            self.embed_model = settings_embed_model() or default_embed_model(CallbackManager())
        embedder = LlamaIndexEmbedder(self.embed_model)
        self._corpus = Corpus(None, embedder=embedder, cache=self.store)
        # the store this block writes to, so another block can share it: store=block.store
        self.store = self._corpus.cache
        if self.llm is not None:
            self._generator = llamaindex_generator(self.llm, self.prompt_style)
        self._personalizer = Personalizer(
            generator=self._generator,
            corpus=self._corpus,
            config=cfg,
            cache=self.cache,
            strict=self.strict,
        )

    @classmethod
    def class_name(cls) -> str:
        return "PBRMemoryBlock"

    def persist(self, persist_dir: str | os.PathLike[str]) -> None:
        """Save the stored items and their vectors to the folder ``persist_dir`` (one snapshot made
        current atomically: a crash leaves the previous save loadable)."""
        self._corpus.cache.save(str(persist_dir))

    @classmethod
    def from_persist_dir(
        cls, persist_dir: str | os.PathLike[str], *, user_id: str, **kwargs: Any
    ) -> PBRMemoryBlock:
        """The block of ``user_id`` over a folder written by :meth:`persist`; ``kwargs`` are the
        block's fields. Refuses an ``embed_model`` of another model than the saved vectors'
        (default: ``Settings.embed_model`` if set, else the embedded MiniLM); a damaged folder is a
        ``PersistenceError`` naming it."""
        embed_model = kwargs.pop("embed_model", None)
        if embed_model is None:
            embed_model = settings_embed_model() or default_embed_model(CallbackManager())
        loaded = Corpus.load(persist_dir, LlamaIndexEmbedder(embed_model))
        return cls(user_id=user_id, embed_model=embed_model, store=loaded.cache, **kwargs)

    @property
    def corpus(self) -> Corpus:
        """pbr's corpus of this block's user (items: the stored messages)."""
        return self._corpus

    def history(self) -> UserHistory | None:
        """The user's stored messages as pbr's history (None before the first put)."""
        return self._corpus.history(self.user_id)

    def last_explanation(self) -> dict[str, Any] | None:
        """pbr's explanation of the latest recall (None before one, and after one that
        personalized nothing: no messages with text, or nothing stored): the query, fusion, terms,
        timings, ``degraded``, plus ``user``, ``mode`` and per result its ``id``, ``score`` and
        both legs' scores and ranks."""
        return None if self._explanation is None else dict(self._explanation)

    # -- BaseMemoryBlock ---------------------------------------------------------------------
    async def _aput(self, messages: list[ChatMessage]) -> None:
        """Store each message with text (its role and session in metadata) as one item."""
        now = time.time()
        items = []
        for message in messages:
            text = _storable(message_text(message))
            if not text.strip():
                continue  # empty, or no text content (an image, a bare tool call)
            metadata: dict[str, Any] = {ROLE_KEY: _storable(str(message.role.value))}
            session = message.additional_kwargs.get(SESSION_KEY)
            if isinstance(session, str):
                metadata[SESSION_KEY] = _storable(session)  # provenance only, never filtered by
            items.append(
                HistoryItem(id=uuid.uuid4().hex, text=text, metadata=metadata, timestamp=now)
            )
        if items:
            await self._corpus.aadd_many({self.user_id: items})

    async def _aget(
        self,
        messages: list[ChatMessage] | None = None,
        session_id: str | None = None,  # Memory's; deliberately unused (see the module doc)
        **block_kwargs: Any,
    ) -> str:
        """The user's best ``similarity_top_k`` items for the latest messages, as text."""
        self._explanation = None  # until this recall has one
        if not messages:
            return ""
        window = messages[-self.retrieval_context_window :]
        query = " ".join(t for t in (message_text(m) for m in window) if t)
        if not query.strip():
            return ""
        cfg = self.config
        assert cfg is not None  # set in model_post_init
        request = Request(
            self.user_id,
            query,
            self.similarity_top_k,
            config=cfg,
            generator=self._generator,
            strict=self.strict,
            skip_unknown=True,  # nothing stored yet: no recall, no LLM call
        )
        got = await aretrieve(self._corpus, request, self._personalizer.apersonalize)
        if got.query is None:
            return ""
        scored = got.results
        self._explanation = got.payload(
            user=self.user_id,
            results=[
                {"id": s.hit.id, "score": float(s.hit.score), **(s.hit.legs or {})} for s in scored
            ],
        )
        if not scored:
            return ""
        text = "\n\n".join(
            f"<message role='{s.hit.metadata.get(ROLE_KEY, 'user')}'>{s.hit.text}</message>"
            for s in scored
        )
        return self.format_template.format(text=text)
