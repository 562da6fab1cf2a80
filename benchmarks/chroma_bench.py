"""PBR on a real Chroma server vs in process: query latency, throughput, and where the time goes.

For each configuration ``USERSxITEMS`` (default ``100x1000``) the script starts a fresh
``chroma run`` on a loopback port, writes every user's items through
``langchain_pbr.PBRRetriever.add_documents`` into **one** collection (the user is a metadata
filter, applied in the database), then times the same queries on two paths that share one
pbr_core history:

* ``chroma``: the final search is Chroma's filtered HNSW query over HTTP;
* ``in-process``: ``vectorstore=None``, the final search is pbr_core's per-user index in memory;
* ``chroma-raw``: for scale, Chroma alone (``collection.query`` with the same ``where`` filter and
  a random unit vector), no PBR.

The models are stand-ins so that only the database and the method are measured: embeddings are
``DeterministicFakeEmbedding`` (sha256-seeded, ``--dim`` floats) and the LLM is an instant fake
that answers after a fixed ``--llm-ms`` sleep per call (PBR makes its two calls concurrently).
Each path is timed twice: with the instant LLM (the system's own cost, and throughput with
``--threads`` concurrent requests) and with the sleeping one (the share of database, method and
LLM in a request, from the stage timings every result's explanation carries).

Run (2 shared cores here: one configuration at a time, and read the recorded load average):

    python benchmarks/chroma_bench.py                          # 100 users x 1k items
    python benchmarks/chroma_bench.py --configs 100x1000 1000x100
    python benchmarks/chroma_bench.py --configs 20x200 --queries 50   # quick look

Prints a table and writes ``benchmarks/results/chroma.json``, ``chroma.csv`` and ``chroma.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from langchain_chroma import Chroma
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import ConfigurableField
from tqdm import tqdm

from langchain_pbr import PBRRetriever
from pbr_bench.chroma_server import ChromaServer
from pbr_bench.paths import RESULTS_DIR
from pbr_core import PBRConfig

RESULTS = RESULTS_DIR
K = 10
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
# Stages of pbr_core's explanation timings, grouped for the "where the time goes" columns.
METHOD_STAGES = ("related_history", "anchor", "parse", "fusion")
EMBED_STAGES = ("embed_query", "embed_feedback")


class SleepyChat(BaseChatModel):
    """A chat model that answers :data:`ANSWER` after ``delay_s``: an LLM of fixed latency."""

    delay_s: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "sleepy-fake"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if self.delay_s:
            time.sleep(self.delay_s)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=ANSWER))])

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=ANSWER))])


def _item_text(rng: random.Random, user: int, n: int) -> str:
    return f"u{user} item {n}: " + " ".join(rng.choices(WORDS, k=12))


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _ingest(r: PBRRetriever, users: int, items: int, seed: int) -> float:
    """Write every user's items through the retriever; returns seconds."""
    rng = random.Random(seed)
    start = time.perf_counter()
    for u in tqdm(range(users), desc="ingest", unit="user", leave=False):
        docs = [Document(page_content=_item_text(rng, u, n)) for n in range(items)]
        r.add_documents(docs, user_id=f"u{u}", ids=[f"u{u}-{n}" for n in range(items)])
    return time.perf_counter() - start


def _workload(users: int, n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed + 1)
    return [
        (f"u{rng.randrange(users)}", "what about " + " ".join(rng.choices(WORDS, k=5)))
        for _ in range(n)
    ]


def _latency(r: PBRRetriever, work: list[tuple[str, str]], desc: str) -> dict[str, Any]:
    """Sequential requests: wall time per request and the explanation's stage timings."""
    walls: list[float] = []
    stages: dict[str, list[float]] = {}
    for user, query in tqdm(work, desc=desc, unit="q", leave=False):
        start = time.perf_counter()
        docs = r.invoke(query, user_id=user, k=K)
        walls.append((time.perf_counter() - start) * 1000.0)
        assert docs and all(d.metadata["user_id"] == user for d in docs)
        for stage, ms in docs[0].metadata["pbr"]["timings_ms"].items():
            stages.setdefault(stage, []).append(ms)
    mean = {stage: statistics.fmean(v) for stage, v in stages.items()}
    wall = statistics.fmean(walls)
    parts = {
        "database": mean.get("search", 0.0),
        "method": sum(mean.get(s, 0.0) for s in METHOD_STAGES),
        "embedding": sum(mean.get(s, 0.0) for s in EMBED_STAGES),
        "llm": mean.get("llm", 0.0),
    }
    parts["framework"] = max(0.0, wall - sum(parts.values()))
    search = stages.get("search", [0.0])
    return {
        "median_ms": statistics.median(walls),
        "p95_ms": _pct(walls, 95),
        "search_median_ms": statistics.median(search),
        "search_p95_ms": _pct(search, 95),
        "mean_ms": wall,
        "mean_parts_ms": parts,
        "share": {k: v / wall for k, v in parts.items()},
        "stage_means_ms": mean,
    }


