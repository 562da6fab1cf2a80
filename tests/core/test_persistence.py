"""Persistence that cannot be half-done: atomic save folders, damaged files, unsaveable input.

A save folder holds snapshot subfolders and a ``CURRENT`` pointer (``pbr_core.persist``). These
tests specify what a caller can rely on: a save is all-or-nothing, the previous state stays
loadable until the pointer moves, every damaged file is a ``PersistenceError`` naming it, folders
of the older layout still load and convert, and input that could not be saved is refused when it
is added, not when everyone's save fails later.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HashEmbedder

import pbr_core.history as history_mod
import pbr_core.persist as persist_mod
from pbr_core import HistoryItem, HistoryStore, PBRConfig, PersistenceError, UnknownUserError
from pbr_core.history import check_serialisable
from pbr_core.persist import POINTER_NAME, current_snapshot, write_atomically

EMB = HashEmbedder(dim=8)
CFG = PBRConfig(theta=0.0)


def items(user: str, n: int, start: int = 0) -> list[HistoryItem]:
    return [
        HistoryItem(id=f"{user}{i}", text=f"{user} said thing {i}", metadata={"n": i})
        for i in range(start, start + n)
    ]


def add(store: HistoryStore, user: str, batch: list[HistoryItem]) -> None:
    store.upsert(user, batch, np.array(EMB.embed_documents([it.text for it in batch])))


def make_store(users: dict[str, int]) -> HistoryStore:
    store = HistoryStore(embedding_model_id=EMB.model_id)
    for user, n in users.items():
        add(store, user, items(user, n))
    return store


def contents(store: HistoryStore) -> dict[str, list[tuple[str, str]]]:
    return {u: [(it.id, it.text) for it in store.get(u).items] for u in store.users()}


def snapshots(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("snapshot-"))


def user_file(folder: Path, user: str, suffix: str) -> Path:
    """The file of ``user`` ending in ``suffix`` in the snapshot that ``folder`` currently names."""
    snap = current_snapshot(folder)
    manifest = json.loads((snap / "manifest.json").read_text(encoding="utf-8"))
    key = next(u["key"] for u in manifest["users"] if u["user_id"] == user)
    return snap / "users" / f"{key}{suffix}"


# -- the save is atomic ----------------------------------------------------------------------
def test_save_replaces_atomically_and_old_state_stays_loadable_until_pointer_moves(
    tmp_path, monkeypatch
) -> None:
    folder = tmp_path / "h"
    old = make_store({"alice": 3})
    old.save(folder)
    old_snapshot = current_snapshot(folder)
    new = make_store({"alice": 5, "bob": 2})

    seen: list[tuple[dict, dict]] = []
    real_replace = persist_mod.os.replace

    def replace(src, dst):  # the one atomic step: check both sides of it
        if Path(dst).name == POINTER_NAME:
            before = contents(HistoryStore.load(folder))
            complete = sorted(p.name for p in Path(folder).iterdir())
            new_snap = next(
                Path(folder) / n
                for n in complete
                if n.startswith("snapshot-") and n != old_snapshot.name
            )
            seen.append((before, contents(HistoryStore.load(new_snap))))
        real_replace(src, dst)

    monkeypatch.setattr(persist_mod.os, "replace", replace)
    assert new.save(folder) == folder
    ((before, staged),) = seen
    assert before == contents(old)  # until the pointer moves, loaders read the old state
    assert staged == contents(new)  # and the new snapshot is already complete
    assert contents(HistoryStore.load(folder)) == contents(new)
    assert old_snapshot.is_dir()  # kept for a reader that opened it
    assert old_snapshot.name in snapshots(folder) and len(snapshots(folder)) == 2


def test_a_writer_that_fails_midway_leaves_the_previous_state_current(
    tmp_path, monkeypatch
) -> None:
    folder = tmp_path / "h"
    store = make_store({"alice": 3, "bob": 2})
    store.save(folder)
    pointer = (folder / POINTER_NAME).read_bytes()
    add(store, "carol", items("carol", 4))
    real = history_mod.write_user

    def crash_on_carol(snap, users):
        if snap.user_id == "carol":
            raise OSError(28, "No space left on device")
        return real(snap, users)

    monkeypatch.setattr(history_mod, "write_user", crash_on_carol)
    with pytest.raises(PersistenceError, match=r"could not save user 'carol'.*previous save"):
        store.save(folder)
    assert (folder / POINTER_NAME).read_bytes() == pointer
    assert HistoryStore.load(folder).users() == ["alice", "bob"]
    assert len(snapshots(folder)) == 1  # the half-written snapshot was removed at once

    monkeypatch.setattr(history_mod, "write_user", real)
    store.save(folder)
    assert HistoryStore.load(folder).users() == ["alice", "bob", "carol"]


def test_a_snapshot_left_by_a_killed_writer_is_ignored_and_removed_by_the_next_save(
    tmp_path,
) -> None:
    folder = tmp_path / "h"
    store = make_store({"alice": 3})
    store.save(folder)
    current = current_snapshot(folder)
    # What a process killed mid-write leaves: a newer snapshot folder, half-filled, not pointed to.
    leftover = folder / "snapshot-99991231T235959.999999Z-deadbeef"
    (leftover / "users").mkdir(parents=True)
    (leftover / "users" / "x.jsonl").write_text('{"id": "half', encoding="utf-8")
    (folder / ".CURRENT.tmp-deadbeef").write_text(leftover.name, encoding="utf-8")

    assert current_snapshot(folder) == current
    assert contents(HistoryStore.load(folder)) == contents(store)

    add(store, "alice", items("alice", 1, start=10))
    store.save(folder)
    assert not leftover.exists()
    assert not (folder / ".CURRENT.tmp-deadbeef").exists()
    assert snapshots(folder) == sorted([current.name, current_snapshot(folder).name])
    assert len(HistoryStore.load(folder).get("alice")) == 4


def test_each_save_keeps_the_new_and_the_previous_snapshot_only(tmp_path) -> None:
    folder = tmp_path / "h"
    store = make_store({"alice": 1})
    names = []
    for n in range(4):
        add(store, "alice", items("alice", 1, start=n + 1))
        store.save(folder)
        names.append(current_snapshot(folder).name)
    assert snapshots(folder) == sorted(names[-2:])
    assert (folder / POINTER_NAME).read_text(encoding="ascii") == f"{names[-1]}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h"]  # nothing beside the folder


def test_concurrent_saves_to_one_folder_all_finish_and_leave_a_loadable_state(tmp_path) -> None:
    folder = tmp_path / "h"
    stores = [make_store({f"user{i}": 2}) for i in range(6)]
    errors: list[BaseException] = []

    def save(store: HistoryStore) -> None:
        try:
            for _ in range(3):
                store.save(folder)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    loaded = HistoryStore.load(folder)
    assert len(loaded.users()) == 1 and loaded.users()[0].startswith("user")
    assert len(snapshots(folder)) == 2


def test_a_process_keeps_no_lock_for_a_folder_once_its_writers_are_done(tmp_path) -> None:
    """A service saving each tenant to its own folder must not grow a lock per folder for
    the process's life (before, every folder ever saved kept one)."""
    held_while_writing: list[bool] = []

    def write(folder: Path) -> None:
        held_while_writing.append(len(persist_mod._process_locks) == 1)
        (folder / "data.txt").write_text("v", encoding="utf-8")

    def broken(folder: Path) -> None:
        raise RuntimeError("disk full")

    for i in range(20):
        write_atomically(tmp_path / f"tenant{i}", write)
        with pytest.raises(RuntimeError):
            write_atomically(tmp_path / f"tenant{i}", broken)
    assert held_while_writing == [True] * 20
    assert persist_mod._process_locks == {}


