"""Turning whatever an embedder returns into checked, L2-normalised float32 arrays.

Every vector that enters pbr_core passes through here, so the math downstream can assume finite,
unit-norm rows of one dimension (spec §1: "normalise explicitly; do not assume the model does it").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import EmbeddingError, call_unstopped
from .protocols import Embedder


def as_unit_rows(vectors: Any, *, dim: int | None = None, what: str = "embedding") -> np.ndarray:
    """Check and L2-normalise a batch of vectors; returns a new ``(n, d)`` float32 array.

    Raises:
        EmbeddingError: on a ragged or empty batch, NaN/inf values, an all-zero vector, or a
            dimension other than ``dim``.
    """
    try:
        arr = np.array(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"{what}: not a rectangular batch of numbers ({exc})") from exc
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise EmbeddingError(f"{what}: expected a batch of vectors, got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise EmbeddingError(
            f"{what}: dimension {arr.shape[1]} does not match the stored vectors' dimension "
            f"{dim}; use the same embedding model for history and queries"
        )
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        raise EmbeddingError(f"{what}: row(s) {np.flatnonzero(bad).tolist()} contain NaN or inf")
    zero = ~arr.any(axis=1)
    if zero.any():
        raise EmbeddingError(f"{what}: row(s) {np.flatnonzero(zero).tolist()} are all zeros")
    with np.errstate(over="ignore", under="ignore"):
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
    # float32 squares overflow above ~1e19 (the norm is inf: the row would become zeros) and
    # underflow below ~1e-19 (a norm of 0, or a wrong one): such rows are scaled to a largest
    # component of 1 first. Other rows are divided by their norm as computed.
    odd = ~np.isfinite(norms[:, 0]) | (norms[:, 0] < _SMALLEST_EXACT_NORM)
    if odd.any():
        rows = arr[odd] / np.abs(arr[odd]).max(axis=1, keepdims=True)
        arr[odd] = rows
        norms[odd] = np.linalg.norm(rows, axis=1, keepdims=True)
    arr /= norms
    return arr


#: Below this float32 norm, some of a row's squares may have underflowed (float32's smallest
#: normal number is ~1.2e-38, the square of ~1.1e-19).
_SMALLEST_EXACT_NORM = 1e-18


def as_unit_vector(vector: Any, *, dim: int | None = None, what: str = "embedding") -> np.ndarray:
    """One vector, checked and normalised (shape ``(d,)``)."""
    arr = np.asarray(vector, dtype=np.float32)
    if arr.ndim != 1:
        raise EmbeddingError(f"{what}: expected one vector, got shape {arr.shape}")
    return as_unit_rows(arr, dim=dim, what=what)[0]


def embed_documents(
    embedder: Embedder, texts: Sequence[str], *, dim: int | None = None
) -> np.ndarray:
    """Embed texts with any :class:`Embedder`; returns unit rows ``(len(texts), d)``."""
    if not texts:
        return np.zeros((0, dim or 0), dtype=np.float32)
    out = call_unstopped(embedder.embed_documents, list(texts))
    return _checked_batch(out, len(texts), dim)


def embed_query(embedder: Embedder, text: str, *, dim: int | None = None) -> np.ndarray:
    out = call_unstopped(embedder.embed_query, text)
    return as_unit_vector(out, dim=dim, what="query embedding")


async def aembed_documents(
    embedder: Embedder, texts: Sequence[str], *, dim: int | None = None
) -> np.ndarray:
    """Async twin of :func:`embed_documents`: native ``aembed_documents`` if the embedder has one,
    else the sync call in a worker thread (never blocking the event loop)."""
    if not texts:
        return np.zeros((0, dim or 0), dtype=np.float32)
    native = getattr(embedder, "aembed_documents", None)
    if native is not None:
        out = await native(list(texts))
    else:
        out = await asyncio.to_thread(call_unstopped, embedder.embed_documents, list(texts))
    return _checked_batch(out, len(texts), dim)


async def aembed_query(embedder: Embedder, text: str, *, dim: int | None = None) -> np.ndarray:
    native = getattr(embedder, "aembed_query", None)
    if native is not None:
        out = await native(text)
    else:
        out = await asyncio.to_thread(call_unstopped, embedder.embed_query, text)
    return as_unit_vector(out, dim=dim, what="query embedding")


def _checked_batch(out: Any, n: int, dim: int | None) -> np.ndarray:
    arr = as_unit_rows(out, dim=dim, what="document embeddings")
    if arr.shape[0] != n:
        raise EmbeddingError(f"the embedder returned {arr.shape[0]} vectors for {n} texts")
    return arr


def check_dimension(embedder: Embedder, dim: int | None, where: str) -> None:
    """Raise :class:`~pbr_core.errors.PersistenceError` unless ``embedder`` makes vectors of
    ``dim`` (the saved vectors' dimension; None: nothing saved yet, nothing to check).

    One embedding of a short probe text: paid at load, so that a wrong embedder fails there,
    with the saved folder named, rather than at the first query.
    """
    if dim is None:
        return
    from .errors import PersistenceError

    got = np.asarray(embedder.embed_query("pbr dimension check"), dtype=np.float32).reshape(-1)
    if got.shape[0] != dim:
        raise PersistenceError(
            f"{where} holds vectors of dimension {dim}, but the embedder makes vectors of "
            f"dimension {got.shape[0]}; load it with the embedding model that built it"
        )


def check_model(saved_model_id: str | None, embedder: Embedder | None, where: str) -> None:
    """Raise :class:`~pbr_core.errors.PersistenceError` unless ``embedder`` is the model that
    made the vectors ``where`` holds (``saved_model_id``; None: nothing recorded, nothing to
    check). Without an embedder the default MiniLM would embed the queries: it is checked
    (by its id alone: no model load). The one model check of every load path."""
    if saved_model_id is None:
        return
    from .errors import PersistenceError
    from .protocols import model_id_of

    if embedder is None:
        from .models import MiniLMEmbedder

        current, fix = MiniLMEmbedder.model_id, "pass the embedder that made them"
    else:
        current, fix = model_id_of(embedder), "pass the embedding model that made them"
    if current != saved_model_id:
        raise PersistenceError(
            f"{where} holds vectors of {saved_model_id!r}, but the embedder is {current!r}; "
            f"{fix} (or re-add the history with this one)"
        )
