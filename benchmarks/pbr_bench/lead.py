"""A lead tested against the shipped hybrid rule under the one-parameter-set protocol (#42):
the fixed baselines of every question, the admissibility test, the choice on the tuning split
and its one reading on the test split. Shared by ``benchmarks/lexical_prf.py``,
``benchmarks/lexical_fields.py``, ``benchmarks/lexical_windows.py``,
``benchmarks/window_pooling.py``, ``benchmarks/long_items.py``, ``benchmarks/dense_prf.py``,
``benchmarks/lexical_bigrams.py``, ``benchmarks/lexical_pairs_weight.py``,
``benchmarks/lexical_peak.py`` and ``benchmarks/lexical_flat.py``, which differ only in the
candidates they rank.

Protocol, ``benchmarks/hybrid_tuning.py``'s: the tuning split is
:func:`pbr_bench.splits.is_tuning_question`. A candidate is admissible when, on the tuning split,
on no data set of :data:`~pbr_bench.one_set.RULE_SETS` and on neither R@5 nor N@5 it is
significantly below (two-sided sign test p < .05, more losses than wins) the shipped rule,
dense, BM25 or RRF, and it has no more (data set, metric) cells below the best of dense, BM25
and RRF on the mean than the shipped rule has (:func:`pbr_bench.one_set.judge`). Among the
admissible, the choice is the highest mean of the four LoCoMo goal numbers on the tuning split
(:func:`~pbr_bench.one_set.objective`); ties by the candidates' order. With none admissible, the
candidate with the fewest significant losses (then the fewest cells below, then the goal mean)
is read once on the test split for reference, not as a choice. The test split is reported per
data set, paired against the shipped rule, dense, BM25 and RRF, with the same judgement.

(Until 2026-12-06 the harness tested admissibility against the shipped rule alone: weaker than
the protocol it names. ``lexical_fields.py`` had been read once on the test split under that
rule; docs/hybrid.md says what changed.)
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from pbr_core.hybrid import lexical_query, rank
from pbr_core.lexical import LexicalIndex
from pbr_core.snapshot import UserHistory

from .datasets import Query
from .metrics import best_over_combinations, recall_any_at_k
from .one_set import (
    CUT,
    METRICS,
    RULE_SETS,
    SHORT,
    VIEWS,
    Row,
    built_with_main,
    judge,
    load_all,
    objective,
    paired_rows,
    question_row,
    ranks,
    view_cells,
    views,
)
from .paths import BENCHMARKS_DIR, RESULTS_DIR, in_repo, scratch_dir
from .report import write_csv

__all__ = [
    "BASELINES",
    "Candidates",
    "baselines",
    "collect",
    "metrics_of",
    "per_history",
    "report",
    "run",
]

#: The shipped rule and the fixed baselines of ``benchmarks/hybrid_tuning.py``.
BASELINES = ("shipped", "dense", "bm25", "rrf")


def metrics_of(ids: Sequence[str], order: Sequence[int], gold: Any) -> tuple[float, float, float]:
    """R@5, N@5 (PersonaBench's best-over-combinations rule) and recall_any@5 of a ranking
    (positions into ``ids``, best first)."""
    ranked = [ids[i] for i in order[:CUT]]
    rr, nn = best_over_combinations(ranked, gold, CUT)
    return rr, nn, recall_any_at_k(ranked, gold, CUT)


def baselines(
    hist: UserHistory,
    plain: UserHistory,
    vector: np.ndarray,
    own: dict[str, float],
    gold: Any,
    bm25: LexicalIndex,
) -> dict[str, tuple[float, float, float]]:
    """One question's :data:`BASELINES`: the shipped rule (``hist``, with windows), dense (no
    windows), BM25 (``bm25``: unstemmed, k1 1.5, b .75, ties in the dense order) and RRF
    (c = 60) over those two."""
    ids = [it.id for it in hist.items]
    out = {"shipped": metrics_of(ids, [r.position for r in rank(hist, vector, own, CUT)], gold)}
    dense = np.asarray(plain.dense_scores(vector), dtype=np.float64)
    lex = bm25.scores(own).astype(np.float64) + 1e-9 * (dense + 1)
    out["dense"] = metrics_of(ids, np.argsort(-dense, kind="stable").tolist(), gold)
    out["bm25"] = metrics_of(ids, np.argsort(-lex, kind="stable").tolist(), gold)
    rrf = 1 / (60 + ranks(dense)) + 1 / (60 + ranks(lex))
    out["rrf"] = metrics_of(ids, np.argsort(-rrf, kind="stable").tolist(), gold)
    return out


T = TypeVar("T")


def per_history(build: Callable[[UserHistory], T]) -> Callable[[UserHistory], T]:
    """``build`` kept per snapshot: what a candidate derives from a user's history (a second
    index, a window matrix) is built once for all of that user's questions."""
    held: dict[int, tuple[UserHistory, T]] = {}

    def of(history: UserHistory) -> T:
        entry = held.get(id(history))
        if entry is None or entry[0] is not history:
            entry = held[id(history)] = (history, build(history))
        return entry[1]

    return of


