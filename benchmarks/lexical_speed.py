"""Speed of the per-user BM25 index (pbr_core.lexical) against bm25s, on synthetic corpora.

Corpora of 1k, 10k and 100k items: sentences of 8-30 words drawn, with a fixed seed, from a
Zipf-like vocabulary (p ∝ 1/rank^1.07) of 20k words whose 60 most frequent ranks are English stop
words, as in real text. Queries are 5 words drawn from the same distribution without the stop
words, so they hit the long postings of frequent words as real queries do; a second, harder set
draws its 5 words uniformly from the 100 most frequent non-stop words (long postings only).

Both libraries analyze alike: pbr's stop words, then no stemmer (``--stemmer none``, the library's
default analyzer) or the English Snowball stemmer (PyStemmer, ``--stemmer english``). Per size and
library: median build seconds (tokenizing and stemming included), median seconds to add one item to
the index (``LexicalIndex.derived``; bm25s has no update, so a full rebuild over n + 1 texts),
median and p90 milliseconds per query over the 50 queries of each set (ours from the query string,
tokenizing and stemming included; bm25s from pre-tokenized tokens, its fastest path,
``backend="numpy"``), and, as a check, the largest relative difference between the two libraries'
scores.

Targets: query ≤ 2 ms at 1k items and ≤ 20 ms at 100k; build of 100k ≤ 10 s.

Run (a shared 2-core machine: the load average is recorded with the figures):

    python benchmarks/lexical_speed.py                 # about two minutes
    python benchmarks/lexical_speed.py --sizes 1000 10000 --repeats 2
    python benchmarks/lexical_speed.py --stemmer english  # with the stemmer

Prints a table and writes ``benchmarks/results/lexical_speed.json`` and ``lexical_speed.csv``
(``lexical_speed_english.*`` with ``--stemmer english``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from pbr_bench.machine import describe
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import bar_png
from pbr_bench.synthetic import (
    N_QUERIES,
    QUERY_TERMS,
    VOCAB_SIZE,
    ZIPF_S,
    corpus,
    queries,
    vocabulary,
)
from pbr_core.lexical import (
    DEFAULT_STEMMER,
    ENGLISH_STOP_WORDS,
    LexicalIndex,
    StemmerName,
    analyze,
)

TARGETS = {"query_ms_1k": 2.0, "query_ms_100k": 20.0, "build_s_100k": 10.0}
STOP = list(ENGLISH_STOP_WORDS)


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall seconds of ``repeats`` calls, and the last call's result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bm25s_stemmer(stemmer: StemmerName | None) -> Any:
    """What bm25s.tokenize takes as its stemmer: PyStemmer's stemWords, or None."""
    if stemmer is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(stemmer).stemWords


def bm25s_build(texts: list[str], stemmer: StemmerName | None) -> bm25s.BM25:
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    tokens = bm25s.tokenize(
        texts, stopwords=STOP, stemmer=bm25s_stemmer(stemmer), show_progress=False
    )
    retriever.index(tokens, show_progress=False)
    return retriever


def per_query_ms(fn: Callable[[Any], Any], qs: list[Any]) -> tuple[float, float]:
    for q in qs[:5]:  # warm-up
        fn(q)
    ms = []
    for q in qs:
        t0 = time.perf_counter()
        fn(q)
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), float(np.percentile(ms, 90))


