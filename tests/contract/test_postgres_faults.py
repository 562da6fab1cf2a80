"""Nothing lost or leaked on PostgreSQL under faults (issue #38): LangChain's ``PGVector`` under
pbr with a worker process SIGKILLed mid-add and with the database itself killed mid-batch, and
LlamaIndex's ``PGVectorStore`` with the database killed mid-batch.

After each fault the state is checked in SQL, not only through pbr: every row of the collection
carries pbr's owner metadata (no orphan row), no row is there twice (no duplicate), every item of
pbr's history has its row (no orphan item), and a user's queries return only that user's items.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake import FakeListLLM
from langchain_postgres import PGVector
from sqlalchemy import create_engine, text

from langchain_pbr import PBRRetriever
from pbr_core import VectorStoreUnavailableError

DIM = 16
EMB = DeterministicFakeEmbedding(size=DIM)
COLLECTION = "faults"
BATCH, BATCHES = 200, 20  # 4,000 documents per run

# A worker: adds ann's documents batch by batch, printing each acknowledged batch.
WRITER = textwrap.dedent(
    """
    import sys
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_postgres import PGVector
    from langchain_pbr import PBRRetriever

    url, collection, dim, batch, batches = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
    emb = DeterministicFakeEmbedding(size=dim)
    store = PGVector(embeddings=emb, connection=url, collection_name=collection)
    r = PBRRetriever(llm=FakeListLLM(responses=["x"]), embeddings=emb, vectorstore=store)
    for b in range(batches):
        ids = [f"ann-{n}" for n in range(b * batch, (b + 1) * batch)]
        r.add_documents([Document(page_content=f"ann note {i}") for i in ids], user_id="ann",
                        ids=ids)
        print(b, flush=True)
    """
)


def _docs(user: str, start: int, stop: int) -> tuple[list[Document], list[str]]:
    ids = [f"{user}-{n}" for n in range(start, stop)]
    return [Document(page_content=f"{user} note {i}") for i in ids], ids


def _retriever(engine: Any) -> PBRRetriever:
    store = PGVector(embeddings=EMB, connection=engine, collection_name=COLLECTION)
    return PBRRetriever(llm=FakeListLLM(responses=["x"]), embeddings=EMB, vectorstore=store)


def _add_all(r: PBRRetriever, user: str, total: int) -> None:
    for start in range(0, total, BATCH):
        docs, ids = _docs(user, start, min(start + BATCH, total))
        r.add_documents(docs, user_id=user, ids=ids)


def _rows(engine: Any) -> dict[str, Any]:
    """The collection's rows as PostgreSQL holds them, per owner."""
    with engine.connect() as conn:
        per_user = conn.execute(
            text(
                "SELECT e.cmetadata->>'user_id' AS owner, count(*), count(DISTINCT e.id),"
                " count(DISTINCT e.document)"
                " FROM langchain_pg_embedding e JOIN langchain_pg_collection c"
                " ON e.collection_id = c.uuid WHERE c.name = :name GROUP BY 1"
            ),
            {"name": COLLECTION},
        ).all()
        all_rows = conn.execute(text("SELECT count(*) FROM langchain_pg_embedding")).scalar_one()
    return {"per_user": {row[0]: tuple(row[1:]) for row in per_user}, "all": all_rows}


def _texts(engine: Any, user: str) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT e.document FROM langchain_pg_embedding e JOIN langchain_pg_collection"
                    " c ON e.collection_id = c.uuid WHERE c.name = :name"
                    " AND e.cmetadata->>'user_id' = :user"
                ),
                {"name": COLLECTION, "user": user},
            ).scalars()
        )


def _check_exact(engine: Any, r: PBRRetriever, expected: dict[str, int]) -> None:
    """Zero orphans, zero duplicates, zero cross-user results: the rows, pbr's history and the
    queries all hold exactly ``expected[user]`` items per user, the same ones."""
    rows = _rows(engine)
    # every row has an owner (no None group), none twice: rows == distinct keys == distinct texts
    assert rows["per_user"] == {u: (n, n, n) for u, n in expected.items() if n}, rows
    assert rows["all"] == sum(expected.values())
    for user, n in expected.items():
        texts = _texts(engine, user)
        found = r.invoke(f"{user} note", user_id=user, k=n + 10)  # reads the user's rows
        assert len(found) == n
        assert {d.metadata["user_id"] for d in found} == {user}  # nothing of another user
        assert {d.page_content for d in found} == set(texts)
        held = r.history.get(user).items  # pbr's copy, as the query read it
        assert len(held) == n and len({item.id for item in held}) == n
        assert {item.text for item in held} == set(texts)  # each item has its row, and back