#: One question's candidates: ``(query, its user's history with windows, the user's words as
#: the lexical query, the query vector) -> candidate -> ranking`` (positions, best first).
Candidates = Callable[[Query, UserHistory, dict[str, float], np.ndarray], dict[str, list[int]]]


def collect(name: str, cache: Path, candidates: Candidates) -> list[Row]:
    """Data set ``name``'s rows: per question its split, whether it is in LoCoMo's current
    set, and the metrics of the :data:`BASELINES` and of each of ``candidates``' rankings;
    kept in ``cache/<name>.pkl`` (read back, not recomputed, when it exists)."""
    path = cache / f"{name}.pkl"
    if path.exists():
        rows: list[Row] = pickle.loads(path.read_bytes())
        return rows
    built, main_ids = built_with_main(name)
    bm25_ix: dict[str, LexicalIndex] = {}
    rows = []
    for q in built.queries:
        hist, plain = built.windowed.get(q.user_id), built.plain.get(q.user_id)
        ids = [it.id for it in hist.items]
        if q.user_id not in bm25_ix:
            texts = [it.text for it in hist.items]
            bm25_ix[q.user_id] = LexicalIndex.build(texts, k1=1.5, b=0.75)
        v = built.qvec[q.id]
        own = lexical_query(q.text)
        res = baselines(hist, plain, v, own, q.gold, bm25_ix[q.user_id])
        for label, order in candidates(q, hist, own, v).items():
            res[label] = metrics_of(ids, order, q.gold)
        rows.append(question_row(name, q, main_ids, res=res))
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(rows))
    return rows


def _scores(sets: dict[str, list[Row]], method: str, split: str) -> dict[str, np.ndarray]:
    return {
        d: np.array(
            [r["res"][method] for r in rows if split == "all" or r["split"] == split]
        ).reshape(-1, 3)
        for d, rows in sets.items()
    }


def _summary_row(
    method: str, split: str, s: dict[str, np.ndarray], base: dict[str, Any] | None
) -> Row:
    """One method's means over :data:`~pbr_bench.one_set.VIEWS` and its goal mean; with
    ``base`` (the baselines' scores on the split), its judgement against them."""
    out: Row = {"split": split, "method": method}
    for d in VIEWS:
        for j, m in enumerate(METRICS):
            out[f"{d} {m}"] = float(s[d][:, j].mean())
    out["goal mean"] = objective(s)
    if base is not None:
        verdict = judge(s, base, [b for b in BASELINES if b != method])
        out["fails"] = len(verdict["fails"])
        out["sig. losses"] = "; ".join(verdict["losses"])
    return out


def _print_table(rows: list[Row], title: str) -> None:
    print(f"\n== {title}: R@5 / N@5 (LoCoMo -all: recall_any@5) ==")
    head = f"{'method':26}" + "".join(f"{SHORT[d]:>12}" for d in VIEWS)
    print(head + f"{'goal':>8}{'fails':>6}  significant losses")
    for r in rows:
        cells = view_cells(r)
        print(f"{r['method']:26}{cells}{r['goal mean']:8.4f}{r['fails']:6d}  {r['sig. losses']}")


