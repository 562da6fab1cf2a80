"""llamaindex_pbr.PBRRetriever on a real Chroma server through ``ChromaVectorStore``.

One collection holds every user; the per-user ``MetadataFilters`` become Chroma's ``where``,
applied in the database. Fakes for the models (``HashEmbedding``, ``MockLLM``, which echoes the
prompt): the point here is the database.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("chromadb")
pytest.importorskip("llama_index.vector_stores.chroma")

from chroma_server import (
    HOSTILE_USER_IDS,
    ChromaServer,
    assert_collection_holds,
    assert_history_matches_database,
    brute_force_ids,
)
from llama_index.core import VectorStoreIndex
from llama_index.core.llms.mock import MockLLM
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.core.vector_stores import MetadataFilter, MetadataFilters
from llama_index.vector_stores.chroma import ChromaVectorStore

from llamaindex_pbr import PBRRetriever
from llamaindex_pbr.testing import HashEmbedding
from pbr_core import PBRConfig, PseudoFeedback, VectorStoreUnavailableError
from pbr_core.corpus import scoped_key

DIM = 32
USERS = [f"u{i:02d}" for i in range(50)]
ROUNDS, PER_ROUND = 2, 6  # 12 items per user, written round-robin: users' rows interleave
ITEMS = ROUNDS * PER_ROUND
TOPICS = ("running", "cooking", "film cameras", "cars", "gardening", "chess", "jazz", "travel")
QUERY = "what should I do this weekend?"
K = 5


class CountingEmbedding(HashEmbedding):
    """HashEmbedding that counts the texts it embeds (same ``model_name``: same model)."""

    texts_embedded: int = 0

    def _get_text_embedding(self, text: str) -> list[float]:
        self.texts_embedded += 1
        return super()._get_text_embedding(text)


EMB = HashEmbedding(dim=DIM)


def text(user: str, n: int) -> str:
    return f"{user} note {n} about {TOPICS[(n + len(user)) % len(TOPICS)]}"


def chroma_index(server: ChromaServer, name: str, embed_model: Any) -> VectorStoreIndex:
    col = server.client().get_or_create_collection(
        name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
    )
    return VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=col), embed_model=embed_model
    )


def collection(server: ChromaServer, name: str) -> Any:
    return server.client().get_collection(name, embedding_function=None)


def retriever_on(index: VectorStoreIndex, embed_model: Any) -> PBRRetriever:
    """Dense search, so results can be checked against a brute-force cosine ranking (hybrid
    search is tested in tests/core/test_hybrid.py and tests/contract/test_ownership_contract.py)."""
    return PBRRetriever(
        index,
        llm=MockLLM(),
        embed_model=embed_model,
        similarity_top_k=K,
        config=PBRConfig(search="dense", explain="all"),  # the tests read the explanation
    )


def add_interleaved(base: PBRRetriever, users: list[str]) -> None:
    for rnd in range(ROUNDS):
        for user in users:
            ns = range(rnd * PER_ROUND, (rnd + 1) * PER_ROUND)
            base.for_user(user).add_nodes(
                [TextNode(text=text(user, n), id_=f"{user}-{n}") for n in ns]
            )


def check(base: PBRRetriever, user: str, nodes: list[NodeWithScore], k: int = K) -> None:
    assert len(nodes) == min(k, ITEMS)
    owners = {n.node.metadata["user_id"] for n in nodes}
    assert owners == {user}, f"{user} got nodes of {owners - {user}}"
    # Brute force over the user's items with the same q*, rebuilt from the explanation.
    pbr = nodes[0].node.metadata["pbr"]
    feedback = PseudoFeedback(pbr["pseudo_utterances"], pbr["reasoning"])
    pq = base.personalizer.personalize(user, pbr["query"], feedback=feedback)
    assert list(pq.explanation.used) == pbr["used"]
    history = base.personalizer.store.get(user)
    ids = [it.id for it in history.items]
    assert [n.node.node_id for n in nodes] == brute_force_ids(history.vectors, ids, pq.vector, k)
    scores = [n.score or 0.0 for n in nodes]
    assert scores == sorted(scores, reverse=True)


@pytest.fixture(scope="module")
def world(shared_chroma: ChromaServer) -> tuple[PBRRetriever, str]:
    """50 users, 12 items each, in one collection, written interleaved through the retriever."""
    name = f"li-isolation-{uuid.uuid4().hex[:8]}"
    base = retriever_on(chroma_index(shared_chroma, name, EMB), EMB)
    add_interleaved(base, USERS)
    return base, name


# -- isolation -------------------------------------------------------------------------------------
def test_the_collection_holds_every_user_interleaved(
    world: tuple[PBRRetriever, str], shared_chroma: ChromaServer
) -> None:
    base, name = world
    col = collection(shared_chroma, name)
    assert_collection_holds(col, base.personalizer.store, USERS, ITEMS)


def test_sync_queries_see_only_their_user_and_match_brute_force(
    world: tuple[PBRRetriever, str],
) -> None:
    base, _ = world
    for user in USERS:
        check(base, user, base.for_user(user).retrieve(QUERY))


async def test_async_queries_concurrently(world: tuple[PBRRetriever, str]) -> None:
    base, _ = world
    results = await asyncio.gather(*(base.for_user(u).aretrieve(QUERY) for u in USERS))
    for user, nodes in zip(USERS, results):
        check(base, user, nodes)


def test_a_batch_across_threads_with_a_user_per_item(world: tuple[PBRRetriever, str]) -> None:
    base, _ = world
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda u: base.for_user(u).retrieve(QUERY), USERS))
    for user, nodes in zip(USERS, results):
        check(base, user, nodes)


def test_the_user_filter_runs_in_the_database(world: tuple[PBRRetriever, str]) -> None:
    # A view filter makes Chroma search (without one pbr ranks the user's items itself); the
    # user filter is ANDed to it and applied by Chroma's where, not after its top-k.
    base, _ = world
    mine = MetadataFilters(filters=[MetadataFilter(key="user_id", value="u07")])
    nodes = base.for_user("u07", similarity_top_k=ITEMS + 10, filters=mine).retrieve(QUERY)
    assert len(nodes) == ITEMS  # a post-filter on the collection's top-k would return fewer
    check(base, "u07", nodes, k=ITEMS)


def test_add_and_delete_update_the_database_and_the_history(
    shared_chroma: ChromaServer,
) -> None:
    name = f"li-add-delete-{uuid.uuid4().hex[:8]}"
    base = retriever_on(chroma_index(shared_chroma, name, EMB), EMB)
    add_interleaved(base, ["ann", "ben"])
    col = collection(shared_chroma, name)
    ann = base.for_user("ann", similarity_top_k=ITEMS)
    ann.delete_nodes(["ann-0", "ann-5"])
    assert col.get(ids=[scoped_key("ann", "ann-0"), scoped_key("ann", "ann-5")])["ids"] == []
    assert col.count() == 2 * ITEMS - 2
    assert len(base.personalizer.store.get("ann")) == ITEMS - 2
    with pytest.raises(KeyError, match="ben-1"):
        ann.delete_nodes(["ben-1"])
    assert col.get(ids=[scoped_key("ben", "ben-1")])["ids"] == [scoped_key("ben", "ben-1")]
    found = {n.node.node_id for n in ann.retrieve(QUERY)}
    assert found == {f"ann-{n}" for n in range(ITEMS)} - {"ann-0", "ann-5"}


# -- hostile input ---------------------------------------------------------------------------------
def test_user_ids_that_look_like_filter_operators_are_plain_values(
    shared_chroma: ChromaServer,
) -> None:
    name = f"li-hostile-{uuid.uuid4().hex[:8]}"
    base = retriever_on(chroma_index(shared_chroma, name, EMB), EMB)
    users = ["u00", *HOSTILE_USER_IDS]
    for i, user in enumerate(users):
        base.for_user(user).add_nodes(
            [
                TextNode(
                    text=f"{user} item {n}",
                    id_=f"h{i}-{n}",
                    metadata={"note": 'a "quoted" $or value'},
                    excluded_embed_metadata_keys=["note"],
                )
                for n in range(4)
            ]
        )
    for i, user in enumerate(users):
        nodes = base.for_user(user, similarity_top_k=10).retrieve("item")
        assert sorted(n.node.node_id for n in nodes) == [f"h{i}-{n}" for n in range(4)], user
        assert {n.node.metadata["user_id"] for n in nodes} == {user}
        assert nodes[0].node.metadata["note"] == 'a "quoted" $or value'
    for bad in ({"$ne": "u00"}, ["u00"], ""):
        with pytest.raises(ValueError, match="user_id must be a non-empty string"):
            base.for_user(bad)  # type: ignore[arg-type]


# -- faults ----------------------------------------------------------------------------------------
def test_a_server_that_is_gone_gives_a_clear_error_and_no_partial_state(
    own_chroma: ChromaServer,
) -> None:
    base = retriever_on(chroma_index(own_chroma, "li-faults", EMB), EMB)
    add_interleaved(base, ["ann"])
    ann = base.for_user("ann")
    store = base.personalizer.store
    before = store.get("ann")
    own_chroma.stop()
    with pytest.raises(VectorStoreUnavailableError, match=own_chroma.url) as info:
        ann.retrieve(QUERY)
    assert info.value.url == own_chroma.url
    with pytest.raises(VectorStoreUnavailableError, match=own_chroma.url):
        asyncio.run(ann.aretrieve(QUERY))
    with pytest.raises(VectorStoreUnavailableError, match="history is unchanged"):
        ann.add_nodes([TextNode(text="lost", id_="ann-new")])
    with pytest.raises(VectorStoreUnavailableError, match="history is unchanged"):
        asyncio.run(base.for_user("ben").aadd_nodes([TextNode(text="lost")]))
    with pytest.raises(VectorStoreUnavailableError, match="history is unchanged"):
        ann.delete_nodes(["ann-0"])
    assert store.get("ann") is before
    assert "ben" not in store


def test_the_next_query_after_a_server_restart_works(own_chroma: ChromaServer) -> None:
    base = retriever_on(chroma_index(own_chroma, "li-restart", EMB), EMB)
    add_interleaved(base, ["ann", "ben"])
    ann = base.for_user("ann")
    first = [n.node.node_id for n in ann.retrieve(QUERY)]
    own_chroma.restart(kill=False)
    assert [n.node.node_id for n in ann.retrieve(QUERY)] == first
    own_chroma.restart(kill=True)
    assert [n.node.node_id for n in asyncio.run(ann.aretrieve(QUERY))] == first
    ann.add_nodes([TextNode(text="after the restart", id_="ann-x")])
    found = base.for_user("ann", similarity_top_k=ITEMS + 1).retrieve(QUERY)
    assert "ann-x" in {n.node.node_id for n in found}


# -- durability ------------------------------------------------------------------------------------
def test_sigkill_and_restart_loses_nothing_and_keeps_anchors_consistent(
    own_chroma: ChromaServer, tmp_path: Any
) -> None:
    emb = CountingEmbedding(dim=DIM)
    users = USERS[:6]
    base = retriever_on(chroma_index(own_chroma, "li-durable", emb), emb)
    add_interleaved(base, users)
    base.for_user("u01").delete_nodes(["u01-3"])
    views = {u: base.for_user(u) for u in users}
    before = {u: [n.node.node_id for n in v.retrieve(QUERY)] for u, v in views.items()}
    anchors = {u: base.personalizer.store.get(u).anchor(base.config) for u in users}
    base.persist(tmp_path / "pbr")

    own_chroma.kill()  # SIGKILL right after the writes
    own_chroma.start()
    emb.texts_embedded = 0
    col = collection(own_chroma, "li-durable")
    loaded = PBRRetriever.from_persist_dir(
        tmp_path / "pbr",
        llm=MockLLM(),
        embed_model=emb,
        vector_store_loader=lambda _folder: ChromaVectorStore(chroma_collection=col),
    )
    assert emb.texts_embedded == 0  # the histories are read back, not re-embedded

    assert col.count() == len(users) * ITEMS - 1
    for user in users:
        history = loaded.personalizer.store.get(user)
        assert_history_matches_database(col, history, anchors[user], loaded.config)
        nodes = loaded.for_user(user).retrieve(QUERY)
        assert [n.node.node_id for n in nodes] == before[user]


def test_a_partition_of_chroma_collections_loads_each_users_store_by_user(
    shared_chroma: ChromaServer, tmp_path: Any
) -> None:
    """A per-user partition (one Chroma collection per user) is persisted in hashed folders; the
    loader is given the user, so it can find that user's collection."""
    emb = HashEmbedding(dim=DIM)
    tag = uuid.uuid4().hex[:8]

    def store_of(user: str) -> ChromaVectorStore:
        col = shared_chroma.client().get_or_create_collection(f"part-{tag}-{user}")
        return ChromaVectorStore(chroma_collection=col)

    base = PBRRetriever.from_defaults(
        nodes=[
            TextNode(text=text(u, n), metadata={"user_id": u}) for u in USERS[:2] for n in (0, 1)
        ],
        llm=MockLLM(),
        embed_model=emb,
        vector_store_factory=store_of,
    )
    base.persist(tmp_path / "pbr")
    seen: list[Any] = []

    def loader(folder: str, user: str | None) -> ChromaVectorStore:
        seen.append(user)
        assert user is not None
        return store_of(user)

    loaded = PBRRetriever.from_persist_dir(
        tmp_path / "pbr", llm=MockLLM(), embed_model=emb, vector_store_loader=loader
    )
    assert sorted(seen) == sorted(USERS[:2])
    for user in USERS[:2]:
        got = loaded.retrieve(QUERY, user_id=user)
        assert {n.node.get_content() for n in got} == {text(user, 0), text(user, 1)}


