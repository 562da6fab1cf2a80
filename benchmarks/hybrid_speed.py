"""What the lexical leg and the fusion add to a query, per user size (issue #24's speed targets).

One synthetic user of 1k, 10k and 100k items (texts from ``pbr_bench.synthetic``'s
Zipf corpus, random unit 384-d vectors, fixed seeds) in a :class:`pbr_core.HistoryStore`. Per
size: median milliseconds of :func:`pbr_core.hybrid.rank` for k = 10 in dense mode (the cosine
ranking alone) and in hybrid mode (cosine + BM25 + fusion), over 50 queries, interleaved so the
machine's noise hits both alike; the difference is what hybrid search adds. The lexical index is
built before timing (its build is ``lexical_speed.py``'s figure).

Targets: hybrid adds ≤ 2 ms per query at 1k items and ≤ 20 ms at 100k.

    python benchmarks/hybrid_speed.py

Prints a table and writes ``benchmarks/results/hybrid_speed.json`` and ``.csv``.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.machine import describe
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import bar_png
from pbr_bench.synthetic import corpus, queries, vocabulary
from pbr_core import HistoryItem, HistoryStore
from pbr_core.hybrid import lexical_query, rank

SIZES = (1_000, 10_000, 100_000)
DIM = 384
K = 10
TARGET_MS = {1_000: 2.0, 100_000: 20.0}
OUT = RESULTS_DIR


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median ms per query, dense and hybrid, per history size."""
    groups = {
        f"{r['items']:,} items": {"dense": r["dense_ms_median"], "hybrid": r["hybrid_ms_median"]}
        for r in rows
    }
    bar_png(path, groups, title="hybrid_speed: ms per query (median)", ylabel="ms", log=True)


def main() -> None:
    rng = np.random.default_rng(0)
    words = vocabulary(rng)
    rows = []
    for n in SIZES:
        texts = corpus(n, words, rng)
        vectors = rng.normal(size=(n, DIM)).astype(np.float32)
        items = [HistoryItem(id=str(i), text=t) for i, t in enumerate(texts)]
        history = HistoryStore().upsert("u", items, vectors)
        history.lexical()
        qs = queries(words, rng)
        qv = rng.normal(size=(len(qs), DIM)).astype(np.float32)
        qv /= np.linalg.norm(qv, axis=1, keepdims=True)
        dense_ms, hybrid_ms = [], []
        for q, v in zip(qs, qv):
            terms = lexical_query(q)
            t0 = time.perf_counter()
            rank(history, v, terms, K, mode="dense")
            t1 = time.perf_counter()
            rank(history, v, terms, K, mode="hybrid")
            t2 = time.perf_counter()
            dense_ms.append((t1 - t0) * 1000)
            hybrid_ms.append((t2 - t1) * 1000)
        added = [h - d for h, d in zip(hybrid_ms, dense_ms)]
        row = {
            "items": n,
            "dense_ms_median": statistics.median(dense_ms),
            "hybrid_ms_median": statistics.median(hybrid_ms),
            "added_ms_median": statistics.median(added),
            "target_added_ms": TARGET_MS.get(n),
            "load_avg": round(os.getloadavg()[0], 2),
        }
        rows.append(row)
        print(
            f"{n:>7} items  dense {row['dense_ms_median']:7.2f} ms  hybrid "
            f"{row['hybrid_ms_median']:7.2f} ms  added {row['added_ms_median']:6.2f} ms"
            + (f"  (target ≤ {TARGET_MS[n]} ms)" if n in TARGET_MS else ""),
            flush=True,
        )
    OUT.mkdir(parents=True, exist_ok=True)
    payload = {"machine": describe(), "rows": rows}  # what the rows were timed on
    (OUT / "hybrid_speed.json").write_text(json.dumps(payload, indent=1) + "\n")
    plot(rows, OUT / "hybrid_speed.png")
    with (OUT / "hybrid_speed.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