def test_a_worker_killed_mid_add_and_restarted_loses_nothing_and_duplicates_nothing(
    pgvector_engine: Any,
) -> None:
    """A worker process adding ann's 4,000 documents in batches is SIGKILLed mid-way. A restarted
    worker sees the rows that landed as ann's ordinary items (searchable, deletable), bob's are
    untouched, and retrying every batch completes ann's set exactly once."""
    engine = pgvector_engine[0]
    bob = _retriever(engine)
    _add_all(bob, "bob", 300)
    url = engine.url.render_as_string(hide_password=False)
    total = BATCH * BATCHES
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, COLLECTION, *map(str, (DIM, BATCH, BATCHES))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        for _ in range(3):  # three batches acknowledged, the fourth under way
            assert child.stdout.readline().strip(), "the worker stopped before it was killed"
        time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    landed = _rows(engine)["per_user"]["ann"][0]
    assert 3 * BATCH <= landed < total
    assert landed % BATCH == 0  # a batch is one transaction: whole or not at all

    fresh = _retriever(engine)  # the restarted worker
    _check_exact(engine, fresh, {"ann": landed, "bob": 300})
    fresh.delete(["ann-0"], user_id="ann")  # a landed item is an ordinary, deletable one
    _check_exact(engine, fresh, {"ann": landed - 1, "bob": 300})
    _add_all(fresh, "ann", total)  # the retry of every batch
    _check_exact(engine, fresh, {"ann": total, "bob": 300})
    _check_exact(engine, bob, {"ann": total, "bob": 300})  # the first process sees it too


