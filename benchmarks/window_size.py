"""How long should a window be? The dense leg's window length for long items (issue #24), no LLM.

Why: pbr splits an item longer than the embedder reads into windows of the embedder's own length
(all-MiniLM-L6-v2: 256 word pieces) and scores the item by its best window. A LoCoMo session is
~800 word pieces, so it becomes three or four windows, each a mix of several topics; the
published LoCoMo table behind the issue (arXiv 2606.04194) scored a session by its best *turn*.
With the shipped fusion rule LoCoMo session level is at .8396 R@5 on the test split, below the
issue's .85. This script asks whether shorter windows (a cap below the model's length) help the
hybrid ranking, and what they cost elsewhere.

Candidates: the shipped hybrid rule (``pbr_core.hybrid.rank(mode="hybrid")``: min-max dense
from the best window, BM25 / max weighted by √coverage) with windows of at most
``MAX_TOKENS`` word pieces: the model's own (254 of text), 128 and 64. Everything else is the
library's default.

Tuning split and choice rule, fixed before any number of this script was read (the same as
``benchmarks/hybrid_adaptive.py``'s): the questions with ``pbr_bench.splits.is_tuning_question``;
for each data set and each of R@5 and N@5 the best baseline is max(dense, BM25, RRF ensemble) on
that split, a candidate *fails* a cell below it; the chosen candidate has the fewest failed
cells, ties by the mean of R@5 and N@5 over the cells. The test split is printed only with
``--test``, once the choice is made, with per-question wins / losses and a sign test against the
shipped window and the baselines.

    python benchmarks/window_size.py            # tuning split; --test adds the test split

Writes ``benchmarks/results/hybrid/window_size.{txt,json}``. Deterministic: fixed data, cached
MiniLM vectors (``.pbr-cache/``; the first run embeds every window length's windows).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from pbr_bench.compare import SplitScores, cells_below_best, sign_summary
from pbr_bench.ensemble import rrf
from pbr_bench.histories import DATASETS, build, encoders, item_ids
from pbr_bench.metrics import best_over_combinations
from pbr_bench.paths import RESULTS_DIR
from pbr_bench.report import bar_png
from pbr_bench.splits import is_tuning_question
from pbr_core.hybrid import lexical_query, rank
from pbr_core.windows import Window

OUT = RESULTS_DIR / "hybrid"
CUT = 5
#: Window caps tried, in word pieces of text (None: the model's own length).
MAX_TOKENS: tuple[int | None, ...] = (None, 128, 64)
BASELINES = ("dense", "bm25", "rrf")


def label(cap: int | None, model: int) -> str:
    return f"hybrid, windows {model} (shipped)" if cap is None else f"hybrid, windows {cap}"


def collect() -> tuple[SplitScores, dict[str, Any]]:
    counter, cache, model_window = encoders()
    scores: SplitScores = {}
    costs: dict[str, Any] = {}

    def put(method: str, ds: str, split: str, top: list[str], gold: Any) -> None:
        per = scores.setdefault(method, {}).setdefault(ds, {}).setdefault(split, [])
        per.append(best_over_combinations(top, gold, CUT))

    for name in DATASETS:
        for cap in MAX_TOKENS:
            window = (
                model_window
                if cap is None
                else Window(max_tokens=min(cap, model_window.max_tokens), count=model_window.count)
            )
            t0 = time.perf_counter()
            built = build(name, cache, counter, window)
            method = label(cap, model_window.max_tokens)
            costs.setdefault(name, {})[method] = dict(
                long_items=built.stats.long_items,
                windows=built.stats.windows,
                items=built.stats.items,
                build_s=round(time.perf_counter() - t0, 1),
            )
            for q in built.queries:
                split = "tune" if is_tuning_question(name, q.user_id, q.id) else "test"
                hw, hp = built.windowed.get(q.user_id), built.plain.get(q.user_id)
                v, terms = built.qvec[q.id], lexical_query(q.text)
                put(method, name, split, item_ids(hw, rank(hw, v, terms, CUT)), q.gold)
                if cap is None:  # the baselines do not depend on the window
                    dense = item_ids(hp, rank(hp, v, terms, len(hp), mode="dense"))
                    lex = item_ids(hp, rank(hp, v, terms, len(hp), mode="lexical"))
                    put("dense", name, split, dense[:CUT], q.gold)
                    put("bm25", name, split, lex[:CUT], q.gold)
                    put("rrf", name, split, rrf([dense, lex], [0.5, 0.5])[:CUT], q.gold)
                put(
                    f"dense, windows {cap or model_window.max_tokens}",
                    name,
                    split,
                    item_ids(hw, rank(hw, v, terms, CUT, mode="dense")),
                    q.gold,
                )
            print(name, method, costs[name][method], flush=True)
    return scores, costs


def table(scores: SplitScores, split: str) -> tuple[str, list[dict[str, Any]]]:
    lines = [f"== {split} split: R@5 / N@5 (fails: cells below max(dense, bm25, rrf)) =="]
    lines.append("method".ljust(30) + "".join(d[:16].rjust(18) for d in DATASETS) + "  fails  mean")
    records = []
    for c in cells_below_best(scores, split, DATASETS, BASELINES):
        cells = "".join(f"{r5:.4f}/{n5:.4f}".rjust(18) for r5, n5 in c.cells)
        lines.append(c.method[:30].ljust(30) + cells + f"{c.fails:7d}{c.mean:8.4f}")
        records.append(dict(method=c.method, split=split, fails=c.fails, mean=c.mean))
    lines.append(
        "questions: " + ", ".join(f"{d} {len(scores['dense'][d][split])}" for d in DATASETS)
    )
    return "\n".join(lines), records


def paired(scores: SplitScores, method: str, others: list[str], split: str) -> str:
    lines = [f"== {method}, {split} split: per-question R@5 W / L, mean ΔR@5, sign test p =="]
    for d in DATASETS:
        a = [x[0] for x in scores[method][d][split]]
        for other in others:
            b = [x[0] for x in scores[other][d][split]]
            w, loss, mean, p = sign_summary([x - y for x, y in zip(a, b)])
            lines.append(f"{d:24s} vs {other:30s} {w:4d} / {loss:4d}  {mean:+.4f}  p {p:.3g}")
    return "\n".join(lines)


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Each window size's mean of R@5 and N@5 over the data sets, per split."""
    groups: dict[str, dict[str, float]] = {}
    for r in records:
        groups.setdefault(str(r["split"]), {})[str(r["method"])] = r["mean"]
    bar_png(path, groups, title="window_size: mean R@5 / N@5 over the data sets", ylabel="mean")


def main() -> None:
    scores, costs = collect()
    text, records = table(scores, "tune")
    candidates = [r for r in records if r["method"].startswith("hybrid")]
    chosen = min(candidates, key=lambda r: (r["fails"], -r["mean"]))["method"]
    parts = [text, f"chosen on the tuning split: {chosen}"]
    if "--test" in sys.argv:
        test_text, test_records = table(scores, "test")
        shipped = next(m for m in scores if m.endswith("(shipped)"))
        hybrids = [m for m in scores if m.startswith("hybrid") and m != shipped]
        parts.append(test_text)
        for m in hybrids:
            parts.append(paired(scores, m, [shipped, *BASELINES], "test"))
        records += test_records
    parts.append("window cost per data set: " + json.dumps(costs, indent=1))
    report = "\n\n".join(parts)
    print(report)
    OUT.mkdir(parents=True, exist_ok=True)
    plot(records, OUT / "window_size.png")
    (OUT / "window_size.txt").write_text(report + "\n")
    (OUT / "window_size.json").write_text(
        json.dumps(dict(records=records, chosen=chosen, costs=costs), indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
