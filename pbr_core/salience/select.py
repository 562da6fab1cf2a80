"""What to do with salience scores: re-rank candidates or gate the use of memory (spec §3).

Kept apart from scoring: both rules take the scores as given, so they run without a model.
Units are the scores' own: nats for re-ranking (``sum``; order is the same for ``mean``), nats
per query token for the gate's threshold ``tau`` (``mean``, so one ``tau`` fits every query).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import numpy as np

from ..protocols import SearchHit
from .score import Reduction, SalienceScores, _check_cap, _scores_array

__all__ = [
    "GateDecision",
    "RerankMethod",
    "Reranked",
    "gate",
    "rerank",
]

T = TypeVar("T")
U = TypeVar("U")
RerankMethod = Literal["salience", "rrf", "zsum"]
_METHODS: tuple[str, ...] = ("salience", "rrf", "zsum")


@dataclass(frozen=True)
class Reranked(Generic[T]):
    """Candidates in their new order and the scores that decided it.

    Attributes:
        items: the candidates, best first.
        order: ``items[j] is candidates[order[j]]``.
        scores: the score the order was sorted by (salience, RRF score or z-sum), aligned with
            ``items``.
        salience: each item's salience, aligned with ``items``.
        dense: each item's dense score, aligned with ``items`` (``None`` if not given).
        method: ``"salience"``, ``"rrf"`` or ``"zsum"``.
    """

    items: list[T]
    order: np.ndarray
    scores: np.ndarray
    salience: np.ndarray
    dense: np.ndarray | None
    method: str


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, highest value first; ties keep the input order."""
    r = np.empty(len(x), dtype=np.int64)
    r[np.argsort(-x, kind="stable")] = np.arange(1, len(x) + 1)
    return r


def _zscore(x: np.ndarray) -> np.ndarray:
    """z-scores; 0 for a constant ``x`` (tested exactly: rounding gives a constant's mean and
    std of ~1e-17, which would turn equal values into z = -1)."""
    if x.size == 0 or np.all(x == x[0]):
        return np.zeros_like(x, dtype=np.float64)
    sd = float(x.std())
    return np.zeros_like(x) if sd == 0.0 or not math.isfinite(sd) else (x - x.mean()) / sd


def rerank(
    candidates: Sequence[T],
    salience: SalienceScores | Sequence[float] | np.ndarray,
    method: RerankMethod = "salience",
    rrf_k: int = 60,
    weight: float = 0.5,
    *,
    dense_scores: Sequence[float] | np.ndarray | None = None,
) -> Reranked[T]:
    """Re-order dense-search candidates by salience, alone or fused with the dense score.

    Methods (higher is better for every score):

    * ``"salience"``: by salience; ties by dense score, then by input order.
    * ``"rrf"``: reciprocal-rank fusion, ``weight / (rrf_k + rank_sal) + (1 − weight) /
      (rrf_k + rank_dense)`` with 1-based ranks. Without dense scores the input order is the
      dense rank (candidates come from a search, best first).
    * ``"zsum"``: ``weight · z(salience) + (1 − weight) · z(dense)``, z-scores over the
      candidates (a constant score has z = 0). Needs dense scores.

    Summed and mean salience give the same order and the same fused scores for one query (they
    differ by a constant factor, which ranks and z-scores ignore).

    Args:
        candidates: the top-N of a dense search, best first; any objects. For
            :class:`~pbr_core.protocols.SearchHit` the dense score is ``hit.score``.
        salience: :class:`SalienceScores` (its ``sum`` is used) or an array aligned with
            ``candidates``.
        method: ``"salience"``, ``"rrf"`` or ``"zsum"``.
        rrf_k: the RRF constant (60, as in Cormack et al. 2009).
        weight: salience's share in ``[0, 1]`` of the fused score.
        dense_scores: the dense scores, if the candidates are not ``SearchHit``.
    """
    items = list(candidates)
    sal = _scores_array(salience, "sum")
    if len(sal) != len(items):
        raise ValueError(f"got {len(items)} candidates but {len(sal)} salience scores")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if not (math.isfinite(rrf_k) and rrf_k >= 0):  # NaN would make every score NaN
        raise ValueError(f"rrf_k must be a finite number >= 0, got {rrf_k}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight is salience's share and must lie in [0, 1], got {weight}")
    dense: np.ndarray | None
    if dense_scores is not None:
        dense = np.asarray(dense_scores, dtype=np.float64)
    elif items and all(isinstance(c, SearchHit) for c in items):
        dense = np.array([c.score for c in items], dtype=np.float64)  # type: ignore[attr-defined]
    else:
        dense = None
    if dense is not None:
        if dense.shape != sal.shape:
            raise ValueError(f"got {len(items)} candidates but dense scores of shape {dense.shape}")
        if not np.isfinite(dense).all():
            raise ValueError("dense scores contain NaN/inf")

    n = len(items)
    if method == "salience":
        score = sal
        tiebreak = -dense if dense is not None else np.zeros(n)
        order = np.lexsort((np.arange(n), tiebreak, -sal))
    else:
        if method == "rrf":
            dense_rank = _ranks(dense) if dense is not None else np.arange(1, n + 1)
            score = weight / (rrf_k + _ranks(sal)) + (1.0 - weight) / (rrf_k + dense_rank)
        else:
            if dense is None:
                raise ValueError(
                    "method='zsum' needs dense scores: pass dense_scores=[...] or SearchHit "
                    "candidates (or use method='rrf', which only needs the input order)"
                )
            score = weight * _zscore(sal) + (1.0 - weight) * _zscore(dense)
        order = np.argsort(-score, kind="stable")
    return Reranked(
        items=[items[i] for i in order],
        order=order.astype(np.int64),
        scores=np.asarray(score, dtype=np.float64)[order],
        salience=sal[order],
        dense=None if dense is None else dense[order],
        method=method,
    )


