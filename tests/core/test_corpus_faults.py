"""A fault in the middle of a corpus operation leaves a state the next call heals, and a reader
never sees an operation half applied.

The host stores are dict-backed doubles (:class:`doubles.ListingHost`), the unit under test
being the corpus: a host that fails once where asked, with or without a change token.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from conftest import HashEmbedder
from doubles import ListingHost, SilentHost

from pbr_core import HistoryItem, HistoryStore
from pbr_core.corpus import Corpus, Record
from pbr_core.windows import Window


class TokenHost(ListingHost):
    """A listing host with a change token (as PostgreSQL has) whose next delete can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.token = 0
        self.fail_next_delete = False

    def upsert(self, records: Sequence[Record]) -> None:
        super().upsert(records)
        self.token += 1

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        if self.fail_next_delete:
            self.fail_next_delete = False
            raise ConnectionError("connection lost")
        super().delete(user_id, keys)
        self.token += 1

    def change_token(self, user_id: str) -> str:
        return str(self.token)


class WindowedEmbedder(HashEmbedder):
    """Reads 8 words at a time (long items get windows); its ``fail_at``-th call fails."""

    fail_at: int | None = None

    def window(self) -> Window:
        return Window(max_tokens=8, count=lambda text: len(text.split()))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            self.fail_at = None
            raise ConnectionError("embedding API timed out")
        return super().embed_documents(texts)


def ids_of(corpus: Corpus, user: str) -> list[str]:
    history = corpus.history(user)
    return [] if history is None else sorted(item.id for item in history.items)


def test_a_retried_delete_removes_the_record_written_before_pbr_too() -> None:
    host = TokenHost()
    vector = np.full(16, 0.25, dtype=np.float32)
    # written to the store before pbr wrapped it: its own key, no pbr id
    host.rows["x"] = Record("x", "alice", "x", "old secret", {"user_id": "alice"}, vector)
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore())
    corpus.add("alice", [HistoryItem("x", "new text")])  # shadows the old record
    assert [i.text for i in corpus.history("alice").items] == ["new text"]  # type: ignore[union-attr]
    host.fail_next_delete = True
    with pytest.raises(ConnectionError):
        corpus.delete("alice", ["x"])
    corpus.delete("alice", ["x"])  # the retry
    assert host.rows == {}
    assert corpus.history("alice") is None


class LostReplyHost(ListingHost):
    """A host whose next delete, or whose next upsert after its first record, lands and then
    loses the reply (the server committed; the connection dropped)."""

    fail_delete = fail_upsert = False

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        super().delete(user_id, keys)
        if self.fail_delete:
            self.fail_delete = False
            raise ConnectionResetError("reset after the server committed")

    def upsert(self, records: Sequence[Record]) -> None:
        if self.fail_upsert:
            self.fail_upsert = False
            super().upsert(records[:1])
            raise ConnectionResetError("the server went away mid-add")
        super().upsert(records)


def test_a_write_that_landed_but_raised_is_seen_by_the_next_read_within_the_staleness() -> None:
    """With ``max_staleness_s`` the corpus serves its own writes from its cache: a delete or an
    add that landed (whole or in part) and raised left the cache as it was, so the deleted
    item was returned, and the landed one missed, until the window ended (from a review)."""
    host = LostReplyHost()
    corpus = Corpus(host, embedder=HashEmbedder(), max_staleness_s=60)
    corpus.add_texts("alice", ["my cat is called Pistachio", "my dog is Rex"], ids=["cat", "dog"])
    host.fail_delete = True
    with pytest.raises(ConnectionResetError):
        corpus.delete("alice", ["cat"])
    history = corpus.history("alice")
    assert history is not None and [it.id for it in history.items] == ["dog"]
    host.fail_upsert = True
    with pytest.raises(ConnectionResetError):
        corpus.add_texts("alice", ["my cat likes tuna", "it sleeps all day"], ids=["tuna", "nap"])
    history = corpus.history("alice")
    assert history is not None and [it.id for it in history.items] == ["dog", "tuna"]


