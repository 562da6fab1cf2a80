"""Speed and scale of PBR's own work (issue 6): anchors, incremental updates, per-query overhead,
many users. No embedding model and no LLM: synthetic clustered unit vectors and instant fakes.

Sections (each can be skipped with ``--skip``):

* ``scaling``: anchor build (kNN graph + PageRank + weighted mean) for histories of n items,
  exact vs approximate kNN (IVF, HNSW), each in a fresh process so that its peak memory is its
  own. Quality against the exact build at the same n: edge recall, cosine between anchors, and
  whether the top-5 retrieved items change after fusion. Without an exact build at that n
  (above ``--exact-max``), edge recall is estimated on a sample of rows searched exactly.
* ``incremental``: a history of ``--incremental-n`` items, then small changes (add, delete,
  replace) through :class:`HistoryStore`; the anchor is derived from the previous one and
  compared with a full rebuild.
* ``query``: everything per query that is not an embedding or LLM call (related-history search,
  anchor lookup, prompts, parsing, fusion, weights, final search), with a 1k-item history, the
  anchor cached and instant fake embedder/LLM; median, p90 and a profile.
* ``users``: ``--users`` users × ``--items-per-user`` items in one process: memory per user,
  ``HistoryStore.save`` time, and, in a fresh process, time to the first query after a restart
  (eager and lazy load; the anchors come from disk).

Run (a shared 2-core machine: the load average is recorded with every figure):

    python benchmarks/perf.py --quick        # under a minute
    python benchmarks/perf.py                # the docs/performance.md figures (about half an hour)
    python benchmarks/perf.py --skip users --sizes 1000 10000 --approx-sizes 10000

Prints a table and writes ``benchmarks/results/perf.json``, ``perf.csv`` (the scaling rows),
``perf_summary.csv`` (every other figure) and ``perf_scaling.png`` (``perf_quick*`` with
``--quick``, so that a quick run never overwrites the full run's figures).
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import json
import multiprocessing as mp
import os
import platform
import pstats
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import faiss
import numpy as np
import scipy
from tqdm import tqdm

from pbr_bench.machine import describe
from pbr_bench.paths import RESULTS_DIR, in_repo
from pbr_core import HistoryItem, HistoryStore, PBRConfig, Personalizer
from pbr_core.anchor import ApproximateKnn, compute_anchor
from pbr_core.fusion import fuse

RESULTS = RESULTS_DIR
DIM = 384
T = TypeVar("T")


# -- data ------------------------------------------------------------------------------------------
def clustered(n: int, d: int = DIM, seed: int = 0, per_cluster: int = 200) -> np.ndarray:
    """A Gaussian mixture of unit vectors, so that nearest neighbours mean something.

    ``n / per_cluster`` centres with Dirichlet-distributed sizes; each cluster has its own spread,
    giving cosines of 0.4-0.8 between items of one cluster (like embeddings of one topic) and ~0
    across clusters. Generated in blocks: the peak memory is the result plus one block.
    """
    rng = np.random.default_rng(seed)
    c = max(8, n // per_cluster)
    centres = rng.normal(size=(c, d)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = rng.choice(c, size=n, p=rng.dirichlet(np.full(c, 2.0)))
    spread = rng.uniform(0.03, 0.06, size=c).astype(np.float32)
    out = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 65536):
        e = min(n, s + 65536)
        lab = labels[s:e]
        x = centres[lab] + rng.standard_normal((e - s, d), dtype=np.float32) * spread[lab, None]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[s:e] = x
    return out


# -- machine ---------------------------------------------------------------------------------------
def load1() -> float:
    return round(os.getloadavg()[0], 2)


def rss_mb() -> float:
    """Current resident memory of this process (Linux /proc; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (``ru_maxrss``, KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a new interpreter: its peak memory and caches are its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def machine() -> dict[str, Any]:
    """:func:`pbr_bench.machine.describe` and the versions and threads of the libraries timed."""
    return {
        **describe(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "faiss": faiss.__version__,
        "faiss_threads": faiss.omp_get_max_threads(),
        "platform": platform.platform(),
    }


# -- scaling ---------------------------------------------------------------------------------------
def _build(n: int, method: str, seed: int) -> dict[str, Any]:
    """In a fresh process: one anchor build; its time, peak memory and result."""
    x = clustered(n, seed=seed)
    base = peak_rss_mb()
    exact = method == "exact"
    cfg = PBRConfig(exact_knn_max_items=n if exact else 0)
    before = load1()
    t = time.perf_counter()
    approximate: ApproximateKnn = "hnsw" if method == "hnsw" else "ivf"
    result = compute_anchor(x, cfg, approximate=approximate)
    seconds = time.perf_counter() - t
    assert result is not None
    return {
        "seconds": seconds,
        "peak_rss_mb": peak_rss_mb(),
        "data_rss_mb": base,
        "load_before": before,
        "load_after": load1(),
        "iterations": result.iterations,
        "vector": result.vector,
        "indptr": result.graph.indptr,
        "indices": result.graph.indices,
    }


def _edges(res: dict[str, Any], n: int) -> np.ndarray:
    """Graph edges as sorted int64 codes ``row * n + col``, self-loops left out."""
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(res["indptr"]))
    cols = res["indices"].astype(np.int64)
    keep = rows != cols
    return np.sort(rows[keep] * n + cols[keep])


def _queries(x: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries near random history items, with pseudo-utterance and reasoning vectors near them."""
    rng = np.random.default_rng(seed)
    d = x.shape[1]

    def near(v: np.ndarray, noise: float) -> np.ndarray:
        out = v + rng.normal(size=v.shape).astype(np.float32) * noise / np.sqrt(d)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    q = near(x[rng.integers(len(x), size=count)], 1.0)
    return q, near(q, 1.0), near(q, 1.5)


def _top5(x: np.ndarray, anchor: np.ndarray, queries: tuple[np.ndarray, ...]) -> np.ndarray:
    """Top-5 items for each query after fusion with ``anchor`` (spec §2.4), exact search."""
    q, f, r = queries
    fused = np.stack([fuse(q[i], anchor=anchor, f_avg=f[i], r=r[i]).vector for i in range(len(q))])
    scores = fused @ x.T
    top = np.argpartition(-scores, 4, axis=1)[:, :5]
    return np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), 1), 1)


def _sampled_recall(x: np.ndarray, res: dict[str, Any], k2: int, sample: int) -> float:
    """Edge recall on ``sample`` rows searched exactly (when no exact build is affordable)."""
    rng = np.random.default_rng(1)
    n = len(x)
    rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    cfg = PBRConfig()
    sims, ids = faiss.knn(x[rows], x, k2 + 1, metric=faiss.METRIC_INNER_PRODUCT)
    found = total = 0
    for r, s_row, i_row in zip(rows, sims, ids):
        want = [j for j, s in zip(i_row, s_row) if j != r and s >= cfg.theta][: k2 - 1]
        got = set(res["indices"][res["indptr"][r] : res["indptr"][r + 1]].tolist())
        found += len(set(want) & got)
        total += len(want)
    return found / total if total else float("nan")


def run_scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    plan = [(n, "exact") for n in args.sizes if n <= args.exact_max]
    plan += [(n, "ivf") for n in args.approx_sizes]
    plan += [(n, "hnsw") for n in args.approx_sizes if n <= args.hnsw_max]
    plan.sort(key=lambda p: (p[0], p[1] != "exact"))
    rows: list[dict[str, Any]] = []
    reference: dict[int, dict[str, Any]] = {}
    cache: dict[int, np.ndarray] = {}
    for n, method in tqdm(plan, desc="anchor builds", unit="build"):
        res = in_fresh_process(_build, n, method, args.seed)  # its own peak memory
        row: dict[str, Any] = {
            "n": n,
            "method": method,
            "seconds": round(res["seconds"], 3),
            "peak_rss_mb": round(res["peak_rss_mb"], 1),
            "data_rss_mb": round(res["data_rss_mb"], 1),
            "vectors_mb": round(n * DIM * 4 / 2**20, 1),
            "pagerank_iterations": res["iterations"],
            "load_before": res["load_before"],
            "load_after": res["load_after"],
        }
        if method == "exact":
            reference[n] = res
        else:
            if n not in cache:
                cache.clear()
                cache[n] = clustered(n, seed=args.seed)
            x = cache[n]
            ref = reference.get(n)
            if ref is not None:
                want, got = _edges(ref, n), _edges(res, n)
                row["edge_recall"] = round(np.isin(want, got).mean(), 5)
                a, b = ref["vector"].astype(np.float64), res["vector"].astype(np.float64)
                row["anchor_cosine"] = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
                qs = _queries(x, args.retrieval_queries, args.seed)
                t_ref, t_got = _top5(x, ref["vector"], qs), _top5(x, res["vector"], qs)
                row["top5_identical"] = round(float((t_ref == t_got).all(axis=1).mean()), 4)
                row["top5_overlap"] = round(
                    float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(t_ref, t_got)])),
                    4,
                )
            else:
                row["edge_recall_sampled"] = round(
                    _sampled_recall(x, res, PBRConfig().k2, args.recall_sample), 5
                )
        rows.append(row)
    return rows


# -- incremental -----------------------------------------------------------------------------------
def _items(ids: range | list[int], prefix: str = "") -> list[HistoryItem]:
    return [HistoryItem(id=f"{prefix}{i}", text=f"history item {prefix}{i}") for i in ids]


def run_incremental(args: argparse.Namespace) -> list[dict[str, Any]]:
    n = args.incremental_n
    cfg = PBRConfig()
    pool = clustered(n + 200, seed=args.seed + 1)
    store = HistoryStore()
    store.upsert("u", _items(range(n)), pool[:n])
    t = time.perf_counter()
    first = store.get("u").anchor(cfg)
    full_seconds = time.perf_counter() - t
    assert first is not None
    rows = [
        {
            "change": f"full build (n={n})",
            "upsert_ms": None,
            "anchor_ms": round(full_seconds * 1e3, 2),
            "share_of_full": 1.0,
            "rows_searched": first.rows_searched,
            "rows_merged": 0,
            "pagerank_iterations": first.iterations,
            "cold_iterations": first.iterations,
            "max_abs_diff_vs_full": 0.0,
            "graph_equal": True,
            "load1": load1(),
        }
    ]
    rng = np.random.default_rng(args.seed)
    next_new = n
    changes = [("add 1", 1), ("add 10", 10), ("delete 1", -1), ("replace 1", 0), ("add 100", 100)]
    for name, amount in changes:
        snap = store.get("u")
        t = time.perf_counter()
        if amount > 0:
            new = pool[next_new : next_new + amount]
            store.upsert("u", _items(range(next_new, next_new + amount)), new)
            next_new += amount
        elif amount < 0:
            store.delete("u", [snap.items[int(rng.integers(len(snap)))].id])
        else:
            victim = snap.items[int(rng.integers(len(snap)))]
            store.upsert("u", [HistoryItem(id=victim.id, text=victim.text + "!")], pool[-1:])
        upsert_s = time.perf_counter() - t
        snap = store.get("u")
        t = time.perf_counter()
        got = snap.anchor(cfg)
        anchor_s = time.perf_counter() - t
        # The reference is an exact full rebuild: the updated rows are searched exactly, also
        # once the history outgrows exact_knn_max_items (then a rebuild would be approximate).
        exact_cfg = cfg.with_(exact_knn_max_items=max(len(snap), cfg.exact_knn_max_items))
        full = compute_anchor(np.asarray(snap.vectors), exact_cfg)
        assert got is not None and full is not None
        diff = abs(got.graph - full.graph)
        rows.append(
            {
                "change": name,
                "upsert_ms": round(upsert_s * 1e3, 2),
                "anchor_ms": round(anchor_s * 1e3, 2),
                "share_of_full": round(anchor_s / full_seconds, 5),
                "rows_searched": got.rows_searched,
                "rows_merged": got.rows_merged,
                "pagerank_iterations": got.iterations,
                "cold_iterations": full.iterations,
                "max_abs_diff_vs_full": float(np.abs(got.vector - full.vector).max()),
                "graph_equal": bool(diff.nnz == 0 or diff.max() < 1e-6),
                "load1": load1(),
            }
        )
    return rows


# -- per-query overhead ----------------------------------------------------------------------------
UTTERANCES = [
    f"I was thinking about trying something new with topic {i} after my morning run today"
    for i in range(10)
]
REASONING = "Step 1: the user asks about a habit. Step 2: their history shows it. Step 3: answer."


class InstantEmbedder:
    """Precomputed vectors by text: an embedding call that costs a dictionary lookup."""

    model_id = "bench/instant-embedder"

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self.rng = np.random.default_rng(0)
        self.table: dict[str, np.ndarray] = {}
        self.batches: dict[tuple[str, ...], np.ndarray] = {}
        self.spent = 0.0

    def _vector(self, text: str) -> np.ndarray:
        v = self.table.get(text)
        if v is None:
            v = self.table[text] = self.rng.normal(size=self.dim).astype(np.float32)
        return v

    # numpy arrays out (pbr_core takes any array-like); typed Any to satisfy the Embedder protocol
    def embed_query(self, text: str) -> Any:
        t = time.perf_counter()
        v = self._vector(text)
        self.spent += time.perf_counter() - t
        return v

    def embed_documents(self, texts: list[str]) -> Any:
        t = time.perf_counter()
        key = tuple(texts)
        out = self.batches.get(key)
        if out is None:
            out = self.batches[key] = np.stack([self._vector(x) for x in texts])
        self.spent += time.perf_counter() - t
        return out


class InstantLLM:
    """Answers both P-PRF prompts at once (JSON utterances, plain reasoning)."""

    model_id = "bench/instant-llm"
    answer = json.dumps({"candidates": UTTERANCES})

    def __init__(self) -> None:
        self.spent = 0.0

    def generate(self, prompt: str) -> str:
        t = time.perf_counter()
        out = self.answer if "candidates" in prompt else REASONING
        self.spent += time.perf_counter() - t
        return out


class InstantBatchLLM(InstantLLM):
    """The same, with ``generate_batch`` (the pipeline then makes one call for both prompts)."""

    def generate_batch(self, prompts: list[str]) -> list[str]:
        return [self.generate(p) for p in prompts]


def _personalizer(generator: InstantLLM, n_items: int, seed: int) -> Personalizer:
    emb = InstantEmbedder()
    p = Personalizer(emb, generator, config=PBRConfig())
    texts = [f"history item {i} about topic {i % 37}" for i in range(n_items)]
    for t, v in zip(texts, clustered(n_items, seed=seed)):
        emb.table[t] = v
    p.add_texts("u", texts, ids=[str(i) for i in range(n_items)])
    return p


def run_query(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"history_items": args.query_items, "repetitions": args.query_reps}
    queries = [f"what should I do about topic {i}?" for i in range(25)]
    for label, gen in (("batch_llm", InstantBatchLLM()), ("two_calls", InstantLLM())):
        p = _personalizer(gen, args.query_items, args.seed)
        emb = p.embedder
        assert isinstance(emb, InstantEmbedder)
        for q in queries:  # warm up: the anchor is built once and cached, fakes fill their tables
            p.search("u", q, k=5)
        times: list[float] = []
        stages: dict[str, list[float]] = {}
        before = load1()
        for i in tqdm(range(args.query_reps), desc=f"queries ({label})", leave=False):
            emb.spent = gen.spent = 0.0
            t = time.perf_counter()
            res = p.search("u", queries[i % len(queries)], k=5)
            elapsed = time.perf_counter() - t - emb.spent - gen.spent
            times.append(elapsed * 1e3)
            for stage, ms in res.personalized.explanation.timings_ms.items():
                stages.setdefault(stage, []).append(ms)
        entry: dict[str, Any] = {
            "median_ms": round(statistics.median(times), 3),
            "p90_ms": round(float(np.percentile(times, 90)), 3),
            "min_ms": round(min(times), 3),
            "stages_median_ms": {k: round(statistics.median(v), 3) for k, v in stages.items()},
            "load_before": before,
            "load_after": load1(),
        }
        if label == "batch_llm":  # profiled separately: the profiler slows every call
            profile = cProfile.Profile()
            profile.enable()
            for i in range(args.query_reps):
                p.search("u", queries[i % len(queries)], k=5)
            profile.disable()
            stats = pstats.Stats(profile, stream=io.StringIO())
            entry["profile_top"] = _profile_rows(stats, args.query_reps)
        out[label] = entry
    return out


def _profile_rows(stats: pstats.Stats, reps: int) -> list[dict[str, Any]]:
    """The 12 functions with the most own time, in microseconds per query (profiler included)."""
    raw = stats.stats  # type: ignore[attr-defined]
    rows = sorted(raw.items(), key=lambda kv: -kv[1][2])[:12]
    return [
        {
            "function": f"{Path(f).name}:{line}({name})",
            "own_us_per_query": round(tt / reps * 1e6, 1),
            "cumulative_us_per_query": round(ct / reps * 1e6, 1),
        }
        for (f, line, name), (_, _, tt, ct, _) in rows
    ]


# -- many users ------------------------------------------------------------------------------------
def _restart(path: str, user: str, lazy: bool, query_items: int) -> dict[str, Any]:
    """In a fresh process: load the saved store, then answer one query with instant fakes."""
    base = rss_mb()
    t = time.perf_counter()
    store = HistoryStore.load(path, lazy=lazy)
    load_s = time.perf_counter() - t
    emb = InstantEmbedder()
    p = Personalizer(emb, InstantBatchLLM(), store=store, config=PBRConfig())
    t = time.perf_counter()
    res = p.search(user, "what did I say about topic 3?", k=5)
    query_s = time.perf_counter() - t
    return {
        "load_s": load_s,
        "first_query_ms": query_s * 1e3,
        "anchor_stage_ms": res.personalized.explanation.timings_ms.get("anchor"),
        "restart_to_first_answer_s": load_s + query_s,
        "rss_after_mb": rss_mb() - base,
    }


def _users_build(users: int, per_user: int, seed: int, folder: str) -> dict[str, Any]:
    """In a fresh process (a clean memory baseline): fill, anchor and save a store."""
    cfg = PBRConfig()
    rng = np.random.default_rng(seed)
    base = rss_mb()
    store = HistoryStore()
    t = time.perf_counter()
    for u in tqdm(range(users), desc="users: add", unit="user"):
        items = [
            HistoryItem(
                id=f"{u}-{i}",
                text=f"user {u} turn {i}: a chat message about topic {i % 50} of usual length",
                metadata={"turn": i},
                timestamp=1.7e9 + i,
            )
            for i in range(per_user)
        ]
        store.upsert(f"user{u}", items, rng.standard_normal((per_user, DIM), dtype=np.float32))
    add_s = time.perf_counter() - t
    after_items = rss_mb()
    t = time.perf_counter()
    for u in tqdm(range(users), desc="users: anchors", unit="user"):
        store.get(f"user{u}").anchor(cfg)
    anchors_s = time.perf_counter() - t
    after_anchors = rss_mb()
    t = time.perf_counter()
    store.save(folder)
    save_s = time.perf_counter() - t
    return {
        "add_s": add_s,
        "history_mb": after_items - base,
        "anchors_mb": after_anchors - after_items,
        "anchors_s": anchors_s,
        "save_s": save_s,
        "load1": load1(),
    }


def run_users(args: argparse.Namespace) -> dict[str, Any]:
    users, per_user = args.users, args.items_per_user
    folder = Path(tempfile.mkdtemp(prefix="pbr-perf-")) / "store"
    try:
        built = in_fresh_process(_users_build, users, per_user, args.seed, str(folder))
        size_mb = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
        restarts = {}
        for lazy in (False, True):
            restarts["lazy" if lazy else "eager"] = in_fresh_process(
                _restart, str(folder), f"user{users // 2}", lazy, per_user
            )
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
    return {
        "users": users,
        "items_per_user": per_user,
        "add_s": round(built["add_s"], 2),
        "memory_per_user_mb": round((built["history_mb"] + built["anchors_mb"]) / users, 3),
        "memory_per_user_history_mb": round(built["history_mb"] / users, 3),
        "memory_per_user_anchor_mb": round(built["anchors_mb"] / users, 3),
        "vectors_per_user_mb": round(per_user * DIM * 4 / 2**20, 3),
        "anchor_build_ms_per_user": round(built["anchors_s"] / users * 1e3, 2),
        "save_s": round(built["save_s"], 2),
        "saved_mb": round(size_mb, 1),
        "restart": {
            k: {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items()}
            for k, v in restarts.items()
        },
        "load1": built["load1"],
    }


# -- output ----------------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def report(results: dict[str, Any]) -> str:
    m = results["machine"]
    parts = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; load average "
        f"{m['load_avg']} at start, {results.get('load_avg_end')} at end; numpy {m['numpy']}, "
        f"scipy {m['scipy']}, faiss {m['faiss']} ({m['faiss_threads']} threads), "
        f"Python {m['python']}"
    ]
    if "scaling" in results:
        rows = [
            [
                r["n"],
                r["method"],
                r["seconds"],
                r["peak_rss_mb"],
                r["vectors_mb"],
                r.get("edge_recall", r.get("edge_recall_sampled")),
                None if "anchor_cosine" not in r else f"{r['anchor_cosine']:.7f}",
                r.get("top5_identical"),
                r.get("top5_overlap"),
                f"{r['load_before']}/{r['load_after']}",
            ]
            for r in results["scaling"]
        ]
        heads = ["n", "kNN", "build s", "peak MB", "vectors MB", "edge recall", "anchor cos"]
        heads += ["top5 same", "top5 overlap", "load"]
        parts.append("Anchor build (graph + PageRank + anchor), one fresh process each:")
        parts.append(_table(heads, rows))
    if "incremental" in results:
        rows = [
            [
                r["change"],
                r["upsert_ms"],
                r["anchor_ms"],
                r["share_of_full"],
                r["rows_searched"],
                r["rows_merged"],
                f"{r['pagerank_iterations']}/{r['cold_iterations']}",
                f"{r['max_abs_diff_vs_full']:.1e}",
                r["graph_equal"],
                r["load1"],
            ]
            for r in results["incremental"]
        ]
        heads = ["change", "upsert ms", "anchor ms", "of full", "searched", "merged"]
        heads += ["PR iters warm/cold", "|Δanchor|∞", "graph equal", "load"]
        parts.append("Incremental anchor update through HistoryStore:")
        parts.append(_table(heads, rows))
    if "query" in results:
        q = results["query"]
        rows = []
        for label in ("batch_llm", "two_calls"):
            e = q[label]
            st = e["stages_median_ms"]
            rows.append(
                [label, e["median_ms"], e["p90_ms"], e["min_ms"]]
                + [st.get(s) for s in ("related_history", "anchor", "llm", "parse")]
                + [st.get(s) for s in ("embed_feedback", "fusion", "search")]
                + [f"{e['load_before']}/{e['load_after']}"]
            )
        heads = ["generator", "median ms", "p90 ms", "min ms", "related", "anchor", "llm"]
        heads += ["parse", "embed fb", "fusion", "search", "load"]
        parts.append(
            f"Per-query overhead without model calls ({q['history_items']}-item history, "
            f"{q['repetitions']} queries; stage medians in ms):"
        )
        parts.append(_table(heads, rows))
    if "users" in results:
        u = results["users"]
        rows = [
            [
                mode,
                r["load_s"],
                r["first_query_ms"],
                r["anchor_stage_ms"],
                r["restart_to_first_answer_s"],
            ]
            for mode, r in u["restart"].items()
        ]
        parts.append(
            f"{u['users']} users × {u['items_per_user']} items: {u['memory_per_user_mb']} MB "
            f"per user ({u['memory_per_user_history_mb']} history incl. "
            f"{u['vectors_per_user_mb']} vectors, {u['memory_per_user_anchor_mb']} anchor), "
            f"anchor {u['anchor_build_ms_per_user']} ms per user, save {u['save_s']} s "
            f"({u['saved_mb']} MB), load {u['load1']}. Restart:"
        )
        parts.append(
            _table(["load", "load s", "first query ms", "anchor stage ms", "to answer s"], rows)
        )
    return "\n\n".join(parts)


def write_csv(results: dict[str, Any], out: Path, suffix: str = "") -> None:
    if results.get("scaling"):
        keys: list[str] = []
        for r in results["scaling"]:
            keys += [k for k in r if k not in keys]
        with (out / f"perf{suffix}.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(results["scaling"])
    flat: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for i, v in enumerate(value):
                walk(f"{prefix}[{i}]", v)
        else:
            flat.append((prefix, value))

    walk("", {k: v for k, v in results.items() if k != "scaling"})
    with (out / f"perf{suffix}_summary.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["key", "value"])
        writer.writerows(flat)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results.get("scaling") or []
    if not rows:
        return
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"exact": ("o-", "exact (faiss flat)"), "ivf": ("s-", "IVF"), "hnsw": ("^--", "HNSW")}
    for method, (style, label) in styles.items():
        pts = sorted(
            (r["n"], r["seconds"], r["peak_rss_mb"]) for r in rows if r["method"] == method
        )
        if not pts:
            continue
        n, s, m = zip(*pts)
        ax_t.loglog(n, s, style, label=label)
        ax_m.loglog(n, m, style, label=label)
    vec = sorted({(r["n"], r["vectors_mb"]) for r in rows})
    ax_m.loglog([v[0] for v in vec], [v[1] for v in vec], ":", color="grey", label="the vectors")
    # The targets hold at n = 100k only.
    ax_t.plot([1e5], [30], "r_", ms=22, mew=2, label="target at 100k: ≤ 30 s")
    ax_m.plot([1e5], [2048], "r_", ms=22, mew=2, label="target at 100k: ≤ 2 GB")
    ax_t.set(xlabel="history items n", ylabel="anchor build, seconds", title="Time")
    ax_m.set(xlabel="history items n", ylabel="peak RSS of the process, MB", title="Memory")
    for ax in (ax_t, ax_m):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    m = results["machine"]
    fig.suptitle(
        f"P-Anchor build, {DIM}-d clustered vectors; {m['cpu']}, {m['cores']} cores, "
        f"load {m['load_avg'][0]}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: under a minute")
    ap.add_argument("--sizes", type=int, nargs="+", help="n for exact builds (and references)")
    ap.add_argument("--approx-sizes", type=int, nargs="+", help="n for approximate builds")
    ap.add_argument("--exact-max", type=int, help="largest n built exactly")
    ap.add_argument("--hnsw-max", type=int, help="largest n built with HNSW")
    ap.add_argument("--recall-sample", type=int, default=500, help="rows for sampled recall")
    ap.add_argument("--retrieval-queries", type=int, default=200)
    ap.add_argument("--incremental-n", type=int)
    ap.add_argument("--query-items", type=int, default=1000)
    ap.add_argument("--query-reps", type=int)
    ap.add_argument("--users", type=int)
    ap.add_argument("--items-per-user", type=int, default=1000)
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["scaling", "incremental", "query", "users"]
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--plot-only", type=Path, help="redraw the plot and table from a perf.json")
    args = ap.parse_args(argv)
    if args.plot_only:
        saved = json.loads(args.plot_only.read_text())
        print(report(saved))
        plot(saved, args.plot_only.with_name(args.plot_only.stem + "_scaling.png"))
        return saved
    quick = args.quick
    defaults = {
        "sizes": [1000, 2000, 5000]
        if quick
        else [1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000],
        "approx_sizes": [5000] if quick else [10_000, 20_000, 50_000, 100_000, 1_000_000],
        "exact_max": 5000 if quick else 100_000,
        "hnsw_max": 5000 if quick else 100_000,
        "incremental_n": 5000 if quick else 10_000,
        "query_reps": 200 if quick else 1000,
        "users": 50 if quick else 1000,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if quick else ""  # a quick run never overwrites docs/performance.md's figures

    results: dict[str, Any] = {"machine": machine(), "quick": quick, "args": {}}
    results["args"] = {k: (in_repo(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    t0 = time.perf_counter()
    if "scaling" not in args.skip:
        results["scaling"] = run_scaling(args)
    if "incremental" not in args.skip:
        results["incremental"] = run_incremental(args)
    if "query" not in args.skip:
        results["query"] = run_query(args)
    if "users" not in args.skip:
        results["users"] = run_users(args)
    results["load_avg_end"] = [round(v, 2) for v in os.getloadavg()]
    results["wall_s"] = round(time.perf_counter() - t0, 1)

    text = report(results)
    print(text)
    out = args.out_dir
    (out / f"perf{suffix}.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    write_csv(results, out, suffix)
    plot(results, out / f"perf{suffix}_scaling.png" if quick else out / "perf_scaling.png")
    print(f"\nwrote {out}/perf{suffix}.json, .csv, _summary.csv and the scaling plot")
    return results


if __name__ == "__main__":
    main()
