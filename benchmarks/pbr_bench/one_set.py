"""The one-parameter-set protocol of the hybrid rule (#42), shared by the scripts that search or
test a rule under it (``benchmarks/hybrid_tuning.py``; through :mod:`pbr_bench.lead`,
``benchmarks/lexical_prf.py`` and ``benchmarks/lexical_fields.py``): which data sets are read,
how LoCoMo's current question set is a view of its every-question set, the conversation goals a
candidate is chosen by, and the table helpers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .compare import sign_summary
from .datasets import Query, load_named
from .histories import DATASETS, Built, build, encoders
from .splits import is_tuning_question

__all__ = [
    "CUT",
    "GOALS",
    "GOAL_TARGETS",
    "LOADED",
    "METRICS",
    "RULE_SETS",
    "SHORT",
    "VIEWS",
    "Row",
    "Scores",
    "built_with_main",
    "judge",
    "load_all",
    "objective",
    "paired_rows",
    "question_row",
    "ranks",
    "view_cells",
    "views",
]

CUT = 5
METRICS = ("R@5", "N@5", "recall_any@5")
Row = dict[str, Any]
#: view -> (questions, 3): each question's R@5, N@5 and recall_any@5.
Scores = dict[str, np.ndarray]

#: The data sets of the rule ("no worse" is judged on each; the -all views only enter the goals).
RULE_SETS = [*DATASETS, "prefeval-explicit-n100", "prefeval-explicit-n300"]
#: What is loaded: LoCoMo once, on every question with evidence; the current question set is
#: the subset without the adversarial category (:func:`views`).
LOADED = [f"{d}-all" if d.startswith("locomo") else d for d in RULE_SETS]
VIEWS = [*RULE_SETS, "locomo-turn-all", "locomo-session-all"]
#: (data set, metric) of the conversation goals: what a candidate is chosen by.
GOALS = [
    ("locomo-turn", "R@5"),
    ("locomo-session", "R@5"),
    ("locomo-turn-all", "recall_any@5"),
    ("locomo-session-all", "recall_any@5"),
]
#: Issue #42's targets for :data:`GOALS`, on every question (no LLM, one parameter set); their
#: mean is what a candidate's goal mean (:func:`objective`) must at least reach to meet all four.
GOAL_TARGETS = {
    ("locomo-turn", "R@5"): 0.57,
    ("locomo-session", "R@5"): 0.88,
    ("locomo-turn-all", "recall_any@5"): 0.62,
    ("locomo-session-all", "recall_any@5"): 0.94,
}
#: Column heads of the printed tables.
SHORT = {
    "personabench-0.0": "PB0.0",
    "personabench-0.7": "PB0.7",
    "locomo-turn": "turn",
    "locomo-session": "sess",
    "prefeval-explicit-n10": "PE10",
    "prefeval-explicit-n50": "PE50",
    "prefeval-explicit-n100": "PE100",
    "prefeval-explicit-n300": "PE300",
    "locomo-turn-all": "turn-all",
    "locomo-session-all": "sess-all",
    "personabench-0.3": "PB0.3",
    "personabench-0.5": "PB0.5",
}


def built_with_main(name: str) -> tuple[Built, set[str] | None]:
    """Data set ``name``'s histories and query vectors (:func:`pbr_bench.histories.build`), and,
    for a LoCoMo ``-all`` set, the ids of its current question set's questions (else None)."""
    counter, cache, window = encoders()
    built = build(name, cache, counter, window)
    main_ids: set[str] | None = None
    if name.endswith("-all"):
        main_ids = {q.id for q in load_named(name.removesuffix("-all")).scored_queries}
    return built, main_ids


def question_row(name: str, q: Query, main_ids: set[str] | None, **fields: Any) -> Row:
    """One question's row: its id, split, whether it is in the current question set (what
    :func:`views` reads), then ``fields``."""
    return dict(
        qid=q.id,
        split="tune" if is_tuning_question(name, q.user_id, q.id) else "test",
        main=main_ids is None or q.id in main_ids,
        **fields,
    )


