"""Memory of one worker serving many users under pbr's cache budget (HistoryStore max_cache_bytes).

A worker over a host store that lists its records holds pbr's per-user histories as a cache
(docs/deployment.md): under ``max_cache_bytes`` the least recently used users are evicted whole
and read back from the host on their next request. This script serves ``--users`` distinct users
(default 10,000 users of 100 items at 384-d) once each through :meth:`Personalizer.search`
(``fusion="paper"``: the anchor, both P-PRF terms and the BM25 index are built for every user)
with a ``--budget-mb`` budget (default 256 MB), and reports along the way the process's RSS, the
store's ``cached_bytes``, the users resident and evicted, and what an unbudgeted worker would hold
(the sum of each user's bytes right after its request). Then it serves a sample of users again
(re-read from the host after their eviction) and compares their rankings (top-10 ids and scores,
and ``q*``) with those of a fresh unbudgeted worker over the same host.

The host is in-process and synthetic: each user's 100 records are generated from a fixed seed
when listed (so the host itself holds nothing and the RSS is the worker's), and listed without
vectors, so a re-read re-embeds them (the embedder is a deterministic hash, as for a store that
does not return vectors). The LLM is a fixed answer (no model is loaded): this measures memory,
not quality.

    python benchmarks/cache_budget.py                    # about 5 minutes on 2 cores
    python benchmarks/cache_budget.py --users 2000 --budget-mb 64

Prints a table and writes ``benchmarks/results/cache_budget.{csv,json,png}``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_core import HistoryStore, PBRConfig, Personalizer
from pbr_core.corpus import Corpus, Record, scoped_key

DIM = 384
SEED = 0
WORDS = [
    "".join(
        random.Random(i).choices("abcdefghijklmnopqrstuvwxyz", k=random.Random(-i).randint(3, 9))
    )
    for i in range(4000)
]
QUERIES = ["what should I cook tonight", "plan a weekend trip", "fix my running schedule"]
ANSWER = '["a quick vegetarian dinner", "something with what is left in the fridge"]'


class HashEmbedder:
    """Deterministic unit-free vectors seeded by the text's hash (no model)."""

    model_id = "bench/hash-embedder-384"

    def _vector(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        return np.random.default_rng(seed).standard_normal(DIM, dtype=np.float32)

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text).tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vector(t).tolist() for t in texts]


class FixedAnswer:
    """The LLM: one fixed answer that both P-PRF prompts parse."""

    model_id = "bench/fixed-answer"

    def generate(self, prompt: str) -> str:
        return ANSWER


class SyntheticHost:
    """A host store that lists each user's ``items`` records, generated from a fixed seed when
    listed (without vectors); read-only."""

    can_list = True

    def __init__(self, items: int) -> None:
        self.items = items
        self.listings = 0

    def records(self, user_id: str) -> list[Record]:
        rnd = random.Random(f"{SEED}-{user_id}")
        out = []
        for i in range(self.items):
            text = " ".join(rnd.choices(WORDS, k=rnd.randint(8, 30)))
            item_id = f"n{i}"
            out.append(
                Record(
                    key=scoped_key(user_id, item_id),
                    user_id=user_id,
                    item_id=item_id,
                    text=text,
                    metadata={"user_id": user_id, "source": "chat"},
                )
            )
        return out

    def validate(self, records: Sequence[Record]) -> None:
        return None

    def upsert(self, records: Sequence[Record]) -> None:
        raise NotImplementedError("read-only synthetic host")

    def delete(self, user_id: str, keys: Sequence[str]) -> None:
        raise NotImplementedError("read-only synthetic host")

    def list_user(self, user_id: str) -> list[Record]:
        self.listings += 1
        return self.records(user_id)

    def fetch(self, user_id: str, keys: Sequence[str]) -> list[Record]:
        return []  # no vectors: re-embedded


