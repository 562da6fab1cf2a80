"""What one history item is, and the checks every item passes before anything stores it.

Owns :class:`HistoryItem`, the batch rules (:func:`check_batch`, :func:`check_ids`), the rule
that an item can be saved exactly as given (:func:`check_serialisable`) and the check of an item's
window vectors. One module for core and adapters alike, so a batch is refused by the same rule
wherever it arrives, before anything (pbr's history or the host store) is written.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from .errors import EmbeddingError
from .vectors import as_unit_rows

__all__ = [
    "HistoryItem",
    "check_batch",
    "check_ids",
    "check_serialisable",
    "checked_windows",
    "copy_metadata",
    "id_or_new",
    "is_no_id",
]


def checked_windows(windows: Any, dim: int, what: str) -> np.ndarray:
    """An item's window vectors checked like item vectors (finite, non-zero, the store's
    dimension, normalised), and at least one: a bad window would poison every query's dense
    score of the item and make the saved folder unloadable."""
    rows = as_unit_rows(windows, dim=dim, what=what)
    if rows.shape[0] == 0:
        raise EmbeddingError(f"{what}: no window vectors (omit the item from windows instead)")
    return rows


def check_batch(values: Iterable[Any], what: str) -> list[Any]:
    """``values`` as a list, elements as given: the one rule for a batch of ids or texts.

    A bare string is refused, not iterated: ``delete(user, "xy")`` would otherwise remove the
    items ``"x"`` and ``"y"``, and ``add_texts(user, "hello")`` store five one-letter items.
    """
    if isinstance(values, str | bytes):
        raise TypeError(
            f"{what} must be a list of strings, got the single string {values!r}; pass [{values!r}]"
        )
    return list(values)


def is_no_id(given: object) -> bool:
    """Whether ``given`` is no id: None and ``""``, as LangChain's stores read an empty
    ``Document.id`` or ``ids`` entry (a write makes a new one, :func:`id_or_new`)."""
    return given is None or given == ""


def id_or_new(given: object) -> str:
    """The id of an item being written: ``given`` as a string, or a new one (a uuid4 hex) where
    none was given (:func:`is_no_id`): no item is stored under an empty id, or under the string
    ``"None"``."""
    return uuid.uuid4().hex if is_no_id(given) else str(given)


def check_ids(ids: Iterable[str], what: str = "ids") -> list[str]:
    """``ids`` as a list of strings (see :func:`check_batch`), core and adapters."""
    return [str(i) for i in check_batch(ids, what)]


@dataclass(frozen=True)
class HistoryItem:
    """One item of a user's history (a chat turn, a session, a note, a purchase).

    Attributes:
        id: unique within the user.
        text: what gets embedded and shown to the LLM.
        metadata: anything JSON-serialisable the host wants back.
        timestamp: POSIX seconds, used to order items chronologically (optional).
    """

    id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    timestamp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "metadata": dict(self.metadata),
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> HistoryItem:
        return cls(
            id=str(row["id"]),
            text=str(row["text"]),
            metadata=dict(row.get("metadata") or {}),
            timestamp=row.get("timestamp"),
        )


def copy_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of JSON-like ``metadata`` that shares no dict or list with it: what pbr keeps of
    a caller's item, and what a result hands out, so that neither side's later change of a
    nested value reaches the other (or a save). Scalars are shared (immutable)."""
    return {key: _copy_value(value) for key, value in metadata.items()}


def _copy_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _copy_value(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy_value(v) for v in value)
    return value


def _where(item: HistoryItem, user_id: str) -> str:
    """How an error names an item (built only for an error: a check of every item of a cold
    read must not format one string per item)."""
    return f"item {item.id!r} of user {user_id!r}"