def _throughput(r: PBRRetriever, work: list[tuple[str, str]], threads: int) -> float:
    """Requests per second with ``threads`` requests in flight (LangChain ``batch``)."""
    per_user = r.configurable_fields(user_id=ConfigurableField(id="user_id"))
    configs: Any = [{"configurable": {"user_id": u}, "max_concurrency": threads} for u, _ in work]
    start = time.perf_counter()
    per_user.batch([q for _, q in work], config=configs)
    return len(work) / (time.perf_counter() - start)


def _raw_chroma(collection: Any, users: int, dim: int, n: int, seed: int) -> dict[str, Any]:
    """Chroma alone: the same filtered query PBR sends, and (for scale) the unfiltered one."""
    rng = np.random.default_rng(seed)
    walls: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * n):
        q = rng.standard_normal(dim)
        filtered = i % 2 == 0
        where = {"user_id": f"u{int(rng.integers(users))}"} if filtered else None
        start = time.perf_counter()
        collection.query(
            query_embeddings=[q / np.linalg.norm(q)],
            n_results=K,
            where=where,
            include=["metadatas", "documents", "distances"],
        )
        walls[filtered].append((time.perf_counter() - start) * 1000.0)
    return {
        "median_ms": statistics.median(walls[True]),
        "p95_ms": _pct(walls[True], 95),
        "unfiltered_median_ms": statistics.median(walls[False]),
        "unfiltered_p95_ms": _pct(walls[False], 95),
    }


def _rss_mb(pid: int | None) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()
        return int(fields[0]) / 1024.0
    except (OSError, IndexError, ValueError):
        return None


