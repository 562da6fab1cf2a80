"""How many new tokens the embedded Gemma needs per P-PRF answer ("Pay for the LLM only when it
helps": output budgets that match what helps).

Decoding is most of a personalized query's LLM time (``gemma_latency.py``: 160 steps × 47 ms of
12.3 s in bf16), and the utterance prompt nearly always writes its full 160 tokens. A shorter
budget can be scored *without generating*: sampling is causal and seeded per call (from the
batch's prompts, not the budget), so the same batch with ``max_new_tokens = N`` writes exactly the
first ``N`` tokens of the committed 160-token answer (the stop strings cut both the same way).
Each cached answer is cut to its first ``N`` Gemma tokens and the pipeline is rerun on it, per
question.

Split and rule, fixed before any number of this script was read: the budget is chosen on the
tuning questions of :func:`pbr_bench.splits.is_tuning_question` pooled over every Gemma cell
below, as the smallest budget of :data:`BUDGETS` whose ``safe`` fusion (the default, dense search
as in the committed harness cells) keeps pooled R@5 and N@5 within :data:`TOLERANCE` of the
160-token answers; every cell is then reported on its test questions and on all, with
per-question R@5 wins / losses against 160 tokens and an exact sign test.

    python benchmarks/output_budget.py          # minutes: cached answers only, no model runs

Writes ``benchmarks/results/output_budget.{csv,json,png}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pbr_bench.cached import cached_questions, local_ids
from pbr_bench.compare import sign_summary
from pbr_bench.datasets import load_named
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import write_rows
from pbr_bench.runner import Bench
from pbr_bench.splits import is_tuning_question
from pbr_core import GenerationCache

OUT = RESULTS_DIR
BUDGETS = (32, 48, 64, 96, 128, 160)  # 160: the default max_new_tokens, the committed answers
TOLERANCE = 0.005
#: Every harness cell with the embedded Gemma's answers committed: (data set, questions, seed).
CELLS = (
    ("personabench-0.0", None, 0),
    ("personabench-0.7", None, 0),
    ("locomo-turn", 200, 2),
    ("locomo-turn", 200, 3),
    ("locomo-turn", 200, 4),
    ("locomo-turn", 200, 5),
    ("locomo-session", 200, 1),
    ("prefeval-explicit-n50", 200, 1),
)


class BudgetCache:
    """The committed generation cache with every answer cut to its first ``budget`` tokens."""

    def __init__(self, real: GenerationCache, tokenizer: Any, budget: int) -> None:
        self.real, self.tok, self.budget = real, tokenizer, budget
        self._cut: dict[str, str | None] = {}

    def get(self, model_id: str, prompt: str) -> str | None:
        if prompt not in self._cut:
            text = self.real.get(model_id, prompt)
            if text is not None:
                ids = self.tok(text, add_special_tokens=False)["input_ids"][: self.budget]
                text = self.tok.decode(ids, skip_special_tokens=True)
            self._cut[prompt] = text
        return self._cut[prompt]

    def put(self, model_id: str, prompt: str, text: str) -> None:
        """Nothing is stored: the committed cache is read-only here."""

    async def aput(self, model_id: str, prompt: str, text: str) -> None:
        """As :meth:`put`."""

    def mean_tokens(self) -> float:
        """Mean Gemma tokens per answer served (what a run with this budget would decode)."""
        kept = [
            len(self.tok(t, add_special_tokens=False)["input_ids"]) for t in self._cut.values() if t
        ]
        return float(np.mean(kept)) if kept else 0.0


@dataclass
class Scored:
    dataset: str
    cell: str  # "<data set>" or "<data set> n<questions> seed <seed>"
    ids: list[str]
    tuning: np.ndarray  # bool per question
    metric: dict[int, np.ndarray]  # budget -> (n, 2): R@5, N@5
    tokens: dict[int, float]  # budget -> mean tokens per answer actually kept


def score(bench: Bench, cell: str, real: GenerationCache, tok: Any, model_id: str) -> Scored:
    ds = bench.ds.name
    cfg = bench.config.with_(fusion="safe")
    metric, tokens = {}, {}
    for budget in BUDGETS:
        cache = BudgetCache(real, tok, budget)
        bench.personalizer.cache = cache  # type: ignore[assignment]
        rows = []
        for q in bench.queries:
            pq = bench.personalizer.personalize(q.user_id, q.text, config=cfg)
            rows.append(best_over_combinations(bench._search(q.user_id, pq.vector), q.gold, 5))
        metric[budget] = np.asarray(rows)
        kept = [
            len(tok(t, add_special_tokens=False)["input_ids"]) for t in cache._cut.values() if t
        ]
        tokens[budget] = float(np.mean(kept)) if kept else 0.0
        print(f"{ds} budget {budget}: R@5 {metric[budget][:, 0].mean():.4f}", flush=True)
    bench.personalizer.cache = real
    tuning = np.asarray([is_tuning_question(ds, q.user_id, q.id) for q in bench.queries])
    return Scored(ds, cell, [q.id for q in bench.queries], tuning, metric, tokens)


def choose(cells: list[Scored]) -> int:
    """The smallest budget whose pooled tuning R@5 and N@5 are within TOLERANCE of 160."""

    def pooled(budget: int) -> np.ndarray:
        return np.concatenate([c.metric[budget][c.tuning] for c in cells]).mean(axis=0)

    full = pooled(max(BUDGETS))
    return next(b for b in BUDGETS if np.all(pooled(b) >= full - TOLERANCE))


def report(cells: list[Scored], chosen: int) -> list[dict[str, Any]]:
    rows = []
    for c in cells:
        for split, keep in (("tune", c.tuning), ("test", ~c.tuning), ("all", c.tuning | True)):
            if not keep.any():
                continue
            full = c.metric[max(BUDGETS)][keep]
            for budget in BUDGETS:
                m = c.metric[budget][keep]
                d = m[:, 0] - full[:, 0]
                wins, losses, mean_delta, p = sign_summary(d)
                rows.append(
                    {
                        "dataset": c.dataset,
                        "cell": c.cell,
                        "split": split,
                        "n": int(keep.sum()),
                        "budget": budget,
                        "chosen": budget == chosen,
                        "tokens_per_answer": round(c.tokens[budget], 1),
                        "R@5": round(float(m[:, 0].mean()), 4),
                        "N@5": round(float(m[:, 1].mean()), 4),
                        "dR@5_vs_160": round(mean_delta, 4),
                        "wins": wins,
                        "losses": losses,
                        "sign_p": float(f"{p:.2g}"),
                    }
                )
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for cell in dict.fromkeys(r["cell"] for r in rows):
        pts = [(r["budget"], r["R@5"]) for r in rows if r["cell"] == cell and r["split"] == "all"]
        ax.plot(*zip(*pts), marker="o", label=cell)
    ax.set_xlabel("max new tokens per answer (Gemma 3 270M)")
    ax.set_ylabel("R@5, safe fusion, all questions")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    from transformers import AutoTokenizer

    from pbr_core.models import ensure_gemma_dir

    tok = AutoTokenizer.from_pretrained(str(ensure_gemma_dir()))
    model_id = local_ids()["gemma-270m"]
    cells = []
    for name, limit, seed in CELLS:
        bench, total = cached_questions(load_named(name), "gemma-270m", model_id, limit, seed)
        if bench is None or len(bench.queries) < total:
            raise SystemExit(f"{name}: only part of the questions have cached answers")
        assert bench.generation_cache is not None
        cell = name if limit is None else f"{name} n{limit} seed {seed}"
        cells.append(score(bench, cell, bench.generation_cache, tok, model_id))
    chosen = choose(cells)
    rows = report(cells, chosen)
    payload = {
        "split": "pbr_bench.splits.is_tuning_question, pooled over every cell",
        "rule": f"smallest budget with tuning R@5 and N@5 within {TOLERANCE} of 160 tokens",
        "chosen": chosen,
        "rows": rows,
    }
    write_rows(rows, OUT / "output_budget", payload=payload)
    plot(rows, OUT / "output_budget.png")
    print(json.dumps({"chosen": chosen}))
    for r in rows:
        if r["split"] != "tune" and r["budget"] in (chosen, 160):
            print(r)


if __name__ == "__main__":
    main()