def test_a_worker_that_never_wrote_a_user_reads_their_collection_from_the_factory(
    shared_chroma: ChromaServer,
) -> None:
    """One collection per user (``vector_store_factory``): a second worker, or the app after a
    restart, opens the user's collection on a read, so it finds, ranks and deletes what another
    worker wrote (before, a user this worker had not written was unknown: no results, and a
    delete raised KeyError)."""
    tag = uuid.uuid4().hex[:8]

    def store_of(user: str) -> ChromaVectorStore:
        return ChromaVectorStore(
            chroma_collection=shared_chroma.client().get_or_create_collection(f"w-{tag}-{user}")
        )

    def worker() -> PBRRetriever:
        return PBRRetriever(
            {},
            vector_store_factory=store_of,
            llm=MockLLM(),
            embed_model=EMB,
            similarity_top_k=5,
            config=PBRConfig(fusion="no_prf"),
        )

    first = worker()
    first.for_user("alice").add_nodes(
        [TextNode(id_=f"n{i}", text=f"alice note {i} about apples") for i in range(3)]
    )
    second = worker()  # never wrote alice
    assert sorted(n.node.node_id for n in second.retrieve("apples", user_id="alice")) == [
        "n0",
        "n1",
        "n2",
    ]
    second.for_user("alice").delete_nodes(["n0"])
    assert sorted(n.node.node_id for n in first.retrieve("apples", user_id="alice")) == ["n1", "n2"]


