"""Where the queries lie relative to each user's history and anchor, per data set.

Explains why the anchor term (``q* = q + c_anchor + …``) helps on one data set and hurts on
another, with no LLM involved: for every scored question, the cosine of the plain query with the
user's anchor and with its closest history item; for every user, the anchor's norm and the mean
cosine of the user's items with the anchor's direction (how tightly the history clusters around
it). Medians per data set.

    python benchmarks/anchor_geometry.py

Writes ``benchmarks/results/anchor_geometry.{csv,json}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pbr_bench.datasets import Dataset, load_locomo, load_personabench, load_prefeval
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_bench.runner import Bench

OUT = RESULTS_DIR


def geometry(ds: Dataset) -> dict[str, Any]:
    bench = Bench(ds, llm_name="none")
    store, cfg = bench.personalizer.store, bench.config
    users: dict[str, tuple[np.ndarray, float, float]] = {}
    for uid in {q.user_id for q in ds.scored_queries}:
        history = store.get(uid)
        result = history.anchor(cfg)
        assert result is not None
        norm = float(np.linalg.norm(result.vector))
        unit = result.vector / norm
        users[uid] = (unit, norm, float(np.mean(history.vectors @ unit)))
    to_anchor, to_closest = [], []
    for q in ds.scored_queries:
        qv = np.asarray(bench.embedder.embed_query(q.text))
        to_anchor.append(float(qv @ users[q.user_id][0]))
        to_closest.append(store.get(q.user_id).search(qv, 1)[0][1])
    return {
        "dataset": ds.name,
        "users": len(users),
        "questions": len(ds.scored_queries),
        "anchor_norm": round(float(np.median([u[1] for u in users.values()])), 3),
        "cos_item_anchor": round(float(np.median([u[2] for u in users.values()])), 3),
        "cos_query_anchor": round(float(np.median(to_anchor)), 3),
        "cos_query_closest_item": round(float(np.median(to_closest)), 3),
    }


def main() -> int:
    loaders = [
        lambda: load_personabench("0.0"),
        lambda: load_personabench("0.7"),
        lambda: load_locomo("turn"),
        lambda: load_prefeval(n_filler=10),
    ]
    rows = [geometry(load()) for load in loaders]
    write_rows(rows, OUT / "anchor_geometry")
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
