"""pbr_core.derived: a user's anchors and BM25 index packed into one checked blob, taken only
by a history of exactly the items they were derived from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pbr_core import HistoryItem, PBRConfig
from pbr_core.derived import DamagedState, OtherVersion, attach, pack, rows_digest, unpack
from pbr_core.lexical import LexicalIndex
from pbr_core.snapshot import UserHistory

CONFIG = PBRConfig()
BASIS = "digest-of-the-rows"  # what the caller computes from the rows it read


def _history(user: str = "alice", order: list[int] | None = None) -> UserHistory:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [f"note {i} about {'tea' if i % 3 else 'trains'} and item{i}" for i in range(30)]
    rows = order if order is not None else list(range(30))
    items = [HistoryItem(id=f"i{j}", text=texts[j]) for j in rows]
    return UserHistory(user, items, vectors[rows], version=1)


def _built() -> UserHistory:
    history = _history()
    history.anchor(CONFIG)
    history.lexical()
    return history


def test_a_history_that_built_nothing_has_nothing_to_pack() -> None:
    assert pack(_history(), BASIS) is None


def test_the_same_items_take_the_anchor_and_the_index_without_building_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _built()
    blob = pack(built, BASIS)
    assert blob is not None
    fresh = _history()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("rebuilt instead of taken")

    monkeypatch.setattr("pbr_core.snapshot.compute_anchor", refuse)
    monkeypatch.setattr(LexicalIndex, "build", classmethod(lambda cls, *a, **k: refuse()))
    attach(fresh, blob, BASIS)
    anchor, original = fresh.anchor(CONFIG), built.anchor(CONFIG)
    assert anchor is not None and original is not None
    assert np.array_equal(anchor.vector, original.vector)
    assert np.array_equal(anchor.pagerank, original.pagerank)
    assert (anchor.graph != original.graph).nnz == 0
    for query in ("tea", "trains item7", "nothing here"):
        assert np.array_equal(fresh.lexical().scores(query), built.lexical().scores(query))


def test_every_analyzers_index_is_shared_and_taken_under_its_own_analyzer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _built()
    built.lexical("english")
    blob = pack(built, BASIS)
    assert blob is not None
    fresh = _history()
    monkeypatch.setattr(
        LexicalIndex, "build", classmethod(lambda cls, *a, **k: pytest.fail("rebuilt"))
    )
    attach(fresh, blob, BASIS)
    assert {index.stemmer for index in fresh.lexical_indexes()} == {None, "english"}
    for stemmer in (None, "english"):
        for query in ("trained", "item7 teas"):
            assert np.array_equal(
                fresh.lexical(stemmer).scores(query), built.lexical(stemmer).scores(query)
            )
    assert fresh.lexical("english").scores("trained").any()  # "trains" and "trained": "train"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b[:-7] + bytes([b[-7] ^ 0xFF]) + b[-6:], "checksum"),
        (lambda b: b[:200], "checksum"),
        (lambda b: b"XXXX" + b[4:], "not a packed state"),
        (lambda b: b"", "not a packed state"),
    ],
)
def test_a_damaged_blob_is_refused_and_leaves_the_history_as_it_was(
    damage: object, reason: str
) -> None:
    blob = pack(_built(), BASIS)
    assert blob is not None
    fresh = _history()
    with pytest.raises(DamagedState, match=reason):
        attach(fresh, damage(blob), BASIS)  # type: ignore[operator]
    assert fresh._anchors == {} and not fresh.lexical_indexes()


def test_another_users_or_other_items_state_is_refused() -> None:
    blob = pack(_built(), BASIS)
    assert blob is not None
    with pytest.raises(DamagedState, match="another user"):
        attach(_history(user="bob"), blob, BASIS)
    with pytest.raises(DamagedState, match="other items"):
        attach(_history(order=[1, 0, *range(2, 30)]), blob, BASIS)  # same items, another order
    with pytest.raises(DamagedState, match="other items"):
        attach(_history(order=list(range(29))), blob, BASIS)  # one item fewer


def test_a_lexical_index_whose_parts_do_not_fit_is_refused() -> None:
    terms, parts = LexicalIndex.build(["tea time", "trains"]).parts()
    good = LexicalIndex.from_parts(terms, parts, k1=1.5, b=0.75, stemmer=None)
    assert len(good) == 2
    bad = dict(parts, indices=np.array([0, 5, 1], dtype=np.int32))  # a row that is not there
    with pytest.raises(ValueError, match="do not fit"):
        LexicalIndex.from_parts(terms, bad, k1=1.5, b=0.75, stemmer=None)
    with pytest.raises(ValueError, match="do not fit"):
        LexicalIndex.from_parts([*terms, "extra"], parts, k1=1.5, b=0.75, stemmer=None)


def test_terms_given_as_one_string_are_looked_up_in_place_and_score_alike() -> None:
    """What a request ranked in the database builds (terms one per line, never split): the
    same scores and ceilings, and the same refusal of parts that do not fit."""
    texts = ["tea at night", "trains and tea", "green tea", "bikes", ""]
    index = LexicalIndex.build(texts)
    terms, parts = index.parts()
    lazy = LexicalIndex.from_parts("\n".join(terms), parts, k1=index.k1, b=index.b, stemmer=None)
    for query in ["tea", "trains bikes", "nothing here", "tea night green", "bike"]:
        assert np.array_equal(lazy.scores(query), index.scores(query))
        assert lazy.ceiling(query) == index.ceiling(query)
    assert list(lazy.parts()[0]) == terms and len(lazy) == len(texts)
    with pytest.raises(ValueError, match="do not fit"):
        LexicalIndex.from_parts(
            "\n".join([*terms, "extra"]), parts, k1=index.k1, b=index.b, stemmer=None
        )
    empty_terms, empty_parts = LexicalIndex.build(["", ""]).parts()
    empty = LexicalIndex.from_parts("", empty_parts, k1=index.k1, b=index.b, stemmer=None)
    assert empty_terms == [] and empty.scores("").tolist() == [0.0, 0.0]


def _fractional(parts: dict[str, np.ndarray]) -> None:
    parts["data"] = parts["data"].astype(np.float64)
    parts["data"][0] = 0.5  # a count that is not a whole number


def _past_int32(parts: dict[str, np.ndarray]) -> None:
    parts["data"] = parts["data"].astype(np.uint64) * (2**32 - 1)  # would wrap to -1


def _lengths_off(parts: dict[str, np.ndarray]) -> None:
    parts["dl"] = parts["dl"] + 1  # lengths that are not the sums of the counts


def _a_row_twice(parts: dict[str, np.ndarray]) -> None:
    parts["indices"][1] = 0  # "tea" lists item 0 twice


@pytest.mark.parametrize("edit", [_fractional, _past_int32, _lengths_off, _a_row_twice])
def test_lexical_parts_whose_counts_do_not_add_up_are_refused(
    edit: Callable[[dict[str, np.ndarray]], None],
) -> None:
    """Parts with the right shapes but counts no index could have (before, each was read and
    scored wrong without a word)."""
    terms, parts = LexicalIndex.build(["tea time", "tea trains"]).parts()
    assert terms[0] == "tea" and parts["indices"][:2].tolist() == [0, 1]
    bad = {name: np.array(array) for name, array in parts.items()}
    edit(bad)
    with pytest.raises(ValueError, match="do not fit"):
        LexicalIndex.from_parts(terms, bad, k1=1.5, b=0.75, stemmer=None)


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: a["anchor0_data"].__setitem__(3, np.nan),
        lambda a: a.__setitem__("anchor0_data", -a["anchor0_data"]),
        lambda a: a["anchor0_pagerank"].__setitem__(slice(None), -1.0),
        lambda a: a["anchor0_pagerank"].__setitem__(0, a["anchor0_pagerank"][0] + 0.5),
        lambda a: a["anchor0_indptr"].__setitem__(1, a["anchor0_indptr"][2] + 1),
    ],
    ids=[
        "nan-weight",
        "negative-weights",
        "negative-pagerank",
        "pagerank-not-a-distribution",
        "indptr-down",
    ],
)
def test_an_anchor_whose_values_are_not_an_anchors_is_refused(
    edit: Callable[[dict[str, np.ndarray]], None],
) -> None:
    """Shapes alone let a NaN edge weight or a negative PageRank through, to surface later as a
    NaN anchor or a failed query: each is refused when read."""
    from pbr_core.history_format import anchor_arrays, anchors_from_arrays

    built = _built()
    entries, arrays = anchor_arrays(list(built._anchors.items()), prefix="anchor")
    assert anchors_from_arrays(entries, arrays, 30, 8, "anchor")  # as written: taken
    copies = {name: np.array(array) for name, array in arrays.items()}
    edit(copies)
    with pytest.raises(ValueError, match="does not fit"):
        anchors_from_arrays(entries, copies, 30, 8, "anchor")


def test_a_state_of_other_rows_or_another_pbr_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = pack(_built(), BASIS)
    assert blob is not None
    with pytest.raises(DamagedState, match="other rows"):
        attach(_history(), blob, "the digest of rows changed since")
    with pytest.raises(DamagedState, match="not a packed state") as garbage:
        attach(_history(), b"PNG" + blob[3:], BASIS)
    assert not isinstance(garbage.value, OtherVersion)  # damage, not an upgrade
    # an .npz body; at most one BM25 index, unstemmed; words cut at their combining marks; no
    # host keys, affinities or central items; host keys listed and arrays in their own types;
    # the dot of a lower-cased "İ" kept
    for older in (1, 2, 3, 4, 5, 6):
        with pytest.raises(OtherVersion, match=f"packed in format {older}, not 7"):
            attach(_history(), blob[:4] + bytes([older]) + blob[5:], BASIS)
    monkeypatch.setattr("pbr_core.derived._PBR", "9.9.9")
    with pytest.raises(OtherVersion, match="derived by pbr"):
        attach(_history(), blob, BASIS)


def test_a_states_arrays_are_copied_out_aligned_and_little_endian_on_disk() -> None:
    """Read arrays own their memory (aligned, writable, native order) instead of viewing the
    blob, which they would keep alive uncounted by the cache budget; packed little-endian."""
    from pbr_core.derived import _arrays, _header

    blob = pack(_built(), BASIS)
    assert blob is not None
    body = memoryview(blob)[37:]
    header, start = _header(body)
    assert all(dtype[0] in "<|" for _, dtype, _, _ in header["arrays"])
    for array in _arrays(body, header["arrays"], start).values():
        assert array.flags.owndata and array.flags.aligned and array.flags.writeable
        assert array.dtype.isnative


def test_counts_and_positions_are_stored_narrow_and_read_back_in_their_own_types() -> None:
    """A third of a 1k-item state is BM25 counts and positions: each stored in the narrowest
    unsigned type that holds it, and read back as the type it was built in; float64 values
    that are float32 (the graph's weights) as float32, any other float64 (PageRank) as is."""
    from pbr_core.derived import _arrays, _header

    built = _built()
    blob = pack(built, BASIS)
    assert blob is not None
    body = memoryview(blob)[37:]
    header, start = _header(body)
    stored = {name: (kept, wanted) for name, kept, _, wanted in header["arrays"]}
    assert stored["lexical0_data"] == ("|u1", "<i4")  # term counts of short notes
    assert stored["lexical0_indices"][0] == "|u1"  # 30 items
    assert stored["anchor0_data"] == ("<f4", "<f8")  # float32 similarities
    assert stored["anchor0_pagerank"] == ("<f8", "<f8")
    read = _arrays(body, header["arrays"], start)
    anchor = built.anchor(CONFIG)
    assert anchor is not None
    assert np.array_equal(read["anchor0_data"], anchor.graph.tocsr().data)
    assert np.array_equal(read["anchor0_pagerank"], anchor.pagerank)
    _, parts = built.lexical().parts()
    for name, array in parts.items():
        assert read[f"lexical0_{name}"].dtype == array.dtype
        assert np.array_equal(read[f"lexical0_{name}"], array)


def test_only_rows_in_key_order_with_distinct_keys_make_a_state_that_ranks_without_vectors() -> (
    None
):
    """What ranks a user in the database is kept only for rows the state can be lined up
    with as the database returns them (key order) and told apart (distinct keys)."""
    built = _built()
    keys = [f"k{i:03d}" for i in range(len(built))]
    stamps = [str(700 + i) for i in range(len(built))]
    state = unpack(pack(built, BASIS, keys, stamps, "token-1") or b"")
    assert state.rows == rows_digest(keys, stamps) and state.token == "token-1"
    assert set(state.affinity) == set(state.anchors) and state.central
    for other in (keys[::-1], [keys[0], *keys[:-1]]):  # another order; a key repeated
        plain = unpack(pack(built, BASIS, other, stamps, "token-1") or b"")
        assert plain.rows is None and plain.token is None and not plain.affinity
        assert plain.lexical and plain.anchors  # still shared with cold readers


def test_a_history_of_one_item_with_an_empty_id_is_taken_back() -> None:
    """Ids are kept as one string, one per line: a lone empty id must not read back as none."""
    history = UserHistory("alice", [HistoryItem(id="", text="tea")], np.ones((1, 8)), version=1)
    history.lexical()
    blob = pack(history, BASIS)
    assert blob is not None
    assert unpack(blob).ids == [""]
    fresh = UserHistory("alice", [HistoryItem(id="", text="tea")], np.ones((1, 8)), version=1)
    attach(fresh, blob, BASIS)
    assert len(fresh.lexical_indexes()) == 1  # taken, not rebuilt


def _crafted(blob: bytes, edit: Callable[[dict[str, Any]], None], tail: bytes = b"") -> bytes:
    """``blob`` with its JSON header edited (and bytes appended), checksum made to match:
    what anyone who may write the table could store."""
    import hashlib
    import json

    body = blob[37:]
    size = int.from_bytes(body[:4], "little")
    header = json.loads(body[4 : 4 + size])
    edit(header)
    head = json.dumps(header).encode()
    body = len(head).to_bytes(4, "little") + head + body[4 + size :] + tail
    return blob[:5] + hashlib.sha256(body).digest() + body


def test_whatever_a_malformed_blob_raises_is_a_damaged_state() -> None:
    """A blob that passes its checksum (anyone who may write the table can make one) but holds
    values numpy or the anchor cannot take: still DamagedState, never another error."""
    built = _built()
    blob = pack(built, BASIS)
    assert blob is not None

    def overflow(header: dict[str, Any]) -> None:
        header["anchors"][0]["iterations"] = float("inf")  # int(inf): OverflowError

    crafted = _crafted(blob, overflow)
    fresh = _history()
    with pytest.raises(DamagedState, match="OverflowError"):
        attach(fresh, crafted, BASIS)
    assert fresh._anchors == {}


@pytest.mark.parametrize(
    ("edit", "tail", "why"),
    [
        (lambda h: h["arrays"][0].__setitem__(1, "|O"), b"", "type '\\|O'"),
        (lambda h: h["arrays"][0].__setitem__(2, [10**9]), b"", "past the end"),
        (lambda h: None, b"\x00" * 8, "8 bytes after the arrays"),
        (lambda h: h["arrays"][0].__setitem__(2, [-2, -3]), b"", "of shape"),
        (lambda h: h["arrays"][0].__setitem__(2, [2.5]), b"", "of shape"),
    ],
    ids=["object-array", "array-past-the-end", "trailing-bytes", "negative-dims", "float-dim"],
)
def test_a_blob_whose_header_does_not_fit_its_arrays_is_a_damaged_state(
    edit: Callable[[dict[str, Any]], None], tail: bytes, why: str
) -> None:
    """Arrays are read in place from what the header lists: an object type (a pickle) is never
    read, and a header that lists more or fewer bytes than follow is refused."""
    blob = pack(_built(), BASIS)
    assert blob is not None
    fresh = _history()
    with pytest.raises(DamagedState, match=why):
        attach(fresh, _crafted(blob, edit, tail), BASIS)
    assert fresh._anchors == {} and not fresh.lexical_indexes()


def test_two_indexes_of_one_analyzer_are_a_damaged_state() -> None:
    """Each analyzer's index is taken under its own name: a blob listing one analyzer twice
    (one of them mislabelled) is refused, not half taken."""
    built = _built()
    built.lexical("english")
    blob = pack(built, BASIS)
    assert blob is not None

    def relabel(header: dict[str, Any]) -> None:
        for spec in header["lexical"]:
            spec["stemmer"] = "english"

    fresh = _history()
    with pytest.raises(DamagedState, match="two BM25 indexes of one analyzer"):
        attach(fresh, _crafted(blob, relabel), BASIS)
    assert not fresh.lexical_indexes()
