"""One user's slow read never holds up another user's requests.

Found by review: a burst of async requests for one user whose host listing is slow parked every
thread of asyncio's shared pool behind that user's lock, so another user's requests (their own
reads, their query embeddings) waited for all of them; a lazily loaded store read a cold user's
files under the store-wide lock, and on the event loop in async code.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest
from conftest import HashEmbedder, ScriptedGenerator
from doubles import ListingHost

import pbr_core.history as history_mod
from pbr_core import HistoryItem, HistoryStore, PBRConfig, Personalizer
from pbr_core.corpus import Corpus

#: More requests than asyncio's default pool has threads (at most 32).
BURST = 48


class GatedHost(ListingHost):
    """Lists ``slow_user`` only once the gate opens."""

    def __init__(self, slow_user: str, gate: threading.Event) -> None:
        super().__init__()
        self.slow_user, self.gate, self.armed = slow_user, gate, False

    def list_user(self, user_id: str) -> list[Any]:
        if self.armed and user_id == self.slow_user:
            self.gate.wait(10)
        return super().list_user(user_id)


async def test_a_burst_for_one_user_with_a_slow_host_does_not_hold_up_another_user() -> None:
    gate = threading.Event()
    host = GatedHost("ann", gate)
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore(), max_staleness_s=0)
    p = Personalizer(
        corpus=corpus,
        generator=ScriptedGenerator('["a"]', "r"),
        config=PBRConfig(fusion="no_prf"),
    )
    p.add_texts("ann", ["kale salad", "roasted beets", "morning run"])
    p.add_texts("bob", ["rust borrow checker", "tokio runtime", "memory safety"])
    host.armed = True
    anns = [asyncio.create_task(p.asearch("ann", f"dinner {i}?", k=2)) for i in range(BURST)]
    try:
        await asyncio.sleep(0.1)  # every ann request has started and waits for the listing
        got = await asyncio.wait_for(p.asearch("bob", "rust?", k=2), timeout=5)
        assert {hit.id for hit in got.hits} <= set(_ids(p.corpus.history("bob")))
        assert not any(task.done() for task in anns)  # still waiting for ann's host
    finally:
        gate.set()
        results = await asyncio.gather(*anns, return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert host.listed.count("ann") <= BURST + 2  # one listing per request at most


async def test_a_cancelled_request_does_not_strand_the_next_read_of_its_user() -> None:
    gate = threading.Event()
    host = GatedHost("ann", gate)
    corpus = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore(), max_staleness_s=0)
    corpus.add_texts("ann", ["kale salad"])
    host.armed = True
    first = asyncio.create_task(corpus.ahistory("ann"))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(corpus.ahistory("ann"))
    await asyncio.sleep(0.05)
    first.cancel()  # its listing goes on in its thread; the second waits for it, then reads
    second_waiter_cancelled = asyncio.create_task(corpus.ahistory("ann"))
    await asyncio.sleep(0.05)
    second_waiter_cancelled.cancel()
    gate.set()
    history = await asyncio.wait_for(second, timeout=5)
    assert history is not None and _ids(history) == _ids(corpus.history("ann"))
    assert not corpus._async_reads  # nothing left behind


def _ids(history: Any) -> list[str]:
    return [item.id for item in history.items]


def _lazy_store(tmp_path: Any) -> HistoryStore:
    store = HistoryStore(dim=8)
    for user in ("big", "small"):
        items = [HistoryItem(id=f"{user}{i}", text=f"{user} note {i}") for i in range(3)]
        store.upsert(user, items, np.eye(8, dtype=np.float32)[:3])
    store.save(tmp_path / "h")
    return HistoryStore.load(tmp_path / "h", lazy=True)


@pytest.fixture
def slow_big_read(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """``read_user`` blocks for user ``big`` until the gate opens; records the reading threads."""
    gate, threads = threading.Event(), []
    read_user = history_mod.read_user

    def gated(folder: Any, entry: Any, dim: Any) -> Any:
        threads.append(threading.current_thread().name)
        if entry["user_id"] == "big":
            gate.wait(10)
        return read_user(folder, entry, dim)

    monkeypatch.setattr(history_mod, "read_user", gated)
    return gate, threads


def test_a_cold_users_files_are_read_without_the_stores_lock(
    tmp_path: Any, slow_big_read: tuple[threading.Event, list[str]]
) -> None:
    gate, _ = slow_big_read
    store = _lazy_store(tmp_path)
    store.get("small")
    reading = threading.Thread(target=store.get, args=("big",))
    reading.start()
    try:
        got: list[Any] = []
        other = threading.Thread(target=lambda: got.append(store.get("small")))
        other.start()
        other.join(5)
        assert got and _ids(got[0]) == ["small0", "small1", "small2"]
    finally:
        gate.set()
        reading.join(5)
    assert _ids(store.get("big")) == ["big0", "big1", "big2"]


async def test_an_async_read_of_a_lazy_users_files_runs_off_the_event_loop(
    tmp_path: Any, slow_big_read: tuple[threading.Event, list[str]]
) -> None:
    gate, threads = slow_big_read
    gate.set()
    corpus = Corpus(None, embedder=HashEmbedder(8), cache=_lazy_store(tmp_path))
    history = await corpus.ahistory("big")
    assert history is not None and _ids(history) == ["big0", "big1", "big2"]
    assert threads and threading.current_thread().name not in threads


async def test_a_read_cancelled_before_it_started_does_not_shut_out_the_users_next_reads() -> None:
    """The user's gate opened only when its read ran: a request cancelled while its read still
    waited for a thread of the pool (which then dropped it) left the gate shut, and every later
    async read of the user waited for good (from a review of the gate)."""
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
    corpus = Corpus(ListingHost(), embedder=HashEmbedder(), cache=HistoryStore(), max_staleness_s=0)
    corpus.add_texts("ann", ["kale salad"])
    busy = threading.Event()
    blockers = [loop.run_in_executor(None, busy.wait, 10) for _ in range(2)]  # the pool is full
    queued = asyncio.create_task(corpus.ahistory("ann"))
    await asyncio.sleep(0.05)
    queued.cancel()
    await asyncio.sleep(0.05)
    busy.set()
    await asyncio.gather(*blockers)
    history = await asyncio.wait_for(corpus.ahistory("ann"), timeout=5)
    assert history is not None and _ids(history) == _ids(corpus.history("ann"))
    assert not corpus._async_reads


def test_a_lazy_users_read_that_a_save_overtakes_reads_where_the_save_moved_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read outside the store's lock, a user's files can be pruned by this store's own saves
    before the read ends (two saves, or one converting an older layout): the read failed as if
    the folder were gone; it reads the user from the new snapshot (from a review)."""
    store = _lazy_store(tmp_path)
    read_user, paused, go = history_mod.read_user, threading.Event(), threading.Event()

    def slow(folder: Any, entry: Any, dim: Any) -> Any:
        if entry["user_id"] == "big" and not paused.is_set():
            paused.set()
            go.wait(10)
        return read_user(folder, entry, dim)

    monkeypatch.setattr(history_mod, "read_user", slow)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(store.get("big")))
    reader.start()
    assert paused.wait(5)
    store.save(tmp_path / "h")
    store.save(tmp_path / "h")  # prunes the snapshot the reader is reading
    go.set()
    reader.join(10)
    assert got and _ids(got[0]) == ["big0", "big1", "big2"]
