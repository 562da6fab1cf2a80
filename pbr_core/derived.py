"""A user's derived state (anchors, BM25 index) as one checked blob, kept beside the rows.

Why: a worker that has never seen a user (a new process, an evicted user) must otherwise
rebuild what every other worker already built: the anchor's kNN graph and PageRank (about 26 ms
for 1k items, 384-d) and the BM25 index (about 6 ms), on top of reading the rows. A host store
that keeps this blob per user and per change token (:class:`pbr_core.postgres.PgRecords`) lets
the first worker to build it share it: the next cold worker reads it with the rows and serves
the user as if warm.

The blob is a cache, never a record: it is used only with the exact rows it was derived from
(the host's change token at which they were read, and a digest of those rows: each item's id,
host key, revision and vector, in order, so that a write the token missed, e.g. made while the
trigger was disabled, still makes it stale), by the same version of pbr; a blob that fails its
checksum, names another user or does not fit the rows is ignored (with a warning) and the state
rebuilt from the rows, which are the truth.

Layout: ``b"PBRD"``, a format byte, the sha256 of the rest, then the length of a JSON header
(4 bytes, little-endian), the header (user, item ids, anchor keys, each BM25 index's
parameters, analyzer and terms, and each array's name, stored type, shape and type) and the raw
bytes of those arrays: the anchors' (:func:`pbr_core.history_format.anchor_arrays`) and each
BM25 index's (:meth:`pbr_core.lexical.LexicalIndex.parts`), each in the narrowest type that
holds its values exactly (counts and positions unsigned, float32 weights as float32). Numbers
only, never a pickle; read in place, without an ``.npz`` container, whose per-array parsing
cost a cold read ~0.7 ms; ids and terms as one string each, one per line (a JSON list of
thousands of strings costs ~0.3 ms to parse).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from .anchor import AnchorResult
from .config import PBRConfig
from .fusion import MODE_TERMS
from .history_format import anchor_arrays, anchors_from_arrays
from .items import HistoryItem
from .lexical import DEFAULT_B, DEFAULT_K1, LexicalIndex, StemmerName
from .snapshot import AnchorKey, UserHistory

__all__ = [
    "CENTRAL_ITEMS",
    "DamagedState",
    "OtherVersion",
    "PackedState",
    "attach",
    "derive",
    "pack",
    "to_derive",
    "unpack",
]

try:  # which pbr derived a state: another version may tokenize or build anchors otherwise
    _PBR = importlib.metadata.version("personalize-before-retrieve")
except importlib.metadata.PackageNotFoundError:  # a source tree run without installing
    _PBR = "unknown"

_MAGIC = b"PBRD"
# 1: an .npz body; 2: at most one BM25 index, unstemmed; 3: the tokenizer cut words at their
# combining marks and did not normalise to NFC (a BM25 index's terms differ); 4: no host keys,
# anchor affinities or central items (what ranks a user without their vectors); 5: the host
# keys listed, the rows digest in the items' order, the item ids as a JSON list, arrays in
# their own types; 6: the tokenizer kept the dot of a lower-cased "İ" (a BM25 index's terms
# differ)
_FORMAT = 7
#: How many of each anchor's most central items a state keeps, for the explanations of requests
#: ranked without the user's rows (:mod:`pbr_core.view`; ``PBRConfig.top_anchor_items`` up to it).
CENTRAL_ITEMS = 10
_HEAD = len(_MAGIC) + 1 + 32


class DamagedState(ValueError):
    """A packed state that cannot be used for this user's rows (damaged, foreign or stale)."""


class OtherVersion(DamagedState):
    """A state packed by another version of pbr or in another format: expected for a while
    after an upgrade (every user's state written before it), not a sign of damage."""


def to_derive(history: UserHistory, config: PBRConfig, ranks: bool) -> tuple[bool, bool]:
    """(the anchor, the BM25 index) a request with ``config`` derives from ``history`` and has
    not built yet: the anchor where the fusion uses it, the index where pbr ranks (``ranks``)
    with a lexical leg."""
    anchor = bool(MODE_TERMS[config.fusion][0]) and len(history) >= 2
    lexical = ranks and config.search != "dense"
    return (
        anchor and not history.has_anchor(config),
        lexical and not history.has_lexical(config.lexical_stemmer),
    )


