"""Salience re-ranking of hybrid candidates (issue #42 point 2): R@1, R@5, N@5, wins / losses, cost.

What it measures: for a seeded sample of 200 LoCoMo turn-level questions and all 230 of
PersonaBench 0.0's questions (in a seeded order), the top ``N = 10`` of the library's default
search (hybrid, with windows, the plain query: no LLM feedback, so no generation is needed)
re-ordered by the
Bayes-factor salience of each candidate (``pbr_core.salience``, the embedded Gemma 3 270M in fp32,
default template, items cut at 128 tokens). Every row re-ranks exactly the same candidates:

    hybrid                  the candidates in the hybrid order (no re-rank)
    hybrid → salience       by salience alone (the opt-in's rule, ``PBRConfig(rerank="salience")``,
                            named before any number of this script was read)
    hybrid → RRF            reciprocal-rank fusion of the salience rank and the hybrid rank (c = 60)
    hybrid → z-sum          z(salience) + z(hybrid score), equal weights

Scored by R@1, R@5, N@5 (PersonaBench's best-over-combinations rule), with per-question wins /
losses of each re-rank against ``hybrid`` and the two-sided sign test
(:func:`pbr_bench.compare.sign_summary`). Cost: wall seconds of each salience call (N + 1
sequences), on the machine as it was (each cache line records the load average when it was scored).

Salience of every (question, candidate) pair is cached in
``benchmarks/cache/salience_<model>.jsonl`` (one line per question: the query, the candidate texts,
their summed and mean log-probability gains, the seconds the call took), so a rerun scores only
what is missing; ``--report`` reads the cache alone and scores the questions it holds.

Run (one model process at a time; long: pin it to one core)::

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/salience_rerank.py          # score + report
    python benchmarks/salience_rerank.py --report                                # cache only

Writes ``benchmarks/results/salience_rerank.{json,csv}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.compare import sign_summary
from pbr_bench.datasets import Query
from pbr_bench.histories import Built, build, encoders, item_ids
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import GENERATION_CACHE_DIR, RESULTS_DIR
from pbr_bench.report import bar_png
from pbr_core.hybrid import lexical_query, rank
from pbr_core.salience import rerank

DATASETS = {"locomo-turn": 200, "personabench-0.0": None}  # None: every scored question
SEED = 0
N = 10  # candidates re-ranked per question
MODEL_ID = "gemma-3-270m-q4_k_m/fp32"
#: What the cache's scores were computed with besides the model: ``MODEL_ID`` keys them, so a
#: scorer with other settings must not append to (or be served from) it.
MAX_ITEM_TOKENS = 128
#: The template the cached scores were computed with, written out (not the library's default,
#: which may change).
TEMPLATE_BLOCKS = ("{memory}\n", "{condition}\n")
CACHE = GENERATION_CACHE_DIR / "salience_gemma-3-270m-fp32.jsonl"
METHODS = ["hybrid", "hybrid → salience", "hybrid → RRF", "hybrid → z-sum"]
OUT = RESULTS_DIR


def sample(built: Built, limit: int | None) -> list[Query]:
    """The data set's scored questions in a seeded order, the first ``limit`` of them."""
    queries = list(built.queries)
    random.Random(SEED).shuffle(queries)
    return queries if limit is None else queries[:limit]


def read_cache(path: Path) -> dict[tuple[str, str], dict[str, float]]:
    """(query, item text) -> {"sum", "mean", "seconds"} from the cache file."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["model"] != MODEL_ID:
            continue
        for text, s, m in zip(row["items"], row["sum"], row["mean"]):
            out[(row["query"], text)] = {"sum": s, "mean": m, "seconds": row["seconds"]}
    return out


def candidates(built: Built, q: Query) -> tuple[list[str], list[str], np.ndarray]:
    """The hybrid top-N of ``q``'s user: ids, texts and the returned scores."""
    h = built.windowed.get(q.user_id)
    ranked = rank(h, built.qvec[q.id], lexical_query(q.text), N, mode="hybrid")
    return (
        item_ids(h, ranked),
        [h.items[r.position].text for r in ranked],
        np.array([r.score for r in ranked]),
    )


def _checked(scorer: Any) -> Any:
    """``scorer``, if it scores as the cached salience was scored; else SystemExit saying what
    to change (a new ``MODEL_ID``, so old and new scores never share a key)."""
    template = scorer.template
    blocks = (template.memory_block, template.condition_block)
    seen = (scorer.model_id, blocks, scorer.max_item_tokens)
    cached = (MODEL_ID, TEMPLATE_BLOCKS, MAX_ITEM_TOKENS)
    if seen != cached:
        raise SystemExit(
            f"default_scorer() now scores as {seen!r}, the cache {CACHE.name} as {cached!r}: "
            "give MODEL_ID a new name (and the other constants their values) before scoring"
        )
    return scorer


