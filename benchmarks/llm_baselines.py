"""The LLM query-expansion baselines next to PBR, from cached generations only (issue #5).

HyDE, Query2Term, CoT and ThinkQE (spec §4.4) with a local LLM cost one or two generations per
question; on this 2-core machine a full ``python -m pbr_bench run --methods hyde,...`` did not
always fit a session. This script scores every method on the questions whose baseline answers are
all in the generation cache (a miss is never generated here: the question is left out and
counted), so a partly finished run still gives a paired comparison on equal questions.

    python benchmarks/llm_baselines.py --dataset personabench --llm gemma-270m --limit 60
    python benchmarks/llm_baselines.py --dataset locomo --limit 30      # LoCoMo turn level
    python benchmarks/llm_baselines.py --dataset prefeval --limit 30    # PrefEval, N = 10

Prints the table and writes ``llm_baselines__<llm>.csv`` / ``.json`` into the subset's results
folder (``benchmarks/results/<data set>/n<limit>-seed<seed>/``).
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from pbr_bench.cached import cached_bench, local_ids
from pbr_bench.compare import paired
from pbr_bench.datasets import Dataset
from pbr_bench.metrics import evaluate
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_bench.runner import LLM_BASELINES, Bench
from pbr_bench.runs import load_dataset

METHODS = ("plain", "bm25", "pbr", "pbr-safe", *LLM_BASELINES)


def answered(bench: Bench) -> tuple[list[Any], dict[str, dict[str, list[str]]]]:
    """Each method's rankings of the questions it could rank from the cache, restricted to the
    questions every method with any cached answer could rank (so all rows compare equal sets).
    A method with no cached answer at all is left out and named."""
    rankings: dict[str, dict[str, list[str]]] = {m: {} for m in METHODS}
    every = bench.queries
    try:
        for q in every:
            bench.queries = [q]
            for method in METHODS:
                with contextlib.suppress(LookupError):  # a baseline answer not cached
                    rankings[method][q.id] = bench.run(method, progress=False).rankings[q.id]
    finally:
        bench.queries = every
    for method in [m for m, r in rankings.items() if not r]:
        print(f"{method}: no cached answers, left out")
        del rankings[method]
    keep = [q for q in every if all(q.id in r for r in rankings.values())]
    return keep, {m: {q.id: r[q.id] for q in keep} for m, r in rankings.items()}


def table(
    ds: Dataset, queries: list[Any], rankings: dict[str, dict[str, list[str]]]
) -> list[dict[str, Any]]:
    gold = {q.id: q.gold for q in queries}
    rows = []
    for method, ranks in rankings.items():
        o = evaluate(ranks, gold, ks=(5,))["Overall"]
        row: dict[str, Any] = {
            "dataset": ds.name,
            "method": method,
            "questions": len(queries),
            "R@5": round(o["R@5"], 4),
            "N@5": round(o["N@5"], 4),
            "wins": "",
            "losses": "",
            "sign_p": "",
        }
        if method != "plain":
            pair = paired(ds, rankings["plain"], ranks, method, k=5)
            row.update(wins=pair.wins, losses=pair.losses, sign_p=float(f"{pair.p_value:.2g}"))
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dataset", choices=["personabench", "locomo", "prefeval"], default="personabench"
    )
    p.add_argument("--noise", default="0.0", help="PersonaBench noise level")
    p.add_argument("--n-filler", type=int, default=10, help="PrefEval filler messages")
    p.add_argument("--llm", choices=["gemma-270m", "smollm2-135m"], default="gemma-270m")
    p.add_argument("--limit", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(level="turn", data_dir=None, per_topic=None)  # what load_dataset also reads
    args = p.parse_args()
    ds = load_dataset(args)
    model_id = local_ids()[args.llm]
    # cached_bench keeps the questions whose PBR answers are cached (PBR would degrade, not
    # fail, on a miss); answered() then drops those with a baseline answer missing.
    bench = cached_bench(ds, args.llm, model_id, args.limit, args.seed)
    if bench is None:
        return 1
    total = len(bench.queries)
    queries, rankings = answered(bench)
    print(f"{ds.name} {args.llm}: {len(queries)} of {total} questions have every answer cached")
    if not queries:
        return 1
    rows = table(ds, queries, rankings)
    out = RESULTS_DIR / ds.name / f"n{args.limit}-seed{args.seed}"
    payload = {"questions": [q.id for q in queries], "rows": rows}
    write_rows(rows, out / f"llm_baselines__{args.llm}", payload=payload)
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
