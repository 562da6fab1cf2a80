"""One call for the LangChain and LlamaIndex adapters: score, then re-rank or gate.

Kept in pbr_core so both adapters decide alike; they only map documents / nodes to texts and
back. Lenient about retrieved metadata (missing dense scores or timestamps) where
:func:`~pbr_core.salience.rerank` and :func:`~pbr_core.salience.gate` are strict. Scores in nats
(re-rank) or nats per query token (gate), as there.
"""

from __future__ import annotations

import datetime
import math
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .loading import default_scorer
from .protocol import LogProbScorer
from .score import Reduction, SalienceScores, _as_texts, _empty, salience
from .select import GateDecision, Reranked, RerankMethod, gate, rerank

__all__ = [
    "SELECT_OPTIONS",
    "SalienceSelection",
    "as_scorer",
    "select_by_salience",
]

Mode = Literal["rerank", "gate"]
_MODES: tuple[str, ...] = ("rerank", "gate")


@dataclass(frozen=True)
class SalienceSelection:
    """What :func:`select_by_salience` kept, in output order, with everything it computed.

    Attributes:
        indices: positions (in the input) of the kept items, in output order.
        scores: per kept item, the score that ranked it (re-rank: salience / RRF / z-sum) or
            gated it (gate: the ``reduction`` salience).
        salience: the salience of *every* input item.
        reranked: the full re-ranking (re-rank mode), else ``None``.
        decision: the gate decision (gate mode), else ``None``.
    """

    indices: np.ndarray
    scores: np.ndarray
    salience: SalienceScores
    reranked: Reranked[int] | None = None
    decision: GateDecision[int] | None = None


#: The options of :func:`select_by_salience` that the adapters expose as their own fields.
SELECT_OPTIONS: tuple[str, ...] = (
    "mode",
    "method",
    "top_n",
    "rrf_k",
    "weight",
    "tau",
    "max_items",
    "reduction",
)


def as_scorer(value: Any) -> LogProbScorer:
    """``value`` if it implements :class:`LogProbScorer`; ``None`` gives :func:`default_scorer`."""
    if value is None:
        return default_scorer()
    if not isinstance(value, LogProbScorer):
        raise TypeError(
            "scorer must implement pbr_core.salience.LogProbScorer (a model_id attribute and a "
            f"logprobs(contexts, targets) method), got {type(value).__name__}"
        )
    return value


def _usable_dense(values: Sequence[Any] | np.ndarray | None) -> np.ndarray | None:
    """Dense scores if every item has a finite real number, else ``None`` (rank by input
    order): a NaN from a store is as good as missing, not a reason to fail the re-ranking."""
    if values is None:
        return None
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values):
        dense = np.asarray(values, dtype=np.float64)
        return dense if np.isfinite(dense).all() else None
    return None


def _usable_timestamps(values: Sequence[Any] | None, what: str) -> list[Hashable] | None:
    """Timestamps as POSIX seconds if every item has one that reads as a time; none at all:
    ``None``; some missing or unreadable: warn, ``None`` (input order).

    Metadata is whatever the store holds: numbers, datetimes (naive ones read as UTC), numeric
    or ISO strings, mixed. Each is turned into seconds first, so the order is chronological
    (ISO strings with other offsets, or numbers written as strings, compare wrongly as text)
    and values of mixed types never make the gate raise."""
    if values is None or all(v is None for v in values):
        return None
    seconds = [_seconds(v) for v in values]
    if any(s is None for s in seconds):
        warnings.warn(
            f"only some items have a timestamp ({what}) that reads as a time; the gate keeps "
            "input order instead of chronological order",
            UserWarning,
            stacklevel=4,
        )
        return None
    return list(seconds)


def _seconds(value: Any) -> float | None:
    """``value`` as POSIX seconds: a finite number; a datetime; a string holding a number or
    an ISO 8601 time (``Z`` for UTC); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float, np.number)):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return moment.timestamp()
    if isinstance(value, str):
        try:
            return _seconds(float(value))
        except ValueError:
            pass
        try:
            return _seconds(datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def select_by_salience(
    scorer: LogProbScorer | None,
    query: str,
    texts: Sequence[str],
    *,
    mode: Mode = "rerank",
    method: RerankMethod = "salience",
    top_n: int | None = None,
    rrf_k: int = 60,
    weight: float = 0.5,
    tau: float = 0.0,
    max_items: int | None = None,
    reduction: Reduction = "mean",
    dense_scores: Sequence[float | None] | np.ndarray | None = None,
    timestamps: Sequence[Hashable | None] | None = None,
    timestamp_source: str = "timestamps",
) -> SalienceSelection:
    """Score ``texts`` for ``query``, then re-rank them (keep ``top_n``) or gate them.

    This is the whole post-processing step that the LangChain compressor and the LlamaIndex
    postprocessor run; they only map documents / nodes to texts and back. Re-rank mode: see
    :func:`rerank` (``top_n=None`` keeps all). Gate mode: see :func:`gate` (a closed gate keeps
    nothing).

    Lenient where :func:`rerank` and :func:`gate` are strict, because retrieved items come
    with whatever metadata they have: ``scorer=None`` uses :func:`default_scorer`; dense scores
    with a missing (``None``) or non-finite entry are ignored (RRF then uses the input order,
    z-sum fails); timestamps with a missing entry are ignored with a warning that names
    ``timestamp_source``.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if top_n is not None and top_n < 1:
        raise ValueError(f"top_n must be >= 1 or None (keep all), got {top_n}")
    texts = _as_texts(texts)
    if texts:
        sal = salience(as_scorer(scorer), query, texts)
    else:  # nothing to score: no model is loaded, but every option is checked as usual below
        if not isinstance(query, str) or not query.strip():
            raise ValueError("salience needs a non-empty query; got " + repr(query))
        sal = _empty(query, getattr(scorer, "model_id", ""))
    positions = list(range(len(texts)))
    if mode == "rerank":
        dense = _usable_dense(dense_scores)
        ranked = rerank(positions, sal, method, rrf_k, weight, dense_scores=dense)
        keep = len(positions) if top_n is None else top_n
        return SalienceSelection(ranked.order[:keep], ranked.scores[:keep], sal, reranked=ranked)
    times = _usable_timestamps(timestamps, timestamp_source)
    decision = gate(positions, sal, tau, max_items, times, reduction=reduction)
    return SalienceSelection(
        decision.indices, decision.scores[decision.indices], sal, decision=decision
    )
