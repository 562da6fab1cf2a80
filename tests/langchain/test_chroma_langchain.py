"""langchain_pbr.PBRRetriever on a real Chroma server (``chroma run``) shared by many users.

One collection holds every user; the user scope is Chroma's ``where`` filter, applied in the
database. The models are fakes (deterministic embedding, a parrot chat model): the point here is
the database - isolation, durability, faults and hostile input.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

pytest.importorskip("chromadb")
pytest.importorskip("langchain_chroma")

from chroma_server import (
    HOSTILE_USER_IDS,
    ChromaServer,
    assert_collection_holds,
    assert_history_matches_database,
    brute_force_ids,
)
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import ParrotFakeChatModel
from langchain_core.runnables import ConfigurableField

from langchain_pbr import PBRRetriever
from pbr_core import (
    PBRConfig,
    Personalizer,
    PseudoFeedback,
    VectorStoreUnavailableError,
)
from pbr_core.corpus import scoped_key
from pbr_core.hybrid import lexical_query, lexical_terms, rank

DIM = 32
USERS = [f"u{i:02d}" for i in range(50)]
ROUNDS, PER_ROUND = 2, 6  # 12 items per user, written round-robin: users' rows interleave
ITEMS = ROUNDS * PER_ROUND
TOPICS = ("running", "cooking", "film cameras", "cars", "gardening", "chess", "jazz", "travel")
QUERY = "what should I do this weekend?"
K = 5
EMB = DeterministicFakeEmbedding(size=DIM)


class CountingEmbedding(DeterministicFakeEmbedding):
    """DeterministicFakeEmbedding that counts the documents it embeds."""

    documents_embedded: int = 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.documents_embedded += len(texts)
        return super().embed_documents(texts)


def text(user: str, n: int) -> str:
    return f"{user} note {n} about {TOPICS[(n + len(user)) % len(TOPICS)]}"


def chroma_store(server: ChromaServer, name: str, embeddings: Any) -> Chroma:
    # langchain-chroma creates the collection with embedding_function=None (it embeds on the
    # client); cosine space so that distances rank like PBR's inner products.
    return Chroma(
        client=server.client(),
        collection_name=name,
        embedding_function=embeddings,
        collection_configuration={"hnsw": {"space": "cosine"}},
    )


def collection(server: ChromaServer, name: str) -> Any:
    return server.client().get_collection(name, embedding_function=None)


def retriever_on(store: Chroma, embeddings: Any, **kwargs: Any) -> PBRRetriever:
    # explain="all": the tests check the scores and the explanation off the documents
    kwargs["config"] = kwargs.get("config", PBRConfig()).with_(explain="all")
    return PBRRetriever(
        llm=ParrotFakeChatModel(), embeddings=embeddings, vectorstore=store, k=K, **kwargs
    )


def add_interleaved(r: PBRRetriever, users: list[str]) -> None:
    for rnd in range(ROUNDS):
        for user in users:
            ns = range(rnd * PER_ROUND, (rnd + 1) * PER_ROUND)
            docs = [Document(page_content=text(user, n), metadata={"n": n}) for n in ns]
            r.add_documents(docs, user_id=user, ids=[f"{user}-{n}" for n in ns])


def expected(r: PBRRetriever, user: str, doc: Document, k: int) -> list[str]:
    """Brute force over the user's items with the same ``q*``, rebuilt from the explanation."""
    pbr = doc.metadata["pbr"]
    feedback = PseudoFeedback(pbr["pseudo_utterances"], pbr["reasoning"])
    core = Personalizer(r.embeddings, store=r.history, config=r.config)
    pq = core.personalize(user, pbr["query"], feedback=feedback)
    assert list(pq.explanation.used) == pbr["used"]
    history = r.history.get(user)
    return brute_force_ids(history.vectors, [it.id for it in history.items], pq.vector, k)


