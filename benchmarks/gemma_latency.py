"""Where the embedded Gemma's time goes on one personalized query (issue #25's speed goal).

The two P-PRF prompts that ``Personalizer()`` sends for a few PersonaBench 0.0 questions (the
embedded defaults, pre-gate off so every question asks), generated as the default generator does
(both prompts in one batched ``generate``, seeded sampling, up to 160 new tokens), and taken apart:

- ``prefill_s``: one forward pass over both left-padded prompts (~1,000 Gemma tokens each);
- ``step_ms``: one decoding step for the batch of two (a forward pass of one token per row over the
  KV cache, greedy, no sampling), the median of 20;
- ``generate_s``: the whole ``LocalGemmaGenerator.generate_batch`` call, and the new tokens it
  wrote per prompt.

Per dtype (bf16, the default, and fp32) with torch's two threads. What it shows: ``generate_s`` ≈
``prefill_s`` + new tokens × ``step_ms`` (+ sampling), so at ~1,000 prompt tokens and 160 new
tokens no exact-output change (same tokens, same sampling) reaches 4 s; the floor is set by the
output budget and the prompt length, which change the text and so the quality rows.

    python benchmarks/gemma_latency.py --queries 6
    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/gemma_latency.py --queries 6 \
        --dtypes bfloat16 --budgets 160 96 --out gemma_latency_budget   # output budgets, 1 core

Writes ``benchmarks/results/gemma_latency.{json,csv}``. Run it alone: on 2 cores any other model
process slows torch several-fold.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from pbr_bench.gemma import decode_parts, prompt_pairs
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_core.models import LocalGemmaGenerator

OUT = RESULTS_DIR
FIELDS = ["dtype", "budget", "question", "prompt_tokens", "new_tokens"]
FIELDS += ["prefill_s", "step_ms", "generate_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--queries", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument(
        "--budgets",
        nargs="+",
        type=int,
        default=[160],
        help="max_new_tokens values to time (output_budget.py scores their quality)",
    )
    p.add_argument("--out", default="gemma_latency", help="result files' stem in results/")
    args = p.parse_args()
    pairs = prompt_pairs(args.queries, args.seed)
    rows: list[dict[str, Any]] = []
    for dtype, budget in [(d, b) for d in args.dtypes for b in args.budgets]:
        gen = LocalGemmaGenerator(dtype=dtype, max_new_tokens=budget)
        model, tok = gen._load()
        gen.generate_batch(["warm-up:\n1.", "warm-up, two:\n1."])
        for qid, pair in pairs:
            prompts = list(pair)
            prefill, step = decode_parts(model, tok, prompts)
            t0 = time.perf_counter()
            texts = gen.generate_batch(prompts)
            total = time.perf_counter() - t0
            row = {
                "dtype": dtype,
                "budget": budget,
                "question": qid,
                "prompt_tokens": "/".join(str(len(tok(x)["input_ids"])) for x in prompts),
                "new_tokens": "/".join(str(len(tok(t)["input_ids"])) for t in texts),
                "prefill_s": round(prefill, 2),
                "step_ms": round(step, 1),
                "generate_s": round(total, 2),
            }
            rows.append(row)
            print(row, flush=True)
    medians = {
        f"{dtype}/{budget}": {
            f: round(
                statistics.median(
                    r[f] for r in rows if r["dtype"] == dtype and r["budget"] == budget
                ),
                2,
            )
            for f in ("prefill_s", "step_ms", "generate_s")
        }
        for dtype in args.dtypes
        for budget in args.budgets
    }
    payload = {
        "questions": len(pairs),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "median": medians,
        "runs": rows,
    }
    write_rows(rows, OUT / args.out, fields=FIELDS, payload=payload)
    for dtype, m in medians.items():
        print(
            f"{dtype:14}  prefill {m['prefill_s']:.2f} s  step {m['step_ms']:.1f} ms  "
            f"generate_batch {m['generate_s']:.2f} s (median)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
