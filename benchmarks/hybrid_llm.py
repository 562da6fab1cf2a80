"""Hybrid + PBR with each small local LLM, on every data set with cached generations (issue #24).

The issue's goal with LLM feedback: with each small local LLM, no data set significantly below
the no-LLM hybrid (paired sign test, p < .05, on >= 200 questions) and the mean over data sets
>= it. This script scores the library's default pipeline (``PBRConfig()``: safe fusion, the
pre-generation gate, the lexical feedback weight, hybrid search with windows) against the no-LLM
hybrid, plain dense and BM25, for the embedded Gemma 3 270M and SmolLM2-135M, whose answers come
only from the committed generation caches (``benchmarks/cache/``): no model runs. A question is
scored for an LLM when every prompt of the *ungated* pipeline is cached (so that the gate's
skips and the always-call pipeline are scored on the same questions); the others are counted.

Nothing is tuned here: every row is a default of the library.

    python benchmarks/hybrid_llm.py    # a few minutes; writes results/hybrid/llm.{csv,json}
    python benchmarks/hybrid_llm.py --generate smollm2 --datasets locomo-session \
        --questions 200 --seed 1       # first generate what 200 seeded questions lack (hours)

``--generate`` is the only way this script runs a model: it writes the answers (as written,
parsable or not) of the ungated pipeline's prompts for a seeded sample of questions into the
committed cache, then scores as always.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.cached import (
    answered_by_each_llm,
    cache_only_personalizer,
    local_ids,
    ungated_prompts,
)
from pbr_bench.compare import sign_summary
from pbr_bench.histories import DATASETS, build, encoders, item_ids
from pbr_bench.llms import harness_generator
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import bar_png
from pbr_bench.runner import generate_missing, generation_cache_of
from pbr_core import PBRConfig
from pbr_core.hybrid import lexical_query, lexical_terms, rank

K, CUT = 10, 5
MIN_QUESTIONS = 200  # the threshold for a data set to count in the verdict
OUT = RESULTS_DIR / "hybrid"
BASELINE = "hybrid (no LLM)"
DIAGNOSTICS: dict[str, PBRConfig] = {}  # label -> config, filled in main()
#: The default pipeline's feedback applied to one leg only (the other leg keeps the user's query):
#: which leg a gain or a loss comes from.
ONE_LEG = ("hybrid + PBR, dense feedback only", "hybrid + PBR, lexical feedback only")


def paired(d: np.ndarray, prefix: str, p_prefix: str) -> dict[str, Any]:
    """Per-question R@5 differences as wins / losses / mean and the two-sided sign test."""
    wins, losses, mean, p = sign_summary(d)
    return {
        f"{prefix}wins": wins,
        f"{prefix}losses": losses,
        f"{prefix}mean_delta": mean,
        f"{p_prefix}p_sign": p,
    }


def generate(llm: str, names: list[str], questions: int, seed: int) -> None:
    """Write the missing ungated answers of ``llm`` for ``questions`` seeded questions of each
    data set (the same sample for every LLM) into its generation cache."""
    counter, emb_cache, window = encoders()
    generator = harness_generator(llm)
    model_id = generator.model_id
    cache = generation_cache_of(model_id)
    for name in names:
        built = build(name, emb_cache, counter, window)
        personalizer = cache_only_personalizer(built, emb_cache, model_id, cache)
        chosen = random.Random(seed).sample(built.queries, min(questions, len(built.queries)))
        prompts = [p for q in chosen for p in ungated_prompts(personalizer, q.user_id, q.text)]
        done = generate_missing(prompts, generator.generate_batch, model_id, cache, desc=name)
        print(f"{name} {llm}: {done} of {len(prompts)} prompts generated", flush=True)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """R@5 per data set: the no-LLM legs and hybrid + PBR with each small LLM."""
    groups: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["method"] in ("dense", "bm25", "hybrid (no LLM)"):
            bar = str(r["method"])
        elif r["method"] == "hybrid + PBR":
            bar = f"hybrid + PBR, {r['llm']}"
        else:
            continue
        groups.setdefault(str(r["dataset"]), {})[bar] = r["R@5"]
    bar_png(path, groups, title="hybrid_llm: R@5", ylabel="R@5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", choices=["local", "smollm2"], help="generate first")
    parser.add_argument("--datasets", nargs="+", default=DATASETS, choices=DATASETS)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.generate:
        generate(args.generate, args.datasets, args.questions, args.seed)
    score()


def score() -> None:
    counter, emb_cache, window = encoders()
    config = PBRConfig()
    ungated = config.with_(pre_gate=None)
    DIAGNOSTICS.update(
        {
            "hybrid + PBR, no pre-gate": ungated,
            "hybrid + PBR, no gates": ungated.with_(safe_history_gate=False),
            "hybrid + PBR, no anchor, no gates": ungated.with_(fusion="no_anchor"),
        }
    )
    rows_out: list[dict[str, Any]] = []
    for name in DATASETS:
        built = build(name, emb_cache, counter, window)
        for llm, personalizer, answered in answered_by_each_llm(built, emb_cache):
            scored: dict[str, list[tuple[float, float]]] = {}
            calls = 0
            for q in answered:
                hw, hp = built.windowed.get(q.user_id), built.plain.get(q.user_id)
                v, terms = built.qvec[q.id], lexical_query(q.text)
                pq = personalizer.personalize(q.user_id, q.text)
                calls += pq.explanation.llm_calls + pq.explanation.llm_cached
                gated = lexical_terms(pq.explanation, config.lexical_feedback_weight)
                lists = {
                    "dense": item_ids(hp, rank(hp, v, terms, K, mode="dense")),
                    "bm25": item_ids(hp, rank(hp, v, terms, K, mode="lexical")),
                    BASELINE: item_ids(hw, rank(hw, v, terms, K)),
                    "hybrid + PBR": item_ids(hw, rank(hw, pq.vector, gated, K, own_terms=terms)),
                    ONE_LEG[0]: item_ids(hw, rank(hw, pq.vector, terms, K, own_terms=terms)),
                    ONE_LEG[1]: item_ids(hw, rank(hw, v, gated, K, own_terms=terms)),
                }
                # diagnostics: what the gates throw away, and the anchor's share
                for label, variant in DIAGNOSTICS.items():
                    dq = personalizer.personalize(q.user_id, q.text, config=variant)
                    expanded = lexical_terms(dq.explanation, variant.lexical_feedback_weight)
                    lists[label] = item_ids(hw, rank(hw, dq.vector, expanded, K, own_terms=terms))
                for method, top in lists.items():
                    scored.setdefault(method, []).append(best_over_combinations(top, q.gold, CUT))
            n = len(scored.get(BASELINE, []))
            print(f"{name} {llm}: {n} of {len(built.queries)} questions cached", flush=True)
            if n == 0:
                continue
            ours = np.array(scored["hybrid + PBR"])
            base_arr = np.array(scored[BASELINE])
            for method, vals in scored.items():
                arr = np.array(vals)
                row: dict[str, Any] = {
                    "dataset": name,
                    "llm": llm,
                    "method": method,
                    "n": n,
                    "R@5": float(arr[:, 0].mean()),
                    "N@5": float(arr[:, 1].mean()),
                    "llm_calls_per_q": calls / n if method == "hybrid + PBR" else 0.0,
                }
                if method in DIAGNOSTICS or method in ONE_LEG:  # against the no-LLM hybrid
                    row.update(paired(arr[:, 0] - base_arr[:, 0], "vs_hybrid_", "vs_hybrid_"))
                elif method != "hybrid + PBR":  # the default pipeline against this method
                    row.update(paired(ours[:, 0] - arr[:, 0], "pbr_", ""))
                rows_out.append(row)
    verdict = []
    for llm in local_ids():
        mine = [r for r in rows_out if r["llm"] == llm and r["method"] == BASELINE]
        big = [r for r in mine if r["n"] >= MIN_QUESTIONS]
        worse = [r["dataset"] for r in big if r["pbr_mean_delta"] < 0 and r["p_sign"] < 0.05]
        mean_delta = float(np.mean([r["pbr_mean_delta"] for r in big])) if big else float("nan")
        verdict.append(
            dict(
                llm=llm,
                datasets_with_200=[r["dataset"] for r in big],
                significantly_worse=worse,
                mean_delta_over_datasets=mean_delta,
            )
        )
    OUT.mkdir(parents=True, exist_ok=True)
    order = ["dataset", "llm", "method", "n", "R@5", "N@5", "llm_calls_per_q"]
    fields = order + sorted({k for r in rows_out for k in r} - set(order))
    with (OUT / "llm.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows_out)
    (OUT / "llm.json").write_text(json.dumps({"rows": rows_out, "verdict": verdict}, indent=1))
    plot(rows_out, OUT / "llm.png")
    for r in rows_out:
        if "pbr_wins" in r:
            extra = (
                f"  PBR {r['pbr_wins']}/{r['pbr_losses']} {r['pbr_mean_delta']:+.4f} "
                f"p {r['p_sign']:.2g}"
            )
        elif "vs_hybrid_wins" in r:
            extra = (
                f"  vs hybrid {r['vs_hybrid_wins']}/{r['vs_hybrid_losses']} "
                f"{r['vs_hybrid_mean_delta']:+.4f} p {r['vs_hybrid_p_sign']:.2g}"
            )
        else:
            extra = f"  calls/q {r['llm_calls_per_q']:.2f}"
        print(
            f"{r['dataset']:22s} {r['llm']:13s} {r['method']:16s} n {r['n']:4d} "
            f"R@5 {r['R@5']:.4f} N@5 {r['N@5']:.4f}{extra}"
        )
    for judged in verdict:
        print(judged)


if __name__ == "__main__":
    main()