def test_a_views_docstore_reads_neighbours_from_the_collection(
    shared_chroma: ChromaServer,
) -> None:
    """Chroma keeps the text itself (the index's docstore is empty): the view's docstore reads
    the user's nodes from the collection, with the relationships LlamaIndex stored."""
    from llama_index.core.postprocessor import PrevNextNodePostprocessor
    from llama_index.core.schema import NodeRelationship

    base = retriever_on(
        chroma_index(shared_chroma, f"li-docstore-{uuid.uuid4().hex[:8]}", EMB), EMB
    )
    for user in ("ann", "bob"):
        nodes = [TextNode(text=text(user, n), id_=f"{user}-{n}") for n in range(3)]
        for a, b in itertools.pairwise(nodes):
            a.relationships[NodeRelationship.NEXT] = b.as_related_node_info()
        base.for_user(user).add_nodes(nodes)
    ann = base.for_user("ann", similarity_top_k=1)
    assert len(base.index.docstore.docs) == 0  # type: ignore[union-attr]
    first = [n for n in ann.retrieve(text("ann", 0)) if n.node.node_id == "ann-0"]
    assert first, "the query for ann's first node finds it"
    got = PrevNextNodePostprocessor(docstore=ann.docstore, num_nodes=2).postprocess_nodes(first)
    assert [n.node.node_id for n in got] == ["ann-0", "ann-1", "ann-2"]
    assert {n.node.metadata["user_id"] for n in got} == {"ann"}
    assert ann.docstore.get_node("bob-1", raise_error=False) is None