def score_missing(todo: list[tuple[Built, Query]]) -> None:
    """Salience of every candidate not cached yet, appended to the cache one question a line."""
    from pbr_core.salience import default_scorer, salience

    cached = read_cache(CACHE)
    scorer = None
    for i, (built, q) in enumerate(todo):
        _, texts, _ = candidates(built, q)
        if all((q.text, t) in cached for t in texts):
            continue
        if scorer is None:
            scorer = _checked(default_scorer())
        t0 = time.perf_counter()
        s = salience(scorer, q.text, texts)
        seconds = time.perf_counter() - t0
        sums, means = [float(x) for x in s.sum], [float(x) for x in s.mean]
        row = {
            "model": MODEL_ID,
            "query": q.text,
            "items": texts,
            "sum": sums,
            "mean": means,
            "seconds": round(seconds, 3),
            "load": round(os.getloadavg()[0], 2),
        }
        with CACHE.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for t, a, b in zip(texts, sums, means):
            cached[(q.text, t)] = {"sum": a, "mean": b, "seconds": seconds}
        print(f"{i + 1}/{len(todo)} {built.ds.name} {seconds:.1f} s", flush=True)


def orders(dense: np.ndarray, sal: np.ndarray) -> dict[str, list[int]]:
    """Each method's order of the N candidates (indices into the hybrid order)."""
    idx = list(range(len(sal)))
    return {
        "hybrid": idx,
        "hybrid → salience": [int(i) for i in rerank(idx, sal, "salience").order],
        "hybrid → RRF": [int(i) for i in rerank(idx, sal, "rrf").order],
        "hybrid → z-sum": [int(i) for i in rerank(idx, sal, "zsum", dense_scores=dense).order],
    }


def report(todo: list[tuple[Built, Query]]) -> dict[str, Any]:
    cached = read_cache(CACHE)
    per: dict[str, dict[str, dict[str, list[float]]]] = {}
    seconds: dict[str, list[float]] = {}
    for built, q in todo:
        ids, texts, dense = candidates(built, q)
        if not all((q.text, t) in cached for t in texts):
            continue
        sal = np.array([cached[(q.text, t)]["sum"] for t in texts])
        seconds.setdefault(built.ds.name, []).append(cached[(q.text, texts[0])]["seconds"])
        d = per.setdefault(built.ds.name, {m: {"R@1": [], "R@5": [], "N@5": []} for m in METHODS})
        for method, order in orders(dense, sal).items():
            ranking = [ids[i] for i in order]
            r1, _ = best_over_combinations(ranking, q.gold, 1)
            r5, n5 = best_over_combinations(ranking, q.gold, 5)
            d[method]["R@1"].append(r1)
            d[method]["R@5"].append(r5)
            d[method]["N@5"].append(n5)
    rows: list[dict[str, Any]] = []
    for name, d in per.items():
        base = d["hybrid"]
        for method in METHODS:
            row: dict[str, Any] = {"dataset": name, "method": method, "questions": len(base["R@5"])}
            for metric in ("R@1", "R@5", "N@5"):
                vals = np.array(d[method][metric])
                row[metric] = round(float(vals.mean()), 4)
                if method != "hybrid":
                    w, lo, mean, p = sign_summary(vals - np.array(base[metric]))
                    row[f"{metric} wins"], row[f"{metric} losses"] = w, lo
                    row[f"{metric} delta"], row[f"{metric} p"] = round(mean, 4), p
            secs = seconds[name]
            row["salience s/query (median)"] = round(float(np.median(secs)), 2)
            row["salience s/query (mean)"] = round(float(np.mean(secs)), 2)
            rows.append(row)
    return {"candidates": N, "seed": SEED, "model": MODEL_ID, "rows": rows}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """R@5 of each re-rank order, per data set (over the same candidates)."""
    groups: dict[str, dict[str, float]] = {}
    for r in rows:
        groups.setdefault(str(r["dataset"]), {})[str(r["method"])] = r["R@5"]
    bar_png(path, groups, title="salience_rerank: R@5 over the same candidates", ylabel="R@5")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--report", action="store_true", help="read the cache only, score nothing")
    args = p.parse_args()
    counter, cache, window = encoders()
    todo: list[tuple[Built, Query]] = []
    for name, limit in DATASETS.items():
        built = build(name, cache, counter, window)
        todo.extend((built, q) for q in sample(built, limit))
    if not args.report:
        score_missing(todo)
    out = report(todo)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "salience_rerank.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    plot(out["rows"], OUT / "salience_rerank.png")
    keys = list(dict.fromkeys(k for r in out["rows"] for k in r))
    with (OUT / "salience_rerank.csv").open("w", encoding="utf-8") as f:
        f.write(",".join(keys) + "\n")
        for r in out["rows"]:
            f.write(",".join(str(r.get(k, "")) for k in keys) + "\n")
    for r in out["rows"]:
        print(
            f"{r['dataset']:18} {r['method']:20} n={r['questions']:4} R@1 {r['R@1']:.4f} "
            f"R@5 {r['R@5']:.4f} N@5 {r['N@5']:.4f}"
            + (
                f"  R@5 {r['R@5 wins']}/{r['R@5 losses']} p={r['R@5 p']:.2g}"
                if "R@5 wins" in r
                else ""
            )
        )


if __name__ == "__main__":
    main()