def test_an_embedder_fault_on_a_long_items_windows_writes_nothing() -> None:
    host = SilentHost()  # pbr's history is the only record of what the host holds
    embedder = WindowedEmbedder()
    corpus = Corpus(host, embedder=embedder, cache=HistoryStore())
    corpus.add_texts("alice", ["short note"], ids=["s"])
    embedder.fail_at = len(embedder.calls) + 1  # the item embeds, its windows do not
    with pytest.raises(ConnectionError):
        corpus.add_texts("alice", [" ".join(f"w{i}" for i in range(30))], ids=["long"])
    assert sorted(r.item_id for r in host.rows.values()) == ["s"] == ids_of(corpus, "alice")
    corpus.add_texts("alice", [" ".join(f"w{i}" for i in range(30))], ids=["long"])  # retried
    assert sorted(r.item_id for r in host.rows.values()) == ["long", "s"]
    corpus.delete("alice", ["long"])
    assert ids_of(corpus, "alice") == ["s"]


def _renamed_elsewhere(host: ListingHost, corpus: Corpus) -> None:
    """Another worker replaces item x of user a by y, through the same store."""
    other = Corpus(host, embedder=corpus.embedder, cache=HistoryStore())
    other.add_texts("a", ["one, edited"], ids=["y"])
    other.delete("a", ["x"])


def test_a_reader_sees_another_workers_change_whole_or_not_at_all() -> None:
    host = ListingHost()
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore(), max_staleness_s=60.0)
    corpus.add_texts("a", ["one", "two", "three"], ids=["x", "k1", "k2"])
    corpus.history("a")  # verified: reads within 60 s are served from the cache
    _renamed_elsewhere(host, corpus)
    seen: list[list[str]] = []
    fetch = corpus._vectors_of

    def concurrent_read(user_id: str, records: list[Record], **kwargs: Any) -> np.ndarray:
        seen.append(ids_of(corpus, user_id))  # a request while the change is being applied
        return fetch(user_id, records, **kwargs)

    corpus._vectors_of = concurrent_read  # type: ignore[method-assign]
    corpus.delete("a", ["k2"])  # applies the other worker's change first
    assert seen == [["k1", "k2", "x"]]  # the view before it, not half of it
    assert ids_of(corpus, "a") == ["k1", "y"]


def test_a_fault_while_applying_another_workers_change_leaves_the_cache_as_it_was() -> None:
    host = ListingHost()
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore(), max_staleness_s=60.0)
    corpus.add_texts("a", ["one", "two", "three"], ids=["x", "k1", "k2"])
    corpus.history("a")
    _renamed_elsewhere(host, corpus)

    def lost(user_id: str, records: list[Record], **kwargs: Any) -> np.ndarray:
        raise ConnectionError("fetch failed")

    corpus._vectors_of = lost  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        corpus.delete("a", ["k2"])
    del corpus._vectors_of
    assert ids_of(corpus, "a") == ["k1", "k2", "x"]  # the last verified view, whole
    corpus.max_staleness_s = 0.0
    assert ids_of(corpus, "a") == ["k1", "k2", "y"]  # the next verified read heals


