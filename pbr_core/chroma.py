"""What pbr knows about Chroma as a host store, whichever framework wraps it.

Both adapters write to and list a Chroma collection directly (an upsert by pbr's key, a listing
by owner), so both need the same two rules: how to recognise a framework's Chroma wrapper
without importing it (by class name and its ``_collection``), and which metadata Chroma can
store (flat scalars), checked before anything is written so a bad batch writes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .corpus import Record

__all__ = ["CHROMA_SCALARS", "check_flat_metadata", "collection_of", "upsert_in_batches"]

#: The metadata value types a Chroma collection stores.
CHROMA_SCALARS = (str, int, float, bool)

#: The framework classes that wrap a Chroma collection in ``_collection``.
_WRAPPERS = frozenset({"Chroma", "ChromaVectorStore"})
#: The packages those classes come from (top-level module names).
_PACKAGES = frozenset({"langchain_chroma", "langchain_community", "llama_index"})


def collection_of(store: object) -> Any | None:
    """The Chroma collection ``store`` wraps (LangChain's ``Chroma``, LlamaIndex's
    ``ChromaVectorStore``, or a subclass of either), or None for any other store. Recognised by
    class name along the class's bases, so that no framework or Chroma import is needed to ask
    (a subclass taken for an unknown store would leave pbr's history as the record: a delete
    made through the store would still reach the LLM's prompt)."""
    if any(
        cls.__name__ in _WRAPPERS and cls.__module__.split(".")[0] in _PACKAGES
        for cls in type(store).__mro__
    ):
        return getattr(store, "_collection", None)
    return None


def check_flat_metadata(records: Sequence[Record], noun: str = "item") -> None:
    """Raise ``ValueError`` naming the first record whose metadata Chroma cannot store as given:
    a value that is not str, int, float or bool, a float that is not finite (Chroma drops the
    key), an int outside 64 bits (it comes back a float), or a key that is empty or Chroma's
    own (``$...``, ``#...``, ``chroma:...``: refused by Chroma with no name). ``noun`` is what
    the framework calls a record."""
    for r in records:
        for name, value in r.metadata.items():
            why = _unstorable(name, value)
            if why:
                raise ValueError(
                    f"{noun} {r.item_id!r} of user {r.user_id!r}: Chroma cannot store metadata "
                    f"key {name!r} as given: {why}"
                )


def _unstorable(name: str, value: object) -> str:
    """Why Chroma cannot store ``name: value`` exactly ('' if it can)."""
    if not name or name.startswith(("$", "#", "chroma:")):
        return "the key is empty or reserved by Chroma ('$', '#', 'chroma:'); rename it"
    if not isinstance(value, CHROMA_SCALARS):
        return (
            f"its value is {type(value).__name__}; Chroma stores str, int, float or bool "
            "(convert it, e.g. to a JSON string)"
        )
    if isinstance(value, float) and not math.isfinite(value):
        return f"its value {value!r} is not a finite number (Chroma would drop the key)"
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return "its int does not fit 64 bits (Chroma would return a float); store it as a string"
    return ""


def upsert_in_batches(collection: Any, **columns: Sequence[Any]) -> None:
    """``collection.upsert(**columns)`` in slices of at most the server's ``max_batch_size``
    (5,461 rows on a local server): Chroma refuses a larger call whole. A failure part-way
    leaves the slices before it written, as a crash mid-write would: the next read lists them
    as the user's, and the same add retried overwrites them (upserts by key)."""
    n = len(next(iter(columns.values()), ()))
    limit = _max_batch(collection)
    for start in range(0, n, limit):
        collection.upsert(**{name: list(v[start : start + limit]) for name, v in columns.items()})


def _max_batch(collection: Any) -> int:
    try:
        return max(1, int(collection._client.get_max_batch_size()))
    except Exception:  # an older client, or a double without one: Chroma's local default
        return 5461