def rss_mb() -> float:
    """The process's resident set now, in MB (from /proc; 0 where there is none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def worker(host: SyntheticHost, max_cache_bytes: int) -> Personalizer:
    corpus = Corpus(
        host, embedder=HashEmbedder(), cache=HistoryStore(max_cache_bytes=max_cache_bytes)
    )
    return Personalizer(corpus=corpus, generator=FixedAnswer(), config=PBRConfig(fusion="paper"))


def ranking(p: Personalizer, user: str, query: str) -> tuple[list[tuple[str, float]], np.ndarray]:
    got = p.search(user, query, k=10)
    return [(h.id, round(h.score, 6)) for h in got.hits], got.personalized.vector


def plot(rows: list[dict[str, Any]], budget_mb: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    served = [r["users_served"] for r in rows]
    ax.plot(served, [r["unbudgeted_mb"] for r in rows], label="unbudgeted worker would hold")
    ax.plot(served, [r["rss_mb"] for r in rows], marker="o", label="RSS (whole process)")
    ax.plot(served, [r["cached_mb"] for r in rows], marker=".", label="cached_bytes")
    ax.axhline(budget_mb, color="grey", ls="--", lw=1, label="max_cache_bytes")
    ax.set_xlabel("distinct users served")
    ax.set_ylabel("MB")
    ax.set_title("One worker under a cache budget")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--budget-mb", type=float, default=256.0)
    parser.add_argument("--sample", type=int, default=200, help="users compared at the end")
    parser.add_argument("--every", type=int, default=500, help="users between two table rows")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "cache_budget")
    args = parser.parse_args()

    budget = int(args.budget_mb * 2**20)
    host = SyntheticHost(args.items)
    budgeted = worker(host, budget)
    store = budgeted.store
    users = [f"user{u:06d}" for u in range(args.users)]
    rss_start = rss_mb()
    unbudgeted_bytes = 0
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    print(
        f"{'users':>7} {'RSS MB':>8} {'cached MB':>10} {'resident':>9} {'evicted':>8} "
        f"{'unbudgeted MB':>14} {'s':>6}"
    )
    for n, user in enumerate(users, 1):
        budgeted.search(user, QUERIES[n % len(QUERIES)], k=10)
        snap = store._current(user)  # the user just served: its anchor and index are built
        unbudgeted_bytes += snap.nbytes() if snap is not None else 0
        if n % args.every == 0 or n == len(users):
            row = {
                "users_served": n,
                "rss_mb": round(rss_mb(), 1),
                "rss_growth_mb": round(rss_mb() - rss_start, 1),
                "cached_mb": round(store.cached_bytes / 2**20, 1),
                "resident_users": len(store),
                "evictions": store.evictions,
                "unbudgeted_mb": round(unbudgeted_bytes / 2**20, 1),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            rows.append(row)
            print(
                f"{n:>7} {row['rss_mb']:>8} {row['cached_mb']:>10} {row['resident_users']:>9} "
                f"{row['evictions']:>8} {row['unbudgeted_mb']:>14} {row['seconds']:>6}"
            )
    serve_s = time.perf_counter() - t0

    # Rankings of re-read users against an unbudgeted worker's.
    sample = random.Random(SEED).sample(users, min(args.sample, len(users)))
    plain = worker(host, 2**62)
    equal = 0
    reread = 0
    for i, user in enumerate(sample):
        reread += user not in store
        query = QUERIES[i % len(QUERIES)]
        got, got_q = ranking(budgeted, user, query)
        want, want_q = ranking(plain, user, query)
        equal += got == want and bool(np.allclose(got_q, want_q, atol=1e-6))
    summary = {
        "users": args.users,
        "items_per_user": args.items,
        "dim": DIM,
        "budget_mb": args.budget_mb,
        "serve_seconds": round(serve_s, 1),
        "ms_per_request": round(serve_s / args.users * 1000, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_start_mb": round(rss_start, 1),
        "final_cached_mb": rows[-1]["cached_mb"],
        "bytes_per_warm_user": round(unbudgeted_bytes / args.users),
        "sample": len(sample),
        "sample_reread": reread,
        "sample_rankings_equal": equal,
        "host_listings": host.listings,
    }
    print(
        f"\n{equal}/{len(sample)} sampled rankings equal an unbudgeted worker's "
        f"({reread} of them re-read from the host after eviction); peak RSS "
        f"{summary['peak_rss_mb']} MB; {summary['bytes_per_warm_user']} bytes per warm user; "
        f"{summary['ms_per_request']} ms per request"
    )
    meta = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
        "seed": SEED,
    }
    write_rows(rows, args.out, payload={"meta": meta, "summary": summary, "rows": rows})
    plot(rows, args.budget_mb, Path(f"{args.out}.png"))
    print(f"wrote {args.out}.csv / .json / .png")


if __name__ == "__main__":
    main()