def derive(history: UserHistory, config: PBRConfig, anchor: bool, lexical: bool) -> None:
    """Build what :func:`to_derive` found missing (the async request path runs it in a worker
    thread, so a cold user's derivation never runs on the event loop)."""
    if anchor:
        history.anchor(config)
    if lexical:
        history.lexical(config.lexical_stemmer)


def rows_digest(keys: Sequence[str], stamps: Sequence[str]) -> str:
    """A digest of rows' keys and row versions (PostgreSQL's ``xmin``), in the given order: a
    row rewritten by any means, seen by a trigger or not, has another version."""
    raw = "\x00".join(keys) + "\x01" + "\x00".join(stamps)
    return hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def pack(
    history: UserHistory,
    basis: str,
    keys: Sequence[str] | None = None,
    stamps: Sequence[str] | None = None,
    token: str | None = None,
    window: int | None = None,
) -> bytes | None:
    """``history``'s built anchors and BM25 indexes (one per analyzer) as one blob, for rows of
    digest ``basis`` (the caller's, e.g. :meth:`pbr_core.corpus.Corpus`'s of the rows it read);
    None when it has built neither (nothing worth sharing).

    ``keys`` and ``stamps``: each item's host key and row version, in the items' order;
    ``token``: the host's change token of the rows; ``window``: the tokens the embedder read per
    text (None: no limit), which decided which items have windows. With the first three, where
    the items are in key order (code points, as a cold read puts them and the scored read
    sorts them) and no key repeats, the blob also holds what ranks the user without their vectors
    (:mod:`pbr_core.view`, which uses it only for exactly those rows, read by a worker whose
    embedder reads as much): :func:`rows_digest` of the keys and versions, each item's inner
    product with each anchor, and the most central items of each anchor, as the explanation
    lists them. The keys themselves are not kept: the rows that come with the state have
    them."""
    anchors = [(k, a) for k, a in list(history._anchors.items()) if a is not None]
    lexical = history.lexical_indexes()
    if not anchors and not lexical:
        return None
    entries, arrays = anchor_arrays(anchors, prefix="anchor")
    ids = [item.id for item in history.items]
    ranks = (
        keys is not None
        and stamps is not None
        and token is not None
        and len(keys) == len(stamps) == len(ids)
        and all(a < b for a, b in pairwise(keys))  # in key order, none repeated
    )
    header: dict[str, Any] = {
        "pbr": _PBR,
        "basis": basis,
        "user_id": history.user_id,
        "ids": _joined(ids),
        "dim": history.dim,
        "anchors": entries,
        "token": token if ranks else None,
        "rows": None,
        "window": window,
        "windowed": bool(history.windows),
        "central": {},
    }
    if ranks:
        assert keys is not None and stamps is not None
        header["rows"] = rows_digest(keys, stamps)
        central: set[int] = set()
        for i, (_, result) in enumerate(anchors):
            # float64: the view adds it to the database's cosine with q (float8)
            arrays[f"affinity{i}"] = np.asarray(history.vectors, dtype=np.float64) @ np.asarray(
                result.vector, dtype=np.float64
            )
            central.update(pos for pos, _ in result.top_items(CENTRAL_ITEMS))
        header["central"] = {str(p): history.items[p].to_dict() for p in sorted(central)}
    header["lexical"] = []
    for i, index in enumerate(lexical):
        terms, parts = index.parts()
        header["lexical"].append(
            {"k1": index.k1, "b": index.b, "stemmer": index.stemmer, "terms": _joined(terms)}
        )
        arrays.update({f"lexical{i}_{name}": array for name, array in parts.items()})
    # little-endian on every host, so a state packed on one is read on any other; each array in
    # the narrowest type that holds it exactly (counts and positions: a third of a 1k-item state)
    stored = [_narrowed(a) for a in arrays.values()]
    header["arrays"] = [
        [name, kept.dtype.str, list(array.shape), np.dtype(array.dtype).newbyteorder("<").str]
        for name, array, kept in zip(arrays, arrays.values(), stored)
    ]
    head = json.dumps(header).encode("utf-8")
    raw = [array.tobytes() for array in stored]
    body = b"".join([len(head).to_bytes(4, "little"), head, *raw])
    return _MAGIC + bytes([_FORMAT]) + hashlib.sha256(body).digest() + body