@pytest.mark.parametrize(
    ("text", "vector", "why"),
    [
        ("", None, "has no text"),
        ("   ", None, "has no text"),
        ("an item", [0.0] * 16, "NaN, inf or zeros"),
        ("an item", [float("nan")] * 16, "NaN, inf or zeros"),
    ],
)
def test_a_host_record_pbr_cannot_rank_is_left_out_not_fatal_to_the_user(
    text: str, vector: list[float] | None, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A record written to the host by someone else without text (an image node, an empty
    document) or with an unusable vector is left out of the history, warned about once per
    revision; the user's other items are still searched, added to and deleted (before, every
    read of the user raised)."""
    host = ListingHost()
    corpus = Corpus(host, embedder=HashEmbedder())
    corpus.add("alice", [HistoryItem("a", "alice likes green tea"), HistoryItem("b", "a walk")])
    bad = Record(
        key="outside",
        user_id="alice",
        item_id="outside",
        text=text,
        metadata={"user_id": "alice"},
        vector=None if vector is None else np.asarray(vector, dtype=np.float32),
    )
    host.rows["outside"] = bad
    with caplog.at_level("WARNING", logger="pbr.corpus"):
        assert ids_of(corpus, "alice") == ["a", "b"]
        assert ids_of(corpus, "alice") == ["a", "b"]
    assert [r.getMessage() for r in caplog.records if why in r.getMessage()] != []
    assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 1  # once
    corpus.add("alice", [HistoryItem("c", "alice runs on Sundays")])
    corpus.delete("alice", ["b"])
    assert ids_of(corpus, "alice") == ["a", "c"]
    host.rows["outside"] = Record(
        "outside", "alice", "outside", "now it has text", {"user_id": "alice"}
    )
    assert ids_of(corpus, "alice") == ["a", "c", "outside"]  # rewritten: read again


@pytest.mark.parametrize("host", [None, ListingHost()])
def test_pbr_keeps_its_own_copy_of_metadata_and_hands_out_copies(host: ListingHost | None) -> None:
    """Changing a nested metadata value of an added item, or of a search result, afterwards
    changes neither what pbr holds nor what it saves (before, both were the same objects)."""
    corpus = Corpus(host, embedder=HashEmbedder())
    tags = ["tea"]
    corpus.add("alice", [HistoryItem("a", "alice likes green tea", {"tags": tags, "n": {"x": 1}})])
    tags.append("changed by the caller")
    history = corpus.history("alice")
    assert history is not None
    q = np.asarray(HashEmbedder().embed_query("green tea"), dtype=np.float32)
    q /= np.linalg.norm(q)
    (hit,) = [r.hit for r in corpus.search("alice", history, q, {"green": 1.0}, 1)]
    assert hit.metadata["tags"] == ["tea"]
    hit.metadata["tags"].append("changed in a result")
    hit.metadata["n"]["x"] = 2
    item = corpus.history("alice").items[0]  # type: ignore[union-attr]
    assert item.metadata["tags"] == ["tea"] and item.metadata["n"] == {"x": 1}


def _pausing(host_kind: type) -> tuple[Any, threading.Event, threading.Event]:
    """A ``host_kind`` whose next upsert, once ``pause`` is set, writes, sets ``written`` and
    waits for ``resume``: an add held between its host write and its cache update."""
    written, resume = threading.Event(), threading.Event()

    class Pausing(host_kind):  # type: ignore[misc, valid-type]
        pause = False

        def upsert(self, records: Sequence[Record]) -> None:
            super().upsert(records)
            if self.pause:
                self.pause = False
                written.set()
                resume.wait(10)

    return Pausing(), written, resume


@pytest.mark.parametrize("host_kind", [ListingHost, SilentHost])
def test_a_delete_during_an_add_of_the_same_item_is_not_undone(host_kind: type) -> None:
    """A delete that starts while an add of the same id is writing the host waits for the
    add, then removes the item everywhere (before, it ran between the add's host write and its
    cache update, and the add put the deleted item back in pbr's history: for good over a
    store that cannot list, where it reached the anchor, the prompts and the save)."""
    host, written, resume = _pausing(host_kind)
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore())
    corpus.add("alice", [HistoryItem("a", "kale salad"), HistoryItem("b", "morning run")])
    host.pause = True
    adding = threading.Thread(target=corpus.add, args=("alice", [HistoryItem("a", "kale v2")]))
    adding.start()
    assert written.wait(10)  # the add has written the host, not yet pbr's history
    deleting = threading.Thread(target=corpus.delete, args=("alice", ["a"]))
    deleting.start()
    deleting.join(0.3)
    assert deleting.is_alive()  # it waits for the add
    resume.set()
    adding.join(10)
    deleting.join(10)
    assert ids_of(corpus, "alice") == ["b"]
    assert [r.item_id for r in host.rows.values()] == ["b"]


def test_an_async_add_checks_and_writes_the_host_off_the_event_loop() -> None:
    """``validate`` may be I/O (PostgreSQL reads the keys an add would take): an async add runs
    it in a worker thread, as it runs the write (before, it ran on the event loop)."""
    import asyncio

    on_loop: list[bool] = []

    class Watched(ListingHost):
        def validate(self, records: Sequence[Record]) -> None:
            on_loop.append(threading.current_thread() is loop_thread)

        def upsert(self, records: Sequence[Record]) -> None:
            on_loop.append(threading.current_thread() is loop_thread)
            super().upsert(records)

    loop_thread = threading.current_thread()  # asyncio.run runs the loop in this thread
    corpus = Corpus(Watched(), embedder=HashEmbedder(), cache=HistoryStore())
    asyncio.run(corpus.aadd_many({"alice": [HistoryItem("a", "kale salad")]}))
    assert on_loop == [False, False]
    assert ids_of(corpus, "alice") == ["a"]


def test_a_read_does_not_wait_for_an_add_writing_the_host() -> None:
    """A read of a user whose add is writing the host returns (adds and deletes of a user wait
    for each other; a read, which lists the host under the user's lock, waits for neither)."""
    host, written, resume = _pausing(ListingHost)
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore())
    corpus.add("alice", [HistoryItem("a", "kale salad")])
    host.pause = True
    adding = threading.Thread(target=corpus.add, args=("alice", [HistoryItem("b", "run")]))
    adding.start()
    assert written.wait(10)
    seen: list[list[str]] = []
    reading = threading.Thread(target=lambda: seen.append(ids_of(corpus, "alice")))
    reading.start()
    reading.join(5)
    assert not reading.is_alive()  # it did not wait for the add
    resume.set()
    adding.join(10)
    assert seen[0] == ["a", "b"] and ids_of(corpus, "alice") == ["a", "b"]  # the host's


