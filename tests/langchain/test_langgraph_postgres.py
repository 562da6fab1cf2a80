"""PBRStore over LangGraph's PostgresStore on a real PostgreSQL server (started by the fixture).

The in-memory tests (test_langgraph_store.py, beside this file) pin PBRStore's behaviour; these
check that it holds over the store agents deploy with: the database is the truth, users stay
apart, memories survive a restart, and a graph with a Postgres checkpointer and store keeps two
users' threads apart.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

pytest.importorskip("langgraph.store.postgres")

import psycopg
from conftest import clear_postgres
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.store.base import BaseStore
from langgraph.store.postgres import AsyncPostgresStore, PostgresStore
from test_langgraph_store import ALICE, BOB, NOTES, BagOfWords, filled, graph, keys

from langchain_pbr import PBRStore


@pytest.fixture
async def apostgres(postgres_url: str) -> AsyncIterator[AsyncPostgresStore]:
    async with AsyncPostgresStore.from_conn_string(postgres_url) as store:
        await store.setup()
        clear_postgres(postgres_url)
        yield store


def test_query_search_ranks_each_users_rows_only(postgres: PostgresStore) -> None:
    store = filled(PBRStore(postgres, BagOfWords()))
    assert keys(store.search(("memories", "alice"), query="cello"))[0] == "m4"
    assert keys(store.search(("memories", "bob"), query="peanuts"))[0] == "m2"
    alice = store.search(("memories", "alice"), query="I", limit=10)
    bob = store.search(("memories", "bob"), query="I", limit=10)
    # the two users share keys m1/m2; each sees exactly their own rows
    assert sorted(keys(alice)) == [k for k, _ in ALICE]
    assert sorted(keys(bob)) == [k for k, _ in BOB]
    assert {i.namespace for i in alice} == {("memories", "alice")}
    scores = [i.score for i in alice]
    assert all(s is not None for s in scores) and scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    explained = store.last_explanation(("memories", "bob"))
    assert explained is not None and explained["user"] == "bob"
    assert [r["key"] for r in explained["results"]] == keys(bob)
    assert all("dense_rank" in r and "lexical_rank" in r for r in explained["results"])


def test_every_row_of_one_batch_is_ranked_though_they_share_a_timestamp(
    postgres: PostgresStore,
) -> None:
    # PostgresStore orders a search by updated_at alone, the same for every row of one batch:
    # offset pages over it overlapped and skipped rows, which no query could then find
    from langgraph.store.base import PutOp

    ns = ("memories", "alice")
    postgres.batch([PutOp(ns, f"k{i:03d}", {"content": f"note {i} word{i}"}) for i in range(450)])
    store = PBRStore(postgres, BagOfWords(), page_size=100)
    history = store.corpus.history('["memories", "alice"]')
    assert history is not None and len(history) == 450
    for i in (0, 100, 199, 200, 449):
        assert keys(store.search(ns, query=f"word{i}", limit=1)) == [f"k{i:03d}"]


def test_reads_and_writes_are_the_databases(postgres: PostgresStore, postgres_url: str) -> None:
    store = filled(PBRStore(postgres, BagOfWords()))
    store.put(("memories", "alice"), "m3", {"content": "I changed jobs", "kind": "news"})
    store.delete(("memories", "bob"), "m2")
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT prefix, key FROM store ORDER BY prefix, key").fetchall()
    assert rows == [("memories.alice", k) for k, _ in ALICE] + [("memories.bob", "m1")]
    got = store.get(("memories", "alice"), "m3")
    assert got is not None and got.value == {"content": "I changed jobs", "kind": "news"}
    assert keys(store.search(("memories", "alice"), filter={"kind": "news"})) == ["m3"]


def test_the_database_is_the_truth(postgres: PostgresStore, postgres_url: str) -> None:
    store = filled(PBRStore(postgres, BagOfWords()))
    assert keys(store.search(("memories", "alice"), query="cello"))[0] == "m4"
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # behind pbr's back
        conn.execute("DELETE FROM store WHERE prefix = 'memories.alice' AND key = 'm4'")
    postgres.put(("memories", "alice"), "m9", {"content": "my cello teacher moved away"})
    got = keys(store.search(("memories", "alice"), query="cello"))
    assert "m4" not in got and got[0] == "m9"


def test_memories_survive_a_restart(postgres: PostgresStore, postgres_url: str) -> None:
    filled(PBRStore(postgres, BagOfWords()))
    with PostgresStore.from_conn_string(postgres_url) as reopened:  # a new process's store
        store = PBRStore(reopened, BagOfWords())
        assert keys(store.search(("memories", "alice"), query="ramen"))[0] == "m2"
        assert keys(store.search(("memories", "bob"), query="cameras"))[0] == "m1"


def test_a_state_graph_with_postgres_checkpointer_and_store_keeps_users_apart(
    postgres: PostgresStore, postgres_url: str
) -> None:
    store = PBRStore(postgres, BagOfWords())
    notes = NOTES
    with PostgresSaver.from_conn_string(postgres_url) as saver:
        saver.setup()
        app = graph(store, saver)
        for turn in range(3):
            for user in ("alice", "bob"):  # the two users' threads interleaved
                cfg: RunnableConfig = {"configurable": {"thread_id": f"t-{user}", "user_id": user}}
                out = app.invoke({"note": notes[user][turn], "query": "ramen", "found": []}, cfg)
                assert len(out["found"]) == turn + 1
                assert all(text.startswith(user) for text in out["found"])  # zero cross-user
        assert out["found"][0] == "bob eats ramen"
        snapshot = app.get_state({"configurable": {"thread_id": "t-alice"}})
        assert snapshot.values["note"] == "alice eats ramen"
    assert sorted(postgres.list_namespaces()) == [("memories", "alice"), ("memories", "bob")]


async def test_async_search_and_writes(apostgres: AsyncPostgresStore) -> None:
    store: BaseStore = PBRStore(apostgres, BagOfWords())
    for key, text in ALICE:
        await store.aput(("memories", "alice"), key, {"content": text})
    await store.aput(("memories", "bob"), "m1", {"content": "I play the cello too"})
    found = await store.asearch(("memories", "alice"), query="cello")
    assert keys(found)[0] == "m4" and {i.namespace for i in found} == {("memories", "alice")}
    await store.adelete(("memories", "alice"), "m4")
    found = await store.asearch(("memories", "alice"), query="cello")
    assert "m4" not in keys(found)
    other = uuid.uuid4().hex
    assert await store.asearch(("memories", other), query="cello") == []