def check(r: PBRRetriever, user: str, docs: list[Document], k: int = K) -> None:
    assert len(docs) == min(k, ITEMS)
    owners = {d.metadata["user_id"] for d in docs}
    assert owners == {user}, f"{user} got documents of {owners - {user}}"
    assert all(d.id is not None and d.id.startswith(f"{user}-") for d in docs)
    assert [d.id for d in docs] == expected(r, user, docs[0], k)
    scores = [d.metadata["score"] for d in docs]
    assert scores == sorted(scores, reverse=True)  # one meaning of score: cosine, best first
    # pbr listed the view through Chroma's where-filter and ranked it: no store score
    assert all(d.metadata.get("store_score") is None for d in docs)


@pytest.fixture(scope="module")
def world(shared_chroma: ChromaServer) -> tuple[PBRRetriever, str]:
    """50 users, 12 items each, in one collection, written interleaved through the retriever.

    Dense search with a view filter (``n >= 0``, every item): the user filter and the view's
    are Chroma's (its ``where``), through which pbr lists the view and ranks all of it."""
    name = f"lc-isolation-{uuid.uuid4().hex[:8]}"
    r = retriever_on(
        chroma_store(shared_chroma, name, EMB),
        EMB,
        config=PBRConfig(search="dense"),
        search_kwargs={"filter": {"n": {"$gte": 0}}},
    )
    add_interleaved(r, USERS)
    return r, name


def test_without_a_view_filter_pbr_ranks_every_item_of_the_user_itself(
    world: tuple[PBRRetriever, str],
) -> None:
    """Hybrid (the default) over the same collection: the adapter's ranking is the core's over
    the user's verified items; no store score, as Chroma did not search."""
    r, _ = world
    hybrid = r.model_copy(update={"config": PBRConfig(explain="all"), "search_kwargs": {}})
    for user in USERS[:10]:
        docs = hybrid.invoke(QUERY, user_id=user)
        pbr = docs[0].metadata["pbr"]
        feedback = PseudoFeedback(pbr["pseudo_utterances"], pbr["reasoning"])
        pq = Personalizer(r.embeddings, store=r.history).personalize(user, QUERY, feedback=feedback)
        history = r.history.get(user)
        terms = lexical_terms(pq.explanation, hybrid.config.lexical_feedback_weight)
        want = rank(history, pq.vector, terms, K, own_terms=lexical_query(QUERY))
        assert [d.id for d in docs] == [history.items[x.position].id for x in want]
        assert all(d.metadata["store_score"] is None for d in docs)
        assert all(d.metadata["pbr_search"]["mode"] == "hybrid" for d in docs)


# -- isolation -------------------------------------------------------------------------------------
def test_the_collection_holds_every_user_interleaved(
    world: tuple[PBRRetriever, str], shared_chroma: ChromaServer
) -> None:
    r, name = world
    assert_collection_holds(collection(shared_chroma, name), r.history, USERS, ITEMS)


def test_sync_queries_see_only_their_user_and_match_brute_force(
    world: tuple[PBRRetriever, str],
) -> None:
    r, _ = world
    for user in USERS:
        check(r, user, r.invoke(QUERY, user_id=user))


async def test_async_queries_concurrently(world: tuple[PBRRetriever, str]) -> None:
    r, _ = world
    results = await asyncio.gather(*(r.ainvoke(QUERY, user_id=u) for u in USERS))
    for user, docs in zip(USERS, results):
        check(r, user, docs)


def test_batch_with_a_user_per_input(world: tuple[PBRRetriever, str]) -> None:
    r, _ = world
    per_user = r.configurable_fields(user_id=ConfigurableField(id="user_id"))
    configs: Any = [{"configurable": {"user_id": u}, "max_concurrency": 8} for u in USERS]
    for user, docs in zip(USERS, per_user.batch([QUERY] * len(USERS), config=configs)):
        check(r, user, docs)


async def test_abatch_with_a_user_per_input(world: tuple[PBRRetriever, str]) -> None:
    r, _ = world
    per_user = r.configurable_fields(user_id=ConfigurableField(id="user_id"))
    configs: Any = [{"configurable": {"user_id": u}} for u in reversed(USERS)]
    results = await per_user.abatch([QUERY] * len(USERS), config=configs)
    for user, docs in zip(reversed(USERS), results):
        check(r, user, docs)


