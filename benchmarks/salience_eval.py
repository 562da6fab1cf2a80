"""Bayes-factor salience measured in the harness (issue #7): re-ranking, the gate, the oracle.

On a seeded subset of one data set's questions, with the default scorer (Gemma 3 270M, fp32):

1. **Re-ranking**: the top-N candidates of a dense search, from the plain query and from PBR
   (the Gemma P-PRF generations in ``benchmarks/cache``; run
   ``python -m pbr_bench run --llm local`` with the same ``--limit``/``--seed`` first, or pass
   ``--no-pbr``), re-ordered by salience alone, by RRF
   with the dense rank and by the z-score sum. R@1/R@5/N@5 on exactly the same candidates.
2. **The gate** (``max_c mean Sal_q > τ``): open rate on questions whose memory holds the answer
   (the asking user's own candidates) against the same questions put to *another* user's memory
   (LoCoMo: the next conversation; PrefEval: the next user), and LoCoMo's adversarial category 5
   on its own conversation, across τ: recall, false-open rate and precision.
3. **Agreement with the oracle** ``Sal_a = log p(a | q, c) − log p(a | q)`` (where the data set has
   reference answers): Spearman ρ between ``Sal_q`` and ``Sal_a`` over each question's candidates.

Run one model process at a time (2 cores):

    python benchmarks/salience_eval.py --dataset locomo --limit 40
    python benchmarks/salience_eval.py --dataset prefeval --limit 40 --no-pbr

Writes ``benchmarks/results/salience_<dataset>.json`` / ``.csv`` and a PNG of the gate curve.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr
from tqdm import tqdm

from pbr_bench.datasets import (
    Dataset,
    _read_json,
    load_locomo,
    load_prefeval,
    resolve_data_dir,
)
from pbr_bench.metrics import evaluate
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_bench.runner import Bench
from pbr_core.salience import default_scorer, oracle_salience, rerank, salience

OUT = RESULTS_DIR
TAUS = [round(0.1 * i, 1) for i in range(31)]  # 0 … 3 nats per query token


def load(args: argparse.Namespace) -> Dataset:
    if args.dataset == "locomo":
        return load_locomo("turn")
    return load_prefeval(args.n_filler)


def adversarial(users: list[str], limit: int, seed: int) -> list[tuple[str, str]]:
    """LoCoMo category-5 questions of ``users``' conversations as (conversation, question)."""
    samples = _read_json(resolve_data_dir(None) / "locomo" / "locomo10.json")
    pairs = [
        (s["sample_id"], qa["question"])
        for s in samples
        if s["sample_id"] in users
        for qa in s["qa"]
        if qa.get("category") == 5
    ]
    return random.Random(seed).sample(pairs, min(limit, len(pairs)))


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dataset", choices=["locomo", "prefeval"], default="locomo")
    p.add_argument("--n-filler", type=int, default=10, help="PrefEval filler messages")
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=10, help="candidates per question")
    p.add_argument("--no-pbr", action="store_true", help="plain candidates only")
    args = p.parse_args()

    ds = load(args)
    generator = None
    if not args.no_pbr:
        from pbr_bench.llms import harness_generator

        generator = harness_generator("local")  # as `python -m pbr_bench run --llm local`
    bench = Bench(
        ds, generator=generator, llm_name="gemma-270m", limit=args.limit, seed=args.seed, k=args.n
    )
    scorer = default_scorer()
    pers = bench.personalizer
    users = sorted({q.user_id for q in bench.queries})  # the users whose corpora were loaded

    def candidates(user: str, vector: np.ndarray) -> tuple[list[str], list[str], np.ndarray]:
        history = pers.store.get(user)
        hits = history.search(vector, args.n)
        ids = [history.items[i].id for i, _ in hits]
        texts = [history.items[i].text for i, _ in hits]
        return ids, texts, np.array([s for _, s in hits])

    sources = ["plain"] + ([] if args.no_pbr else ["pbr"])
    rankings: dict[str, dict[str, list[str]]] = {}
    gate_rows: list[dict[str, Any]] = []
    rho: list[float] = []
    seconds: list[float] = []
    for q in tqdm(bench.queries, desc=f"{ds.name}: salience", unit="q"):
        plain_vec = np.asarray(bench.embedder.embed_query(q.text))
        vectors = {"plain": plain_vec}
        if "pbr" in sources:
            vectors["pbr"] = pers.personalize(q.user_id, q.text).vector
        own_max = None
        for source, vec in vectors.items():
            ids, texts, dense = candidates(q.user_id, vec)
            t0 = time.perf_counter()
            sal = salience(scorer, q.text, texts)
            seconds.append(time.perf_counter() - t0)
            rankings.setdefault(source, {})[q.id] = ids
            for method in ("salience", "rrf", "zsum"):
                r = rerank(ids, sal, method, dense_scores=dense)
                rankings.setdefault(f"{source}+{method}", {})[q.id] = r.items
            if source == "plain":
                own_max = float(sal.mean.max())
                if q.answer:
                    orc = oracle_salience(scorer, q.text, q.answer, texts)
                    value = spearmanr(sal.sum, orc.sum).statistic
                    if np.isfinite(value):
                        rho.append(float(value))
        other = users[(users.index(q.user_id) + 1) % len(users)]
        if other != q.user_id:
            _, other_texts, _ = candidates(other, plain_vec)
            other_max = float(salience(scorer, q.text, other_texts).mean.max())
            gate_rows.append({"id": q.id, "own": own_max, "other_user": other_max})

    adv: list[float] = []
    if args.dataset == "locomo":
        for conv, text in tqdm(adversarial(users, args.limit, args.seed), desc="cat 5", unit="q"):
            _, texts, _ = candidates(conv, np.asarray(bench.embedder.embed_query(text)))
            adv.append(float(salience(scorer, text, texts).mean.max()))

    gold = {q.id: q.gold for q in bench.queries}
    cats = {q.id: q.category for q in bench.queries}
    table = []
    for name, ranks in rankings.items():
        m = evaluate(ranks, gold, ks=(1, 5), categories=cats)["Overall"]
        table.append({"candidates": name, **{k: round(m[k], 4) for k in ("R@1", "R@5", "N@5")}})
    own = np.array([r["own"] for r in gate_rows])
    neg = np.array([r["other_user"] for r in gate_rows])
    curve = []
    for tau in TAUS:
        tp, fp = int((own > tau).sum()), int((neg > tau).sum())
        curve.append(
            {
                "tau": tau,
                "open_own": round(tp / len(own), 3),
                "open_other_user": round(fp / len(neg), 3),
                "precision": round(tp / (tp + fp), 3) if tp + fp else None,
                "open_adversarial": round(float((np.array(adv) > tau).mean()), 3) if adv else None,
            }
        )

    def auc(pos: np.ndarray, neg: np.ndarray) -> float | None:
        """P(a question with memory scores above one without); 0.5 is chance."""
        if not len(pos) or not len(neg):
            return None
        return round(
            float(
                (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
            ),
            3,
        )

    result: dict[str, Any] = {
        "dataset": ds.name,
        "questions": len(bench.queries),
        "candidates_per_question": args.n,
        "seed": args.seed,
        "scorer": scorer.model_id,
        "rerank": table,
        "gate": curve,
        "gate_auc": {
            "own_vs_other_user": auc(own, neg),
            "own_vs_adversarial": auc(own, np.array(adv)),
        },
        "oracle_spearman": {
            "questions": len(rho),
            "median": round(float(np.median(rho)), 3) if rho else None,
            "mean": round(float(np.mean(rho)), 3) if rho else None,
            "share_positive": round(float(np.mean(np.array(rho) > 0)), 3) if rho else None,
        },
        "seconds_per_salience_call": round(float(np.median(seconds)), 2),
        "gate_scores": gate_rows,
        "adversarial_scores": adv,
    }
    stem = OUT / f"salience_{ds.name}"
    write_rows(table, stem, payload=result)
    _plot(curve, ds.name, stem.with_suffix(".png"))
    print(f"\n{ds.name}: {len(bench.queries)} questions, top-{args.n} candidates")
    for row in table:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    print("gate:")
    for point in curve:
        print("  ".join(f"{k}={v}" for k, v in point.items()))
    print("gate AUC:", result["gate_auc"])
    print("oracle agreement:", result["oracle_spearman"])
    return 0


def _plot(curve: list[dict[str, Any]], name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    taus = [r["tau"] for r in curve]
    ax.plot(taus, [r["open_own"] for r in curve], label="own memory (needs it)")
    ax.plot(taus, [r["open_other_user"] for r in curve], label="another user's memory")
    if curve[0]["open_adversarial"] is not None:
        ax.plot(taus, [r["open_adversarial"] for r in curve], label="adversarial (cat. 5)")
    ax.set_xlabel("τ (mean log Bayes factor per query token)")
    ax.set_ylabel("gate open rate")
    ax.set_title(f"{name}: salience gate")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