# -- the pointer and the folder, directly -----------------------------------------------------
def test_write_atomically_hands_the_writer_an_empty_folder_and_points_at_it(tmp_path) -> None:
    def write(folder: Path) -> None:
        assert list(folder.iterdir()) == []
        (folder / "data.txt").write_text("v1", encoding="utf-8")

    snap = write_atomically(tmp_path / "s", write)
    assert snap.parent == tmp_path / "s" and snap.name.startswith("snapshot-")
    assert current_snapshot(tmp_path / "s") == snap
    assert (snap / "data.txt").read_text(encoding="utf-8") == "v1"


def test_a_writer_exception_propagates_unchanged_and_nothing_is_left(tmp_path) -> None:
    write_atomically(tmp_path / "s", lambda f: (f / "data.txt").write_text("v1"))
    before = current_snapshot(tmp_path / "s")

    def broken(folder: Path) -> None:
        (folder / "data.txt").write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "s", broken)
    assert current_snapshot(tmp_path / "s") == before
    assert snapshots(tmp_path / "s") == [before.name]


@pytest.mark.parametrize(
    ("pointer", "error"),
    [
        (b"", "damaged .*CURRENT"),
        (b"\xff\xfe garbage", "damaged .*CURRENT"),
        (b"../../etc\n", "damaged .*CURRENT"),
        (b"snapshot-a\nsnapshot-b\n", "damaged .*CURRENT"),
        (b"snapshot-20000101T000000.000000Z-00000000\n", "CURRENT names .* is missing"),
    ],
)
def test_a_damaged_or_dangling_pointer_is_a_persistence_error_naming_it(
    tmp_path, pointer, error
) -> None:
    folder = tmp_path / "h"
    make_store({"alice": 2}).save(folder)
    (folder / POINTER_NAME).write_bytes(pointer)
    with pytest.raises(PersistenceError, match=error):
        HistoryStore.load(folder)