def _narrowed(array: np.ndarray) -> np.ndarray:
    """``array`` little-endian and in the narrowest type that holds its values exactly
    (:func:`_arrays` widens it back to the type it names): an integer one unsigned where none
    is negative, a ``float64`` one as ``float32`` where every value is one (the kNN graph's
    weights, float32 similarities: half of a state of real text's anchor)."""
    a = np.asarray(array)
    if a.dtype.kind in "iu" and a.size and int(a.min()) >= 0:
        top = int(a.max())
        for kind in ("|u1", "<u2", "<u4"):
            if top <= np.iinfo(np.dtype(kind)).max:
                return np.ascontiguousarray(a, dtype=kind)
    if a.dtype == np.float64 and np.array_equal(a.astype(np.float32), a):
        return np.ascontiguousarray(a, dtype="<f4")
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))


def _joined(terms: list[str]) -> str | list[str]:
    """Strings (a BM25 index's terms, item ids) as one, one per line (a JSON list of thousands
    of strings costs a cold request ~0.3 ms to parse); as the list where one holds a line
    break, or is the only one and empty (which would read back as none)."""
    if terms == [""] or any("\n" in term for term in terms):
        return terms
    return "\n".join(terms)


def _split(terms: Any) -> list[str]:
    """What :func:`_joined` wrote, as the list of terms."""
    if isinstance(terms, str):
        return terms.split("\n") if terms else []
    if not isinstance(terms, list):
        raise ValueError("terms that are neither a string nor a list")
    return terms


