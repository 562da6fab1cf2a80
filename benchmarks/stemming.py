"""Stemming in the lexical leg: BM25 and hybrid search with and without the English stemmer.

What it measures: for every scored question of the hybrid benchmark's data sets (PersonaBench
0.0 and 0.7, LoCoMo turn and session level on both question sets, PrefEval explicit with 10 and
50 fillers), the top 10 of the asking user's items ranked by :func:`pbr_core.hybrid.rank` with
the lexical leg analyzed two ways: ``stemmer=None`` (the words as they are, pbr's analyzer until
now) and ``stemmer="english"`` (the Snowball stemmer through PyStemmer, as bm25s stems). Methods,
each under both analyzers:

    bm25                   rank(mode="lexical"), no windows
    hybrid                 rank(mode="hybrid") with windows (the library's default search)
    hybrid + context       rank(mode="hybrid") with windows and the opt-in neighbour context
                           (``PBRConfig(lexical_context=0.5)``): what a chat memory with both
                           opt-ins gets (reported; not part of the choice rule)
    hybrid + PBR (authors) PersonaBench 0.0 only: q* of the default Personalizer fed the PBR
                           authors' cached gpt-4o-mini generations, the lexical query expanded
                           with that feedback at 0.25 (so the feedback is stemmed too)

Scored by R@5, N@5 (PersonaBench's best-over-combinations rule) and recall_any@5 (any gold item
in the top 5), with per-question wins / losses of stemmed over unstemmed and the two-sided sign
test (:func:`pbr_bench.compare.sign_summary`) per metric.

Protocol, fixed before any number of this script was read (the issue's author had measured
BM25 and hybrid on all 1,536 LoCoMo questions; nothing else had been):

- Tuning split: :func:`pbr_bench.splits.is_tuning_question`, the split of
  ``hybrid_adaptive.py`` and ``window_size.py`` (LoCoMo and PrefEval: the users with
  ``sha1(user_id) % 3 == 0``; PersonaBench: the questions with ``sha1(question_id) % 3 == 0``).
  Everything else is the test split.
- Choice rule, on the tuning split: stemming becomes the default if ``hybrid`` with stemming has
  a mean of R@5 and N@5 over the six data sets (the LoCoMo ``-all`` sets overlap the others and
  are left out of the mean) at least that without, and on no data set loses significantly
  (sign test p < .05, more losses than wins) on R@5 or N@5.
- Then the project's "no worse" check on the test split of every data set: not significantly
  worse (p < .05 on ≥ 200 questions) and not worse on the mean R@5. The choice stands only if it
  holds; the test split is reported either way and nothing is tuned on it.

No LLM is called. Embeddings come from the on-disk cache (``.pbr-cache/``; missing ones are
encoded with all-MiniLM-L6-v2). Deterministic.

Run (from the repository root)::

    python benchmarks/stemming.py

Writes ``benchmarks/results/hybrid/stemming.{csv,json}`` (per data set, split, method and
analyzer: the metrics; per data set, split, method and metric: stemmed vs unstemmed wins,
losses, mean delta, p; per data set, each analyzer's index bytes per user) and prints the
tables and the rule's verdict.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.compare import sign_summary
from pbr_bench.datasets import load_pbr_generations
from pbr_bench.embed import EmbeddingCache
from pbr_bench.histories import DATASETS, Built, build, encoders, item_ids
from pbr_bench.metrics import best_over_combinations, recall_any_at_k
from pbr_bench.paths import REPO_ROOT, RESULTS_DIR
from pbr_bench.report import bar_png, write_csv
from pbr_bench.runner import CachedEmbedder
from pbr_bench.splits import is_tuning_question
from pbr_core import PBRConfig, Personalizer
from pbr_core.hybrid import LEXICAL_CONTEXT, lexical_query, lexical_terms, rank
from pbr_core.lexical import StemmerName
from pbr_core.pipeline import PseudoFeedback

OUT = RESULTS_DIR / "hybrid"

#: The six data sets of the mean, then LoCoMo on the question set published numbers use.
ALL_DATASETS = [*DATASETS, "locomo-turn-all", "locomo-session-all"]
PBR_DATASET = "personabench-0.0"
STEMMERS: dict[str, StemmerName | None] = {"unstemmed": None, "stemmed": "english"}
METHODS = ["bm25", "hybrid", "hybrid + context", "hybrid + PBR (authors)"]
METRICS = ("R@5", "N@5", "recall_any@5")
SPLITS = ("tune", "test", "all")
K = 10
CUT = 5
FEEDBACK_WEIGHT = 0.25  # PBRConfig.lexical_feedback_weight's default


def rankings(built: Built, cache: EmbeddingCache) -> dict[tuple[str, str], dict[str, list[str]]]:
    """(method, analyzer) -> question id -> top-K item ids."""
    out: dict[tuple[str, str], dict[str, list[str]]] = {}
    for label, stemmer in STEMMERS.items():
        bm25, hybrid = out.setdefault(("bm25", label), {}), out.setdefault(("hybrid", label), {})
        context = out.setdefault(("hybrid + context", label), {})
        for q in built.queries:
            hp, hw = built.plain.get(q.user_id), built.windowed.get(q.user_id)
            v, terms = built.qvec[q.id], lexical_query(q.text)
            bm25[q.id] = item_ids(hp, rank(hp, v, terms, K, mode="lexical", stemmer=stemmer))
            hybrid[q.id] = item_ids(hw, rank(hw, v, terms, K, mode="hybrid", stemmer=stemmer))
            with_context = rank(hw, v, terms, K, stemmer=stemmer, context=LEXICAL_CONTEXT)
            context[q.id] = item_ids(hw, with_context)
    if built.ds.name == PBR_DATASET:
        authors = load_pbr_generations()
        personalizer = Personalizer(
            CachedEmbedder(cache),
            None,
            config=PBRConfig(),
            store=built.windowed,
        )
        rows: dict[str, dict[str, list[str]]] = {label: {} for label in STEMMERS}
        for q in built.queries:
            fake, reason = authors[q.id]
            pq = personalizer.personalize(
                q.user_id, q.text, feedback=PseudoFeedback(list(fake), reason)
            )
            hw = built.windowed.get(q.user_id)
            own = lexical_terms(pq.explanation, 0.0)
            expanded = lexical_terms(pq.explanation, FEEDBACK_WEIGHT)
            for label, stemmer in STEMMERS.items():
                ranked = rank(
                    hw, pq.vector, expanded, K, mode="hybrid", own_terms=own, stemmer=stemmer
                )
                rows[label][q.id] = item_ids(hw, ranked)
        for label in STEMMERS:
            out[("hybrid + PBR (authors)", label)] = rows[label]
    return out


def per_question(ranking: list[str], gold: list[list[str]]) -> tuple[float, float, float]:
    r, n = best_over_combinations(ranking, gold, CUT)
    return r, n, recall_any_at_k(ranking, gold, CUT)


def split_of(name: str, built: Built) -> dict[str, str]:
    return {
        q.id: "tune" if is_tuning_question(name, q.user_id, q.id) else "test" for q in built.queries
    }


def score(
    name: str, built: Built, rows: dict[tuple[str, str], dict[str, list[str]]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    splits = split_of(name, built)
    summary: list[dict[str, Any]] = []
    paired: list[dict[str, Any]] = []
    for split in SPLITS:
        qs = [q for q in built.queries if split == "all" or splits[q.id] == split]
        for method in METHODS:
            if (method, "stemmed") not in rows:
                continue
            vals = {
                label: np.array(
                    [per_question(rows[(method, label)][q.id], q.gold) for q in qs]
                ).reshape(-1, len(METRICS))
                for label in STEMMERS
            }
            for label in STEMMERS:
                means = vals[label].mean(axis=0) if qs else [float("nan")] * len(METRICS)
                summary.append(
                    {
                        "dataset": name,
                        "split": split,
                        "method": method,
                        "analyzer": label,
                        "n": len(qs),
                        **{m: float(v) for m, v in zip(METRICS, means)},
                    }
                )
            for j, metric in enumerate(METRICS):
                deltas = vals["stemmed"][:, j] - vals["unstemmed"][:, j]
                wins, losses, mean_delta, p = sign_summary(deltas)
                paired.append(
                    {
                        "dataset": name,
                        "split": split,
                        "method": method,
                        "metric": metric,
                        "n": len(qs),
                        "wins": wins,
                        "losses": losses,
                        "ties": len(qs) - wins - losses,
                        "mean_delta": mean_delta,
                        "p_sign": p,
                    }
                )
    return summary, paired


def verdict(summary: list[dict[str, Any]], paired: list[dict[str, Any]]) -> dict[str, Any]:
    """The protocol's choice rule on the tuning split, then the "no worse" check on the test
    split (see the module docstring)."""

    def cell(split: str, ds: str, label: str, metric: str) -> float:
        row = next(
            r
            for r in summary
            if (r["split"], r["dataset"], r["method"], r["analyzer"])
            == (split, ds, "hybrid", label)
        )
        return float(row[metric])

    means = {
        label: float(np.mean([cell("tune", d, label, m) for d in DATASETS for m in ("R@5", "N@5")]))
        for label in STEMMERS
    }
    tune_losses = [
        (r["dataset"], r["metric"], r["wins"], r["losses"], r["p_sign"])
        for r in paired
        if r["split"] == "tune"
        and r["method"] == "hybrid"
        and r["dataset"] in DATASETS
        and r["metric"] in ("R@5", "N@5")
        and r["p_sign"] < 0.05
        and r["losses"] > r["wins"]
    ]
    chosen = means["stemmed"] >= means["unstemmed"] and not tune_losses
    test_worse = [
        (r["dataset"], r["wins"], r["losses"], r["mean_delta"], r["p_sign"])
        for r in paired
        if r["split"] == "test"
        and r["method"] == "hybrid"
        and r["metric"] == "R@5"
        and (
            r["mean_delta"] < 0
            or (r["n"] >= 200 and r["p_sign"] < 0.05 and r["losses"] > r["wins"])
        )
    ]
    return {
        "tuning mean of hybrid R@5 and N@5 over the six data sets": means,
        "tuning split: significant losses of hybrid (R@5 or N@5)": tune_losses,
        "rule picks stemming": chosen,
        "test split: hybrid R@5 worse on the mean or significantly (n >= 200)": test_worse,
        "stemming becomes the default": chosen and not test_worse,
    }


def print_tables(summary: list[dict[str, Any]], paired: list[dict[str, Any]], split: str) -> None:
    print(f"\n== {split} split: unstemmed -> stemmed, W / L (p) per metric ==")
    print(f"{'data set':22}{'method':25}{'n':>6}  " + "".join(f"{m:>38}" for m in METRICS))
    for r in summary:
        if r["split"] != split or r["analyzer"] != "stemmed":
            continue
        base = next(
            x
            for x in summary
            if (x["split"], x["dataset"], x["method"], x["analyzer"])
            == (split, r["dataset"], r["method"], "unstemmed")
        )
        cells = []
        for m in METRICS:
            p = next(
                x
                for x in paired
                if (x["split"], x["dataset"], x["method"], x["metric"])
                == (split, r["dataset"], r["method"], m)
            )
            cells.append(
                f"{base[m]:.4f} -> {r[m]:.4f} {p['wins']:>3}/{p['losses']:<3} ({p['p_sign']:.2g})"
            )
        print(
            f"{r['dataset'][:21]:22}{r['method'][:24]:25}{r['n']:6d}  "
            + "".join(f"{c:>38}" for c in cells)
        )


def index_memory(name: str, built: Built) -> dict[str, Any]:
    """What each analyzer's BM25 index costs a user of this data set (the windowed histories the
    hybrid rows ranked, both analyzers built by then), in bytes, mean over the users: what the
    ``lexical_stemmer`` opt-in adds to a user's cache footprint (``UserHistory.nbytes``)."""
    users = sorted({q.user_id for q in built.queries})
    histories = [built.windowed.get(u) for u in users]
    return {
        "dataset": name,
        "users": len(users),
        "items per user": float(np.mean([len(h) for h in histories])),
        "unstemmed index bytes per user": float(
            np.mean([h.lexical(None).nbytes for h in histories])
        ),
        "stemmed index bytes per user": float(
            np.mean([h.lexical("english").nbytes for h in histories])
        ),
        "snapshot bytes per user": float(np.mean([h.nbytes() for h in histories])),
    }


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    """R@5 on every question, each method unstemmed and stemmed, per data set."""
    groups: dict[str, dict[str, float]] = {}
    for r in summary:
        if r["split"] == "all" and r["method"] in ("bm25", "hybrid"):
            bar = f"{r['method']}, {r['analyzer']}"
            groups.setdefault(str(r["dataset"]), {})[bar] = r["R@5"]
    bar_png(path, groups, title="stemming: R@5, every question", ylabel="R@5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets",
        default=",".join(ALL_DATASETS),
        help="comma-separated subset (the verdict needs the six of the mean; partial runs "
        "print their tables and write nothing)",
    )
    names = [n for n in parser.parse_args().datasets.split(",") if n]
    OUT.mkdir(parents=True, exist_ok=True)
    counter, cache, window = encoders()
    summary: list[dict[str, Any]] = []
    paired: list[dict[str, Any]] = []
    memory: list[dict[str, Any]] = []
    for name in names:
        t0 = time.perf_counter()
        built = build(name, cache, counter, window)
        s, p = score(name, built, rankings(built, cache))
        summary.extend(s)
        paired.extend(p)
        memory.append(index_memory(name, built))
        print(
            f"{name}: {len(built.queries)} questions, {time.perf_counter() - t0:.1f}s", flush=True
        )
    print("\n== memory: a user's BM25 index per analyzer, against the user's whole snapshot ==")
    for m in memory:
        print(
            f"{m['dataset']:22} {m['users']:5d} users, {m['items per user']:7.1f} items: "
            f"unstemmed {m['unstemmed index bytes per user']:9.0f} B, stemmed "
            f"{m['stemmed index bytes per user']:9.0f} B, snapshot (both built) "
            f"{m['snapshot bytes per user']:10.0f} B"
        )
    for split in SPLITS:
        print_tables(summary, paired, split)
    if set(names) != set(ALL_DATASETS):
        return
    result = verdict(summary, paired)
    print("\n== verdict ==")
    print(json.dumps(result, indent=1))
    write_csv(OUT / "stemming.csv", summary)
    (OUT / "stemming.json").write_text(
        json.dumps(
            {"summary": summary, "paired": paired, "verdict": result, "memory": memory}, indent=1
        )
        + "\n"
    )
    plot(summary, OUT / "stemming.png")
    print(f"\nwrote {(OUT / 'stemming.json').relative_to(REPO_ROOT)}", flush=True)


if __name__ == "__main__":
    main()