def test_a_save_over_a_damaged_pointer_works_and_prunes_nothing(tmp_path) -> None:
    folder = tmp_path / "h"
    make_store({"alice": 2}).save(folder)
    old = current_snapshot(folder)
    (folder / POINTER_NAME).write_bytes(b"garbage")
    make_store({"bob": 1}).save(folder)
    assert HistoryStore.load(folder).users() == ["bob"]
    assert old.is_dir()  # it may have been the only copy of the previous state


def test_missing_empty_and_non_folder_paths_say_what_is_wrong(tmp_path) -> None:
    with pytest.raises(PersistenceError, match="does not exist"):
        HistoryStore.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PersistenceError, match=r"neither CURRENT nor manifest\.json"):
        HistoryStore.load(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(PersistenceError, match="not a folder"):
        HistoryStore.load(tmp_path / "file")
    with pytest.raises(PersistenceError, match="not a folder"):
        make_store({"alice": 1}).save(tmp_path / "file")
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "snapshot-20000101T000000.000000Z-00000000").mkdir()
    with pytest.raises(PersistenceError, match="interrupted"):
        HistoryStore.load(tmp_path / "first")


# -- every damaged file is a PersistenceError naming it ---------------------------------------
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_anchors_file_names_the_file_on_eager_and_lazy_loads(
    tmp_path, lazy, damage
) -> None:
    folder = tmp_path / "h"
    store = make_store({"alice": 12, "bob": 3})
    store.get("alice").anchor(CFG)
    store.save(folder)
    path = user_file(folder, "alice", ".anchors.npz")
    data = path.read_bytes()
    path.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": b"PK\x03\x04junk", "empty": b""}[damage]
    )
    error = rf"damaged anchors of user 'alice': .*{path.name} cannot be read"
    if not lazy:
        with pytest.raises(PersistenceError, match=error):
            HistoryStore.load(folder)
        return
    loaded = HistoryStore.load(folder, lazy=True)  # reads the manifest only
    assert len(loaded.get("bob")) == 3  # the other user is fine
    with pytest.raises(PersistenceError, match=error):
        loaded.get("alice")
    with pytest.raises(PersistenceError, match=error):  # and stays an error, not half-read
        loaded.get("alice")


@pytest.mark.parametrize("lazy", [False, True])
def test_a_truncated_vectors_file_names_the_file(tmp_path, lazy) -> None:
    folder = tmp_path / "h"
    make_store({"alice": 6}).save(folder)
    path = user_file(folder, "alice", ".npy")
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(PersistenceError, match=rf"{path.name} \(the vectors of user 'alice'\)"):
        HistoryStore.load(folder, lazy=lazy).get("alice")


@pytest.mark.parametrize("lazy", [False, True])
def test_a_bad_items_line_names_the_file_and_the_line(tmp_path, lazy) -> None:
    folder = tmp_path / "h"
    make_store({"alice": 4}).save(folder)
    path = user_file(folder, "alice", ".jsonl")
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[2] = '{"id": "alice2", "text": '
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(PersistenceError, match=rf"line 3 of .*{path.name}"):
        HistoryStore.load(folder, lazy=lazy).get("alice")


