"""Would prompt-lookup decoding make the embedded Gemma faster? (issue #41, second lead)

Prompt-lookup decoding (transformers' ``prompt_lookup_num_tokens``) proposes the tokens that
followed the last n-gram's earlier occurrence in the prompt, and checks all of them in one
forward pass: a decoding step of Gemma 3 270M on 2 cores is memory-bound (it reads every weight
once, whatever the number of tokens), so each accepted proposal saves most of a step. With
sampling, transformers accepts a proposed token only where the seeded draw equals it, so the
distribution of the text is unchanged (the draws, and so the text, are other ones).

transformers (5.x) proposes nothing under this project's sampling settings: before proposing, it
runs the logits processors on constant logits and drops a candidate they forbid, and the top-k
warper on constant logits keeps ids 0-63 only, so every real candidate is "forbidden". The
``check off`` variant clears that check (the accept rule still samples each position from the
model's own processed distribution, so the text's distribution is unchanged).

It only works on a batch of one, so the default generator's batch of two prompts becomes two
calls. This script runs, for the P-PRF prompt pairs of a few PersonaBench 0.0 questions (the
embedded defaults' own prompts), the default generator's batched ``generate`` and each prompt
alone with and without prompt lookup, the same sampling settings and budget, and reports:

- ``forwards``: the model's forward passes (prefill included), counted by a hook; this count
  does not depend on the machine's load, unlike the seconds;
- ``new_tokens``: tokens written, and ``tokens_per_forward`` over the decoding passes;
- ``seconds``: wall time of the call (two cores; quote ratios from one run only).

    python benchmarks/prompt_lookup.py --queries 6

Writes ``benchmarks/results/prompt_lookup.{json,csv,png}``. It changes nothing in the library.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Any

import torch

from pbr_bench.gemma import prompt_pairs
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_core.models import LocalGemmaGenerator

FIELDS = [
    "method",
    "question",
    "forwards",
    "prefills",
    "new_tokens",
    "tokens_per_forward",
    "seconds",
]


class ForwardCounter:
    """Counts a module's forward calls (a hook, so generate's own code is untouched)."""

    def __init__(self, model: Any) -> None:
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1


class CheckOff:
    """Within the block, prompt lookup proposes candidates without transformers' check of them
    against the logits processors run on constant logits (see the module docstring)."""

    def __enter__(self) -> None:
        from transformers.generation import candidate_generator as cg

        self.cls = cg.PromptLookupCandidateGenerator
        self.init = self.cls.__init__

        def init(inner: Any, *args: Any, **kwargs: Any) -> None:
            self.init(inner, *args, **kwargs)
            inner.logits_processor = None

        self.cls.__init__ = init  # type: ignore[method-assign,assignment]

    def __exit__(self, *_: object) -> None:
        self.cls.__init__ = self.init  # type: ignore[method-assign]


def run(
    gen: LocalGemmaGenerator, model: Any, tok: Any, prompts: list[str], lookup: int | None
) -> tuple[int, float]:
    """New tokens (summed over the prompts) and seconds of one seeded ``generate`` call."""
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    t0 = time.perf_counter()
    out, prompt_len = gen._sample(model, tok, prompts, **extra)
    seconds = time.perf_counter() - t0
    new = out[:, prompt_len:]
    return int((new != tok.pad_token_id).sum()), seconds


def plot(summary: list[dict[str, Any]], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [s["method"] for s in summary]
    ax.barh(names, [s["tokens_per_forward"] for s in summary])
    ax.set_xlabel("new tokens per decoding forward pass (higher: fewer passes)")
    ax.set_title("Gemma 3 270M, P-PRF prompts: prompt-lookup decoding")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--queries", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", default=[], help="methods to leave out, by name")
    p.add_argument("--lookups", type=int, nargs="+", default=[10])
    args = p.parse_args()
    pairs = prompt_pairs(args.queries, args.seed)
    gen = LocalGemmaGenerator()
    model, tok = gen._load()
    counter = ForwardCounter(model)
    methods: list[tuple[str, int | None, bool]] = [("batch of 2 (default)", None, True)]
    methods.append(("one prompt at a time", None, False))
    methods += [(f"one at a time, lookup {n}", n, False) for n in args.lookups]
    methods += [(f"one at a time, lookup {n}, check off", n, False) for n in args.lookups]
    methods = [m for m in methods if m[0] not in args.skip]
    rows: list[dict[str, Any]] = []
    for qid, pair in pairs:
        for name, lookup, batched in methods:
            counter.calls = 0
            groups = [list(pair)] if batched else [[p] for p in pair]
            tokens, seconds = 0, 0.0
            for prompts in groups:
                with CheckOff() if name.endswith("check off") else contextlib.nullcontext():
                    t, s = run(gen, model, tok, prompts, lookup)
                tokens, seconds = tokens + t, seconds + s
            decoding = counter.calls - len(groups)  # one prefill pass per call
            rows.append(
                {
                    "method": name,
                    "question": qid,
                    "forwards": counter.calls,
                    "prefills": len(groups),
                    "new_tokens": tokens,
                    "tokens_per_forward": round(tokens / max(decoding, 1), 3),
                    "seconds": round(seconds, 2),
                }
            )
            print(rows[-1], flush=True)
    summary: list[dict[str, Any]] = []
    for name, _, _ in methods:
        mine = [r for r in rows if r["method"] == name]
        summary.append(
            {
                "method": name,
                "forwards": statistics.median(r["forwards"] for r in mine),
                "new_tokens": statistics.median(r["new_tokens"] for r in mine),
                "tokens_per_forward": round(
                    sum(r["new_tokens"] for r in mine)
                    / max(
                        1, sum(r["forwards"] for r in mine) - len(mine) * (2 - ("batch" in name))
                    ),
                    3,
                ),
                "seconds": statistics.median(r["seconds"] for r in mine),
            }
        )
    payload = {
        "questions": len(pairs),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "summary": summary,
        "rows": rows,
    }
    write_rows(rows, RESULTS_DIR / "prompt_lookup", payload=payload, fields=FIELDS)
    plot(summary, RESULTS_DIR / "prompt_lookup.png")
    print(f"{'method':28} {'forwards':>9} {'tokens':>7} {'tok/fwd':>8} {'seconds':>8}")
    for row in summary:
        print(
            f"{row['method']:28} {row['forwards']:>9} {row['new_tokens']:>7} "
            f"{row['tokens_per_forward']:>8} {row['seconds']:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
