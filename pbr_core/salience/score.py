"""The spec's math: Bayes-factor salience ``Sal_q(c; q) = log p(q | c) − log p(q)`` (spec §3).

Kept apart from the model (any scorer will do) and from what is done with the scores (re-rank,
gate). Units: ``sum`` in nats, ``mean`` in nats per query token (per answer token for the
oracle). ``N`` items cost one scorer call of ``N + 1`` sequences (the extra one: empty slot).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .protocol import LogProbScorer, _non_finite

__all__ = [
    "SalienceScores",
    "oracle_focus_set",
    "oracle_salience",
    "salience",
]

Reduction = Literal["sum", "mean"]
_REDUCTIONS: tuple[str, ...] = ("sum", "mean")


@dataclass(frozen=True)
class SalienceScores:
    """Log Bayes factors of ``n`` memory items for one query (or, oracle, one answer).

    Attributes:
        query: the query.
        sum: ``log p(q | c_i) − log p(q)`` in nats, shape ``(n,)``. Ranks items for one query.
        mean: the same divided by the number of query tokens (nats per token). Use it for a
            threshold shared across queries of different lengths (the gate does).
        conditional: ``log p(q | c_i)`` summed over the query tokens, shape ``(n,)``.
        unconditional: ``log p(q)`` (empty memory slot); ``None`` when no item was scored.
        num_tokens: query tokens the sums run over (0 when no item was scored).
        answer: for :func:`oracle_salience`, the answer whose tokens were scored (the query
            then sits in the prompt); ``None`` for :func:`salience`.
        model_id: the scorer's model.
    """

    query: str
    sum: np.ndarray
    mean: np.ndarray
    conditional: np.ndarray
    unconditional: float | None
    num_tokens: int
    answer: str | None = None
    model_id: str = ""

    def __len__(self) -> int:
        return int(self.sum.shape[0])

    def get(self, reduction: Reduction = "sum") -> np.ndarray:
        """``sum`` or ``mean`` by name."""
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        return self.sum if reduction == "sum" else self.mean


def _empty(query: str, model_id: str, answer: str | None = None) -> SalienceScores:
    e = np.zeros(0, dtype=np.float64)
    return SalienceScores(query, e, e.copy(), e.copy(), None, 0, answer, model_id)


def _bayes_factor(
    scorer: LogProbScorer,
    query: str,
    target: str,
    items: Sequence[str],
    conditions: bool,
    answer: str | None,
) -> SalienceScores:
    items = _as_texts(items)
    if not items:
        return _empty(query, scorer.model_id, answer)
    contexts = ["", *items]
    targets = [target] * len(contexts)
    if conditions:
        out = scorer.logprobs(contexts, targets, [query] * len(contexts))
    else:
        out = scorer.logprobs(contexts, targets)
    if len(out) != len(contexts):
        raise RuntimeError(
            f"scorer {scorer.model_id!r} returned {len(out)} results for {len(contexts)} pairs"
        )
    lp = np.array([r.logprob for r in out], dtype=np.float64)
    counts = {r.num_tokens for r in out}
    if not np.isfinite(lp).all():
        raise _non_finite(scorer.model_id, int((~np.isfinite(lp)).sum()), len(lp), "scorer output")
    if len(counts) != 1 or 0 in counts:
        raise ValueError(
            f"scorer {scorer.model_id!r} scored the same target with different token counts "
            f"{sorted(counts)}; the target must be tokenized on its own, independent of the prompt"
        )
    n_tok = counts.pop()
    base, cond = float(lp[0]), lp[1:]
    total = cond - base
    return SalienceScores(query, total, total / n_tok, cond, base, n_tok, answer, scorer.model_id)


def salience(scorer: LogProbScorer, query: str, items: Sequence[str]) -> SalienceScores:
    """``Sal_q(c_i; q) = log p(q | c_i) − log p(q)`` for every memory item (spec §3).

    One scorer call with ``N + 1`` sequences: the ``N`` items and the empty memory slot.
    Positive: the item makes the query more likely than no memory at all.

    Args:
        scorer: any :class:`LogProbScorer` (e.g. :func:`default_scorer`).
        query: the user's query; must contain text.
        items: the memory items' texts (e.g. the top-N of a dense search).

    Returns:
        :class:`SalienceScores` with ``sum`` and ``mean`` arrays aligned with ``items``;
        empty arrays (and no LM call) for no items.

    Raises:
        ValueError: the query is empty.
        NonFiniteLogProbError: the LM produced NaN/inf.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError("salience needs a non-empty query; got " + repr(query))
    return _bayes_factor(scorer, query, query, items, conditions=False, answer=None)


def oracle_salience(
    scorer: LogProbScorer, query: str, answer: str, items: Sequence[str]
) -> SalienceScores:
    """Oracle salience ``Sal_a(c_i) = log p(a | q, c_i) − log p(a | q)`` (evaluation only).

    Needs the reference answer, so it can only label data: it measures how much each item helps
    the LM produce the right answer to the query. The prompt is
    ``memory_block(c) + condition_block(q)`` and the answer's tokens are scored.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError("oracle_salience needs a non-empty query; got " + repr(query))
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError("oracle_salience needs a non-empty reference answer; got " + repr(answer))
    return _bayes_factor(scorer, query, answer, items, conditions=True, answer=answer)


def oracle_focus_set(
    scores: SalienceScores | Sequence[float] | np.ndarray,
    tau: float = 0.0,
    max_items: int | None = None,
    reduction: Reduction = "sum",
) -> np.ndarray:
    """Indices of the items whose oracle salience exceeds ``tau``, most salient first.

    With the default ``tau = 0`` this is every item that makes the reference answer more likely
    than no memory; ``max_items`` caps it. An int64 array (possibly empty).
    """
    s = _scores_array(scores, reduction)
    _check_cap(max_items)
    if not math.isfinite(float(tau)):  # as gate: a NaN tau would silently select nothing
        raise ValueError(f"tau must be a finite number, got {tau}")
    above = np.flatnonzero(s > tau)
    ranked = above[np.argsort(-s[above], kind="stable")]
    return ranked if max_items is None else ranked[:max_items]


def _as_texts(items: Sequence[str]) -> list[str]:
    if isinstance(items, str):
        raise TypeError("items is a list of texts; wrap a single item as [text]")
    out = list(items)
    for i, x in enumerate(out):
        if not isinstance(x, str):
            raise TypeError(f"items[{i}] is {type(x).__name__}, expected str (the item's text)")
    return out


def _scores_array(
    scores: SalienceScores | Sequence[float] | np.ndarray, reduction: Reduction
) -> np.ndarray:
    raw = scores.get(reduction) if isinstance(scores, SalienceScores) else scores
    s = np.asarray(raw, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be one-dimensional, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ValueError(
            "scores contain NaN/inf; compute them with salience(), which checks the LM output"
        )
    return s


def _check_cap(max_items: int | None) -> None:
    if max_items is not None and max_items < 1:
        raise ValueError(f"max_items must be >= 1 or None (no cap), got {max_items}")
