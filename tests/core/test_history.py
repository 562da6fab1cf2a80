"""The per-user history store: validation, isolation, snapshots and persistence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pbr_core import (
    EmbeddingError,
    HistoryItem,
    HistoryStore,
    PBRConfig,
    PersistenceError,
    UnknownUserError,
)
from pbr_core.persist import current_snapshot


def items(*ids: str) -> list[HistoryItem]:
    return [HistoryItem(id=i, text=f"text of {i}", metadata={"n": k}) for k, i in enumerate(ids)]


def vecs(n: int, dim: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


@pytest.fixture
def store() -> HistoryStore:
    s = HistoryStore()
    s.upsert("alice", items("a1", "a2", "a3"), vecs(3))
    s.upsert("bob", items("b1", "b2"), vecs(2, seed=1))
    return s


def test_vectors_are_stored_unit_norm(store: HistoryStore) -> None:
    np.testing.assert_allclose(np.linalg.norm(store.get("alice").vectors, axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("scale", [1e20, 1e-25, 1e-22, 1e-40])
def test_a_finite_vector_of_any_scale_is_stored_as_its_unit_direction(
    store: HistoryStore, scale: float
) -> None:
    """float32 squares overflow or underflow at these scales: before, a 1e20-scaled vector was
    stored as zeros (every later anchor raised), a 1e-25 one refused as all zeros, a 1e-22 one
    stored with norm .9956."""
    store.upsert("alice", items("big"), np.array([[3.0, 4.0, 0.0, 0.0]]) * scale)
    np.testing.assert_allclose(store.get("alice").vectors[-1], [0.6, 0.8, 0.0, 0.0], rtol=1e-5)


def test_unknown_user_error_says_how_to_add_history(store: HistoryStore) -> None:
    with pytest.raises(UnknownUserError, match="add_texts\\('carol'"):
        store.get("carol")


def test_search_is_per_user(store: HistoryStore) -> None:
    bob = store.get("bob")
    hits = bob.search(bob.vectors[1], k=10)
    assert bob.items[hits[0][0]].id == "b2"
    assert len(hits) == 2  # k larger than the corpus gives the whole corpus, no padding


def test_upsert_replaces_items_with_the_same_id(store: HistoryStore) -> None:
    new = HistoryItem(id="a2", text="rewritten")
    snap = store.upsert("alice", [new], vecs(1, seed=9))
    assert [i.id for i in snap.items] == ["a1", "a2", "a3"]
    assert snap.item("a2").text == "rewritten"
    np.testing.assert_allclose(
        snap.vectors[1], vecs(1, seed=9)[0] / np.linalg.norm(vecs(1, seed=9))
    )


@pytest.mark.parametrize(
    ("batch", "vectors", "error"),
    [
        (items("x", "x"), vecs(2), "duplicate item ids"),
        (items("x"), vecs(1, dim=5), "dimension 5 does not match"),
        (items("x"), np.array([[np.nan, 1, 0, 0]]), "NaN or inf"),
        (items("x"), np.array([[np.inf, 1, 0, 0]]), "NaN or inf"),
        (items("x"), np.zeros((1, 4)), "all zeros"),
        (items("x", "y"), vecs(1), "2 items but 1 vectors"),
        ([HistoryItem(id="x", text="  ")], vecs(1), "empty text"),
    ],
)
def test_bad_input_is_rejected_and_nothing_changes(store, batch, vectors, error) -> None:
    before = store.get("alice")
    with pytest.raises((ValueError, EmbeddingError), match=error):
        store.upsert("alice", batch, vectors)
    assert store.get("alice") is before
    assert [i.id for i in store.get("alice").items] == ["a1", "a2", "a3"]


def test_a_change_makes_a_new_snapshot_and_invalidates_the_anchor(store: HistoryStore) -> None:
    old = store.get("alice")
    old_anchor = old.anchor(PBRConfig(theta=-1.0))
    assert old.anchor(PBRConfig(theta=-1.0)) is old_anchor  # cached per snapshot
    store.delete("alice", ["a3"])
    new = store.get("alice")
    assert new.version == old.version + 1
    assert len(old) == 3 and len(new) == 2  # the running query's snapshot is untouched
    assert not np.allclose(new.anchor(PBRConfig(theta=-1.0)).vector, old_anchor.vector)


def test_deleting_unknown_ids_removes_nothing(store: HistoryStore) -> None:
    with pytest.raises(KeyError, match="nope"):
        store.delete("alice", ["a1", "nope"])
    assert len(store.get("alice")) == 3


def test_save_and_load_round_trip(store: HistoryStore, tmp_path) -> None:
    store.embedding_model_id = "m"
    store.save(tmp_path / "h")
    loaded = HistoryStore.load(tmp_path / "h")
    assert loaded.users() == ["alice", "bob"]
    assert loaded.embedding_model_id == "m" and loaded.dim == 4
    for user in ("alice", "bob"):
        np.testing.assert_array_equal(loaded.get(user).vectors, store.get(user).vectors)
        assert loaded.get(user).items == store.get(user).items


def test_user_ids_that_are_not_file_names_survive_a_round_trip(tmp_path) -> None:
    s = HistoryStore()
    weird = '../"$or": [x]/\\'
    s.upsert(weird, items("w"), vecs(1))
    s.save(tmp_path / "h")
    assert HistoryStore.load(tmp_path / "h").get(weird).items[0].id == "w"


def test_saving_twice_replaces_the_folder(store: HistoryStore, tmp_path) -> None:
    store.save(tmp_path / "h")
    store.drop_user("bob")
    store.save(tmp_path / "h")
    assert HistoryStore.load(tmp_path / "h").users() == ["alice"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]


def test_loading_a_missing_folder_says_so(tmp_path) -> None:
    with pytest.raises(PersistenceError, match="does not exist"):
        HistoryStore.load(tmp_path / "nothing")


@pytest.mark.parametrize("damage", ["manifest", "vectors", "items", "count", "nan"])
def test_loading_a_damaged_folder_fails_clearly(store, tmp_path, damage) -> None:
    saved = store.save(tmp_path / "h")
    folder = current_snapshot(saved)  # the snapshot folder CURRENT names
    manifest = json.loads((folder / "manifest.json").read_text())
    key = manifest["users"][0]["key"]
    if damage == "manifest":
        (folder / "manifest.json").write_text("{not json")
    elif damage == "vectors":
        (folder / "users" / f"{key}.npy").write_bytes(b"garbage")
    elif damage == "items":
        (folder / "users" / f"{key}.jsonl").unlink()
    elif damage == "count":
        manifest["users"][0]["count"] = 99
        (folder / "manifest.json").write_text(json.dumps(manifest))
    else:
        bad = np.full((3, 4), np.nan, dtype=np.float32)
        np.save(folder / "users" / f"{key}.npy", bad)
    with pytest.raises(PersistenceError):
        HistoryStore.load(saved)
