"""A damaged save is refused, not read: every file of a save is checked against its manifest.

A save records the size and sha256 of each file it writes in the manifest, and a checksum of the
manifest itself; a load verifies each file of a user when it reads it (eager: at load, lazy: at
the user's first use). These tests damage a save in the ways that stay readable (a flipped byte
in the vectors, edits of the items that stay valid JSON, a consistent manifest edit) and expect
a ``PersistenceError`` naming the file, where the loader used to return wrong data silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import HashEmbedder

from pbr_core import HistoryItem, HistoryStore, PBRConfig, PersistenceError
from pbr_core.persist import current_snapshot

EMB = HashEmbedder(dim=8)
CFG = PBRConfig(theta=0.0)


def items(user: str, n: int) -> list[HistoryItem]:
    return [HistoryItem(id=f"{user}{i}", text=f"{user} said thing {i}") for i in range(n)]


def make_store() -> HistoryStore:
    store = HistoryStore(embedding_model_id=EMB.model_id)
    for user in ("alice", "bob"):
        batch = items(user, 6)
        store.upsert(user, batch, np.array(EMB.embed_documents([it.text for it in batch])))
    windows = np.array(EMB.embed_documents(["alice's first half", "alice's second half"]))
    store.upsert(
        "alice",
        [HistoryItem(id="alice-long", text="a long item, read in two windows")],
        np.array(EMB.embed_documents(["a long item, read in two windows"])),
        windows={"alice-long": windows},
    )
    store.get("alice").anchor(CFG)
    return store


def manifest_path(folder: Path) -> Path:
    return current_snapshot(folder) / "manifest.json"


def user_file(folder: Path, user: str, suffix: str) -> Path:
    manifest = json.loads(manifest_path(folder).read_text(encoding="utf-8"))
    key = next(u["key"] for u in manifest["users"] if u["user_id"] == user)
    return current_snapshot(folder) / "users" / f"{key}{suffix}"


def flip_a_vector_bit(path: Path) -> None:
    """The lowest mantissa bit of the last float: a finite, slightly different vector."""
    data = bytearray(path.read_bytes())
    data[-4] ^= 0x01
    path.write_bytes(bytes(data))


def edit_lines(path: Path, edit: Callable[[list[str]], list[str]]) -> None:
    lines = path.read_text(encoding="utf-8").split("\n")
    path.write_text("\n".join(edit(lines)), encoding="utf-8")


def change_a_text(path: Path) -> None:
    edit_lines(path, lambda lines: [line.replace("thing 2", "thing 9") for line in lines])


def swap_two_lines(path: Path) -> None:
    edit_lines(path, lambda lines: [lines[1], lines[0], *lines[2:]])


def give_an_id_to_another_user(path: Path) -> None:
    edit_lines(path, lambda lines: [line.replace('"alice3"', '"bob3"') for line in lines])


def rewrite_arrays(path: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """A valid ``.npz`` (its zip CRCs right) with other values of the same shapes."""
    with np.load(path) as arrays:
        parts = dict(arrays)
    change(parts)
    with path.open("wb") as fh:
        np.savez(fh, **parts)  # type: ignore[arg-type]


def reverse_the_pagerank(path: Path) -> None:
    rewrite_arrays(path, lambda parts: parts.update({"0_pagerank": parts["0_pagerank"][::-1]}))


def swap_the_windows(path: Path) -> None:
    rewrite_arrays(path, lambda parts: parts.update({"vectors": parts["vectors"][::-1]}))


DAMAGES = {
    "a flipped bit in the vectors": (".npy", flip_a_vector_bit),
    "a changed text": (".jsonl", change_a_text),
    "two swapped lines": (".jsonl", swap_two_lines),
    "an id changed to another user's": (".jsonl", give_an_id_to_another_user),
    "other anchor values": (".anchors.npz", reverse_the_pagerank),
    "other window vectors": (".windows.npz", swap_the_windows),
}


def damaged_save(tmp_path: Path, suffix: str, damage: Callable[[Path], None]) -> tuple[Path, Path]:
    """A save of :func:`make_store` whose alice ``suffix`` file ``damage`` changed: (the save
    folder, that file)."""
    folder = tmp_path / "h"
    make_store().save(folder)
    path = user_file(folder, "alice", suffix)
    damage(path)
    return folder, path


def mismatch(path: Path) -> str:
    return rf"{re.escape(path.name)}.* is damaged \(checksum mismatch"


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_file_damaged_in_a_readable_way_is_refused_naming_the_file(
    tmp_path, damage, lazy
) -> None:
    folder, path = damaged_save(tmp_path, *DAMAGES[damage])
    if not lazy:
        with pytest.raises(PersistenceError, match=mismatch(path)):
            HistoryStore.load(folder)
        return
    loaded = HistoryStore.load(folder, lazy=True)
    assert len(loaded.get("bob")) == 6  # the other user is fine
    with pytest.raises(PersistenceError, match=mismatch(path)):
        loaded.get("alice")
    with pytest.raises(PersistenceError, match=mismatch(path)):  # and stays an error
        loaded.get("alice")


def swap_the_users_files(manifest: dict) -> None:
    alice, bob = manifest["users"][:2]
    alice["key"], bob["key"] = bob["key"], alice["key"]
    for entry in (alice, bob):  # keep the rest consistent: only the checksum can tell
        entry.pop("anchors", None), entry.pop("windows", None)
        entry["count"] = 6


def change_the_model(manifest: dict) -> None:
    manifest["embedding_model_id"] = "another-model"


def claim_an_older_format(manifest: dict) -> None:
    manifest["format_version"] = 2


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize(
    "edit",
    [swap_the_users_files, change_the_model, claim_an_older_format],
    ids=lambda f: f.__name__,
)
def test_an_edited_manifest_is_refused_naming_the_manifest(tmp_path, edit, lazy) -> None:
    folder = tmp_path / "h"
    store = make_store()
    store.delete("alice", ["alice-long"])  # both users: 6 items
    store.save(folder)
    path = manifest_path(folder)
    manifest = json.loads(path.read_text(encoding="utf-8"))
    edit(manifest)
    path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    with pytest.raises(PersistenceError, match=r"manifest\.json is damaged \(checksum mismatch"):
        HistoryStore.load(folder, lazy=lazy)


def test_reformatting_the_manifest_changes_nothing_it_says(tmp_path) -> None:
    folder = tmp_path / "h"
    store = make_store()
    store.save(folder)
    path = manifest_path(folder)
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4), encoding="utf-8")
    assert HistoryStore.load(folder).get("alice").items == store.get("alice").items


def test_an_unread_user_copied_by_a_lazy_save_keeps_its_checksums(tmp_path) -> None:
    folder = tmp_path / "h"
    make_store().save(folder)
    HistoryStore.load(folder, lazy=True).save(folder)  # alice and bob copied unread
    path = user_file(folder, "alice", ".npy")
    flip_a_vector_bit(path)
    with pytest.raises(PersistenceError, match=mismatch(path)):
        HistoryStore.load(folder)


def strip_checksums(folder: Path) -> None:
    """What the previous version wrote: format version 2, no checksums."""
    path = manifest_path(folder)
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["format_version"] = 2
    manifest.pop("manifest_sha256")
    for entry in manifest["users"]:
        entry.pop("files")
    path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_save_without_checksums_loads_and_is_saved_again_with_them(tmp_path, lazy) -> None:
    folder = tmp_path / "h"
    store = make_store()
    store.save(folder)
    strip_checksums(folder)
    loaded = HistoryStore.load(folder, lazy=lazy)
    loaded.save(folder)  # lazy: copied unread, checksummed on the way
    assert HistoryStore.load(folder).get("alice").items == store.get("alice").items
    path = user_file(folder, "alice", ".jsonl")
    change_a_text(path)
    with pytest.raises(PersistenceError, match=mismatch(path)):
        HistoryStore.load(folder, lazy=lazy).get("alice")


def flip_a_byte(offset: int | Callable[[bytes], int]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        data = bytearray(path.read_bytes())
        at = offset if isinstance(offset, int) else offset(bytes(data))
        data[at] ^= 0x01
        path.write_bytes(bytes(data))

    return apply


def _central_entry(data: bytes) -> int:
    return data.rfind(b"PK\x01\x02")  # the last entry of a zip's central directory


UNREADABLE = {  # damage the parsers meet before the checksum: each raised its own error
    "a .npy header": (".npy", flip_a_byte(68)),
    "a windows zip marked encrypted": (
        ".windows.npz",
        flip_a_byte(lambda d: _central_entry(d) + 8),
    ),
    "an anchors zip of another compression": (
        ".anchors.npz",
        flip_a_byte(lambda d: _central_entry(d) + 10),
    ),
    "a truncated windows zip": (".windows.npz", lambda p: p.write_bytes(p.read_bytes()[:-30])),
}


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("damage", list(UNREADABLE))
def test_a_file_damaged_past_parsing_is_a_persistence_error_naming_it(
    tmp_path, damage, lazy
) -> None:
    folder, path = damaged_save(tmp_path, *UNREADABLE[damage])
    with pytest.raises(PersistenceError, match=re.escape(path.name)):
        HistoryStore.load(folder, lazy=lazy).get("alice")


def test_a_save_beside_snapshots_whose_current_was_deleted_keeps_them(tmp_path) -> None:
    folder = tmp_path / "h"
    make_store().save(folder)
    complete = current_snapshot(folder)
    (folder / "CURRENT").unlink()
    with pytest.raises(PersistenceError, match="complete"):  # says both possible causes
        HistoryStore.load(folder)
    HistoryStore().save(folder)  # a new, empty save
    assert complete.is_dir()  # the only copy of the old state is kept
    (folder / "CURRENT").write_text(complete.name + "\n")
    assert sorted(HistoryStore.load(folder).users()) == ["alice", "bob"]


def test_a_snapshot_folder_loads_but_is_not_a_save_folder(tmp_path) -> None:
    folder = tmp_path / "h"
    make_store().save(folder)
    inner = current_snapshot(folder)
    assert sorted(HistoryStore.load(inner).users()) == ["alice", "bob"]  # reading is harmless
    with pytest.raises(PersistenceError, match="snapshot folder inside"):
        HistoryStore().save(inner)
    assert sorted(HistoryStore.load(folder).users()) == ["alice", "bob"]


@pytest.mark.parametrize("spelt", ["symlink", "dot"])
def test_a_snapshot_folder_is_refused_as_a_save_folder_however_it_is_spelt(
    tmp_path, monkeypatch, spelt: str
) -> None:
    """A symlink to the current snapshot, or "." from inside it, is that snapshot: refused
    (before, accepted, and the save removed the snapshot's own files as an older layout's)."""
    folder = tmp_path / "h"
    make_store().save(folder)
    inner = current_snapshot(folder)
    if spelt == "symlink":
        target = tmp_path / "link"
        target.symlink_to(inner, target_is_directory=True)
    else:
        monkeypatch.chdir(inner)
        target = Path(".")
    with pytest.raises(PersistenceError, match="snapshot folder"):
        HistoryStore().save(target)
    assert sorted(HistoryStore.load(folder).users()) == ["alice", "bob"]


def test_a_save_leaves_the_callers_own_files_that_share_an_older_layouts_names(tmp_path) -> None:
    """``users/`` and ``manifest.json`` in a folder that is not an older pbr save are the
    caller's: kept (before, a save removed them as that layout's), and the save loads."""
    folder = tmp_path / "app"
    (folder / "users").mkdir(parents=True)
    (folder / "users" / "alice.db").write_text("the app's own data")
    (folder / "manifest.json").write_text('{"name": "my app"}')
    make_store().save(folder)
    assert (folder / "users" / "alice.db").read_text() == "the app's own data"
    assert (folder / "manifest.json").read_text() == '{"name": "my app"}'
    assert sorted(HistoryStore.load(folder).users()) == ["alice", "bob"]


def test_a_save_that_cannot_lock_its_folder_writes_nothing(tmp_path) -> None:
    folder = tmp_path / "h"
    make_store().save(folder)
    before = sorted(p.name for p in folder.iterdir())
    (folder / ".write.lock").unlink()
    (folder / ".write.lock").mkdir()  # in the way: the lock cannot be opened
    with pytest.raises(PersistenceError, match="cannot lock"):
        HistoryStore().save(folder)
    assert sorted(p.name for p in folder.iterdir()) == before
    assert sorted(HistoryStore.load(folder).users()) == ["alice", "bob"]


def test_a_current_that_is_a_folder_is_a_persistence_error_saying_so(tmp_path) -> None:
    """A save says ``CURRENT`` cannot be replaced, a load that it is a folder (before: a raw
    IsADirectoryError, and a load advising to check permissions)."""
    folder = tmp_path / "h"
    make_store().save(folder)
    (folder / "CURRENT").unlink()
    (folder / "CURRENT").mkdir()
    with pytest.raises(PersistenceError, match="is a folder"):
        HistoryStore.load(folder)
    with pytest.raises(PersistenceError, match="cannot be replaced"):
        make_store().save(folder)


def test_a_save_over_another_kind_of_save_is_refused_and_leaves_it(tmp_path) -> None:
    """A folder whose current snapshot holds another kind of save (a LlamaIndex retriever's
    ``pbr_retriever.json``, say): a history save took it over silently, and its next save
    pruned the other save away."""
    folder = tmp_path / "h"
    make_store().save(folder)
    other = current_snapshot(folder)
    (other / "manifest.json").rename(other / "pbr_retriever.json")  # stands for that kind
    with pytest.raises(PersistenceError, match=r"another kind of save .*pbr_retriever\.json"):
        make_store().save(folder)
    assert current_snapshot(folder) == other and (other / "pbr_retriever.json").is_file()
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("snapshot-")) == [
        other.name
    ]


def test_a_current_snapshot_without_any_manifest_is_replaced_by_the_next_save(tmp_path) -> None:
    """A snapshot that lost its manifest is damage, not another kind of save: a save heals it."""
    folder = tmp_path / "h"
    make_store().save(folder)
    (current_snapshot(folder) / "manifest.json").unlink()
    with pytest.raises(PersistenceError):
        HistoryStore.load(folder)
    make_store().save(folder)
    assert sorted(HistoryStore.load(folder).users()) == ["alice", "bob"]
