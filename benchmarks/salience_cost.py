"""Cost of Bayes-factor salience per query: LM forward passes and wall time for N candidates.

For each N (default 10, 30, 50) and a few LoCoMo questions, score N turns of the question's own
conversation with the default scorer (Gemma 3 270M, fp32) and count:

* sequences scored (``N + 1``: the items and the empty memory slot),
* forward calls (``ceil((N + 1) / batch_size)``) and the tokens they ran over,
* wall time per query (the first, warm-up query is run and discarded).

Run (one model process at a time on a shared machine; it loads ~1.1 GB):

    python benchmarks/salience_cost.py                    # N = 10 30 50, 3 queries each
    python benchmarks/salience_cost.py --n 10 --queries 1 # quick look

Prints a table and writes ``benchmarks/results/salience_cost.json`` (and ``.png`` if matplotlib
is installed). The load average is recorded because other processes on a 2-core machine slow
torch down several-fold (OpenMP oversubscription).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pbr_bench.paths import RESULTS_DIR
from pbr_core.salience import default_scorer, salience

RESULTS = RESULTS_DIR


def _workload(n_max: int, queries: int, seed: int) -> list[tuple[str, list[str]]]:
    """(question, n_max turns of its conversation) pairs from LoCoMo; synthetic if absent."""
    rng = random.Random(seed)
    try:
        from pbr_bench.datasets import load_locomo

        ds = load_locomo("turn")
    except Exception as exc:  # data not present: still measure, on made-up turns
        print(f"LoCoMo not available ({exc}); using synthetic turns", file=sys.stderr)
        topics = "run kale beets plant cat market half marathon fueling morning legs work"
        words = topics.split()
        turns = [" ".join(rng.choices(words, k=30)) for _ in range(n_max)]
        return [(f"What did I say about {w}?", turns) for w in words[:queries]]
    picked = rng.sample(ds.queries, queries)
    out = []
    for q in picked:
        texts = ds.corpora[q.user_id].texts
        out.append((q.text, rng.sample(texts, min(n_max, len(texts)))))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10, 30, 50], help="candidates per query")
    ap.add_argument("--queries", type=int, default=3, help="timed queries per N")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-item-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=RESULTS / "salience_cost.json")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    scorer = default_scorer(batch_size=args.batch_size, max_item_tokens=args.max_item_tokens)
    load_s = time.perf_counter() - t0

    calls: list[int] = []  # rows per forward call
    tokens: list[int] = []  # padded tokens per forward call

    def _count(module: Any, a: Any, kwargs: dict[str, Any]) -> None:
        calls.append(int(kwargs["input_ids"].shape[0]))
        tokens.append(int(kwargs["input_ids"].numel()))

    hook = scorer.model.register_forward_pre_hook(_count, with_kwargs=True)
    work = _workload(max(args.n), args.queries + 1, args.seed)
    rows = []
    try:
        # warm-up (first-call allocations, thread pools), not timed
        salience(scorer, work[0][0], work[0][1][: min(args.n)])
        total = sum(min(n, len(items)) + 1 for n in args.n for _, items in work[1:])
        with tqdm(total=total, unit="seq", desc="salience", file=sys.stderr) as bar:
            for n in args.n:
                times, n_calls, n_rows, n_tok = [], [], [], []
                for query, items in work[1:]:
                    cands = items[:n]
                    calls.clear()
                    tokens.clear()
                    t = time.perf_counter()
                    salience(scorer, query, cands)
                    times.append(time.perf_counter() - t)
                    n_calls.append(len(calls))
                    n_rows.append(sum(calls))
                    n_tok.append(sum(tokens))
                    bar.update(len(cands) + 1)
                rows.append(
                    {
                        "n": n,
                        "queries": len(times),
                        "sequences_per_query": statistics.mean(n_rows),
                        "forward_calls_per_query": statistics.mean(n_calls),
                        "padded_tokens_per_query": statistics.mean(n_tok),
                        "wall_s_median": statistics.median(times),
                        "wall_s_min": min(times),
                        "wall_s_max": max(times),
                        "sequences_per_s": statistics.mean(n_rows) / statistics.median(times),
                    }
                )
    finally:
        hook.remove()

    result = {
        "model_id": scorer.model_id,
        "batch_size": args.batch_size,
        "max_item_tokens": args.max_item_tokens,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "model_load_s": round(load_s, 2),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rows": rows,
    }
    print(
        f"\nsalience cost: {result['model_id']}, batch {args.batch_size}, "
        f"{result['torch_threads']} torch threads, load avg {result['loadavg_before'][0]} -> "
        f"{result['loadavg_after'][0]}, model load {result['model_load_s']} s, "
        f"peak RSS {result['peak_rss_mb']} MB"
    )
    head = (
        f"{'N':>4} {'seqs':>5} {'fwd calls':>9} {'tokens':>7} {'median s':>9} {'min s':>7} "
        f"{'max s':>7} {'seq/s':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['n']:>4} {r['sequences_per_query']:>5.0f} {r['forward_calls_per_query']:>9.0f} "
            f"{r['padded_tokens_per_query']:>7.0f} {r['wall_s_median']:>9.2f} "
            f"{r['wall_s_min']:>7.2f} {r['wall_s_max']:>7.2f} {r['sequences_per_s']:>6.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4.5, 3))
        ax.plot([r["n"] for r in rows], [r["wall_s_median"] for r in rows], "o-")
        ax.set_xlabel("candidates N")
        ax.set_ylabel("seconds per query (median)")
        ax.set_title(f"salience, {result['model_id']}", fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.out.with_suffix(".png"), dpi=120)
    except ImportError:
        pass
    return result


if __name__ == "__main__":
    main()