@dataclass(frozen=True)
class GateDecision(Generic[T]):
    """Whether to use memory for a query, and which items.

    Attributes:
        open: ``max(scores) > tau``.
        selected: the items above ``tau`` (the ``max_items`` most salient of them), in
            chronological order when timestamps were given, else in input order. Empty when
            closed.
        indices: positions of ``selected`` in the input, same order.
        scores: every item's score as used by the gate (aligned with the input items).
        tau: the threshold.
        reason: one line that explains the decision.
    """

    open: bool
    selected: list[T]
    indices: np.ndarray
    scores: np.ndarray
    tau: float
    reason: str

    def take(self, items: Sequence[U]) -> GateDecision[U]:
        """The same decision over ``items`` (aligned with the gated ones, e.g. their documents)."""
        if len(items) != len(self.scores):
            raise ValueError(f"the gate saw {len(self.scores)} items, got {len(items)}")
        selected = [items[i] for i in self.indices.tolist()]
        return GateDecision(self.open, selected, self.indices, self.scores, self.tau, self.reason)


def gate(
    items: Sequence[T],
    scores: SalienceScores | Sequence[float] | np.ndarray,
    tau: float = 0.0,
    max_items: int | None = None,
    timestamps: Sequence[Hashable] | None = None,
    *,
    reduction: Reduction = "mean",
) -> GateDecision[T]:
    """Memory gate (spec §3): open iff ``max_c Sal_q(c; q) > tau``.

    Selects the items whose score exceeds ``tau``; if more than ``max_items``, keeps the most
    salient ones. The selection is handed on in chronological order (``timestamps``: values
    of one comparable kind, e.g. POSIX seconds or aware datetimes; strings compare as text, so
    ISO strings order correctly only with one offset and one precision: the adapters turn
    whatever the metadata holds into seconds first; ties keep input order), else in input
    order.

    Args:
        items: the memory items (any objects), aligned with ``scores``.
        scores: :class:`SalienceScores` (``reduction`` picks ``mean``, the default, because a
            threshold shared across queries must not depend on query length) or an array.
        tau: the threshold, in the units of the scores (nats per query token for ``mean``).
        max_items: cap on the selection; ``None`` for no cap.
        timestamps: one per item, or ``None``.
        reduction: which :class:`SalienceScores` array to use.
    """
    items = list(items)
    s = _scores_array(scores, reduction)
    _check_cap(max_items)
    if len(s) != len(items):
        raise ValueError(f"got {len(items)} items but {len(s)} scores")
    if timestamps is not None and len(timestamps) != len(items):
        raise ValueError(f"got {len(items)} items but {len(timestamps)} timestamps")
    tau = float(tau)
    if not math.isfinite(tau):
        raise ValueError(f"tau must be a finite number, got {tau}")
    none = np.zeros(0, dtype=np.int64)
    if not items:
        return GateDecision(False, [], none, s, tau, "closed: no memory items to gate")
    best = float(s.max())
    if best <= tau:
        return GateDecision(
            False,
            [],
            none,
            s,
            tau,
            f"closed: max score {best:.4g} <= tau {tau:.4g} over {len(items)} item(s)",
        )
    above = np.flatnonzero(s > tau)
    kept = above[np.argsort(-s[above], kind="stable")]
    if max_items is not None:
        kept = kept[:max_items]
    if timestamps is not None:
        ts = list(timestamps)
        try:
            chosen = sorted(kept.tolist(), key=lambda i: (ts[i], i))
        except TypeError as exc:
            raise TypeError(f"timestamps must be mutually comparable: {exc}") from exc
        order_note = "chronological order"
    else:
        chosen = sorted(kept.tolist())
        order_note = "input order"
    idx = np.asarray(chosen, dtype=np.int64)
    capped = max_items is not None and len(above) > max_items
    cap_note = f", capped at {max_items}" if capped else ""
    reason = (
        f"open: {len(above)} of {len(items)} item(s) above tau {tau:.4g} (max {best:.4g}); "
        f"kept {len(idx)}{cap_note}, in {order_note}"
    )
    return GateDecision(True, [items[i] for i in chosen], idx, s, tau, reason)