def run_size(
    n: int,
    words: list[str],
    qs: list[str],
    hard: list[str],
    repeats: int,
    seed: int,
    stemmer: StemmerName | None,
) -> list[dict]:
    rng = np.random.default_rng(seed + n)
    texts = corpus(n, words, rng)
    extra = corpus(1, words, rng)
    load = round(os.getloadavg()[0], 2)

    build_s, index = timed(lambda: LexicalIndex.build(texts, stemmer=stemmer), repeats)
    derive_s, grown = timed(lambda: index.derived(range(n), extra), max(5, 3 * repeats))
    q_med, q_p90 = per_query_ms(index.scores, qs)
    h_med, h_p90 = per_query_ms(index.scores, hard)

    b_build_s, retriever = timed(lambda: bm25s_build(texts, stemmer), repeats)
    b_add_s, _ = timed(lambda: bm25s_build(texts + extra, stemmer), 1)
    stem = bm25s_stemmer(stemmer)
    q_tokens = bm25s.tokenize(
        qs, stopwords=STOP, stemmer=stem, show_progress=False, return_ids=False
    )
    b_med, b_p90 = per_query_ms(retriever.get_scores, q_tokens)
    h_tokens = bm25s.tokenize(
        hard, stopwords=STOP, stemmer=stem, show_progress=False, return_ids=False
    )
    bh_med, bh_p90 = per_query_ms(retriever.get_scores, h_tokens)

    # Checks, not timed: the two libraries agree, and derived() equals a rebuild.
    rel = 0.0
    for q, toks in zip(qs + hard, q_tokens + h_tokens):
        ours, theirs = index.scores(q), retriever.get_scores(toks)
        rel = max(rel, float(np.max(np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-6))))
    rebuilt = LexicalIndex.build(texts + extra, stemmer=stemmer)
    derived_exact = all(np.array_equal(grown.scores(q), rebuilt.scores(q)) for q in qs[:10])
    tf = index._tf
    df = np.diff(tf.indptr)

    def touched(batch: list[str]) -> float:  # postings read per query, on average
        vocab = index._vocab
        terms = [analyze(q, stemmer) for q in batch]
        return float(np.mean([sum(df[vocab[t]] for t in ts if t in vocab) for ts in terms]))

    common = {
        "items": n,
        "postings": int(tf.nnz),
        "terms": int(tf.shape[1]),
        "postings_per_query": touched(qs),
        "postings_per_frequent_query": touched(hard),
        "load_avg": load,
        "stemmer": stemmer,
    }
    return [
        {
            **common,
            "library": "pbr_core.lexical",
            "build_s": build_s,
            "add_one_s": derive_s,
            "query_ms_median": q_med,
            "query_ms_p90": q_p90,
            "frequent_query_ms_median": h_med,
            "frequent_query_ms_p90": h_p90,
            "max_rel_diff_vs_bm25s": rel,
            "derived_equals_build": derived_exact,
        },
        {
            **common,
            "library": f"bm25s {bm25s.__version__} (numpy)",
            "build_s": b_build_s,
            "add_one_s": b_add_s,
            "query_ms_median": b_med,
            "query_ms_p90": b_p90,
            "frequent_query_ms_median": bh_med,
            "frequent_query_ms_p90": bh_p90,
            "max_rel_diff_vs_bm25s": 0.0,
            "derived_equals_build": None,
        },
    ]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Median ms per query of each library, per corpus size."""
    groups: dict[str, dict[str, float]] = {}
    for r in rows:
        groups.setdefault(f"{r['items']:,} items", {})[str(r["library"])] = r["query_ms_median"]
    bar_png(path, groups, title=f"{path.stem}: ms per query (median)", ylabel="ms", log=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3, help="build repeats (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--stemmer",
        choices=["english", "none"],
        default=DEFAULT_STEMMER or "none",
        help="both libraries' stemmer (default: the library's)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    stemmer: StemmerName | None = None if args.stemmer == "none" else "english"

    rng = np.random.default_rng(args.seed)
    words = vocabulary(rng)
    qs = queries(words, rng)
    hard = queries(words, rng, frequent=True)
    rows: list[dict] = []
    for n in args.sizes:
        rows += run_size(n, words, qs, hard, args.repeats, args.seed, stemmer)
        print(f"done {n} items", file=sys.stderr)

    ours = {r["items"]: r for r in rows if r["library"] == "pbr_core.lexical"}
    checks = {}
    if 1_000 in ours:
        worst = max(ours[1_000]["query_ms_median"], ours[1_000]["frequent_query_ms_median"])
        checks["query_ms_1k"] = worst <= TARGETS["query_ms_1k"]
    if 100_000 in ours:
        worst = max(ours[100_000]["query_ms_median"], ours[100_000]["frequent_query_ms_median"])
        checks["query_ms_100k"] = worst <= TARGETS["query_ms_100k"]
        checks["build_s_100k"] = ours[100_000]["build_s"] <= TARGETS["build_s_100k"]

    header = f"{'items':>7} {'library':<22} {'build s':>8} {'add 1 s':>9} {'query ms':>9} "
    header += f"{'p90 ms':>7} {'freq. q ms':>10} {'p90 ms':>7} {'postings':>9} {'max rel diff':>12}"
    print(header)
    for r in rows:
        print(
            f"{r['items']:>7} {r['library']:<22} {r['build_s']:>8.3f} {r['add_one_s']:>9.4f} "
            f"{r['query_ms_median']:>9.3f} {r['query_ms_p90']:>7.3f} "
            f"{r['frequent_query_ms_median']:>10.3f} {r['frequent_query_ms_p90']:>7.3f} "
            f"{r['postings']:>9} "
            f"{r['max_rel_diff_vs_bm25s']:>12.1e}"
        )
    for name, ok in checks.items():
        print(f"target {name} <= {TARGETS[name]}: {'met' if ok else 'MISSED'}")
    for r in rows[::2]:
        print(
            f"{r['items']:>7} items: {r['postings_per_query']:.0f} postings read per query, "
            f"{r['postings_per_frequent_query']:.0f} per frequent-word query"
        )

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": describe(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_end": [round(v, 2) for v in os.getloadavg()],
        "vocab_size": VOCAB_SIZE,
        "zipf_s": ZIPF_S,
        "query_terms": QUERY_TERMS,
        "queries": N_QUERIES,
        "repeats": args.repeats,
        "seed": args.seed,
        "stemmer": stemmer,
        "targets": TARGETS,
        "targets_met": checks,
    }
    name = "lexical_speed" + ("" if stemmer is None else f"_{stemmer}")
    (args.out / f"{name}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    plot(rows, args.out / f"{name}.png")
    with (args.out / f"{name}.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
