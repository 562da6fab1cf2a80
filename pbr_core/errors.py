"""Exceptions with messages that say what was wrong and what to do about it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class PBRError(Exception):
    """Base class of every error raised on purpose by pbr_core."""


class UnknownUserError(PBRError, KeyError):
    """The user has no history in the store."""

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id
        super().__init__(
            f"user {user_id!r} has no history; add items for this user first "
            f"(Personalizer.add_texts({user_id!r}, [...]), or the retriever's add_documents / "
            "add_nodes)"
        )

    def __str__(self) -> str:  # KeyError would otherwise print the repr of the message
        return str(self.args[0])


class EmbeddingError(PBRError, ValueError):
    """An embedding was empty, NaN/inf, zero, or of the wrong dimension."""


class PersistenceError(PBRError, OSError):
    """A persisted folder is missing or damaged."""


class NonFiniteLogProbError(PBRError, FloatingPointError):
    """The language model produced NaN or ±inf log-probabilities, so no ranking can be trusted.

    Raised by salience scoring (:mod:`pbr_core.salience`), which re-exports it.
    """


class GenerationError(PBRError):
    """The LLM failed or its answer could not be used (raised only in strict mode)."""


class LLMTimeoutError(GenerationError, TimeoutError):
    """An LLM call took longer than ``PBRConfig.llm_timeout_s`` (raised only in strict mode;
    otherwise the term is dropped with this message as the reason).

    Attributes:
        timeout_s: the limit that was exceeded.
    """

    def __init__(self, message: str, timeout_s: float | None = None) -> None:
        self.timeout_s = timeout_s
        super().__init__(message)


class VectorStoreUnavailableError(PBRError, ConnectionError):
    """The host vector store (e.g. a Chroma server) could not be reached.

    Attributes:
        url: the address that did not answer (``scheme://host:port``), when the client said so.
    """

    def __init__(self, message: str, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


def call_unstopped(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, with a ``StopIteration`` it raises turned into a ``RuntimeError``.

    Why: a user's embedder or LLM raising ``StopIteration`` (``next()`` on an empty stream) is a
    failure, but inside pbr's step generators it would read as "done" (``personalize`` returning
    None), and set on a future that asyncio awaits it hangs the await for good.
    """
    try:
        return fn(*args)
    except StopIteration as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise RuntimeError(f"{name} raised StopIteration ({exc!r})") from exc
