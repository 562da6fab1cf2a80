"""Paired comparison of two methods' saved rankings: per-question wins/losses and a sign test."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .datasets import Dataset
from .metrics import best_over_combinations


@dataclass(frozen=True)
class Paired:
    method: str
    wins: int
    losses: int
    ties: int
    mean_delta: float
    p_value: float


def load_rankings(path: Path) -> dict[str, list[str]]:
    with path.open() as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {r["q"]: r["top"] for r in rows}


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test (ties dropped): chance of a split at least this uneven."""
    from scipy.stats import binomtest

    n = wins + losses
    return float(binomtest(wins, n).pvalue) if n else 1.0


def sign_summary(deltas: Sequence[float] | np.ndarray) -> tuple[int, int, float, float]:
    """Per-question differences (other minus baseline) as wins, losses, their mean (0 for no
    question) and the two-sided sign test's p."""
    d = np.asarray(deltas, dtype=np.float64)
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    return wins, losses, float(d.mean()) if d.size else 0.0, sign_test(wins, losses)


#: method -> data set -> split -> per-question (R@5, N@5)
SplitScores = dict[str, dict[str, dict[str, list[tuple[float, float]]]]]


@dataclass(frozen=True)
class CellScore:
    """One method on one split, as the fusion studies' choice rule reads it."""

    method: str
    cells: list[tuple[float, float]]  # (R@5, N@5) per data set, in the order given
    fails: int  # (data set, metric) cells below the best baseline
    mean: float  # of R@5 and N@5 over all cells


def cells_below_best(
    scores: SplitScores, split: str, datasets: Sequence[str], baselines: Sequence[str]
) -> list[CellScore]:
    """Every method of ``scores`` on ``split``: its mean R@5 and N@5 per data set and how many
    of those cells fall below max(``baselines``) there. The studies that choose a fusion rule or
    a window length (benchmarks/hybrid_adaptive.py, window_size.py) pick the fewest fails, ties
    by the higher mean."""
    best = {
        (d, m): max(float(np.mean([x[m] for x in scores[b][d][split]])) for b in baselines)
        for d in datasets
        for m in (0, 1)
    }
    out = []
    for method, per in scores.items():
        cells = [
            (
                float(np.mean([x[0] for x in per[d][split]])),
                float(np.mean([x[1] for x in per[d][split]])),
            )
            for d in datasets
        ]
        fails = sum(
            v < best[(d, m)] - 1e-12 for d, cell in zip(datasets, cells) for m, v in enumerate(cell)
        )
        out.append(CellScore(method, cells, fails, float(np.mean(cells))))
    return out


def paired(
    ds: Dataset,
    baseline: dict[str, list[str]],
    other: dict[str, list[str]],
    method: str,
    k: int = 5,
) -> Paired:
    """Recall@k of ``other`` minus ``baseline`` per question both ranked."""
    deltas = []
    for q in ds.scored_queries:
        if q.id in baseline and q.id in other:
            a = best_over_combinations(baseline[q.id], q.gold, k)[0]
            b = best_over_combinations(other[q.id], q.gold, k)[0]
            deltas.append(b - a)
    wins, losses, mean, p = sign_summary(deltas)
    return Paired(method, wins, losses, len(deltas) - wins - losses, mean, p)
