"""Stateless workers: two OS processes of one app, sharing one real Chroma server (or one
PostgreSQL database with pgvector).

Each process is its own retriever (``ownership_worker.py`` beside this file), serving requests
concurrently.
8 clients × 20 users × 200 operations (mixed add / re-add / delete / query) go to a random worker
each; every user belongs to one client, so the expected corpus after each acknowledged operation
is exact. The contract: zero results from another user, zero lost items, and every query sees
exactly the writes acknowledged before it started, whichever process acknowledged them. Then the
same with the server SIGKILLed mid-run and restarted: failed operations are retried (writes are
idempotent), and the state afterwards is exactly the acknowledged one.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from chroma_server import ChromaServer

CLIENTS = 8
USERS = 20
OPS = 200  # per client
WORKER = Path(__file__).with_name("ownership_worker.py")


class Worker:
    """A worker process and the futures of its requests in flight."""

    def __init__(self, adapter: str, target: int | str, collection: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), adapter, str(target), collection],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert json.loads(ready) == {"ready": True}, ready
        self._ids = itertools.count()
        self._pending: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self._lock:
                future = self._pending.pop(answer["id"])
            future.set_result(answer)

    def call(self, request: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            rid = next(self._ids)
            self._pending[rid] = future
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(json.dumps({**request, "id": rid}) + "\n")
            self.proc.stdin.flush()
        return future.result(timeout)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# Chroma's local server saves its HNSW index every ``sync_threshold`` writes (default 1000) in
# three steps that are not atomic together: the index files, the id map, the sequence number in
# SQLite (``persist`` in chroma's rust/segment/src/local_hnsw.rs). A SIGKILL between them leaves an
# index newer than its id map; replaying the log on restart then fails for good ("Error in
# compaction: Failed to apply logs to the hnsw segment writer", chroma-core/chroma#5366). That is
# Chroma's own damage, which no client can heal, so the crash test keeps every write in Chroma's
# log (one index save per 10^6 writes): the restart replays the log, which is the path under test.
NO_INDEX_SAVE = 1_000_000


@pytest.fixture
def workers(request: pytest.FixtureRequest, own_chroma: ChromaServer) -> Iterator[list[Worker]]:
    adapter, _, mode = request.param.partition(":")
    collection = f"workers-{uuid.uuid4().hex[:8]}"
    hnsw: dict[str, Any] = {"space": "cosine"}
    if mode == "crash":
        hnsw["sync_threshold"] = NO_INDEX_SAVE
    own_chroma.client().get_or_create_collection(collection, configuration={"hnsw": hnsw})
    pair = [Worker(adapter, own_chroma.port, collection) for _ in range(2)]
    held = own_chroma.client().get_collection(collection).configuration["hnsw"]
    assert held["sync_threshold"] == hnsw.get("sync_threshold", 1000), held  # workers kept it
    yield pair
    for worker in pair:
        worker.close()


@pytest.fixture
def pg_workers(request: pytest.FixtureRequest, pgvector_engine: Any) -> Iterator[list[Worker]]:
    """Two workers over one fresh PostgreSQL database (LangChain's PGVector collection or
    LlamaIndex's PGVectorStore table)."""
    url = pgvector_engine[0].url.render_as_string(hide_password=False)
    pair = [Worker(f"{request.param}-pg", url, "workers") for _ in range(2)]
    yield pair
    for worker in pair:
        worker.close()


class Client:
    """One client: owns a few users, knows exactly what each of them holds."""

    def __init__(self, n: int, workers: list[Worker], seed: int) -> None:
        self.users = [f"user-{u:02d}" for u in range(USERS) if u % CLIENTS == n]
        self.expected: dict[str, dict[str, str]] = {u: {} for u in self.users}
        self.workers = workers
        self.rng = random.Random(seed)
        self.failures: list[str] = []
        self.retried = 0
        self.n = n

    def send(self, request: dict[str, Any], *, retry: bool) -> dict[str, Any]:
        """Send to a random worker; with ``retry``, resend until a definite answer (a server
        that is down gives errors for a while)."""
        deadline = time.monotonic() + 120
        while True:
            answer = self.rng.choice(self.workers).call(request)
            if answer["ok"] or not retry or answer["error"] == "KeyError":
                return answer
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer within 120 s: {answer}")
            self.retried += 1
            time.sleep(0.2)

    def run(self, ops: int, retry: bool) -> None:
        for step in range(ops):
            user = self.rng.choice(self.users)
            mine = self.expected[user]
            roll = self.rng.random()
            if roll < 0.45 or not mine:
                ids = [f"i{self.rng.randrange(40)}" for _ in range(self.rng.randint(1, 3))]
                ids = list(dict.fromkeys(ids))  # an id already held is a re-add (replace)
                texts = [f"{user} item {i} v{step}" for i in ids]
                answer = self.send(
                    {"op": "add", "user": user, "ids": ids, "texts": texts}, retry=retry
                )
                assert answer["ok"], answer
                mine.update(zip(ids, texts))
            elif roll < 0.65:
                item = self.rng.choice(sorted(mine))
                answer = self.send({"op": "delete", "user": user, "ids": [item]}, retry=retry)
                # after an ambiguous failure the retried delete may find the item gone already
                assert answer["ok"] or (retry and answer["error"] == "KeyError"), answer
                del mine[item]
            else:
                self.check(user, retry)

    def check(self, user: str, retry: bool) -> None:
        answer = self.send({"op": "query", "user": user, "k": 200}, retry=retry)
        assert answer["ok"], answer
        hits = answer["hits"]
        strangers = [h for h in hits if h["owner"] != user or not h["text"].startswith(user)]
        if strangers:
            self.failures.append(f"{user} got another user's items: {strangers[:2]}")
        got = {h["id"]: h["text"] for h in hits}
        if got != self.expected[user]:
            lost = sorted(set(self.expected[user]) - set(got))
            extra = sorted(set(got) - set(self.expected[user]))
            stale = sorted(
                i for i in got if i in self.expected[user] and got[i] != self.expected[user][i]
            )
            self.failures.append(f"{user}: lost {lost}, extra {extra}, stale {stale}")


def drive(workers: list[Worker], *, retry: bool = False, during: Any = None) -> list[Client]:
    clients = [Client(n, workers, seed=n) for n in range(CLIENTS)]
    errors: list[BaseException] = []

    def run(client: Client) -> None:
        try:
            client.run(OPS, retry)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    if during is not None:
        during()
    for t in threads:
        t.join(600)
    assert not errors, errors[0]
    for client in clients:  # the final state, every user, through both workers
        for user in client.users:
            for _ in workers:
                client.check(user, retry=True)
    return clients


@pytest.mark.parametrize("workers", ["langchain", "llamaindex"], indirect=True)
def test_two_processes_on_one_server_behave_like_one(workers: list[Worker]) -> None:
    clients = drive(workers)
    failures = [f for c in clients for f in c.failures]
    assert failures == []
    assert sum(len(e) for c in clients for e in c.expected.values()) > 0


@pytest.mark.parametrize("pg_workers", ["langchain", "llamaindex"], indirect=True)
def test_two_processes_on_one_postgres_database_behave_like_one(pg_workers: list[Worker]) -> None:
    """Each query's check is the revision read; a write by the other process moves it."""
    clients = drive(pg_workers)
    failures = [f for c in clients for f in c.failures]
    assert failures == []
    assert sum(len(e) for c in clients for e in c.expected.values()) > 0


@pytest.mark.parametrize("workers", ["langchain:crash"], indirect=True)
def test_a_server_sigkilled_mid_run_and_restarted_loses_nothing(
    workers: list[Worker], own_chroma: ChromaServer
) -> None:
    def crash() -> None:
        time.sleep(3.0)
        own_chroma.kill()
        time.sleep(1.0)
        own_chroma.start()

    clients = drive(workers, retry=True, during=crash)
    failures = [f for c in clients for f in c.failures]
    assert failures == []
    assert sum(c.retried for c in clients) > 0  # the crash did hit requests in flight