#: The element types a packed state may hold (numbers only: never an object array).
_DTYPES = frozenset({"<f4", "<f8", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8"})


def _header(body: memoryview) -> tuple[dict[str, Any], int]:
    """A state body's JSON header and where its arrays start."""
    size = int.from_bytes(body[:4], "little")
    header = json.loads(str(body[4 : 4 + size], "utf-8"))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return header, 4 + size


def _arrays(body: memoryview, listed: Any, offset: int) -> dict[str, np.ndarray]:
    """The arrays a header lists, copied out of the body in the type each names (aligned,
    writable, and not keeping the body alive); ``ValueError`` and its kin where the body does
    not hold them."""
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape, wanted in listed:
        if dtype not in _DTYPES or wanted not in _DTYPES:
            raise ValueError(f"array {name!r} of type {dtype!r} as {wanted!r}")
        if not (isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape)):
            raise ValueError(f"array {name!r} of shape {shape!r}")
        kind = np.dtype(dtype)
        count = math.prod(shape)  # exact (numpy's product would wrap a crafted huge shape)
        end = offset + count * kind.itemsize
        if end > len(body):
            raise ValueError(f"array {name!r} runs past the end of the state")
        view = np.frombuffer(body, dtype=kind, count=count, offset=offset)
        arrays[name] = view.reshape(shape).astype(np.dtype(wanted).newbyteorder("="))
        offset = end
    if offset != len(body):
        raise ValueError(f"{len(body) - offset} bytes after the arrays")
    return arrays


@dataclass(frozen=True)
class PackedState:
    """A packed state read back and checked (:func:`unpack`), not yet tied to any rows.

    Attributes:
        user_id, basis, ids, dim: whose, of which rows (digest), which items in which order.
        anchors: the anchors by graph parameters.
        lexical: the BM25 indexes built with today's ``k1`` and ``b``, one per analyzer.
        rows: :func:`rows_digest` of the rows it was derived from, whose keys are in the
            items' order (None: packed without them; then so are the next three).
        token: the host's change token of those rows.
        affinity: per anchor key, each item's inner product with that anchor.
        central: the most central items of each anchor by position.
        window: the tokens per text the deriving worker's embedder read (None: no limit).
        windowed: whether some item had windows (its dense score is not one vector's).
    """

    user_id: str
    basis: str
    ids: list[str]
    dim: int
    anchors: dict[AnchorKey, AnchorResult]
    lexical: list[LexicalIndex]
    rows: str | None
    token: str | None
    affinity: dict[AnchorKey, np.ndarray]
    central: dict[int, HistoryItem]
    window: int | None
    windowed: bool

    def lexical_for(self, stemmer: StemmerName | None) -> LexicalIndex | None:
        """The BM25 index built with ``stemmer`` (None: without stemming), if the state holds
        one."""
        for index in self.lexical:
            if index.stemmer == stemmer:
                return index
        return None


def unpack(blob: bytes, *, one_request: bool = False) -> PackedState:
    """A blob of :func:`pack`, every part checked (checksum, format, pbr version, shapes).

    ``one_request``: for a state that serves one request (:mod:`pbr_core.view`): its BM25
    index looks terms up in place (:meth:`LexicalIndex.from_parts` given one string).

    Raises:
        DamagedState: the blob is damaged, or of another format or pbr version (then
            :class:`OtherVersion`). Whatever a malformed blob raises is this error: the state
            is a cache.
    """
    data = memoryview(blob).cast("B")  # read in place: a 1k-item state is ~150 kB
    if len(data) < _HEAD or data[:4] != _MAGIC:
        raise DamagedState("not a packed state")
    if data[4] != _FORMAT:
        raise OtherVersion(f"packed in format {data[4]}, not {_FORMAT}")
    body = data[_HEAD:]
    if hashlib.sha256(body).digest() != data[5:_HEAD]:
        raise DamagedState("damaged (checksum mismatch)")
    try:
        header, start = _header(body)
        if header["pbr"] != _PBR:
            raise OtherVersion(f"derived by pbr {header['pbr']}, not {_PBR}")
        ids, dim = _split(header["ids"]), header["dim"]
        if not set(map(type, ids)) <= {str}:
            raise DamagedState("item ids that are not strings")
        if type(dim) is not int or dim < 1:
            raise DamagedState(f"a dimension of {dim!r}")
        n = len(ids)
        arrays = _arrays(body, header["arrays"], start)
        anchors = anchors_from_arrays(header["anchors"], arrays, n, dim, prefix="anchor")
        lexical = []
        if len({spec["stemmer"] for spec in header["lexical"]}) != len(header["lexical"]):
            raise DamagedState("two BM25 indexes of one analyzer")
        for i, spec in enumerate(header["lexical"]):
            if (spec["k1"], spec["b"]) != (DEFAULT_K1, DEFAULT_B):
                continue
            parts = {
                name: arrays[f"lexical{i}_{name}"] for name in ("indptr", "indices", "data", "dl")
            }
            index = LexicalIndex.from_parts(
                spec["terms"]
                if one_request and isinstance(spec["terms"], str)
                else _split(spec["terms"]),
                parts,
                k1=spec["k1"],
                b=spec["b"],
                stemmer=spec["stemmer"],
            )
            if len(index) != n:
                raise DamagedState("a BM25 index of another number of items")
            lexical.append(index)
        rows = header["rows"]
        affinity: dict[AnchorKey, np.ndarray] = {}
        central: dict[int, HistoryItem] = {}
        if rows is not None:
            for i, key in enumerate(anchors):
                values = arrays[f"affinity{i}"]
                if values.shape != (n,) or not np.isfinite(values).all():
                    raise DamagedState("anchor affinities of another shape, or not finite")
                affinity[key] = values.astype(np.float64)
            for pos, row in header["central"].items():
                item = HistoryItem.from_dict(row)
                if not 0 <= int(pos) < n or item.id != ids[int(pos)]:
                    raise DamagedState("a central item that is not the item at its position")
                central[int(pos)] = item
        return PackedState(
            user_id=str(header["user_id"]),
            basis=str(header["basis"]),
            ids=ids,
            dim=dim,
            anchors=anchors,
            lexical=lexical,
            rows=None if rows is None else str(rows),
            token=None if rows is None else str(header["token"]),
            affinity=affinity,
            central=central,
            window=header["window"] if type(header["window"]) is int else None,
            windowed=bool(header["windowed"]),
        )
    except DamagedState:
        raise
    except Exception as exc:  # anything a crafted or damaged blob makes numpy or json raise
        raise DamagedState(f"cannot be read ({type(exc).__name__}: {exc})") from exc


def attach(history: UserHistory, blob: bytes, basis: str) -> None:
    """Give ``history`` (just built from rows of digest ``basis``) the blob's anchors and BM25
    index, if the blob was derived from rows of that digest.

    A BM25 index is taken only if it was built with today's ``k1`` and ``b`` (what
    :meth:`UserHistory.lexical` would build); each is kept under its analyzer (stemmer), and
    anchors under their graph parameters, so any of those may be taken.

    Raises:
        DamagedState: the blob is damaged, of another format or pbr version (then
            :class:`OtherVersion`), of another user,
            or of other rows (digest, ids or order) than ``history``'s; ``history`` is left as
            it was.
    """
    state = unpack(blob)
    if state.user_id != history.user_id:
        raise DamagedState("the state of another user")
    if state.basis != basis:
        raise DamagedState("the state of other rows than the user's")
    if state.ids != [item.id for item in history.items] or state.dim != history.dim:
        raise DamagedState("the state of other items than the user's rows")
    history.adopt(state.anchors, state.lexical)
