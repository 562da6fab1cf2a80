"""Per-stage latency of one PBR query with real models and no generation cache (issue #5).

The embedded defaults exactly as ``Personalizer()`` builds them (MiniLM; Gemma 3 270M in bf16,
both P-PRF prompts in one batched call) answer a few PersonaBench questions; the explanation's
``timings_ms`` gives each stage: query embedding, related-history search, anchor (cached per
user after its first build, so the first query of each user is reported separately), the LLM,
parsing, embedding the feedback, fusion and the final search.

    python benchmarks/stage_latency.py --queries 3

Writes ``benchmarks/results/stage_latency.json`` / ``.csv``. Run it alone: on 2 cores any other
model process slows torch several-fold.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from typing import Any

from pbr_bench.datasets import load_personabench
from pbr_bench.machine import describe
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_core import Personalizer
from pbr_core.protocols import model_id_of

STAGES = (
    "embed_query",
    "related_history",
    "anchor",
    "llm",
    "parse",
    "embed_feedback",
    "fusion",
    "search",
    "total",
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--queries", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    ds = load_personabench("0.0")
    questions = random.Random(args.seed).sample(ds.scored_queries, args.queries)
    pbr = Personalizer()  # the embedded defaults, no generation cache
    for user in sorted({q.user_id for q in questions}):
        pbr.add_texts(user, ds.corpora[user].texts, ids=ds.corpora[user].ids)
    pbr.search(questions[0].user_id, "warm-up: load both models", k=5)
    runs: list[dict[str, Any]] = []
    for q in questions:
        result = pbr.search(q.user_id, q.text, k=5)
        t = result.personalized.explanation.timings_ms
        runs.append({"question": q.id, **{s: round(t.get(s, 0.0), 1) for s in STAGES}})
        print(runs[-1], flush=True)
    median = {s: round(statistics.median(r[s] for r in runs), 1) for s in STAGES}
    out = RESULTS_DIR
    payload = {
        "questions": len(runs),
        "models": {"embedder": model_id_of(pbr.embedder), "llm": model_id_of(pbr.generator)},
        "load_average": os.getloadavg(),
        "machine": describe(),
        "median_ms": median,
        "runs": runs,
    }
    write_rows(runs, out / "stage_latency", fields=["question", *STAGES], payload=payload)
    print("median ms per stage:", median)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