@pytest.fixture
def own_postgres(pgvector_url: str) -> Iterator[Any]:
    """A throw-away PostgreSQL server of this test's own (it is killed and restarted)."""
    from postgres_server import PostgresServer, find_binaries

    binaries = find_binaries()
    assert binaries is not None  # pgvector_url skips without them
    folder = Path(tempfile.mkdtemp(prefix="pbr-pg-faults-"))
    server = PostgresServer(folder, binaries).start()
    try:
        import psycopg

        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _kill_database_mid_add(server: Any, add: Callable[[], None], landed: Callable[[], int]) -> None:
    """Run ``add`` in a thread, SIGKILL the database once three of its batches have landed, and
    restart it: the add must have raised pbr's error for an unreachable store, saying the retry
    is safe (every item of the batches has an id)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            add()
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=run)
    writer.start()
    deadline = time.monotonic() + 30
    while landed() < 3 * BATCH:
        assert time.monotonic() < deadline and writer.is_alive()
        time.sleep(0.01)
    server.kill()
    writer.join(60)
    assert not writer.is_alive()
    assert len(errors) == 1, errors
    assert isinstance(errors[0], VectorStoreUnavailableError), repr(errors[0])
    assert "retrying the same call is safe" in str(errors[0])
    server.start()  # crash recovery on the same data folder and port


def test_the_database_killed_mid_batch_and_restarted_is_healed_by_the_retry(
    own_postgres: Any,
) -> None:
    """The database is SIGKILLed while a thread adds ann's batches: the add raises, the server
    restarts, and the same retriever object (its pool's connections died with the server) and a
    fresh one both see what landed and complete the set by retrying, exactly once."""
    url = own_postgres.url.replace("postgresql://", "postgresql+psycopg://")
    engine = create_engine(url)
    r = _retriever(engine)
    _add_all(r, "bob", 300)
    total = BATCH * BATCHES
    _kill_database_mid_add(
        own_postgres,
        lambda: _add_all(r, "ann", total),
        lambda: _rows(engine)["per_user"].get("ann", (0,))[0],
    )

    landed = _rows(engine)["per_user"]["ann"][0]
    assert 3 * BATCH <= landed < total
    assert landed % BATCH == 0  # the batch killed mid-statement was rolled back whole
    _check_exact(engine, r, {"ann": landed, "bob": 300})  # the same object, after the restart
    _add_all(r, "ann", total)
    _check_exact(engine, r, {"ann": total, "bob": 300})
    fresh_engine = create_engine(url)
    try:
        _check_exact(fresh_engine, _retriever(fresh_engine), {"ann": total, "bob": 300})
    finally:
        fresh_engine.dispose()
        engine.dispose()


def _li_rows(engine: Any) -> dict[str | None, tuple[int, int, int]]:
    """LlamaIndex's ``data_faults`` rows per owner: rows, distinct node ids, distinct texts."""
    with engine.connect() as conn:
        got = conn.execute(
            text(
                "SELECT metadata_->>'user_id', count(*), count(DISTINCT node_id),"
                " count(DISTINCT text) FROM data_faults GROUP BY 1"
            )
        ).all()
    return {row[0]: (row[1], row[2], row[3]) for row in got}


def test_the_database_killed_mid_batch_is_healed_by_the_retry_with_llamaindex(
    own_postgres: Any,
) -> None:
    """The same with LlamaIndex's ``PGVectorStore`` (a replace is delete + insert in one
    transaction there): the add raises pbr's error, the retry after the restart completes the set
    exactly, and the same and a fresh retriever see only each user's nodes."""
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.schema import TextNode
    from llama_index.vector_stores.postgres import PGVectorStore
    from sqlalchemy.ext.asyncio import create_async_engine

    from llamaindex_pbr import PBRRetriever as LIRetriever
    from llamaindex_pbr.testing import HashEmbedding

    url = own_postgres.url.replace("postgresql://", "postgresql+psycopg://")
    emb = HashEmbedding(dim=DIM)
    engines: list[Any] = []

    def retriever() -> Any:
        engine, async_engine = create_engine(url), create_async_engine(url)
        engines.append(engine)
        store = PGVectorStore(
            engine=engine, async_engine=async_engine, table_name="faults", embed_dim=DIM
        )
        storage = StorageContext.from_defaults(vector_store=store)
        index = VectorStoreIndex([], storage_context=storage, embed_model=emb)
        return LIRetriever(index, llm=MockLLM(max_tokens=8), embed_model=emb), engine

    def add_all(base: Any, user: str, total: int) -> None:
        for start in range(0, total, BATCH):
            ids = [f"{user}-{n}" for n in range(start, min(start + BATCH, total))]
            nodes = [TextNode(text=f"{user} note {i}", id_=i) for i in ids]
            base.for_user(user).add_nodes(nodes)

    def check(base: Any, engine: Any, expected: dict[str, int]) -> None:
        assert _li_rows(engine) == {u: (n, n, n) for u, n in expected.items() if n}
        for user, n in expected.items():
            got = base.for_user(user, similarity_top_k=n + 10).retrieve(f"{user} note")
            assert len(got) == n
            assert {g.node.metadata["user_id"] for g in got} == {user}
            texts = {g.node.get_content() for g in got}
            assert len(texts) == n and all(t.startswith(f"{user} note ") for t in texts)
            held = base.personalizer.store.get(user).items
            assert len(held) == n
            assert {item.text for item in held} == texts  # each item has its row, and back

    r, engine = retriever()
    try:
        add_all(r, "bob", 300)
        total = BATCH * BATCHES
        _kill_database_mid_add(
            own_postgres,
            lambda: add_all(r, "ann", total),
            lambda: _li_rows(engine).get("ann", (0,))[0],
        )

        landed = _li_rows(engine)["ann"][0]
        assert 3 * BATCH <= landed < total
        assert landed % BATCH == 0  # the cut batch was rolled back whole
        check(r, engine, {"ann": landed, "bob": 300})
        add_all(r, "ann", total)
        check(r, engine, {"ann": total, "bob": 300})
        fresh, fresh_engine = retriever()
        check(fresh, fresh_engine, {"ann": total, "bob": 300})
    finally:
        for e in engines:
            e.dispose()