def _plain_dict(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` as the dict :meth:`HistoryItem.to_dict` writes, without copying a dict."""
    return metadata if type(metadata) is dict else dict(metadata)


def check_one_history(items: Sequence[HistoryItem]) -> None:
    """Raise ``ValueError`` unless a batch of saveable items (:func:`check_serialisable`) can be
    one user's: each id once, each text holding something to embed. The history's rules, run
    by :meth:`~pbr_core.history.HistoryStore.upsert` and, before anything is embedded, by a
    corpus write."""
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        counts = Counter(ids)
        raise ValueError(
            f"duplicate item ids in one batch: {sorted(i for i in counts if counts[i] > 1)}"
        )
    for item in items:
        if not item.text or not item.text.strip():
            raise ValueError(f"item {item.id!r} has empty text")


def check_serialisable(user_id: str, items: Iterable[HistoryItem]) -> None:
    """Raise ``ValueError`` unless ``user_id`` and every item can be saved exactly as given.

    A save writes one folder for all users, so a single unsaveable value (a lone surrogate from
    bytes decoded with ``errors="surrogateescape"``, a ``datetime`` in metadata, a NaN
    timestamp) would make every later :meth:`~pbr_core.history.HistoryStore.save` fail, for
    everyone. This check runs in :meth:`~pbr_core.history.HistoryStore.upsert` before anything
    changes; an adapter calls it too before it writes the items to its host vector store, so a
    rejected batch is written nowhere.

    Rules: the user id, item ids and texts are strings encodable as UTF-8; metadata is a mapping
    with string keys (at any depth: JSON would turn ``1`` into ``"1"``, and ``{1: .., "1": ..}``
    into one key) and values JSON can hold (str, int, float, bool, None, lists and dicts of
    them; a tuple is saved as a list), UTF-8 encodable; a timestamp is a finite
    ``int``/``float`` (POSIX seconds) or None.

    Raises:
        ValueError: naming the user, the item and the field, and saying how to fix it.
    """
    _check_utf8(user_id, f"user id {user_id!r}")
    items = list(items)
    for n, item in enumerate(items):
        if not isinstance(item, HistoryItem):
            raise ValueError(
                f"item {n} for user {user_id!r} is a {type(item).__name__}, not a HistoryItem"
            )
        if not isinstance(item.id, str):
            raise ValueError(
                f"item {n} for user {user_id!r} has a {type(item.id).__name__} id {item.id!r}; "
                "ids are strings: pass str(id)"
            )
        if not isinstance(item.text, str):
            raise ValueError(
                f"{_where(item, user_id)} has a {type(item.text).__name__} text; the text must "
                "be a string"
            )
        if item.timestamp is not None:
            _check_timestamp(item.timestamp, _where(item, user_id))
        if not isinstance(item.metadata, Mapping):
            raise ValueError(
                f"{_where(item, user_id)} has metadata of type {type(item.metadata).__name__}; "
                "pass a dict"
            )
    for item in items:
        _check_metadata_shape(item.metadata, item, user_id)
    try:  # the fast path: every item's fields as save() will write them, in one encoder call
        rows = [(i.id, i.text, _plain_dict(i.metadata), i.timestamp) for i in items]
        _check_encoder.encode(rows).encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        for item in items:  # find the first item that cannot be saved, and say why
            try:
                _check_encoder.encode(item.to_dict()).encode("utf-8")
            except (TypeError, ValueError, RecursionError):
                _explain_unserialisable(item, _where(item, user_id))
        # every item encodes on its own (the list's one more level of nesting failed): fine


#: How deep an item's metadata may nest (dicts and lists, the metadata itself the first level).
#: JSON's encoder and decoder recurse: near the interpreter's recursion limit (~1,000 levels)
#: whether a save or a load of such a value succeeds depends on how deep the caller's stack is.
MAX_METADATA_DEPTH = 100


def _check_metadata_shape(metadata: object, item: HistoryItem, user_id: str) -> None:
    """Raise ``ValueError`` at the first dict key in ``metadata`` (at any depth) that is not a
    string, or where it nests deeper than :data:`MAX_METADATA_DEPTH`. Iterative: any depth is
    read without recursion."""
    stack: list[tuple[object, int]] = [(metadata, 1)]
    while stack:
        current, depth = stack.pop()
        inner: Iterable[object]
        if isinstance(current, Mapping):
            for key in current:
                if not isinstance(key, str):
                    raise ValueError(
                        f"metadata of {_where(item, user_id)} has the {type(key).__name__} key "
                        f"{key!r}; keys are strings (JSON would save it as a string, and merge "
                        "it with an equal one): pass str(key)"
                    )
            inner = current.values()
        elif isinstance(current, list | tuple):
            inner = current
        else:
            continue
        if depth > MAX_METADATA_DEPTH:
            raise ValueError(
                f"metadata of {_where(item, user_id)} nests deeper than {MAX_METADATA_DEPTH} "
                "levels of dicts and lists; flatten it (JSON's encoder and decoder recurse, so "
                "such a value could be saved and then not loaded)"
            )
        stack.extend((v, depth + 1) for v in inner if isinstance(v, Mapping | list | tuple))


class _Unserialisable(TypeError):
    def __init__(self, value: object) -> None:
        self.value = value
        super().__init__(f"{type(value).__name__} is not JSON-serialisable")


def _refuse(value: object) -> Any:
    raise _Unserialisable(value)


# Like the encoder of save(), plus circular-reference detection and a hook naming the culprit.
_check_encoder = json.JSONEncoder(ensure_ascii=False, check_circular=True, default=_refuse)


def _check_utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start] if isinstance(exc.object, str) else "?"
        raise ValueError(
            f"{what} is not valid Unicode: it holds the lone surrogate {bad!r} at position "
            f"{exc.start} (typically bytes decoded with errors='surrogateescape'), which cannot "
            "be saved as UTF-8; decode the source bytes with the right encoding, or clean the "
            "string with s.encode('utf-8', 'replace').decode('utf-8')"
        ) from None


def _check_timestamp(timestamp: object, where: str) -> None:
    if timestamp is None:
        return
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise ValueError(
            f"{where} has a timestamp of type {type(timestamp).__name__} ({timestamp!r}); pass "
            "POSIX seconds as a float (e.g. float(value), or value.timestamp() for a datetime) "
            "or None"
        )
    try:
        finite = math.isfinite(timestamp)
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError(
            f"{where} has the timestamp {timestamp!r}; pass finite POSIX seconds or None"
        )


def _explain_unserialisable(item: HistoryItem, where: str) -> NoReturn:
    """Raise a ValueError naming what in ``item`` :func:`check_serialisable` refused."""
    _check_utf8(item.id, f"the id of {where}")
    _check_utf8(item.text, f"the text of {where}")
    for key, value in item.metadata.items():
        field_name = f"metadata[{key!r}] of {where}"
        try:
            _check_encoder.encode({key: value}).encode("utf-8")
        except _Unserialisable as exc:
            culprit = exc.value
            if isinstance(culprit, (_dt.datetime, _dt.date, _dt.time)):
                advice = (
                    "convert it to an ISO string (value.isoformat()) or POSIX seconds "
                    "(value.timestamp())"
                )
            elif type(culprit).__module__ == "numpy":
                advice = "convert it to a Python value (value.item() or value.tolist())"
            else:
                advice = "convert it to str, int, float, bool, None, or a list or dict of them"
            what = "is" if culprit is value else "holds"
            raise ValueError(
                f"{field_name} {what} a {type(culprit).__module__}.{type(culprit).__qualname__}"
                f" ({culprit!r}), which JSON cannot hold; {advice}"
            ) from None
        except UnicodeEncodeError:
            _check_utf8(str(key), f"the key of {field_name}")
            _find_surrogate(value, field_name)
        except ValueError as exc:  # "Circular reference detected"
            raise ValueError(
                f"{field_name} cannot be saved as JSON ({exc}); pass a plain copy without "
                "references to itself"
            ) from None
        except (TypeError, RecursionError) as exc:  # keys JSON cannot hold, too deep nesting
            raise ValueError(
                f"{field_name} cannot be saved as JSON ({exc}); use string keys and plain "
                "values (str, int, float, bool, None, lists and dicts of them)"
            ) from None
    raise ValueError(f"{where} cannot be saved as JSON; pass plain strings and a plain dict")


def _find_surrogate(value: object, where: str) -> None:
    """Raise the lone-surrogate ValueError for the first string in ``value`` that holds one."""
    if isinstance(value, str):
        _check_utf8(value, where)
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            _check_utf8(str(key), f"a key in {where}")
            _find_surrogate(inner, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, inner in enumerate(value):
            _find_surrogate(inner, f"{where}[{i}]")
    _check_utf8(_check_encoder.encode(value), where)