def load_all(
    collect: Callable[[str], list[Row]], names: Sequence[str] = LOADED
) -> dict[str, list[Row]]:
    """``collect`` of every data set in ``names`` (:data:`LOADED`), with progress printed."""
    t0 = time.perf_counter()
    loaded = {}
    for name in names:
        loaded[name] = collect(name)
        print(f"{name}: {len(loaded[name])} questions, {time.perf_counter() - t0:.0f}s", flush=True)
    return loaded


def view_cells(r: Row) -> str:
    """A table row's cells over :data:`VIEWS`: R@5 / N@5, recall_any@5 for LoCoMo's -all sets."""
    return "".join(
        f"{r[f'{d} recall_any@5']:12.4f}"
        if d.endswith("-all")
        else f"{r[f'{d} R@5']:.3f}/{r[f'{d} N@5']:.3f}".rjust(12)
        for d in VIEWS
    )


def views(loaded: Mapping[str, list[Row]], names: Sequence[str] = VIEWS) -> dict[str, list[Row]]:
    """Data set name -> its questions (rows with a ``main`` flag); LoCoMo's current set is the
    ``-all`` set's main part."""
    out = {}
    for name in names:
        if name.startswith("locomo") and not name.endswith("-all"):
            out[name] = [r for r in loaded[f"{name}-all"] if r["main"]]
        else:
            out[name] = loaded[name]
    return out


def judge(s: Scores, base: Mapping[str, Scores], against: Sequence[str]) -> dict[str, Any]:
    """The protocol's admissibility evidence for scores ``s`` on one split: ``fails``, the
    (data set, metric) cells of :data:`RULE_SETS` where ``s`` is below the best of dense, BM25
    and RRF on the mean; ``losses``, where it is significantly below (two-sided sign test
    p < .05, more losses than wins) one of ``against`` (names in ``base``), on R@5 or N@5."""
    best = {
        (d, j): max(float(base[b][d][:, j].mean()) for b in ("dense", "bm25", "rrf"))
        for d in RULE_SETS
        for j in (0, 1)
    }
    fails = [
        f"{d} {METRICS[j]}"
        for d in RULE_SETS
        for j in (0, 1)
        if float(s[d][:, j].mean()) < best[(d, j)] - 1e-12
    ]
    losses = []
    for b in against:
        for d in RULE_SETS:
            for j in (0, 1):
                w, l_, _, p = sign_summary(s[d][:, j] - base[b][d][:, j])
                if p < 0.05 and l_ > w:
                    losses.append(f"{d} {METRICS[j]} vs {b} ({w}/{l_})")
    return {"fails": fails, "losses": losses}


def paired_rows(
    split: str,
    s: Scores,
    base: Mapping[str, Scores],
    label: str,
    against: Sequence[str],
    names: Sequence[str] = VIEWS,
) -> list[Row]:
    """Scores ``s`` of candidate ``label`` paired with each of ``against`` (names in ``base``)
    on every view in ``names`` and metric: means, per-question wins / losses, the mean
    difference and the two-sided sign test's p."""
    out = []
    for b in against:
        for d in names:
            for j, m in enumerate(METRICS):
                w, l_, mean, p = sign_summary(s[d][:, j] - base[b][d][:, j])
                out.append(
                    dict(
                        split=split,
                        candidate=label,
                        baseline=b,
                        dataset=d,
                        metric=m,
                        n=int(s[d].shape[0]),
                        value=float(s[d][:, j].mean()),
                        baseline_value=float(base[b][d][:, j].mean()),
                        wins=w,
                        losses=l_,
                        mean_delta=mean,
                        p_sign=p,
                    )
                )
    return out


def objective(s: Scores) -> float:
    """The mean of the four conversation goals' numbers."""
    return float(np.mean([s[d][:, METRICS.index(m)].mean() for d, m in GOALS]))


def ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, best (highest) first, ties in order (RRF's ranks)."""
    order = np.argsort(-x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    return r