@pytest.mark.parametrize(
    "manifest",
    [
        "{not json",
        '{"format": "pbr-history", "format_version": 2, "users": {}}',
        '{"format": "pbr-history", "format_version": 2, "dim": 8, "users": [{"user_id": "a"}]}',
        '{"format": "pbr-history", "format_version": 2, "dim": 8, '
        '"users": [{"user_id": "a", "key": "../../x", "count": 1}]}',
    ],
)
def test_a_bad_manifest_names_the_manifest(tmp_path, manifest) -> None:
    folder = tmp_path / "h"
    make_store({"alice": 2}).save(folder)
    path = current_snapshot(folder) / "manifest.json"
    path.write_text(manifest, encoding="utf-8")
    with pytest.raises(PersistenceError, match=r"damaged manifest .*manifest\.json"):
        HistoryStore.load(folder)


# -- folders saved by older versions ---------------------------------------------------------
def write_legacy_folder(folder: Path, store: HistoryStore) -> None:
    """What versions before CURRENT wrote: manifest.json and users/ directly in the folder."""
    users = folder / "users"
    users.mkdir(parents=True)
    entries = []
    for n, user in enumerate(store.users()):
        snap = store.get(user)
        key = f"{n:024x}"
        with (users / f"{key}.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(it.to_dict(), ensure_ascii=False) + "\n" for it in snap.items)
        np.save(users / f"{key}.npy", np.asarray(snap.vectors))
        entries.append({"user_id": user, "key": key, "count": len(snap), "version": 1})
    manifest = {
        "format": "pbr-history",
        "format_version": 1,
        "dim": store.dim,
        "embedding_model_id": store.embedding_model_id,
        "users": entries,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


@pytest.mark.parametrize("lazy", [False, True])
def test_a_legacy_layout_folder_still_loads_and_is_converted_by_a_save(tmp_path, lazy) -> None:
    folder = tmp_path / "old"
    store = make_store({"alice": 3, "bob": 2})
    write_legacy_folder(folder, store)
    assert current_snapshot(folder, legacy_marker="manifest.json") == folder

    loaded = HistoryStore.load(folder, lazy=lazy)
    assert loaded.users() == ["alice", "bob"] and loaded.embedding_model_id == EMB.model_id
    if not lazy:
        assert contents(loaded) == contents(store)
    add(loaded, "carol", items("carol", 1))
    loaded.save(folder)  # into the legacy folder itself

    assert (folder / POINTER_NAME).is_file()
    assert not (folder / "manifest.json").exists() and not (folder / "users").exists()
    again = HistoryStore.load(folder)
    assert contents(again) == {**contents(store), "carol": [("carol0", "carol said thing 0")]}
    np.testing.assert_array_equal(again.get("bob").vectors, store.get("bob").vectors)
    assert contents(loaded) == contents(again)  # unread users now come from the new snapshot


# -- input that could not be saved is refused when it is added -------------------------------
def _nested(levels: int) -> list[Any]:
    """``levels`` lists, one inside the other."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("user", "item", "error"),
    [
        ("bad\ud800user", HistoryItem(id="x", text="t"), r"user id .*lone surrogate"),
        ("alice", HistoryItem(id="x\udcff", text="t"), r"id of item .*lone surrogate"),
        ("alice", HistoryItem(id="x", text="caf\udce9"), r"text of item 'x'.*lone surrogate"),
        (
            "alice",
            HistoryItem(id="x", text="t", metadata={"tag": ["ok", "bad\ud800"]}),
            r"metadata\['tag'\].*item 'x'.*lone surrogate",
        ),
        (
            "alice",
            HistoryItem(id="x", text="t", metadata={"when": dt.datetime(2024, 1, 2)}),
            r"metadata\['when'\] of item 'x' of user 'alice' is a datetime.*isoformat.*POSIX",
        ),
        (
            "alice",
            HistoryItem(id="x", text="t", metadata={"days": [dt.date(2024, 1, 2)]}),
            r"metadata\['days'\].*holds a datetime.date.*isoformat",
        ),
        (
            "alice",
            HistoryItem(id="x", text="t", metadata={"obj": object()}),
            r"metadata\['obj'\].*JSON cannot hold",
        ),
        ("alice", HistoryItem(id="x", text="t", timestamp=float("nan")), "finite POSIX seconds"),
        ("alice", HistoryItem(id="x", text="t", timestamp=float("inf")), "finite POSIX seconds"),
        ("alice", HistoryItem(id="x", text="t", timestamp="2024"), "timestamp of type str"),  # type: ignore[arg-type]
        # keys JSON would turn into strings, merging {1: .., "1": ..} into one (a value lost)
        ("alice", HistoryItem(id="x", text="t", metadata={1: "a", "1": "b"}), "int key 1"),  # type: ignore[dict-item]
        ("alice", HistoryItem(id="x", text="t", metadata={"n": [{None: 0}]}), "NoneType key"),
        # nested so deep that whether a save or a load of it succeeded depended on the stack
        ("alice", HistoryItem(id="x", text="t", metadata={"d": _nested(100)}), "deeper than 100"),
        ("alice", HistoryItem(id="x", text="t", metadata={"d": _nested(986)}), "deeper than 100"),
    ],
)
def test_unsaveable_input_is_rejected_at_upsert_and_the_store_is_unchanged(
    tmp_path, user, item, error
) -> None:
    store = make_store({"alice": 2})
    before = store.get("alice")
    vector = np.array(EMB.embed_documents(["t"]))
    with pytest.raises(ValueError, match=error):
        store.upsert(user, [item], vector)
    with pytest.raises(ValueError, match=error):
        check_serialisable(user, [item])  # the same rule, for callers that write elsewhere first
    assert store.get("alice") is before and store.users() == ["alice"]
    store.save(tmp_path / "h")  # and everyone's save still works
    assert contents(HistoryStore.load(tmp_path / "h")) == contents(store)


def test_saveable_edge_cases_are_accepted(tmp_path) -> None:
    store = HistoryStore()
    item = HistoryItem(
        id="é/\u2028",
        text="line\u2028break \U0001f600",
        metadata={"nested": {"list": [1, 2.5, None, True]}, "nan": float("nan")},
        timestamp=1_700_000_000,
    )
    check_serialisable("ünïcode user", [item])
    store.upsert("ünïcode user", [item], np.array(EMB.embed_documents(["x"])))
    loaded = HistoryStore.load(store.save(tmp_path / "h"))
    got = loaded.get("ünïcode user").items[0]
    assert (got.id, got.text, got.timestamp) == (item.id, item.text, item.timestamp)
    assert got.metadata["nested"] == item.metadata["nested"]


def test_save_names_a_user_whose_data_became_unsaveable_and_keeps_the_previous_save(
    tmp_path,
) -> None:
    folder = tmp_path / "h"
    meta: dict[str, object] = {"ok": 1}
    store = make_store({"alice": 2})
    store.upsert("bob", [HistoryItem(id="b", text="t", metadata=meta)], np.ones((1, 8)))
    store.save(folder)
    pointer = (folder / POINTER_NAME).read_bytes()
    meta["when"] = dt.datetime(2024, 1, 2)  # the host mutated the dict it passed in
    with pytest.raises(PersistenceError, match=r"could not save user 'bob'.*drop_user"):
        store.save(folder)
    assert (folder / POINTER_NAME).read_bytes() == pointer
    assert HistoryStore.load(folder).get("bob").items[0].metadata == {"ok": 1}
    assert len(snapshots(folder)) == 1


# -- an empty add ----------------------------------------------------------------------------
def test_an_empty_first_add_leaves_the_user_unknown_and_a_later_add_works(tmp_path) -> None:
    store = HistoryStore()
    empty = store.upsert("carol", [], np.zeros((0, 8)))
    assert len(empty) == 0 and "carol" not in store and store.users() == []
    with pytest.raises(UnknownUserError):
        store.get("carol")
    add(store, "carol", items("carol", 2))
    assert len(store.get("carol")) == 2 and store.dim == 8
    before = store.get("carol")
    assert store.upsert("carol", [], None) is before  # an empty add changes nothing
    assert HistoryStore.load(store.save(tmp_path / "h")).users() == ["carol"]


# -- lazily loaded users survive saves -------------------------------------------------------
def test_a_lazy_store_survives_two_consecutive_saves_to_the_same_path(tmp_path) -> None:
    folder = tmp_path / "h"
    original = make_store({"alice": 12, "bob": 3, "carol": 2})
    original.get("alice").anchor(CFG)
    original.save(folder)
    first = current_snapshot(folder)

    lazy = HistoryStore.load(folder, lazy=True)
    lazy.save(folder)
    lazy.save(folder)  # prunes the snapshot the users were loaded from
    assert not first.exists()
    add(lazy, "dave", items("dave", 1))
    lazy.save(folder)
    assert contents(lazy) == {**contents(original), "dave": [("dave0", "dave said thing 0")]}
    np.testing.assert_allclose(
        lazy.get("alice").anchor(CFG).vector, original.get("alice").anchor(CFG).vector
    )
    assert contents(HistoryStore.load(folder)) == contents(lazy)


def test_a_lazy_store_saved_elsewhere_keeps_reading_its_own_folder(tmp_path) -> None:
    """A save to another folder (an export the app then deletes) moved the reads of the users
    never read, and the evictions of those unchanged, to that folder: with it gone they could
    not be read and every later save failed, though their own folder held them intact."""
    import shutil

    main, backup = tmp_path / "main", tmp_path / "backup"
    original = make_store({"alice": 3, "bob": 2})
    original.save(main)
    lazy = HistoryStore.load(main, lazy=True, max_cache_bytes=0)  # every user goes back
    lazy.get("alice")  # read and unchanged: evicted back to its files; bob never read
    lazy.save(backup)
    shutil.rmtree(backup)
    assert contents(lazy) == contents(original)
    add(lazy, "carol", items("carol", 1))
    lazy.save(main)
    assert contents(HistoryStore.load(main)) == contents(lazy)


def test_a_lazy_user_whose_snapshot_was_pruned_by_another_store_says_to_load_again(
    tmp_path,
) -> None:
    folder = tmp_path / "h"
    make_store({"alice": 2}).save(folder)
    lazy = HistoryStore.load(folder, lazy=True)
    other = make_store({"bob": 1})
    other.save(folder)
    other.save(folder)
    with pytest.raises(PersistenceError, match=r"is gone.*load the save folder again"):
        lazy.get("alice")


def test_host_keys_follow_their_items_through_saves_deletes_and_lazy_copies(
    tmp_path: Path,
) -> None:
    store = HistoryStore()
    items = [HistoryItem("a", "kept under the host's own key"), HistoryItem("b", "pbr's key")]
    store.upsert("u", items, np.eye(2, 4), host_keys={"a": "host-key-a"})
    store.upsert("u", [HistoryItem("a", "edited text, same record")], np.eye(1, 4))
    assert store.get("u").host_keys == {"a": "host-key-a"}  # a replaced item keeps its key
    store.save(tmp_path / "one")
    for lazy in (False, True):
        assert HistoryStore.load(tmp_path / "one", lazy=lazy).get("u").host_keys == {
            "a": "host-key-a"
        }
    HistoryStore.load(tmp_path / "one", lazy=True).save(tmp_path / "two")  # "u" never read
    again = HistoryStore.load(tmp_path / "two")
    assert again.get("u").host_keys == {"a": "host-key-a"}
    again.delete("u", ["a"])
    assert again.get("u").host_keys == {}
    with pytest.raises(ValueError, match="not in this batch"):
        again.upsert("u", [HistoryItem("c", "c")], np.eye(1, 4), host_keys={"zz": "k"})


def test_a_load_while_other_saves_prune_its_snapshot_reads_the_new_one_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def store_of(text: str) -> HistoryStore:
        s = HistoryStore()
        s.upsert("u", [HistoryItem("a", text)], np.eye(1, 4))
        s.upsert("v", [HistoryItem("b", text)], np.eye(1, 4))
        return s

    store_of("old").save(tmp_path / "h")
    real, calls = history_mod.read_user, []

    def two_saves_land_meanwhile(folder, entry, dim):  # type: ignore[no-untyped-def]
        calls.append(entry["user_id"])
        if len(calls) == 2:  # mid-load: another process saves twice, pruning this snapshot
            store_of("new").save(tmp_path / "h")
            store_of("new").save(tmp_path / "h")
        return real(folder, entry, dim)

    monkeypatch.setattr(history_mod, "read_user", two_saves_land_meanwhile)
    loaded = HistoryStore.load(tmp_path / "h")
    assert {loaded.get(u).items[0].text for u in ("u", "v")} == {"new"}  # one state, the new one


def test_a_history_the_default_embedder_made_records_its_model_and_refuses_another(
    tmp_path, monkeypatch
) -> None:
    """Without an embedder the embedded MiniLM embeds, and its id is recorded like any model's:
    a load with another model is refused (before, nothing was recorded, and the vectors of two
    models were compared silently). A fake stands in for MiniLM under its id (no model load)."""
    import pbr_core.models as models
    from pbr_core import Personalizer

    class Other(HashEmbedder):
        model_id = "some-org/other-8d-model"

    stand_in = HashEmbedder(dim=8)
    stand_in.model_id = models.MiniLMEmbedder.model_id
    monkeypatch.setattr(models, "_default_embedder", stand_in)
    p = Personalizer()
    p.add_texts("alice", ["I run marathons", "kale smoothies every morning"])
    assert p.store.embedding_model_id == models.MiniLMEmbedder.model_id
    p.save(tmp_path / "h")
    with pytest.raises(PersistenceError, match="some-org/other-8d-model"):
        Personalizer.load(str(tmp_path / "h"), Other(dim=8))
    assert Personalizer.load(str(tmp_path / "h")).store.users() == ["alice"]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dim": 16.0}, "dim must be an integer"),
        ({"dim": 0}, "dim must be an integer"),
        ({"dim": True}, "dim must be an integer"),
        ({"embedding_model_id": 7}, "embedding_model_id must be a string"),
    ],
)
def test_a_store_refuses_a_dim_or_model_id_no_load_would_read(kwargs, error) -> None:
    """Checked when the store is made, as a load checks them: before, the store took them,
    and its save replaced a good one with a folder no load reads."""
    with pytest.raises(ValueError, match=error):
        HistoryStore(**kwargs)


def test_of_two_saves_of_one_store_the_one_that_commits_last_read_the_store_last(
    tmp_path, monkeypatch
) -> None:
    """A save paused before the folder's writer lock (here: 0.3 s) while an upsert and another
    save ran: it reads the store once it holds the lock, so it saves the upsert too (before, it
    had read the store before waiting, and replaced the newer save with an older state)."""
    real = history_mod.write_atomically

    def paused(*args, **kwargs):
        if threading.current_thread().name == "first":
            time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(history_mod, "write_atomically", paused)
    folder = tmp_path / "h"
    store = make_store({"alice": 1})
    first = threading.Thread(target=store.save, args=(folder,), name="first")
    first.start()
    add(store, "alice", items("late", 1))
    store.save(folder)
    first.join(10)
    saved = HistoryStore.load(folder).get("alice")
    assert sorted(i.id for i in saved.items) == sorted(i.id for i in store.get("alice").items)


def test_a_user_read_while_a_save_converts_an_older_layout_is_read_back_from_the_new_save(
    tmp_path, monkeypatch
) -> None:
    """A lazily loaded user read during the save that converts the folder (removing the older
    layout's files) is evicted later and read back from the new save (before, from the removed
    files: the user could no longer be read, and every later save failed)."""
    folder = tmp_path / "old"
    write_legacy_folder(folder, make_store({"alice": 2, "bob": 2}))
    lazy = HistoryStore.load(folder, lazy=True, max_cache_bytes=10_000_000)
    real = history_mod.copy_user

    def copy_and_meanwhile_read(saved, users):
        out = real(saved, users)
        if saved.entry["user_id"] == "bob":
            lazy.get("alice")  # another request reads alice while the save runs
        return out

    monkeypatch.setattr(history_mod, "copy_user", copy_and_meanwhile_read)
    lazy.save(folder)
    monkeypatch.setattr(history_mod, "copy_user", real)
    assert not (folder / "users").exists()  # converted
    lazy.max_cache_bytes = 0
    lazy.get("bob")  # alice, unchanged since she was read, is evicted to her saved files
    assert [i.id for i in lazy.get("alice").items] == ["alice0", "alice1"]
    lazy.save(folder)
    assert contents(HistoryStore.load(folder)) == contents(make_store({"alice": 2, "bob": 2}))