def test_the_user_filter_runs_in_the_database(world: tuple[PBRRetriever, str]) -> None:
    # A post-filter on the collection's top-k would return fewer than all 12 of the user's items
    # (600 rows, 12 of them the user's); Chroma's where-filter returns every one.
    r, _ = world
    docs = r.invoke(QUERY, user_id="u07", k=ITEMS + 10)
    assert len(docs) == ITEMS
    check(r, "u07", docs, k=ITEMS)


def test_add_and_delete_update_the_database_and_the_history(
    shared_chroma: ChromaServer,
) -> None:
    name = f"lc-add-delete-{uuid.uuid4().hex[:8]}"
    r = retriever_on(chroma_store(shared_chroma, name, EMB), EMB)
    add_interleaved(r, ["ann", "ben"])
    col = collection(shared_chroma, name)
    r.delete(["ann-0", "ann-5"], user_id="ann")
    assert col.get(ids=[scoped_key("ann", "ann-0"), scoped_key("ann", "ann-5")])["ids"] == []
    assert col.count() == 2 * ITEMS - 2 and len(r.history.get("ann")) == ITEMS - 2
    with pytest.raises(KeyError, match="ben-1"):
        r.delete(["ben-1"], user_id="ann")  # another user's document, by id: refused
    assert col.get(ids=[scoped_key("ben", "ben-1")])["ids"] == [scoped_key("ben", "ben-1")]
    check_all = r.invoke(QUERY, user_id="ann", k=ITEMS)
    assert {d.id for d in check_all} == {f"ann-{n}" for n in range(ITEMS)} - {"ann-0", "ann-5"}


# -- hostile input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        ({"x": float("nan")}, "not a finite number"),
        ({"x": 2**70}, "does not fit 64 bits"),
        ({"$x": 1}, "reserved by Chroma"),
        ({"chroma:document": "a"}, "reserved by Chroma"),
        ({"": 1}, "empty or reserved"),
    ],
)
def test_metadata_chroma_would_change_or_refuse_namelessly_is_refused_before_any_write(
    shared_chroma: ChromaServer, metadata: dict[str, Any], why: str
) -> None:
    """Chroma drops a NaN's key and returns a large int as a float, silently, and refuses a
    reserved key with "Invalid metadata at index 1": pbr refuses each up front, naming the
    item and the key, and the batch writes nothing."""
    name = f"lc-meta-{uuid.uuid4().hex[:8]}"
    r = retriever_on(chroma_store(shared_chroma, name, EMB), EMB)
    docs = [Document("alice good", id="g"), Document("alice bad", metadata=metadata, id="b")]
    with pytest.raises(ValueError, match=f"item 'b' of user 'alice'.*{why}"):
        r.add_documents(docs, user_id="alice")
    assert collection(shared_chroma, name).count() == 0


def test_user_ids_that_look_like_filter_operators_are_plain_values(
    shared_chroma: ChromaServer,
) -> None:
    name = f"lc-hostile-{uuid.uuid4().hex[:8]}"
    r = retriever_on(chroma_store(shared_chroma, name, EMB), EMB)
    users = ["u00", *HOSTILE_USER_IDS]
    for i, user in enumerate(users):
        docs = [
            Document(page_content=f"{user} item {n}", metadata={"note": 'a "quoted" $or value'})
            for n in range(4)
        ]
        r.add_documents(docs, user_id=user, ids=[f"h{i}-{n}" for n in range(4)])
    for i, user in enumerate(users):
        docs = r.invoke("item", user_id=user, k=10)
        assert sorted(d.id or "" for d in docs) == [f"h{i}-{n}" for n in range(4)], user
        assert {d.metadata["user_id"] for d in docs} == {user}
        assert docs[0].metadata["note"] == 'a "quoted" $or value'
    for bad in ({"$ne": "u00"}, ["u00"], ""):
        with pytest.raises(ValueError, match="user_id must be a non-empty string"):
            r.invoke("item", user_id=bad)