def run_config(users: int, items: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One ``USERSxITEMS`` configuration on a fresh server; one row per path."""
    emb = DeterministicFakeEmbedding(size=args.dim)
    instant, sleepy = SleepyChat(), SleepyChat(delay_s=args.llm_ms / 1000.0)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pbr-chroma-bench-") as tmp:
        server = ChromaServer(Path(tmp) / "db").start()
        try:
            store = Chroma(
                client=server.client(),
                collection_name="bench",
                embedding_function=emb,
                collection_configuration={"hnsw": {"space": "cosine"}},
            )
            # explain="first": the top document carries the stage timings _latency reads
            explain = PBRConfig(explain="first")
            on_chroma = PBRRetriever(
                llm=instant, embeddings=emb, vectorstore=store, k=K, config=explain
            )
            load = os.getloadavg()
            ingest_s = _ingest(on_chroma, users, items, args.seed)
            in_process = PBRRetriever(
                llm=instant, embeddings=emb, history=on_chroma.history, k=K, config=explain
            )
            # The first query of a user builds their anchor (PageRank over the history); it is
            # shared by both paths through the history, and timed apart from the steady state.
            start = time.perf_counter()
            for u in tqdm(range(users), desc="anchors", unit="user", leave=False):
                in_process.invoke("warm up", user_id=f"u{u}", k=1)
            anchors_s = time.perf_counter() - start
            work = _workload(users, args.queries, args.seed)
            base = {
                "config": f"{users}x{items}",
                "users": users,
                "items_per_user": items,
                "rows": users * items,
                "dim": args.dim,
                "k": K,
                "queries": args.queries,
                "llm_ms_per_call": args.llm_ms,
                "threads": args.threads,
                "ingest_s": ingest_s,
                "ingest_rows_per_s": users * items / ingest_s,
                "first_query_anchor_ms_per_user": anchors_s * 1000.0 / users,
                "loadavg_before": load,
            }
            for name, r in (("chroma", on_chroma), ("in-process", in_process)):
                fast = _latency(r, work, f"{name} instant LLM")
                slow = _latency(r.model_copy(update={"llm": sleepy}), work, f"{name} LLM sleep")
                qps = _throughput(r, work, args.threads)
                rows.append(
                    {
                        **base,
                        "path": name,
                        "median_ms": fast["median_ms"],
                        "p95_ms": fast["p95_ms"],
                        "qps": qps,
                        "search_median_ms": fast["search_median_ms"],
                        "search_p95_ms": fast["search_p95_ms"],
                        "with_llm_median_ms": slow["median_ms"],
                        "with_llm_p95_ms": slow["p95_ms"],
                        "share_with_llm": slow["share"],
                        "parts_with_llm_ms": slow["mean_parts_ms"],
                        "parts_instant_ms": fast["mean_parts_ms"],
                        "server_rss_mb": _rss_mb(server.pid) if name == "chroma" else None,
                        "loadavg_after": os.getloadavg(),
                    }
                )
            col = server.client().get_collection("bench", embedding_function=None)
            raw = _raw_chroma(col, users, args.dim, args.queries, args.seed)
            rows.append(
                {
                    **base,
                    "path": "chroma-raw",
                    **raw,
                    "qps": None,
                    "loadavg_after": os.getloadavg(),
                }
            )
        finally:
            server.stop()
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'config':>10} {'path':>10} | {'median':>7} {'p95':>7} {'q/s':>6} | "
        f"{'+LLM med':>8} {'p95':>7} | {'db':>4} {'method':>6} {'embed':>5} {'llm':>4} "
        f"{'frame':>5} | load"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        share = row.get("share_with_llm") or {}
        pct = [
            f"{100 * share[key]:>{w}.0f}%" if key in share else " " * (w + 1)
            for key, w in (("database", 3), ("method", 5), ("embedding", 4), ("llm", 3))
        ]
        frame = f"{100 * share['framework']:>4.0f}%" if share else "      "
        qps = f"{row['qps']:>6.1f}" if row.get("qps") else "      "
        with_llm = (
            f"{row['with_llm_median_ms']:>8.1f} {row['with_llm_p95_ms']:>7.1f}"
            if "with_llm_median_ms" in row
            else " " * 16
        )
        load = row["loadavg_after"][0]
        print(
            f"{row['config']:>10} {row['path']:>10} | {row['median_ms']:>7.1f} "
            f"{row['p95_ms']:>7.1f} {qps} | {with_llm} | {' '.join(pct)} {frame} | {load:.1f}"
        )


def _write(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    flat_keys = [
        "config", "path", "users", "items_per_user", "rows", "dim", "k", "median_ms", "p95_ms",
        "search_median_ms", "search_p95_ms", "unfiltered_median_ms", "qps",
        "with_llm_median_ms", "with_llm_p95_ms", "ingest_rows_per_s",
        "first_query_anchor_ms_per_user", "server_rss_mb",
    ]  # fmt: skip
    with out.with_suffix(".csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([*flat_keys, "share_db", "share_method", "share_llm", "load1_after"])
        for row in rows:
            share = row.get("share_with_llm") or {}
            writer.writerow(
                [row.get(k) for k in flat_keys]
                + [share.get("database"), share.get("method"), share.get("llm")]
                + [row["loadavg_after"][0]]
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    configs = list(dict.fromkeys(r["config"] for r in rows))
    paths = ["chroma", "in-process", "chroma-raw"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(paths)
    for i, path in enumerate(paths):
        got = [
            next((r for r in rows if (r["config"], r["path"]) == (c, path)), None) for c in configs
        ]
        xs = [j + i * width for j in range(len(configs))]
        med = [r["median_ms"] if r else 0 for r in got]
        p95 = [r["p95_ms"] if r else 0 for r in got]
        ax1.bar(xs, p95, width, color=f"C{i}", alpha=0.35)
        ax1.bar(xs, med, width, color=f"C{i}", label=f"{path} (median; light: p95)")
    ax1.set_xticks([j + width for j in range(len(configs))], configs)
    ax1.set_yscale("log")
    ax1.set_ylabel("ms per request, instant LLM (log scale)")
    ax1.set_title("Query latency")
    ax1.legend(fontsize=8)
    parts = ["database", "method", "embedding", "llm", "framework"]
    bars = [r for r in rows if r.get("share_with_llm")]
    bottoms = np.zeros(len(bars))
    for i, part in enumerate(parts):
        vals = np.array([100 * r["share_with_llm"][part] for r in bars])
        ax2.bar(range(len(bars)), vals, bottom=bottoms, color=f"C{i + 3}", label=part)
        bottoms += vals
    ax2.set_xticks(range(len(bars)), [f"{r['config']}\n{r['path']}" for r in bars], fontsize=8)
    ax2.set_ylabel(f"% of a request (LLM: {meta['llm_ms_per_call']:.0f} ms per call)")
    ax2.set_title("Where the time goes")
    ax2.legend(fontsize=8)
    fig.suptitle(f"PBR on Chroma vs in process - load average {meta['loadavg_start'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["100x1000"], help="USERSxITEMS per user")
    ap.add_argument("--dim", type=int, default=384, help="embedding size (MiniLM: 384)")
    ap.add_argument("--queries", type=int, default=200, help="timed requests per path and run")
    ap.add_argument("--threads", type=int, default=4, help="requests in flight for throughput")
    ap.add_argument("--llm-ms", type=float, default=100.0, help="fake LLM latency per call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "chroma.json")
    args = ap.parse_args(argv)
    meta = {
        "argv": sys.argv[1:] if argv is None else argv,
        "loadavg_start": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "chromadb": version("chromadb"),
        "langchain_chroma": version("langchain-chroma"),
        "llm_ms_per_call": args.llm_ms,
        "note": (
            "fake models: DeterministicFakeEmbedding and an LLM answering after a fixed sleep; "
            "median/p95/q/s with an instant LLM; shares with the sleeping one"
        ),
    }
    rows: list[dict[str, Any]] = []
    for spec in args.configs:
        users, items = (int(x) for x in spec.lower().split("x"))
        rows += run_config(users, items, args)
        _write(rows, meta, args.out)  # after each configuration: a long run keeps what it has
    meta["loadavg_end"] = os.getloadavg()
    _write(rows, meta, args.out)
    _print(rows)
    print(f"wrote {args.out} (+ .csv, .png); load average start {meta['loadavg_start']}")
    return rows


if __name__ == "__main__":
    main()