def test_a_background_read_stuck_in_one_corpus_holds_up_no_other() -> None:
    """Each corpus reads users into its cache after a request ranked them in the database in
    a thread of its own: one read stuck on a dead connection delays no other corpus's, and
    one user is read once at a time."""
    stuck, release = threading.Event(), threading.Event()
    read: list[str] = []
    first, second = Corpus(None), Corpus(None)

    def blocked(user_id: str) -> None:
        stuck.set()
        release.wait(10)

    first.history = blocked  # type: ignore[method-assign]
    second.history = lambda user_id: read.append(user_id)  # type: ignore[method-assign]
    first.read_later("alice")
    assert stuck.wait(5)
    first.read_later("alice")  # already being read: not queued twice
    second.read_later("bob")
    deadline = time.monotonic() + 5
    while not read and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read == ["bob"]
    release.set()


def test_a_corpus_s_background_thread_ends_with_the_corpus() -> None:
    corpus = Corpus(None)
    corpus.history = lambda user_id: None  # type: ignore[method-assign]
    corpus.read_later("alice")
    assert corpus._background is not None
    deadline = time.monotonic() + 5
    while corpus._reading_later and time.monotonic() < deadline:
        time.sleep(0.01)
    thread = corpus._background._thread
    assert thread is not None and thread.is_alive()
    del corpus
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_a_background_read_that_cannot_start_raises_nothing_and_is_tried_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[str] = []
    corpus = Corpus(None)
    corpus.history = lambda user_id: read.append(user_id)  # type: ignore[method-assign]

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", no_thread)
        corpus.read_later("alice")  # a cache fill after an answered request: never raises
    corpus.read_later("alice")
    deadline = time.monotonic() + 5
    while not read and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read == ["alice"]


