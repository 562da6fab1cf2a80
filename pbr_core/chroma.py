"""What pbr knows about Chroma as a host store, whichever framework wraps it.

Both adapters write to and list a Chroma collection directly (an upsert by pbr's key, a listing
by owner), so both need the same two rules: how to recognise a framework's Chroma wrapper
without importing it (by class name and its ``_collection``), and which metadata Chroma can
store (flat scalars), checked before anything is written so a bad batch writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .corpus import Record

__all__ = ["CHROMA_SCALARS", "check_flat_metadata", "collection_of"]

#: The metadata value types a Chroma collection stores.
CHROMA_SCALARS = (str, int, float, bool)

#: The framework classes that wrap a Chroma collection in ``_collection``.
_WRAPPERS = frozenset({"Chroma", "ChromaVectorStore"})


def collection_of(store: object) -> Any | None:
    """The Chroma collection ``store`` wraps (LangChain's ``Chroma``, LlamaIndex's
    ``ChromaVectorStore``), or None for any other store. Recognised by class name, so that no
    framework or Chroma import is needed to ask."""
    if type(store).__name__ in _WRAPPERS:
        return getattr(store, "_collection", None)
    return None


def check_flat_metadata(records: Sequence[Record], noun: str = "item") -> None:
    """Raise ``ValueError`` naming the first record whose metadata Chroma cannot store (a value
    that is not str, int, float or bool). ``noun`` is what the framework calls a record."""
    for r in records:
        for name, value in r.metadata.items():
            if not isinstance(value, CHROMA_SCALARS):
                raise ValueError(
                    f"{noun} {r.item_id!r} of user {r.user_id!r}: Chroma stores metadata values "
                    f"of type str, int, float or bool; {name!r} is {type(value).__name__} "
                    "(convert it, e.g. to a JSON string)"
                )
