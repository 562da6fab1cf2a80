"""A byte budget for pbr's per-user cache: ``HistoryStore(max_cache_bytes=...)``.

Over a host that lists (here a dict-backed :class:`HostRecords`, the unit under test being the
store and the corpus), least recently used users are evicted whole and read back in full; from a
lazy load, unchanged users go back to their files; where pbr's history is the only record,
nothing that cannot be read back is evicted, and an explicit budget is refused.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import HashEmbedder, ScriptedGenerator
from doubles import ListingHost, SilentHost

from pbr_core import HistoryItem, HistoryStore, PBRConfig, Personalizer
from pbr_core.corpus import Corpus
from pbr_core.history_format import Saved

UTTER = '["rust ownership", "borrow checker"]'
REASON = "The user writes systems code and asks about memory safety."
WORDS = ["rust", "python", "borrow", "garbage", "async", "tokio", "numpy", "pandas"]
WORDS += ["memory", "thread", "lock", "vector"]


def texts_of(user: int, n: int = 12) -> list[str]:
    rng = np.random.default_rng(user)
    return [" ".join(rng.choice(WORDS, size=8)) + f" note {user}-{i}" for i in range(n)]


def user_bytes(n: int = 12) -> int:
    """What one fresh user of :func:`texts_of` holds (before its first query)."""
    store = HistoryStore()
    Corpus(ListingHost(), embedder=HashEmbedder(), cache=store).add_texts("probe", texts_of(0, n))
    return store.cached_bytes


def listing_corpus(max_cache_bytes: int | None, host: ListingHost | None = None) -> Corpus:
    host = host if host is not None else ListingHost()
    cache = HistoryStore(max_cache_bytes=max_cache_bytes)
    return Corpus(host, embedder=HashEmbedder(), cache=cache)


def personalizer(corpus: Corpus) -> Personalizer:
    return Personalizer(corpus=corpus, generator=ScriptedGenerator(UTTER, REASON))


def test_max_cache_bytes_must_be_a_number_of_bytes() -> None:
    for bad in (-1, 1.5, "1GB", True):
        with pytest.raises(ValueError, match="max_cache_bytes"):
            HistoryStore(max_cache_bytes=bad)  # type: ignore[arg-type]
    assert HistoryStore(max_cache_bytes=0).max_cache_bytes == 0
    assert not HistoryStore().budget_explicit


def test_the_least_recently_used_user_is_evicted_first() -> None:
    size = user_bytes()
    corpus = listing_corpus(int(3.5 * size))
    for user in "abc":
        corpus.add_texts(user, texts_of(ord(user)))
    corpus.history("a")  # a is now more recently used than b
    corpus.add_texts("d", texts_of(ord("d")))
    assert set(corpus.cache.users()) == {"a", "c", "d"}
    assert corpus.cache.evictions == 1


def test_an_evicted_user_is_evicted_whole_and_read_back_in_full() -> None:
    size = user_bytes()
    corpus = listing_corpus(int(1.5 * size))
    corpus.add_texts("a", texts_of(1))
    before = corpus.history("a")
    assert before is not None
    corpus.add_texts("b", texts_of(2))
    # Whole: no snapshot, no bookkeeping of the corpus, no bytes left of it.
    assert "a" not in corpus.cache
    assert "a" not in corpus._known and "a" not in corpus._verified_at
    assert corpus.cache.cached_bytes == corpus.cache.get("b").nbytes()
    after = corpus.history("a")
    assert after is not None
    assert [i.id for i in after.items] == [i.id for i in before.items]
    assert [i.text for i in after.items] == [i.text for i in before.items]
    np.testing.assert_array_equal(after.vectors, before.vectors)
    assert "b" not in corpus.cache  # b is the least recently used now


def test_a_reader_keeps_its_snapshot_when_its_user_is_evicted() -> None:
    corpus = listing_corpus(0)
    corpus.add_texts("a", texts_of(1))
    held = corpus.history("a")
    assert held is not None
    corpus.add_texts("b", texts_of(2))
    assert "a" not in corpus.cache
    assert held.search(np.asarray(held.vectors[3]), 1)[0][0] == 3
    assert held.anchor(PBRConfig()) is not None


def test_the_user_being_served_stays_even_if_it_alone_exceeds_the_budget() -> None:
    corpus = listing_corpus(1)
    corpus.add_texts("a", texts_of(1))
    assert corpus.cache.users() == ["a"]
    result = personalizer(corpus).search("a", "rust memory", k=3)
    assert len(result.hits) == 3
    assert corpus.cache.users() == ["a"]


def test_cached_bytes_stay_within_the_budget_after_serving_many_users() -> None:
    budget = 6 * user_bytes()
    corpus = listing_corpus(budget)
    pbr = personalizer(corpus)
    for user in range(30):
        corpus.add_texts(f"u{user}", texts_of(user))
        pbr.search(f"u{user}", "rust borrow checker", k=3)  # builds anchor and BM25 index
    corpus.history("u0")  # a read after the last query: that query's caches are counted
    assert corpus.cache.cached_bytes <= budget
    assert 3 <= len(corpus.cache) < 30
    assert corpus.cache.evictions >= 30 - len(corpus.cache)


def test_rankings_after_eviction_and_reread_equal_an_unbudgeted_stores() -> None:
    host = ListingHost()
    budgeted = listing_corpus(2 * user_bytes(), host)
    plain = Corpus(host, embedder=HashEmbedder(), cache=HistoryStore(max_cache_bytes=10**12))
    for user in range(8):
        budgeted.add_texts(f"u{user}", texts_of(user, 30))
    small, big = personalizer(budgeted), personalizer(plain)
    for query in ("rust borrow checker", "numpy vector memory"):
        for user in range(8):
            got = small.search(f"u{user}", query, k=5)
            want = big.search(f"u{user}", query, k=5)
            assert [(h.id, round(h.score, 6)) for h in got.hits] == [
                (h.id, round(h.score, 6)) for h in want.hits
            ]
            np.testing.assert_allclose(got.personalized.vector, want.personalized.vector, atol=1e-6)
    assert budgeted.cache.evictions >= 8
    assert plain.cache.evictions == 0


def test_a_write_to_an_evicted_user_keeps_its_other_items() -> None:
    corpus = listing_corpus(0)
    corpus.add_texts("a", texts_of(1), ids=[f"a{i}" for i in range(12)])
    corpus.add_texts("b", texts_of(2))
    assert "a" not in corpus.cache
    corpus.add_texts("a", ["a brand new note on tokio"], ids=["new"])
    corpus.delete("a", ["a3"])
    history = corpus.history("a")
    assert history is not None
    assert sorted(i.id for i in history.items) == sorted(
        [f"a{i}" for i in range(12) if i != 3] + ["new"]
    )


def test_a_write_to_an_evicted_user_reads_the_rest_back_first() -> None:
    corpus = listing_corpus(0)
    corpus.add_texts("a", texts_of(1), ids=[f"a{i}" for i in range(12)])
    corpus.add_texts("b", texts_of(2))
    corpus.add_texts("a", ["a brand new note on tokio"], ids=["new"])
    # what the store holds right after the write, before any read: never a partial user
    assert sorted(i.id for i in corpus.cache.get("a").items) == sorted(
        [f"a{i}" for i in range(12)] + ["new"]
    )


def test_a_user_being_read_or_written_elsewhere_is_not_evicted() -> None:
    corpus = listing_corpus(0)
    corpus.add_texts("a", texts_of(1))
    lock = corpus._user_lock("a")
    with lock:  # another thread's refresh or write of "a" holds this
        done = threading.Event()
        threading.Thread(target=lambda: (corpus.add_texts("b", texts_of(2)), done.set())).start()
        assert done.wait(10)
        assert "a" in corpus.cache and "a" in corpus._known
    corpus.history("b")  # "a" is tried again on the next read, and goes
    assert "a" not in corpus.cache


def test_a_lazily_loaded_user_unchanged_since_the_save_goes_back_to_its_files(
    tmp_path: object,
) -> None:
    corpus = Corpus(None, embedder=HashEmbedder())
    for user in range(4):
        corpus.add_texts(f"u{user}", texts_of(user))
    corpus.cache.save(tmp_path)  # type: ignore[arg-type]
    store = HistoryStore.load(tmp_path, lazy=True, max_cache_bytes=int(1.5 * user_bytes()))  # type: ignore[arg-type]
    lazy = Corpus(None, embedder=HashEmbedder(), cache=store)  # accepted: it can revert
    first = lazy.history("u0")
    lazy.history("u1")
    assert isinstance(store._users["u0"], Saved)
    again = lazy.history("u0")
    assert again is not None and first is not None and again is not first
    np.testing.assert_array_equal(again.vectors, first.vectors)
    # A changed user is the only record of its change: it stays until saved.
    lazy.add_texts("u2", ["changed since the save"], ids=["x"])
    lazy.history("u3")
    lazy.history("u1")
    assert isinstance(store._users["u2"], type(first))
    store.save(tmp_path)  # type: ignore[arg-type]
    assert isinstance(store._users["u2"], Saved)  # now read back from the new save
    reread = lazy.history("u2")
    assert reread is not None and reread.position("x") is not None


def test_an_explicit_budget_is_refused_where_history_is_the_only_record() -> None:
    with pytest.raises(ValueError, match=r"no host store.*lazily"):
        Corpus(None, cache=HistoryStore(max_cache_bytes=10**9))
    with pytest.raises(ValueError, match=r"SilentHost.*cannot list"):
        Corpus(SilentHost(), cache=HistoryStore(max_cache_bytes=10**9))
    with pytest.raises(ValueError, match="max_cache_bytes"):
        Personalizer(store=HistoryStore(max_cache_bytes=10**9))
    corpus = Corpus(ListingHost(), cache=HistoryStore(max_cache_bytes=10**9))
    with pytest.raises(ValueError, match="cannot list"):
        corpus.host = SilentHost()


@pytest.mark.parametrize("host", [None, SilentHost()], ids=["no host", "non-listing host"])
def test_the_default_budget_never_evicts_a_user_that_cannot_be_read_back(
    host: ListingHost | None,
) -> None:
    store = HistoryStore()
    corpus = Corpus(host, embedder=HashEmbedder(), cache=store)
    store.max_cache_bytes = 0  # as if the default were far smaller than the users
    for user in range(5):
        corpus.add_texts(f"u{user}", texts_of(user))
    assert len(store) == 5 and store.evictions == 0
    for user in range(5):
        history = corpus.history(f"u{user}")
        assert history is not None and len(history) == 12


def test_a_pickled_corpus_evicts_again() -> None:
    import pickle

    corpus = pickle.loads(pickle.dumps(listing_corpus(0)))
    corpus.add_texts("a", texts_of(1))
    corpus.add_texts("b", texts_of(2))
    assert corpus.cache.users() == ["b"]


def test_a_store_pickled_before_snapshots_told_it_of_their_caches_counts_them() -> None:
    """Unpickled from a version that remeasured the last 8 users read instead (a ``_recent``
    deque, no ``_grew`` set), a store still reads its users and counts their caches."""
    from collections import deque

    store = HistoryStore()
    Corpus(None, embedder=HashEmbedder(), cache=store).add_texts("a", texts_of(1, 40))
    state = {k: v for k, v in store.__getstate__().items() if k != "_grew"}
    old = HistoryStore.__new__(HistoryStore)
    old.__setstate__({**state, "_recent": deque(["a"], maxlen=8)})
    history = old.get("a")
    assert history.anchor(PBRConfig()) is not None
    old.get("a")
    assert old._total == history.nbytes()


def test_a_users_bytes_count_the_caches_its_queries_build() -> None:
    store = HistoryStore()
    Corpus(None, embedder=HashEmbedder(), cache=store).add_texts("a", texts_of(1, 40))
    history = store.get("a")
    cold = history.nbytes()
    assert cold == store.cached_bytes > history.vectors.nbytes
    anchor = history.anchor(PBRConfig())
    assert anchor is not None
    assert history.nbytes() == cold + anchor.nbytes
    index = history.lexical()
    assert history.nbytes() == cold + anchor.nbytes + index.nbytes
    assert store.cached_bytes == history.nbytes()


def test_a_personalizer_loaded_lazily_takes_a_budget_and_an_eager_one_refuses_it(
    tmp_path: object,
) -> None:
    corpus = Corpus(None, embedder=HashEmbedder())
    for user in range(3):
        corpus.add_texts(f"u{user}", texts_of(user))
    corpus.cache.save(tmp_path)  # type: ignore[arg-type]
    lazy = Personalizer.load(
        str(tmp_path),
        HashEmbedder(),
        lazy=True,
        max_cache_bytes=0,
        generator=ScriptedGenerator(UTTER, REASON),
    )
    for user in range(3):
        assert len(lazy.search(f"u{user}", "rust memory", k=2).hits) == 2
    assert lazy.store.evictions == 2 and lazy.store.users() == ["u0", "u1", "u2"]
    with pytest.raises(ValueError, match="lazily"):
        Personalizer.load(str(tmp_path), HashEmbedder(), max_cache_bytes=0)


class _EvictOnCheck(dict):  # type: ignore[type-arg]
    """``Corpus._verified_at`` that runs ``then`` once, right after a check of ``user`` has
    read its time: another request landing between the check and the cache read."""

    def __init__(self, held: dict[str, float], user: str, then: object) -> None:
        super().__init__(held)
        self.user, self.then = user, then

    def get(self, key: str, default: object = None) -> object:
        value = super().get(key, default)
        if key == self.user and self.then is not None:
            then, self.then = self.then, None
            then()  # type: ignore[operator]
        return value


def test_a_user_evicted_between_the_staleness_check_and_the_read_is_read_back() -> None:
    corpus = listing_corpus(0)
    corpus.max_staleness_s = 60.0
    corpus.add_texts("a", texts_of(1, 3))
    assert len(corpus.history("a") or []) == 3
    corpus._verified_at = _EvictOnCheck(
        corpus._verified_at, "a", lambda: corpus.add_texts("b", texts_of(2, 3))
    )
    history = corpus.history("a")  # "a" is evicted by b's write during the check
    assert history is not None and len(history) == 3
    assert corpus.history("nobody") is None  # a user without history is still None


def test_an_item_reads_back_as_this_worker_keeps_it_metadata_and_timestamp_included() -> None:
    """What a worker returns for an item does not depend on whether it wrote it, read it
    cold or read it back after an eviction: the owner and the timestamp are in its metadata,
    as the host store holds them."""
    from pbr_core import HistoryItem

    corpus = listing_corpus(0)
    corpus.add("a", [HistoryItem("n1", "a note", {"k": 1}, timestamp=5.0)])
    corpus.add("a", [HistoryItem("n2", "another note", {"timestamp": 7})])
    written = [(i.id, dict(i.metadata), i.timestamp) for i in corpus.history("a").items]  # type: ignore[union-attr]
    assert written == [
        ("n1", {"k": 1, "user_id": "a", "timestamp": 5.0}, 5.0),
        ("n2", {"timestamp": 7, "user_id": "a"}, 7.0),
    ]
    corpus.add_texts("b", texts_of(2))  # evicts a (budget 0)
    assert "a" not in corpus.cache
    back = [(i.id, dict(i.metadata), i.timestamp) for i in corpus.history("a").items]  # type: ignore[union-attr]
    assert back == written


def test_a_timestamp_its_metadata_contradicts_is_refused_before_anything_is_written() -> None:
    from pbr_core import HistoryItem

    host = ListingHost()
    corpus = listing_corpus(None, host)
    for metadata in ({"timestamp": "2024-05-01"}, {"timestamp": 3}):
        with pytest.raises(ValueError, match="disagree"):
            corpus.add("a", [HistoryItem("n1", "a note", metadata, timestamp=1714521600.0)])
    assert host.rows == {} and corpus.history("a") is None


def test_a_cache_built_after_many_other_users_were_read_is_counted() -> None:
    """A user was measured again only while among the last 8 read: an anchor or BM25 index
    built after 8 other users were read (a pool of requests) was left out of the total the
    budget checks (a store held 5x its budget; from a review)."""
    store = HistoryStore()
    corpus = Corpus(None, embedder=HashEmbedder(), cache=store)
    for user in range(12):
        corpus.add_texts(f"u{user}", texts_of(user, 40))
    # u0 read, then eleven other users (each read once, in order)
    resident = [store.get(f"u{user}") for user in range(12)]
    assert resident[0].anchor(PBRConfig()) is not None and resident[0].lexical() is not None
    store.get("u11")  # any read: the store counts what u0's snapshot built meanwhile
    # the running total eviction compares with the budget (cached_bytes measures anew)
    assert store._total == sum(h.nbytes() for h in resident)


def test_a_lazily_loaded_user_changed_since_lets_its_old_snapshot_go(tmp_path: object) -> None:
    """The snapshot read from the save was kept for the eviction back to it, after the user
    changed too (it can no longer go back): its vectors, anchor and index held and uncounted
    until the next save (from a review)."""
    import gc
    import weakref

    corpus = Corpus(None, embedder=HashEmbedder())
    corpus.add_texts("u0", texts_of(0, 40))
    corpus.cache.save(tmp_path)  # type: ignore[arg-type]
    store = HistoryStore.load(tmp_path, lazy=True, max_cache_bytes=10 * 2**20)  # type: ignore[arg-type]
    read = store.get("u0")
    read.anchor(PBRConfig())  # a query's caches
    old = weakref.ref(read)
    del read
    vector = np.asarray(HashEmbedder().embed_documents(["one more note"]))
    store.upsert("u0", [HistoryItem(id="new", text="one more note")], vector)
    gc.collect()
    assert old() is None