# -- faults ----------------------------------------------------------------------------------------
def test_a_server_that_is_gone_gives_a_clear_error_and_no_partial_state(
    own_chroma: ChromaServer,
) -> None:
    r = retriever_on(chroma_store(own_chroma, "lc-faults", EMB), EMB)
    add_interleaved(r, ["ann"])
    before = r.history.get("ann")
    own_chroma.stop()
    with pytest.raises(VectorStoreUnavailableError, match=own_chroma.url) as info:
        r.invoke(QUERY, user_id="ann")
    assert info.value.url == own_chroma.url
    with pytest.raises(VectorStoreUnavailableError, match="history is unchanged"):
        r.add_documents([Document(page_content="lost")], user_id="ann", ids=["ann-new"])
    with pytest.raises(VectorStoreUnavailableError, match=own_chroma.url):
        asyncio.run(r.aadd_documents([Document(page_content="lost")], user_id="ben"))
    with pytest.raises(VectorStoreUnavailableError, match="history is unchanged"):
        r.delete(["ann-0"], user_id="ann")
    assert r.history.get("ann") is before  # not even a new snapshot
    assert "ben" not in r.history


def test_the_next_query_after_a_server_restart_works(own_chroma: ChromaServer) -> None:
    r = retriever_on(chroma_store(own_chroma, "lc-restart", EMB), EMB)
    add_interleaved(r, ["ann", "ben"])
    first = [d.id for d in r.invoke(QUERY, user_id="ann")]
    own_chroma.restart(kill=False)  # graceful, under the same client: keep-alive goes stale
    assert [d.id for d in r.invoke(QUERY, user_id="ann")] == first
    own_chroma.restart(kill=True)
    assert [d.id for d in asyncio.run(r.ainvoke(QUERY, user_id="ann"))] == first
    r.add_documents([Document(page_content="after the restart")], user_id="ann", ids=["ann-x"])
    assert "ann-x" in {d.id for d in r.invoke(QUERY, user_id="ann", k=ITEMS + 1)}


# -- durability ------------------------------------------------------------------------------------
def test_sigkill_and_restart_loses_nothing_and_keeps_anchors_consistent(
    own_chroma: ChromaServer, tmp_path: Any
) -> None:
    emb = CountingEmbedding(size=DIM)
    users = USERS[:6]
    r = retriever_on(chroma_store(own_chroma, "lc-durable", emb), emb)
    add_interleaved(r, users)
    r.delete(["u01-3"], user_id="u01")
    before = {u: [d.id for d in r.invoke(QUERY, user_id=u)] for u in users}  # anchors computed
    anchors = {u: r.history.get(u).anchor(r.config) for u in users}
    r.save(tmp_path / "history")

    own_chroma.kill()  # SIGKILL right after the writes: no graceful flush
    own_chroma.start()
    emb.documents_embedded = 0
    store = chroma_store(own_chroma, "lc-durable", emb)
    loaded = PBRRetriever.load(
        tmp_path / "history", llm=ParrotFakeChatModel(), vectorstore=store, k=K
    )
    assert emb.documents_embedded == 0  # the history is read back, not re-embedded

    col = collection(own_chroma, "lc-durable")
    assert col.count() == len(users) * ITEMS - 1
    for user in users:
        assert_history_matches_database(col, loaded.history.get(user), anchors[user], loaded.config)
        assert [d.id for d in loaded.invoke(QUERY, user_id=user)] == before[user]


def test_a_server_killed_during_a_large_add_is_healed_by_the_retry(
    own_chroma: ChromaServer,
) -> None:
    # The scenario: SIGKILL during a 5,000-document add. Whatever part landed is an
    # ordinary part of the user's corpus (searchable and deletable), and the retry completes the
    # batch without a duplicate.
    import threading
    import time

    name = f"lc-killed-add-{uuid.uuid4().hex[:8]}"
    r = retriever_on(chroma_store(own_chroma, name, EMB), EMB)
    docs = [Document(page_content=f"ann note {n}") for n in range(5000)]
    ids = [f"ann-{n}" for n in range(5000)]
    errors: list[BaseException] = []

    def add() -> None:
        try:
            # batches of 500, as an app writing a large upload would
            for start in range(0, 5000, 500):
                r.add_documents(
                    docs[start : start + 500], user_id="ann", ids=ids[start : start + 500]
                )
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=add)
    writer.start()
    col = collection(own_chroma, name)
    deadline = time.monotonic() + 60
    while col.count() == 0 and time.monotonic() < deadline:  # kill once a batch has landed
        time.sleep(0.01)
    own_chroma.kill()
    writer.join(60)
    assert errors and isinstance(errors[0], VectorStoreUnavailableError)
    own_chroma.start()
    landed = collection(own_chroma, name).count()
    assert 0 < landed < 5000
    store = chroma_store(own_chroma, name, EMB)
    fresh = retriever_on(store, EMB)  # a restarted process
    assert len(fresh.invoke(QUERY, user_id="ann", k=landed + 10)) == landed
    fresh.delete(["ann-0"], user_id="ann")  # a landed item is deletable
    for start in range(0, 5000, 500):  # the retry
        fresh.add_documents(docs[start : start + 500], user_id="ann", ids=ids[start : start + 500])
    assert collection(own_chroma, name).count() == 5000
    assert len(fresh.history.get("ann")) == 5000


