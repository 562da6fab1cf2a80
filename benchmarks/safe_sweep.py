"""Choose ``"safe"`` fusion's trust ramp on PersonaBench, across LLM sources (issue #9).

The grid also switches the history gate (``safe_history_gate``) on and off, so the CSV shows what
the gate costs on PersonaBench, where it was not needed (its queries rarely match a history item
closely; the gate was added for LoCoMo's, see docs/benchmarks.md, "Safe personalization").

For each LLM source (the authors' gpt-4o-mini generations on all 230 scored questions; the
embedded Gemma 3 270M and SmolLM2-135M on the seeded subset their
``python -m pbr_bench run --limit`` runs generated, or on every question with
``--gemma-limit 0 --smollm2-limit 0``), score plain, the paper's fusion and ``"safe"`` for every
(trust ramp, minimum shift) on a grid. LLM answers come from the generation cache only: a missing
one is an error, never a new generation.

A ramp is *admissible* when, for every source, safe R@5 and N@5 are at least the plain query's,
and at noise 0.0 (the only level the paper reports) with the authors' generations at least the
paper's PBR (.4516 / .3855). Among admissible ramps the one with the largest worst-case R@5 gain
over plain wins (ties: mean gain). The library's defaults are the winner with the history gate on
over all 230 questions of noise 0.0 (docs/benchmarks.md, "How the parameters were chosen"):

    python benchmarks/safe_sweep.py --noise 0.0 --gemma-limit 0 --smollm2-limit 0 \
        --out benchmarks/results/personabench-0.0/safe_sweep__all

Writes ``benchmarks/results/personabench-<noise>/safe_sweep.{csv,json}`` (or ``--out``) and prints
the best ramps.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pbr_bench.cached import cached_bench, local_ids
from pbr_bench.datasets import load_personabench
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_bench.runner import Bench
from pbr_bench.safe import admissible
from pbr_core.config import PBRConfig

LOWS = [0.3, 0.4, 0.5, 0.6]
WIDTHS = [0.1, 0.2, 0.3]
MIN_SHIFTS = [0.0, 0.1, 0.2, 0.3, 0.5]
GATES = [True, False]  # safe_history_gate


def sources(noise: str, limits: dict[str, int | None], seed: int) -> dict[str, Bench]:
    ds = load_personabench(noise)
    benches = {"authors": Bench(ds, llm_name="authors")}
    for name, model_id in local_ids().items():
        bench = cached_bench(ds, name, model_id, limits[name], seed)
        if bench is not None:
            benches[name] = bench
    return benches


def score(bench: Bench, method: str, cfg: PBRConfig) -> dict[str, float]:
    o = bench.run(method, config=cfg, progress=False).metrics["Overall"]
    return {"R@5": o["R@5"], "N@5": o["N@5"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--noise", default="0.0")
    p.add_argument("--gemma-limit", type=int, default=60, help="its bench run's --limit (0: all)")
    p.add_argument("--smollm2-limit", type=int, default=40, help="its bench run's --limit (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="result stem (default: the data set's safe_sweep)")
    args = p.parse_args()
    limits = {"gemma-270m": args.gemma_limit or None, "smollm2-135m": args.smollm2_limit or None}
    benches = sources(args.noise, limits, args.seed)
    base = PBRConfig()
    plain = {n: score(b, "plain", base) for n, b in benches.items()}
    paper = {n: score(b, "pbr", base) for n, b in benches.items()}
    rows: list[dict[str, Any]] = []
    grid = [
        (lo, round(lo + w, 2), m, g)
        for g in GATES
        for lo in LOWS
        for w in WIDTHS
        for m in MIN_SHIFTS
    ]
    for low, high, min_shift, gate in grid:
        cfg = base.with_(
            trust_low=low, trust_high=high, safe_min_shift=min_shift, safe_history_gate=gate
        )
        row: dict[str, Any] = {
            "trust_low": low, "trust_high": high, "min_shift": min_shift, "history_gate": gate
        }  # fmt: skip
        safe = {name: score(bench, "pbr-safe", cfg) for name, bench in benches.items()}
        for name, s in safe.items():
            row[f"{name} R@5"], row[f"{name} N@5"] = round(s["R@5"], 4), round(s["N@5"], 4)
        gains = [s["R@5"] - plain[name]["R@5"] for name, s in safe.items()]
        row["worst_gain"] = round(min(gains), 4)
        row["mean_gain"] = round(sum(gains) / len(gains), 4)
        row["admissible"] = admissible(safe, plain, paper_check=args.noise == "0.0")
        rows.append(row)
    results = RESULTS_DIR / f"personabench-{args.noise}"
    write_rows(rows, args.out or results / "safe_sweep")
    print("plain:", {n: {k: round(v, 4) for k, v in s.items()} for n, s in plain.items()})
    print("paper:", {n: {k: round(v, 4) for k, v in s.items()} for n, s in paper.items()})
    best = sorted(rows, key=lambda r: (r["admissible"], r["worst_gain"], r["mean_gain"]))[-8:]
    for r in reversed(best):
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