def _plot(tuning: list[Row], chosen: str | None, path: Path) -> None:
    """The shipped rule and every candidate on the tuning split: the conversation goals' mean
    against PrefEval's mean N@5 (N = 10..300), the trade a lexical lead has to make; dense's
    PrefEval N@5 as a line (BM25 and RRF sit far below both axes' range)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pe = [d for d in RULE_SETS if d.startswith("prefeval")]

    def xy(r: Row) -> tuple[float, float]:
        return float(np.mean([r[f"{d} N@5"] for d in pe])), float(r["goal mean"])

    fig, ax = plt.subplots(figsize=(8, 5))
    shipped_fails = next(r for r in tuning if r["method"] == "shipped")["fails"]
    dense = next(r for r in tuning if r["method"] == "dense")
    ax.axvline(xy(dense)[0], color="tab:gray", linestyle="--", linewidth=1, label="dense")
    shown = [r for r in tuning if r["method"] not in BASELINES or r["method"] == "shipped"]
    for i, r in enumerate(shown):
        if r["method"] == "shipped":
            style: dict[str, Any] = dict(marker="s", color="black")
        elif r["sig. losses"] or r["fails"] > shipped_fails:
            style = dict(marker="x", color="tab:red")
        else:
            style = dict(marker="o", color="tab:blue")
        size = 60 if r["method"] == chosen else 22
        ax.scatter(*xy(r), s=size, label=f"{i}: {r['method']}", **style)
        ax.annotate(str(i), xy(r), xytext=(4, 3), textcoords="offset points", fontsize=7)
    ax.set_xlabel("PrefEval N@5, mean of N = 10, 50, 100, 300 (tuning split)")
    ax.set_ylabel("LoCoMo goals' mean (tuning split)")
    ax.set_title(f"{path.stem}: blue admissible, red not, large the choice")
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(
    sets: dict[str, list[Row]],
    candidates: Sequence[str],
    out: Path,
    extra: dict[str, Any],
) -> None:
    """Choose among ``candidates`` on the tuning split, read the choice (or, with none
    admissible, the nearest candidate) once on the test split and on every question, print the
    tables and write ``out`` ``.csv``, ``.json`` (with ``extra`` first) and ``.png``."""
    methods = [*BASELINES, *candidates]
    base_tune = {b: _scores(sets, b, "tune") for b in BASELINES}
    tuning = [_summary_row(m, "tune", _scores(sets, m, "tune"), base_tune) for m in methods]
    _print_table(tuning, "tuning split")
    shipped_fails = next(r for r in tuning if r["method"] == "shipped")["fails"]
    cands = [r for r in tuning if r["method"] not in BASELINES]
    admissible = [r for r in cands if not r["sig. losses"] and r["fails"] <= shipped_fails]
    chosen = max(admissible, key=lambda r: r["goal mean"])["method"] if admissible else None
    print(f"\nshipped rule's cells below the best baseline: {shipped_fails}")
    print(f"admissible: {len(admissible)} of {len(candidates)}; chosen: {chosen}")
    shown = chosen
    if shown is None:
        shown = min(
            cands,
            key=lambda r: (
                len([x for x in r["sig. losses"].split("; ") if x]),
                r["fails"],
                -r["goal mean"],
            ),
        )["method"]
        print(f"reported for reference (fewest significant losses): {shown}")

    summary: list[Row] = []
    paired: list[Row] = []
    for split in ("test", "all"):
        base = {b: _scores(sets, b, split) for b in BASELINES}
        s = _scores(sets, shown, split)
        summary.extend(_summary_row(b, split, base[b], base) for b in BASELINES)
        summary.append(_summary_row(shown, split, s, base))
        _print_table(summary[-5:], f"{split} split")
        paired.extend(paired_rows(split, s, base, shown, BASELINES))
    print(f"\n== {shown} vs the shipped rule, test split (wins / losses, sign test p) ==")
    for r in paired:
        skip = r["metric"] == "recall_any@5" and not r["dataset"].startswith("locomo")
        if r["split"] == "test" and r["baseline"] == "shipped" and not skip:
            print(
                f"{r['dataset']:24}{r['metric']:>13}{r['value']:8.4f} {r['baseline_value']:8.4f}"
                f" {r['wins']:4d}/{r['losses']:<4d} p {r['p_sign']:.2g}"
            )

    out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(out.with_suffix(".csv"), tuning + summary)
    data = {
        **extra,
        "shipped rule's cells below the best baseline (tuning split)": shipped_fails,
        "chosen": chosen,
        "reported on the test split": shown,
        "admissible": [r["method"] for r in admissible],
        "tuning": tuning,
        "summary": summary,
        "paired": paired,
    }
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(tuning, chosen, out.with_suffix(".png"))
    print(f"\nwrote {in_repo(out.with_suffix('.json'))}")


def run(name: str, candidates: Sequence[str], ranked: Candidates, extra: dict[str, Any]) -> None:
    """A lead script's whole run: every data set's rows (cached in
    ``$PBR_CACHE_DIR/<name>-<code>``, :func:`~pbr_bench.paths.scratch_dir`), then :func:`report`
    to ``benchmarks/results/hybrid/<name>.{csv,json,png}``."""
    t0 = time.perf_counter()
    scratch = scratch_dir(name, BENCHMARKS_DIR / f"{name}.py")  # one fingerprint per run
    sets = views(load_all(lambda data_set: collect(data_set, scratch, ranked)))
    report(sets, candidates, RESULTS_DIR / "hybrid" / name, extra)
    print(f"({time.perf_counter() - t0:.0f}s)")