def _exit_code(pid: int, seconds: float = 10.0) -> int:
    """A forked child's exit code; killed (and failed) if it has not exited in ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


def _holding_alice(corpus: Corpus, seconds: float) -> tuple[threading.Event, threading.Event]:
    """A background read of alice that holds her lock ``seconds``: (started, ended)."""
    reading, done = threading.Event(), threading.Event()

    def slow(user_id: str) -> None:
        with corpus._user_lock(user_id):
            reading.set()
            time.sleep(seconds)
        done.set()

    corpus.history = slow  # type: ignore[method-assign]
    corpus.read_later("alice")
    assert reading.wait(5)
    return reading, done


def _fork_and_take_alice(corpus: Corpus) -> int:
    """Fork; the child takes alice's lock within 2 s and exits 0 if it could (and its corpus
    starts its background work anew)."""
    pid = os.fork()
    if pid == 0:  # the child: exit at once whatever happens, with what it found
        ok = False
        try:
            ok = corpus._user_lock("alice").acquire(timeout=2) and corpus._background is None
        finally:
            os._exit(0 if ok else 1)
    return pid


fork_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is a POSIX call")


@fork_only
def test_a_process_forked_while_a_background_read_holds_a_user_s_lock_does_not_inherit_it() -> None:
    """A server that preloads its app, warms it up and forks its workers: the fork waits for
    the background read under way (which holds the user's lock), so the child can serve that
    user, and starts its own background work anew."""
    corpus = Corpus(None)
    _, done = _holding_alice(corpus, 0.3)
    pid = _fork_and_take_alice(corpus)
    fork_waited = done.is_set()
    assert _exit_code(pid) == 0  # the child took alice's lock
    assert fork_waited  # for the read under way
    corpus.read_later("bob")  # the parent's background work goes on
    assert corpus.join_background(5)


@fork_only
def test_a_fork_that_cannot_wait_for_a_stuck_read_gives_the_child_new_locks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read stuck past the wait (a dead connection): the fork goes ahead, and the child's
    corpus gets new locks, since the stuck read's will never be released there."""
    monkeypatch.setattr("pbr_core.corpus._FORK_WAIT_S", 0.2)
    corpus = Corpus(None)
    _, done = _holding_alice(corpus, 3.0)
    pid = _fork_and_take_alice(corpus)
    assert not done.is_set()  # not waited for
    assert _exit_code(pid) == 0
    assert corpus.join_background(10)


def test_forks_from_two_threads_at_once_leave_every_gate_free() -> None:
    """The handlers let one fork through at a time: a second fork's handlers wait for the
    first's, and neither leaves a worker's gate held."""
    from pbr_core import corpus as module

    corpus = Corpus(None)
    corpus.history = lambda user_id: None  # type: ignore[method-assign]
    corpus.read_later("alice")
    assert corpus.join_background(5)
    module._before_fork()  # the first fork, under way
    second = threading.Thread(
        target=lambda: (module._before_fork(), module._after_fork_in_parent())
    )
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waits for the first fork's handlers
    module._after_fork_in_parent()
    second.join(5)
    assert not second.is_alive()
    background = corpus._background
    assert background is not None and not background._gate.locked()
    corpus.read_later("bob")
    assert corpus.join_background(5)


def test_a_background_job_that_forks_is_not_waited_for_by_its_own_fork() -> None:
    from pbr_core import corpus as module

    corpus = Corpus(None)
    seen: list[tuple[bool, bool]] = []

    def forking(user_id: str) -> None:  # what a fork from inside the job runs first
        module._before_fork()
        background = corpus._background
        seen.append((background in module._GATES_HELD, background in module._GATES_MISSED))
        module._after_fork_in_parent()

    corpus.history = forking  # type: ignore[method-assign]
    corpus.read_later("alice")
    assert corpus.join_background(5)
    assert seen == [(False, False)]  # skipped, neither waited for nor missed
