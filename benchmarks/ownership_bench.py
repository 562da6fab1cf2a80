"""What "the host store is the truth" costs: pbr_core.corpus on a real Chroma server.

Two sections (each can be skipped with ``--skip``), each on a fresh ``chroma run`` whose data
folder is a fresh temporary folder (never in the repository) and which is stopped at the end:

* ``query``: one user of ``--q-items`` items (plus ``--q-users - 1`` other users in the same
  collection) behind LangChain's :class:`~langchain_pbr.PBRRetriever` over
  ``langchain_chroma.Chroma``. Timed against the plain filtered search
  ``Chroma.similarity_search_by_vector_with_relevance_scores(vector, k, filter={"user_id": u})``
  on the same server and user, in ``--reps`` interleaved rounds (every variant once per round, in
  a shuffled order, so that drift of the shared machine cancels):

  - pbr query, anchor cached (steady state: no write since the last query);
  - pbr query right after another worker (a second retriever on the same collection) added one
    item of that user: the verification must fetch it and the anchor updates incrementally;
  - pbr query right after this retriever's own write (nothing to fetch; the anchor updates);
  - the verification alone, ``retriever.corpus.history(user)`` with nothing changed, and its
    parts: Chroma's listing (``get(where=...)``) and the adapter's ``host_records(...).list_user``;
  - for scale, the same query with the default ``safe`` fusion and an LLM that answers at once.

  The pbr queries use ``PBRConfig(fusion="no_prf")`` (``q + c_anchor``, spec §2.4): it needs no
  LLM, so the retrieval path is measured alone (the anchor, the verification and the search).

* ``scale``: ``--users`` × ``--items`` records (default 1,000 × 1,000 = 1M, dim 384) written to
  one collection through :meth:`pbr_core.corpus.Corpus.add_many`, in batches of ``--batch``
  records spanning ``--users-per-batch`` users. Insert rate per batch; if the projected insert
  time exceeds ``--insert-budget-min`` the user count is reduced (said in the table and JSON).
  Then, in a fresh worker process (its memory is its own): query latency for *cold* users
  (first query of the user in that process: the listing fetches all its vectors and the anchor
  is built) and *warm* users, the plain search on the same users, and the worker's RSS before
  and after warming the users.

Both sections end with a probe of Chroma alone on one user (filtered and unfiltered search,
the listing without vectors, the fetch of all the user's vectors): wall time and the server
process's CPU time per call, to show which side of the HTTP connection the time is spent on.

Models are stand-ins, so only the database and pbr are measured: ``DeterministicFakeEmbedding``
(sha256-seeded vectors, unit-normalised by pbr) for texts, seeded random unit vectors for the
bulk insert, ``FakeListLLM`` for the one row that uses an LLM. Seeds are fixed.

Run (a shared 2-core machine: the load average is recorded with every figure):

    python benchmarks/ownership_bench.py --quick     # under a minute
    python benchmarks/ownership_bench.py             # the real measurement (~30-40 minutes)
    python benchmarks/ownership_bench.py --skip scale
    python benchmarks/ownership_bench.py --plot-only benchmarks/results/ownership/ownership.json

Prints two tables and writes ``benchmarks/results/ownership/ownership.json``, ``.csv`` and
``.png``; a run of one section writes ``ownership_query.*`` or ``ownership_scale.*``, and
``--quick`` adds ``_quick``, so no run overwrites another kind's files.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import gc
import io
import json
import math
import multiprocessing as mp
import os
import platform
import pstats
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake import FakeListLLM
from tqdm import tqdm

from langchain_pbr import PBRRetriever
from langchain_pbr.stores import host_records
from pbr_bench.chroma_server import ChromaServer
from pbr_bench.paths import RESULTS_DIR, in_repo
from pbr_core import HistoryItem, PBRConfig
from pbr_core.corpus import Corpus

RESULTS = RESULTS_DIR / "ownership"
K = 10
USER_KEY = "user_id"
#: The retrieval path without an LLM: q + c_anchor (the anchor, verification and search only).
NO_LLM_FUSION = "no_prf"
T = TypeVar("T")
WORDS = [
    "run", "marathon", "pasta", "banana", "knee", "coffee", "sister", "lyon", "camera", "film",
    "leica", "jazz", "piano", "chess", "garden", "tomato", "bike", "commute", "rain", "train",
    "office", "deadline", "dinner", "vegan", "curry", "paris", "book",
]  # fmt: skip
# One answer serves both of PBR's chat prompts (pseudo utterances and reasoning).
ANSWER = json.dumps(
    {
        "candidates": [
            "I want something I can do after my long run",
            "maybe with my sister when she visits",
        ],
        "reasoning": "The user trains for a marathon and likes quiet plans on weekends.",
    }
)
#: pbr_core explanation stages (``timings_ms``) of one query, in pipeline order.
STAGES = (
    "embed_query",
    "related_history",
    "anchor",
    "llm",
    "parse",
    "embed_feedback",
    "fusion",
    "search",
)


# -- machine ---------------------------------------------------------------------------------------
def load1() -> float:
    return round(os.getloadavg()[0], 2)


def rss_mb(pid: int | str = "self") -> float | None:
    """Resident memory (``VmRSS`` of ``/proc/<pid>/status``) in MiB; None where unreadable."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
        return int(text.split("VmRSS:")[1].split()[0]) / 1024.0
    except (OSError, IndexError, ValueError):
        return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far: ``VmHWM`` on Linux (``ru_maxrss`` is kept
    across ``execve``, so a spawned worker would report its parent's peak), else ``ru_maxrss``."""
    try:
        text = Path("/proc/self/status").read_text()
        return int(text.split("VmHWM:")[1].split()[0]) / 1024.0
    except (OSError, IndexError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def mem_available_mb() -> float | None:
    try:
        text = Path("/proc/meminfo").read_text()
        return int(text.split("MemAvailable:")[1].split()[0]) / 1024.0
    except (OSError, IndexError, ValueError):
        return None


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "chromadb": version("chromadb"),
        "langchain_chroma": version("langchain-chroma"),
        "langchain_core": version("langchain-core"),
        "mem_available_mb_start": mem_available_mb(),
        "load_avg_start": [round(v, 2) for v in os.getloadavg()],
    }


def in_fresh_process(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a new interpreter: its memory and caches are its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


# -- helpers ---------------------------------------------------------------------------------------
def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "count": len(values),
        "median_ms": statistics.median(values),
        "p95_ms": _pct(values, 95),
        "mean_ms": statistics.fmean(values),
        "min_ms": min(values),
    }


def _text(rng: random.Random, user: str, n: int) -> str:
    return f"{user} item {n}: " + " ".join(rng.choices(WORDS, k=12))


def _query(rng: random.Random) -> str:
    return "what about " + " ".join(rng.choices(WORDS, k=5))


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


class Recorder:
    """Wraps methods of one object (an instance attribute shadows the method) and records the
    duration of their last call, and for ``fetch`` the number of keys asked for."""

    def __init__(self, obj: Any, names: Sequence[str]) -> None:
        self.last: dict[str, float] = {}
        self.fetched_keys = 0
        for name in names:
            setattr(obj, name, self._wrap(name, getattr(obj, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.last[name] = self.last.get(name, 0.0) + (time.perf_counter() - start) * 1e3
                if name == "fetch":
                    self.fetched_keys += len(args[1] if len(args) > 1 else kwargs["keys"])

        return timed

    def reset(self) -> None:
        self.last = {}
        self.fetched_keys = 0


def _chroma(client: Any, name: str, emb: Any) -> Chroma:
    return Chroma(
        client=client,
        collection_name=name,
        embedding_function=emb,
        collection_configuration={"hnsw": {"space": "cosine"}},
    )


def _retriever(store: Chroma, emb: Any, fusion: str = NO_LLM_FUSION) -> PBRRetriever:
    return PBRRetriever(
        llm=FakeListLLM(responses=[ANSWER]),
        embeddings=emb,
        vectorstore=store,
        k=K,
        # explain="first": the top document carries the stage timings this script reads
        config=PBRConfig(fusion=fusion, explain="first"),  # type: ignore[arg-type]
    )


def _profile_rows(
    stats: pstats.Stats, reps: int, top: int = 12, by: int = 2
) -> list[dict[str, Any]]:
    """The ``top`` functions by own time (``by=2``) or cumulative time (``by=3``), in
    microseconds per call (profiler overhead included)."""
    raw = stats.stats  # type: ignore[attr-defined]
    rows = sorted(raw.items(), key=lambda kv: -kv[1][by])[:top]
    return [
        {
            "function": f"{Path(f).name}:{line}({name})",
            "own_us_per_query": round(tt / reps * 1e6, 1),
            "cumulative_us_per_query": round(ct / reps * 1e6, 1),
        }
        for (f, line, name), (_, _, tt, ct, _) in rows
    ]


def _profile(fn: Callable[[int], Any], reps: int) -> dict[str, list[dict[str, Any]]]:
    profile = cProfile.Profile()
    profile.enable()
    for i in range(reps):
        fn(i)
    profile.disable()
    stats = pstats.Stats(profile, stream=io.StringIO())
    return {
        "by_own_time": _profile_rows(stats, reps),
        "by_cumulative_time": _profile_rows(stats, reps, top=25, by=3),
    }


# -- section 1: query cost on one user ------------------------------------------------------------
VARIANTS = {
    "plain": "plain Chroma search (filter user_id)",
    "steady": "pbr query, anchor cached",
    "after_other_write": "pbr query after another worker's write",
    "after_own_write": "pbr query after its own write",
    "verify": "verification alone (corpus.history)",
    "list_user": "  of which host_records.list_user",
    "chroma_get": "  of which Chroma get(where=user)",
    "steady_safe": "pbr query, safe fusion + instant LLM",
}


def run_query(args: argparse.Namespace) -> dict[str, Any]:
    emb = DeterministicFakeEmbedding(size=args.dim)
    user = "target"
    out: dict[str, Any] = {
        "items_of_user": args.q_items,
        "users_in_collection": args.q_users,
        "dim": args.dim,
        "k": K,
        "reps": args.reps,
        "fusion": NO_LLM_FUSION,
        "load_before": load1(),
    }
    tmp = Path(tempfile.mkdtemp(prefix="pbr-ownership-query-"))
    server = ChromaServer(tmp / "db").start()
    try:
        store = _chroma(server.client(), "ownership_query", emb)
        filler = _retriever(store, emb)
        text_rng = random.Random(args.seed)
        t = time.perf_counter()
        others = [f"bg{u:03d}" for u in range(args.q_users - 1)]
        for uid in tqdm([user, *others], desc="query: fill", unit="user", leave=False):
            docs = [Document(page_content=_text(text_rng, uid, n)) for n in range(args.q_items)]
            ids = [f"{uid}-{n}" for n in range(args.q_items)]
            filler.add_documents(docs, user_id=uid, ids=ids)
        out["fill_s"] = time.perf_counter() - t
        del filler
        # The measured worker reads the user from the host like any fresh worker would.
        r = _retriever(store, emb)
        # The same corpus (cache, anchors) with the default fusion and an instant LLM.
        safe = _retriever(store, emb, fusion="safe").model_copy(update={"corpus": r.corpus})
        # A second worker: its own retriever (own Corpus and cache) on the same collection.
        other = _retriever(_chroma(server.client(), "ownership_query", emb), emb)
        corpus = r.corpus
        assert corpus is not None and corpus.host is not None
        host = corpus.host
        rec = Recorder(corpus, ["history"])
        host_rec = Recorder(host, ["list_user", "fetch"])
        cfg = r.config
        qrng = random.Random(args.seed + 1)
        for _ in range(5):  # warm up: first listing, anchor build, imports, HTTP connections
            r.invoke(_query(qrng), user_id=user, k=K)
            safe.invoke(_query(qrng), user_id=user, k=K)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        stages: dict[str, dict[str, list[float]]] = {}
        fetched: dict[str, list[int]] = {"after_other_write": [], "after_own_write": []}
        anchor_rows: dict[str, list[int]] = {"after_other_write": [], "after_own_write": []}
        order_rng = random.Random(args.seed + 2)
        counter = 0

        def pbr_query(name: str, retriever: PBRRetriever, q: str) -> None:
            rec.reset()
            host_rec.reset()
            start = time.perf_counter()
            docs = retriever.invoke(q, user_id=user, k=K)
            wall = (time.perf_counter() - start) * 1e3
            assert docs and all(d.metadata[USER_KEY] == user for d in docs)
            times[name].append(wall)
            st = stages.setdefault(name, {})
            timings = docs[0].metadata["pbr"]["timings_ms"]
            parts = {s: timings.get(s, 0.0) for s in STAGES}
            parts["verify"] = rec.last.get("history", 0.0)
            parts["verify_list_user"] = host_rec.last.get("list_user", 0.0)
            parts["verify_fetch"] = host_rec.last.get("fetch", 0.0)
            parts["framework"] = wall - parts["verify"] - sum(parts[s] for s in STAGES)
            for key, ms in parts.items():
                st.setdefault(key, []).append(ms)
            if name in fetched:
                fetched[name].append(host_rec.fetched_keys)
                anchor = corpus.cache.get(user).anchor(cfg)
                anchor_rows[name].append(anchor.rows_searched if anchor is not None else -1)

        out["items_of_user_at_start"] = len(corpus.cache.get(user))
        for _ in tqdm(range(args.reps), desc="query: interleaved rounds", unit="round"):
            q = _query(qrng)
            vector = emb.embed_query(q)
            units = list(VARIANTS)
            order_rng.shuffle(units)
            for name in units:
                if name == "plain":
                    start = time.perf_counter()
                    found = store.similarity_search_by_vector_with_relevance_scores(
                        vector, k=K, filter={USER_KEY: user}
                    )
                    times[name].append((time.perf_counter() - start) * 1e3)
                    assert len(found) == K and all(d.metadata[USER_KEY] == user for d, _ in found)
                elif name == "steady":
                    pbr_query(name, r, q)
                elif name == "steady_safe":
                    pbr_query(name, safe, q)
                elif name in ("after_other_write", "after_own_write"):
                    counter += 1
                    doc = Document(page_content=_text(text_rng, user, 10_000 + counter))
                    writer = other if name == "after_other_write" else r
                    writer.add_documents([doc], user_id=user, ids=[f"extra-{counter}"])
                    pbr_query(name, r, q)
                elif name == "verify":
                    start = time.perf_counter()
                    history = corpus.history(user)
                    times[name].append((time.perf_counter() - start) * 1e3)
                    assert history is not None
                elif name == "list_user":
                    start = time.perf_counter()
                    listed = host.list_user(user)
                    times[name].append((time.perf_counter() - start) * 1e3)
                    assert listed
                elif name == "chroma_get":
                    start = time.perf_counter()
                    got = store.get(where={USER_KEY: user}, include=["documents", "metadatas"])
                    times[name].append((time.perf_counter() - start) * 1e3)
                    assert got["ids"]
        out["items_of_user_at_end"] = len(corpus.cache.get(user))
        plain = times["plain"]
        rows = {}
        for name, label in VARIANTS.items():
            s = _summary(times[name])
            paired = [v / p for v, p in zip(times[name], plain)]
            rows[name] = {
                "label": label,
                **s,
                "ratio_to_plain": s["median_ms"] / statistics.median(plain),
                "paired_ratio_median": statistics.median(paired),
            }
        out["rows"] = rows
        out["stages_median_ms"] = {
            name: {k: statistics.median(v) for k, v in st.items()} for name, st in stages.items()
        }
        out["fetched_keys_per_query"] = {k: statistics.median(v) for k, v in fetched.items()}
        out["anchor_rows_searched_median"] = {
            k: statistics.median(v) for k, v in anchor_rows.items()
        }
        out["embed_query_fake_ms"] = _time_embed(emb)
        out["server_probe"] = server_probe(
            store, server.pid, user, emb.embed_query("probe"), min(args.reps, 50)
        )
        # Where the time goes, by function (profiled apart: the profiler slows every call).
        reps = min(args.reps, 50)
        out["profile_steady"] = _profile(
            lambda i: r.invoke(f"profiled query {i}", user_id=user, k=K), reps
        )
        out["profile_verify"] = _profile(lambda i: corpus.history(user), reps)
        out["server_rss_mb"] = rss_mb(server.pid) if server.pid else None
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_after"] = load1()
    return out


def server_probe(
    store: Chroma, server_pid: int | None, user: str, vector: list[float], n: int
) -> dict[str, dict[str, float | None]]:
    """Wall time and the Chroma server's CPU time per call of its four operations on ``user``
    (sequential calls, nothing else running in this process): where the time goes."""
    keys = store.get(where={USER_KEY: user}, include=[])["ids"]
    ops: dict[str, Callable[[], Any]] = {
        "filtered_search": lambda: store.similarity_search_by_vector_with_relevance_scores(
            vector, k=K, filter={USER_KEY: user}
        ),
        "unfiltered_search": lambda: store.similarity_search_by_vector_with_relevance_scores(
            vector, k=K
        ),
        "listing_no_vectors": lambda: store.get(
            where={USER_KEY: user}, include=["documents", "metadatas"]
        ),
        "fetch_all_vectors": lambda: store.get(
            ids=keys, include=["documents", "metadatas", "embeddings"]
        ),
    }
    out: dict[str, dict[str, float | None]] = {}
    for name, op in ops.items():
        op()  # warm
        walls = []
        cpu0 = cpu_s(server_pid)
        for _ in range(n):
            start = time.perf_counter()
            op()
            walls.append((time.perf_counter() - start) * 1e3)
        cpu1 = cpu_s(server_pid)
        server = (cpu1 - cpu0) * 1e3 / n if cpu0 is not None and cpu1 is not None else None
        out[name] = {
            "wall_median_ms": statistics.median(walls),
            "server_cpu_ms_per_call": server,
            "records_of_user": len(keys),
        }
    return out


def _time_embed(emb: Any, n: int = 200) -> float:
    start = time.perf_counter()
    for i in range(n):
        emb.embed_query(f"query {i}")
    return (time.perf_counter() - start) * 1e3 / n


# -- section 2: scale ------------------------------------------------------------------------------
def choose_dim(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """The requested dim if the machine can hold the run, else 64; with the estimate."""
    records = args.users * args.items

    def need_mb(dim: int) -> float:
        vectors = records * dim * 4 / 2**20
        # server: HNSW + its sqlite caches (~2x the vectors); writer: its cache (1x) plus ~1.2 KB
        # of Python objects per record; worker: the warmed users' caches (~3 KB per item + vector).
        worker = min(args.queries, args.users) * args.items * (dim * 4 + 3000) / 2**20
        return 3 * vectors + records * 1200 / 2**20 + worker

    avail = mem_available_mb()
    chosen = args.dim
    # Half of what is free: the machine is shared with another engineer's test runs.
    if avail is not None and need_mb(args.dim) > 0.5 * avail and args.dim > 64:
        chosen = 64
    return chosen, {
        "requested_dim": args.dim,
        "estimated_need_mb": round(need_mb(args.dim), 0),
        "estimated_need_mb_chosen": round(need_mb(chosen), 0),
        "mem_available_mb": avail,
        "dim_reduced": chosen != args.dim,
    }


def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    dim, mem_check = choose_dim(args)
    if mem_check["dim_reduced"]:
        print(
            f"scale: the run needs ~{mem_check['estimated_need_mb']:.0f} MB at dim {args.dim}, "
            f"{mem_check['mem_available_mb']:.0f} MB available: using dim {dim}",
            flush=True,
        )
    emb = DeterministicFakeEmbedding(size=dim)
    out: dict[str, Any] = {
        "users_requested": args.users,
        "items_per_user": args.items,
        "dim": dim,
        "memory_check": mem_check,
        "batch_records": args.batch,
        "users_per_batch": args.users_per_batch,
        "insert_budget_min": args.insert_budget_min,
        "load_before": load1(),
    }
    tmp = Path(tempfile.mkdtemp(prefix="pbr-ownership-scale-"))
    server = ChromaServer(tmp / "db").start()
    try:
        client = server.client()
        store = _chroma(client, "ownership_scale", emb)
        max_batch = int(client.get_max_batch_size())
        out["chroma_max_batch_size"] = max_batch
        writer = Corpus(host_records(store, USER_KEY), embedder=emb, user_key=USER_KEY)
        out.update(_insert(writer, server, args, dim, max_batch))
        out["writer_rss_mb"] = rss_mb()
        out["writer_peak_rss_mb"] = peak_rss_mb()
        del writer
        gc.collect()
        out["server_rss_after_insert_mb"] = rss_mb(server.pid) if server.pid else None
        out["collection_count"] = client.get_collection(
            "ownership_scale", embedding_function=None
        ).count()
        print("scale: queries in a fresh worker process ...", flush=True)
        written = out["users_written"]
        out["worker"] = in_fresh_process(
            _scale_worker,
            server.port,
            server.pid,
            dim,
            written,
            args.items,
            args.queries,
            args.seed,
        )
        out["server_rss_after_queries_mb"] = rss_mb(server.pid) if server.pid else None
        out["data_folder_mb"] = (
            sum(f.stat().st_size for f in (tmp / "db").rglob("*") if f.is_file()) / 2**20
        )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_after"] = load1()
    return out


def _insert(
    writer: Corpus, server: ChromaServer, args: argparse.Namespace, dim: int, max_batch: int
) -> dict[str, Any]:
    """Write ``args.users`` users through ``Corpus.add_many``; fewer if over the time budget."""
    upb = max(1, args.users_per_batch)
    per_chunk = max(1, min(args.batch, max_batch) // upb)  # items of each user in one batch
    chunks = math.ceil(args.items / per_chunk)
    host = writer.host
    assert host is not None
    rec = Recorder(host, ["upsert"])
    rng = np.random.default_rng(args.seed)
    text_rng = random.Random(args.seed)
    budget_s = args.insert_budget_min * 60.0
    target = args.users
    rates: list[float] = []
    host_share: list[float] = []
    batch_log: list[dict[str, Any]] = []
    reduced: str | None = None
    done = 0
    start = time.perf_counter()
    bar = tqdm(total=target * args.items, desc="scale: insert", unit="rec", unit_scale=True)
    while done < target:
        block = [f"u{u:05d}" for u in range(done, min(done + upb, target))]
        block_rates = []
        for c in range(chunks):
            lo, hi = c * per_chunk, min(args.items, (c + 1) * per_chunk)
            groups = {
                uid: [
                    HistoryItem(
                        id=f"i{n}",
                        text=_text(text_rng, uid, n),
                        metadata={"turn": n},
                        timestamp=1.7e9 + n,
                    )
                    for n in range(lo, hi)
                ]
                for uid in block
            }
            vectors = {uid: _unit_rows(rng, hi - lo, dim) for uid in block}
            n_records = len(block) * (hi - lo)
            rec.reset()
            t = time.perf_counter()
            writer.add_many(groups, vectors=vectors)
            dt = time.perf_counter() - t
            rates.append(n_records / dt)
            block_rates.append(n_records / dt)
            host_share.append(rec.last.get("upsert", 0.0) / (dt * 1e3))
            batch_log.append(
                {
                    "records_before": done * args.items + len(block) * lo,
                    "records": n_records,
                    "seconds": round(dt, 4),
                    "host_upsert_s": round(rec.last.get("upsert", 0.0) / 1e3, 4),
                }
            )
            bar.update(n_records)
        done += len(block)
        elapsed = time.perf_counter() - start
        recent = statistics.median(block_rates)
        projected = elapsed + (target - done) * args.items / recent
        if done < target and projected > budget_s:
            fits = int(recent * max(0.0, budget_s - elapsed) / args.items)
            new_target = max(done, done + (fits // upb) * upb)
            if new_target < target:
                reduced = (
                    f"{target} users projected to take {projected / 60:.1f} min to insert at "
                    f"{recent:.0f} records/s (budget {args.insert_budget_min:.0f} min): "
                    f"reduced to {new_target} users"
                )
                bar.write("scale: " + reduced)
                target = new_target
                bar.total = target * args.items
                bar.refresh()
    bar.close()
    total = time.perf_counter() - start
    return {
        "users_written": target,
        "records_written": target * args.items,
        "reduced": reduced,
        "insert_s": total,
        "insert_rate_median": statistics.median(rates),
        "insert_rate_p5": _pct(rates, 5),
        "insert_rate_p95": _pct(rates, 95),
        "insert_rate_overall": target * args.items / total,
        "insert_rate_first_10": statistics.median(rates[:10]),
        "insert_rate_last_10": statistics.median(rates[-10:]),
        "host_upsert_share_median": statistics.median(host_share),
        "batches": len(rates),
        "batch_log": batch_log,
        "server_rss_during_insert_mb": rss_mb(server.pid) if server.pid else None,
    }


def _scale_worker(
    port: int,
    server_pid: int | None,
    dim: int,
    users: int,
    items: int,
    n_queries: int,
    seed: int,
) -> dict[str, Any]:
    """In a fresh process: one worker's queries on cold and warm users, and its memory."""
    import chromadb
    from chromadb.config import Settings

    rss_start = rss_mb()
    emb = DeterministicFakeEmbedding(size=dim)
    client = chromadb.HttpClient(
        host="127.0.0.1", port=port, settings=Settings(anonymized_telemetry=False)
    )
    store = _chroma(client, "ownership_scale", emb)
    r = _retriever(store, emb)
    corpus = r.corpus
    assert corpus is not None and corpus.host is not None
    rec = Recorder(corpus, ["history"])
    host_rec = Recorder(corpus.host, ["list_user", "fetch"])
    all_users = [f"u{u:05d}" for u in range(users)]
    qrng = random.Random(seed + 3)
    warmup = all_users[-1]  # imports, HTTP connections, first faiss call: not a cold user's cost
    for _ in range(3):
        r.invoke(_query(qrng), user_id=warmup, k=K)
        store.similarity_search_by_vector_with_relevance_scores(
            emb.embed_query("warm up"), k=K, filter={USER_KEY: warmup}
        )
    gc.collect()
    rss_before = rss_mb()
    cold_users = random.Random(seed + 4).sample(all_users[:-1], min(n_queries, users - 1))
    cold: list[float] = []
    parts: dict[str, list[float]] = {}
    for uid in tqdm(cold_users, desc="scale: cold users", unit="q"):
        rec.reset()
        host_rec.reset()
        q = _query(qrng)
        start = time.perf_counter()
        docs = r.invoke(q, user_id=uid, k=K)
        wall = (time.perf_counter() - start) * 1e3
        assert len(docs) == K and all(d.metadata[USER_KEY] == uid for d in docs)
        cold.append(wall)
        timings = docs[0].metadata["pbr"]["timings_ms"]
        got = {s: timings.get(s, 0.0) for s in STAGES}
        got["verify"] = rec.last.get("history", 0.0)
        got["verify_list_user"] = host_rec.last.get("list_user", 0.0)
        got["verify_fetch"] = host_rec.last.get("fetch", 0.0)
        got["framework"] = wall - got["verify"] - sum(got[s] for s in STAGES)
        for key, ms in got.items():
            parts.setdefault(key, []).append(ms)
    gc.collect()
    rss_after = rss_mb()
    times: dict[str, list[float]] = {"plain": [], "warm": [], "verify_warm": []}
    warm_parts: dict[str, list[float]] = {}
    order_rng = random.Random(seed + 5)
    pick = random.Random(seed + 6)
    for _ in tqdm(range(n_queries), desc="scale: warm users (interleaved)", unit="round"):
        uid = pick.choice(cold_users)
        q = _query(qrng)
        vector = emb.embed_query(q)
        units = list(times)
        order_rng.shuffle(units)
        for name in units:
            if name == "plain":
                start = time.perf_counter()
                found = store.similarity_search_by_vector_with_relevance_scores(
                    vector, k=K, filter={USER_KEY: uid}
                )
                times[name].append((time.perf_counter() - start) * 1e3)
                assert len(found) == K and all(d.metadata[USER_KEY] == uid for d, _ in found)
            elif name == "warm":
                rec.reset()
                start = time.perf_counter()
                docs = r.invoke(q, user_id=uid, k=K)
                wall = (time.perf_counter() - start) * 1e3
                times[name].append(wall)
                assert len(docs) == K and all(d.metadata[USER_KEY] == uid for d in docs)
                timings = docs[0].metadata["pbr"]["timings_ms"]
                got = {s: timings.get(s, 0.0) for s in STAGES}
                got["verify"] = rec.last.get("history", 0.0)
                got["framework"] = wall - got["verify"] - sum(got[s] for s in STAGES)
                for key, ms in got.items():
                    warm_parts.setdefault(key, []).append(ms)
            else:
                start = time.perf_counter()
                assert corpus.history(uid) is not None
                times[name].append((time.perf_counter() - start) * 1e3)
    plain_med = statistics.median(times["plain"])
    rows: dict[str, dict[str, Any]] = {
        "plain": {"label": "plain Chroma search (filter user_id)", **_summary(times["plain"])},
        "cold": {"label": "pbr query, cold user (first query)", **_summary(cold)},
        "warm": {"label": "pbr query, warm user", **_summary(times["warm"])},
        "verify_warm": {
            "label": "verification alone, warm user",
            **_summary(times["verify_warm"]),
        },
    }
    for name, row in rows.items():
        row["ratio_to_plain"] = row["median_ms"] / plain_med
        if name in times:
            paired = [v / p for v, p in zip(times[name], times["plain"])]
            row["paired_ratio_median"] = statistics.median(paired)
    warm_n = len(cold_users)
    probe_n = max(5, min(20, n_queries))
    probe = server_probe(store, server_pid, cold_users[0], emb.embed_query("probe"), probe_n)
    return {
        "rows": rows,
        "server_probe": probe,
        "cold_stages_median_ms": {k: statistics.median(v) for k, v in parts.items()},
        "warm_stages_median_ms": {k: statistics.median(v) for k, v in warm_parts.items()},
        "rss_process_start_mb": rss_start,
        "rss_before_mb": rss_before,
        "rss_after_mb": rss_after,
        "warm_users": warm_n,
        "rss_per_warm_user_mb": (
            (rss_after - rss_before) / warm_n
            if warm_n and rss_after is not None and rss_before is not None
            else None
        ),
        "vectors_per_user_mb": items * dim * 4 / 2**20,
        "peak_rss_mb": peak_rss_mb(),
        "load1": load1(),
    }


# -- report ----------------------------------------------------------------------------------------
def report(results: dict[str, Any]) -> str:
    lines: list[str] = []
    q = results.get("query")
    if q:
        lines.append(
            f"Query cost: one user of {q['items_of_user']} items ({q['items_of_user_at_start']}"
            f"->{q['items_of_user_at_end']} during the run) among {q['users_in_collection']} "
            f"users, real Chroma server, dim {q['dim']}, k {q['k']}, {q['reps']} interleaved "
            f"rounds; pbr fusion '{q['fusion']}' (q + anchor: no LLM) unless said"
        )
        head = f"{'variant':<42} {'median ms':>9} {'p95 ms':>8} {'x plain':>8} {'x paired':>8}"
        lines += [head, "-" * len(head)]
        for row in q["rows"].values():
            lines.append(
                f"{row['label']:<42} {row['median_ms']:>9.2f} {row['p95_ms']:>8.2f} "
                f"{row['ratio_to_plain']:>8.2f} {row['paired_ratio_median']:>8.2f}"
            )
        lines.append(
            "x plain: ratio of medians; x paired: median of per-round ratios. "
            f"Fake query embedding: {q['embed_query_fake_ms']:.3f} ms (inside pbr's query; the "
            "plain search is given the vector)"
        )
        keys = ["verify", "verify_list_user", "verify_fetch", *STAGES, "framework"]
        names = ["steady", "after_other_write", "after_own_write", "steady_safe"]
        lines.append("")
        lines.append("Where a pbr query's time goes (median ms per stage):")
        sub = f"{'stage':<18}" + "".join(f"{n:>18}" for n in names)
        lines += [sub, "-" * len(sub)]
        for key in keys:
            vals = [q["stages_median_ms"].get(n, {}).get(key) for n in names]
            lines.append(
                f"{key:<18}"
                + "".join(f"{v:>18.3f}" if v is not None else f"{'':>18}" for v in vals)
            )
        lines.append(
            f"fetched keys per query: {q['fetched_keys_per_query']}; anchor graph rows "
            f"recomputed (median): {q['anchor_rows_searched_median']}"
        )
        lines += _probe_lines(q["server_probe"])
    s = results.get("scale")
    if s:
        w = s["worker"]
        lines.append("")
        size = (
            f"{s['users_written']} users x {s['items_per_user']} items = "
            f"{s['records_written']:,} records, dim {s['dim']}"
        )
        lines.append(f"Scale: {size}, one Chroma collection, written through Corpus.add_many")
        if s["memory_check"]["dim_reduced"]:
            lines.append(
                f"  DIM REDUCED from {s['memory_check']['requested_dim']} to {s['dim']}: "
                f"~{s['memory_check']['estimated_need_mb']:.0f} MB needed, "
                f"{s['memory_check']['mem_available_mb']:.0f} MB available"
            )
        if s["reduced"]:
            lines.append(f"  USERS REDUCED: {s['reduced']}")
        lines.append(
            f"insert: median {s['insert_rate_median']:,.0f} records/s per batch (p5 "
            f"{s['insert_rate_p5']:,.0f}, p95 {s['insert_rate_p95']:,.0f}; first 10 batches "
            f"{s['insert_rate_first_10']:,.0f}, last 10 {s['insert_rate_last_10']:,.0f}), "
            f"{s['batches']} batches of {s['batch_records']} records over "
            f"{s['users_per_batch']} users, {s['insert_s']:.0f} s in all "
            f"({s['insert_rate_overall']:,.0f} records/s); Chroma's upsert is "
            f"{100 * s['host_upsert_share_median']:.0f}% of a batch"
        )
        head = f"{'query':<42} {'n':>4} {'p50 ms':>8} {'p95 ms':>8} {'x plain':>8} {'x paired':>8}"
        lines += [head, "-" * len(head)]
        for row in w["rows"].values():
            paired = row.get("paired_ratio_median")
            lines.append(
                f"{row['label']:<42} {row['count']:>4} {row['median_ms']:>8.2f} "
                f"{row['p95_ms']:>8.2f} {row['ratio_to_plain']:>8.2f} "
                + (f"{paired:>8.2f}" if paired is not None else f"{'':>8}")
            )
        lines += _probe_lines(w["server_probe"])
        cold = w["cold_stages_median_ms"]
        lines.append(
            "cold query (median ms): verify "
            f"{cold['verify']:.1f} (listing {cold['verify_list_user']:.1f}, fetch of the "
            f"vectors {cold['verify_fetch']:.1f}), anchor {cold['anchor']:.1f}, search "
            f"{cold['search']:.1f}, framework {cold['framework']:.1f}"
        )
        lines.append(
            f"memory per worker: RSS {w['rss_before_mb']:.0f} MB before, "
            f"{w['rss_after_mb']:.0f} MB after warming {w['warm_users']} users = "
            f"{w['rss_per_warm_user_mb']:.2f} MB per warm user (its vectors alone: "
            f"{w['vectors_per_user_mb']:.2f} MB); worker peak {w['peak_rss_mb']:.0f} MB; "
            f"writer process {s['writer_rss_mb']:.0f} MB; Chroma server "
            f"{s['server_rss_after_queries_mb']:.0f} MB; data folder {s['data_folder_mb']:.0f} MB"
        )
    return "\n".join(lines)


def _probe_lines(probe: dict[str, dict[str, Any]]) -> list[str]:
    parts = []
    for name, row in probe.items():
        cpu = row["server_cpu_ms_per_call"]
        cpu_text = f", server CPU {cpu:.1f}" if cpu is not None else ""
        parts.append(f"{name} {row['wall_median_ms']:.1f}{cpu_text}")
    return ["Chroma alone, ms per call (wall, server CPU): " + "; ".join(parts)]


def write_csv(results: dict[str, Any], path: Path) -> None:
    cols = ["section", "name", "label", "count", "median", "p95", "unit", "ratio_to_plain"]
    cols += ["paired_ratio_median", "note"]
    rows: list[dict[str, Any]] = []
    q = results.get("query")
    if q:
        note = f"user of {q['items_of_user']} items, dim {q['dim']}, fusion {q['fusion']}"
        for name, row in q["rows"].items():
            rows.append(
                {
                    "section": "query",
                    "name": name,
                    "label": row["label"].strip(),
                    "count": row["count"],
                    "median": row["median_ms"],
                    "p95": row["p95_ms"],
                    "unit": "ms",
                    "ratio_to_plain": row["ratio_to_plain"],
                    "paired_ratio_median": row["paired_ratio_median"],
                    "note": note.replace(q["fusion"], "safe, instant FakeListLLM")
                    if name == "steady_safe"
                    else note,
                }
            )
    s = results.get("scale")
    if s:
        w = s["worker"]
        note = f"{s['users_written']}x{s['items_per_user']} records, dim {s['dim']}"
        if s["reduced"]:
            note += f" (reduced: {s['reduced']})"
        if s["memory_check"]["dim_reduced"]:
            note += f" (dim reduced from {s['memory_check']['requested_dim']})"
        rows.append(
            {
                "section": "scale",
                "name": "insert_rate",
                "label": "Corpus.add_many insert rate per batch",
                "count": s["batches"],
                "median": s["insert_rate_median"],
                "p95": s["insert_rate_p95"],
                "unit": "records/s",
                "note": note,
            }
        )
        for name, row in w["rows"].items():
            rows.append(
                {
                    "section": "scale",
                    "name": name,
                    "label": row["label"],
                    "count": row["count"],
                    "median": row["median_ms"],
                    "p95": row["p95_ms"],
                    "unit": "ms",
                    "ratio_to_plain": row["ratio_to_plain"],
                    "paired_ratio_median": row.get("paired_ratio_median"),
                    "note": note,
                }
            )
        for name, value in (
            ("worker_rss_before", w["rss_before_mb"]),
            ("worker_rss_after_warm", w["rss_after_mb"]),
            ("rss_per_warm_user", w["rss_per_warm_user_mb"]),
            ("writer_rss", s["writer_rss_mb"]),
            ("server_rss", s["server_rss_after_queries_mb"]),
        ):
            rows.append(
                {"section": "scale", "name": name, "median": value, "unit": "MB", "note": note}
            )
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c) for c in cols})


def plot(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = [p for p in ("query", "scale") if results.get(p)]
    if not panels:
        return
    ncols = 1 + (2 if "scale" in panels else 0) if "query" in panels else 2
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.8))
    axes = list(np.atleast_1d(axes))
    if "query" in panels:
        ax = axes.pop(0)
        q = results["query"]
        rows = list(q["rows"].values())
        ys = range(len(rows))
        ax.barh(ys, [r["p95_ms"] for r in rows], color="C0", alpha=0.3, label="p95")
        ax.barh(ys, [r["median_ms"] for r in rows], color="C0", label="median")
        for y, r in zip(ys, rows):
            ax.text(r["p95_ms"], y, f" x{r['ratio_to_plain']:.1f}", va="center", fontsize=8)
        ax.set_yticks(list(ys), [r["label"].strip() for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms per call (label: ratio of medians to plain search)")
        ax.set_title(f"One user of {q['items_of_user']} items, dim {q['dim']}", fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    if "scale" in panels:
        s = results["scale"]
        w = s["worker"]
        ax = axes.pop(0)
        rows = list(w["rows"].values())
        xs = range(len(rows))
        ax.bar(xs, [r["p95_ms"] for r in rows], color="C1", alpha=0.3, label="p95")
        ax.bar(xs, [r["median_ms"] for r in rows], color="C1", label="p50")
        for x, r in zip(xs, rows):
            ax.text(x, r["p95_ms"], f"x{r['ratio_to_plain']:.1f}", ha="center", fontsize=8)
        short = {"plain": "plain search", "cold": "pbr, cold user", "warm": "pbr, warm user"}
        short["verify_warm"] = "verification\n(warm user)"
        ax.set_xticks(list(xs), [short.get(k, k) for k in w["rows"]], fontsize=8)
        ax.set_ylabel("ms per call (label: ratio of p50s to plain search)")
        ax.set_title(
            f"{s['records_written']:,} records ({s['users_written']} users), dim {s['dim']}",
            fontsize=10,
        )
        ax.legend(fontsize=8)
        ax = axes.pop(0)
        log = s["batch_log"]
        xs2 = [(b["records_before"] + b["records"]) / 1e3 for b in log]
        ax.plot(xs2, [b["records"] / b["seconds"] for b in log], ".", ms=3, label="batch")
        ax.plot(
            xs2,
            [b["records"] / b["host_upsert_s"] if b["host_upsert_s"] else 0 for b in log],
            ".",
            ms=3,
            alpha=0.5,
            label="Chroma upsert alone",
        )
        ax.set_xlabel("records in the collection (thousands)")
        ax.set_ylabel("records / s")
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"Corpus.add_many: median {s['insert_rate_median']:,.0f} records/s", fontsize=10
        )
        ax.legend(fontsize=8)
    load = results["machine"]["load_avg_start"][0]
    fig.suptitle(f"pbr_core.corpus on a real Chroma server - load average at start {load:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: under a minute")
    ap.add_argument("--dim", type=int, default=384, help="embedding size (MiniLM: 384)")
    ap.add_argument("--q-items", type=int, help="items of the measured user (query section)")
    ap.add_argument("--q-users", type=int, help="users in the query section's collection")
    ap.add_argument("--reps", type=int, help="interleaved rounds (query section)")
    ap.add_argument("--users", type=int, help="users (scale section)")
    ap.add_argument("--items", type=int, help="items per user (scale section)")
    ap.add_argument("--batch", type=int, help="records per Corpus.add_many batch")
    ap.add_argument("--users-per-batch", type=int, help="users one batch spans")
    ap.add_argument("--queries", type=int, help="cold queries, then warm rounds (scale)")
    ap.add_argument("--insert-budget-min", type=float, default=25.0, help="max insert minutes")
    ap.add_argument("--skip", nargs="*", default=[], choices=["query", "scale"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument(
        "--plot-only", type=Path, help="redraw the table, CSV and plot from a saved JSON"
    )
    args = ap.parse_args(argv)
    if args.plot_only:
        saved: dict[str, Any] = json.loads(args.plot_only.read_text(encoding="utf-8"))
        print(report(saved))
        write_csv(saved, args.plot_only.with_suffix(".csv"))
        plot(saved, args.plot_only.with_suffix(".png"))
        return saved
    quick = args.quick
    defaults = {
        "q_items": 300 if quick else 1000,
        "q_users": 3 if quick else 20,
        "reps": 30 if quick else 200,
        "users": 20 if quick else 1000,
        "items": 200 if quick else 1000,
        "batch": 1000 if quick else 5000,
        "users_per_batch": 5 if quick else 50,
        "queries": 15 if quick else 200,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    # named for what ran: a quick run never overwrites the full one, nor a one-section run
    # the file of both (docs/data-ownership.md quotes ownership_query, the query section alone)
    ran = [s for s in ("query", "scale") if s not in args.skip]
    if not ran:
        ap.error("--skip query scale leaves nothing to run")
    stem = "ownership" if len(ran) != 1 else f"ownership_{ran[0]}"
    stem += "_quick" if quick else ""

    results: dict[str, Any] = {"machine": machine(), "quick": quick}
    results["args"] = {k: (in_repo(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    t0 = time.perf_counter()
    out = args.out_dir / f"{stem}.json"

    def save() -> None:  # after each section: a long run keeps what it has
        out.write_text(json.dumps(results, indent=1, default=float) + "\n", encoding="utf-8")

    if "query" not in args.skip:
        results["query"] = run_query(args)
        save()
    if "scale" not in args.skip:
        results["scale"] = run_scale(args)
    results["load_avg_end"] = [round(v, 2) for v in os.getloadavg()]
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    save()
    write_csv(results, out.with_suffix(".csv"))
    plot(results, out.with_suffix(".png"))
    print()
    print(report(results))
    print(f"\nwrote {out}, {out.with_suffix('.csv')}, {out.with_suffix('.png')}")
    start, end = results["machine"]["load_avg_start"], results["load_avg_end"]
    print(f"load average start {start}, end {end}")
    return results


if __name__ == "__main__":
    main()