def test_search_kwargs_over_chroma_are_honoured_or_refused_at_construction(
    shared_chroma: ChromaServer,
) -> None:
    store = chroma_store(shared_chroma, f"lc-kwargs-{uuid.uuid4().hex[:8]}", EMB)
    with pytest.raises(ValueError, match="'fetch_k' is not a parameter of Chroma"):
        PBRRetriever(
            llm=ParrotFakeChatModel(),
            embeddings=EMB,
            vectorstore=store,
            search_kwargs={"fetch_k": 20},
        )
    r = retriever_on(store, EMB, search_kwargs={"where_document": {"$contains": "tea"}, "k": 5})
    r.add_documents(
        [Document(page_content=t) for t in ("green tea", "black tea", "coffee", "tea time")],
        user_id="ann",
    )
    r.add_documents([Document(page_content="tea for bob")], user_id="bob")
    got = r.invoke("tea", user_id="ann")
    assert sorted(d.page_content for d in got) == ["black tea", "green tea", "tea time"]
    everything = r.model_copy(update={"search_kwargs": {"k": 5}}).invoke("tea", user_id="ann")
    cut = sorted(d.metadata["score"] for d in everything)[1]  # keeps all but the lowest
    kept = retriever_on(store, EMB, search_kwargs={"score_threshold": cut, "k": 5})
    scores = [d.metadata["score"] for d in kept.invoke("tea", user_id="ann")]
    assert len(scores) == len(everything) - 1 and min(scores) >= cut


def test_a_subclass_of_chroma_is_verified_like_chroma(shared_chroma: ChromaServer) -> None:
    """A subclass (tracing, caching) is still Chroma: pbr lists it, so a delete made through the
    store never reaches the LLM's prompt (before, a subclass was taken for a store that cannot
    list, and pbr's history, the deleted item included, was the record)."""

    class TracedChroma(Chroma):
        pass

    name = f"lc-sub-{uuid.uuid4().hex[:8]}"
    store = TracedChroma(
        client=shared_chroma.client(),
        collection_name=name,
        embedding_function=EMB,
        collection_configuration={"hnsw": {"space": "cosine"}},
    )
    r = retriever_on(store, EMB)
    assert r.corpus.verified
    r.add_documents(
        [Document("alice pin is 4321"), Document("alice likes pears")],
        user_id="alice",
        ids=["pin", "pears"],
    )
    store.delete([scoped_key("alice", "pin")])
    history = r.corpus.history("alice")
    assert history is not None and [item.id for item in history.items] == ["pears"]


def test_an_add_larger_than_chromas_batch_limit_is_written_whole(
    shared_chroma: ChromaServer,
) -> None:
    """Chroma refuses an upsert above its ``max_batch_size`` (5,461 rows on a local server)
    whole: pbr writes in slices of it (before, such an add failed, writing nothing)."""
    name = f"lc-big-{uuid.uuid4().hex[:8]}"
    r = retriever_on(chroma_store(shared_chroma, name, EMB), EMB)
    limit = shared_chroma.client().get_max_batch_size()
    n = limit + 7
    r.add_documents([Document(f"alice note {i}") for i in range(n)], user_id="alice")
    assert collection(shared_chroma, name).count() == n
    history = r.corpus.history("alice")
    assert history is not None and len(history) == n
