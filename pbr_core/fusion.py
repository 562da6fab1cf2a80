"""Fusion (spec §2.4, §2.5): the personalized query vector from its terms.

    mid = (q + c_anchor) / 2          (mid = q without the anchor)
    w1  = 1 + cos(mid, f_avg)
    w2  = 1 + cos(mid, r)
    q*  = q + c_anchor + w1·f_avg + w2·r

A term that is missing (no history, an LLM answer that could not be used) or switched off by the
fusion mode is simply left out; the caller records why.

``"safe"`` mode (this library's addition, not in the paper) moves the query only part of the way
to the paper's ``q*``: ``q_safe = q + λ·(q*_paper − q)``. The share ``λ`` is read off at query
time from how well the pseudo feedback agrees with the query: each LLM term's cosine with ``q`` is
ramped linearly from ``trust_low`` (trust 0) to ``trust_high`` (trust 1), and
``λ = safe_min_shift + (1 − safe_min_shift)·mean trust``. On-topic feedback from a strong LLM
keeps the paper's full shift; generic text from a tiny model moves the query a little, which the
benchmarks show helps rather than hurts, where the full shift hurts. Without any LLM term, or
with feedback pointing away from the query (every cosine ≤ 0), ``q_safe`` is the plain query:
the anchor alone pulls every query towards the centre of the user's history and is never used
by itself. Nor when the user's history already holds an item closer to the query than every
pseudo-feedback term (``history_gate``): pseudo-relevance feedback stands in for relevant items
the query did not find, and a query that already matches one of the user's items well (a *clear*
query, in query-performance-prediction terms) is more likely moved away from that item than
towards a better one. The gate has no
parameter; the benchmarks that motivated it are in docs/benchmarks.md ("Safe personalization").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .config import FusionMode, PBRConfig

if TYPE_CHECKING:
    from .snapshot import UserHistory

#: The optional terms of ``q*``, in the order of :data:`MODE_TERMS`' flags.
TERMS: tuple[str, str, str] = ("anchor", "utterances", "reasoning")
#: Which terms each fusion mode uses: (anchor, utterances, reasoning).
MODE_TERMS: dict[FusionMode, tuple[bool, bool, bool]] = {
    "full": (True, True, True),
    "paper": (True, True, True),
    "no_anchor": (False, True, True),
    "no_prf": (True, False, False),
    "no_utterances": (True, False, True),
    "no_reasoning": (True, True, False),
    "plain": (False, False, False),
    "safe": (True, True, True),
}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity; 0 when either vector is zero."""
    na = float(np.linalg.norm(a))
    nb = float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


@dataclass(frozen=True)
class FusionResult:
    """The personalized query and how it was made.

    Attributes:
        vector: ``q*`` as the spec defines it (not normalised; ranking by inner product or cosine
            against unit-norm documents is the same).
        w1: weight of the mean pseudo-utterance vector, ``None`` when that term is absent.
        w2: weight of the reasoning vector, ``None`` when absent.
        used: the names of the terms that entered ``q*`` (``"query"`` always does).
        trust: ``"safe"`` mode only: each LLM term's trust in [0, 1], ``"closest_feedback"``
            (the largest cosine of an LLM term with the query), ``"closest_history"`` (the
            query's cosine with its closest history item, when known) and ``"shift"``, the share
            of the paper's shift that was applied.
        fallback: ``"safe"`` mode only: why it kept the plain query, ``None`` when it did not.
    """

    vector: np.ndarray
    w1: float | None
    w2: float | None
    used: tuple[str, ...]
    trust: dict[str, float] = field(default_factory=dict)
    fallback: str | None = None


def trust(q: np.ndarray, term: np.ndarray, low: float, high: float) -> float:
    """How much ``"safe"`` fusion trusts a pseudo-feedback term: its cosine with the query,
    mapped linearly from ``low`` (0) to ``high`` (1) and clipped. ``low < high``, as
    :class:`PBRConfig` requires (equal bounds divided by zero; reversed ones inverted the
    ramp)."""
    if not low < high:
        raise ValueError(f"trust_low must be below trust_high, got {low!r} and {high!r}")
    return float(np.clip((cosine(q, term) - low) / (high - low), 0.0, 1.0))


def fuse(
    q: np.ndarray,
    *,
    anchor: np.ndarray | None = None,
    f_avg: np.ndarray | None = None,
    r: np.ndarray | None = None,
    mode: FusionMode = "full",
    trust_low: float = PBRConfig.trust_low,
    trust_high: float = PBRConfig.trust_high,
    safe_min_shift: float = PBRConfig.safe_min_shift,
    best_history_cos: float | None = None,
    history_gate: bool = PBRConfig.safe_history_gate,
) -> FusionResult:
    """Combine the query with whichever of anchor, utterances and reasoning the mode allows.

    Args:
        q: the unit query vector.
        anchor: ``c_anchor`` or ``None``.
        f_avg: mean of the unit pseudo-utterance vectors or ``None``.
        r: the unit reasoning vector or ``None``.
        mode: one of :data:`MODE_TERMS`.
        trust_low, trust_high, safe_min_shift: ``"safe"`` mode's trust ramp and the smallest
            share of the paper's shift it applies (ignored by the other modes); the defaults
            are :class:`~pbr_core.config.PBRConfig`'s.
        best_history_cos: ``"safe"`` mode: the cosine of the query with its closest history
            item (``None``: unknown, no gate).
        history_gate: ``"safe"`` mode: keep the plain query when ``best_history_cos`` is above
            every LLM term's cosine with the query (default: ``PBRConfig.safe_history_gate``).
    """
    q = np.asarray(q, dtype=np.float64)
    if mode == "safe":
        gate = best_history_cos if history_gate else None
        return _safe(q, anchor, f_avg, r, trust_low, trust_high, safe_min_shift, gate)
    want_anchor, want_f, want_r = MODE_TERMS[mode]
    used = ["query"]
    total = q.copy()
    mid = q
    if want_anchor and anchor is not None:
        a = np.asarray(anchor, dtype=np.float64)
        total += a
        mid = (q + a) / 2.0
        used.append("anchor")
    w1 = w2 = None
    if want_f and f_avg is not None:
        f = np.asarray(f_avg, dtype=np.float64)
        w1 = 1.0 + cosine(mid, f)
        total += w1 * f
        used.append("utterances")
    if want_r and r is not None:
        rr = np.asarray(r, dtype=np.float64)
        w2 = 1.0 + cosine(mid, rr)
        total += w2 * rr
        used.append("reasoning")
    return FusionResult(vector=total.astype(np.float32), w1=w1, w2=w2, used=tuple(used))


def _safe(
    q: np.ndarray,
    anchor: np.ndarray | None,
    f_avg: np.ndarray | None,
    r: np.ndarray | None,
    low: float,
    high: float,
    min_shift: float,
    best_history_cos: float | None,
) -> FusionResult:
    terms = {
        name: np.asarray(v)
        for name, v in (("utterances", f_avg), ("reasoning", r))
        if v is not None
    }
    trusts = {name: trust(q, v, low, high) for name, v in terms.items()}
    closest = max((cosine(q, v) for v in terms.values()), default=0.0)
    report = {**trusts, "closest_feedback": closest} if terms else {}
    if best_history_cos is not None:
        report["closest_history"] = best_history_cos
    why = None
    if not terms or closest <= 0.0:
        why = "no usable pseudo feedback on the query's topic (the anchor is never used alone)"
    elif best_history_cos is not None and best_history_cos > closest:
        why = (
            f"the user's closest history item (cosine {best_history_cos:.2f}) matches the query "
            f"better than any pseudo feedback ({closest:.2f})"
        )
    if why is not None:
        report["shift"] = 0.0
        return FusionResult(q.astype(np.float32), None, None, ("query",), report, why)
    shift = min_shift + (1.0 - min_shift) * float(np.mean(list(trusts.values())))
    paper = fuse(q, anchor=anchor, f_avg=f_avg, r=r, mode="full")
    vector = q + shift * (paper.vector.astype(np.float64) - q)
    w1 = None if paper.w1 is None else shift * paper.w1
    w2 = None if paper.w2 is None else shift * paper.w2
    return FusionResult(vector.astype(np.float32), w1, w2, paper.used, {**report, "shift": shift})


# -- the extension point: a fusion rule ---------------------------------------------------------
@dataclass(frozen=True)
class FusionInputs:
    """Everything a fusion rule may read for one request (spec §2.4's inputs, and their context).

    Attributes:
        q: the unit query vector.
        anchor: ``c_anchor``, or None (no history, or the mode does not use it).
        f_avg: the mean of the unit pseudo-utterance vectors, or None.
        r: the unit reasoning vector, or None.
        config: the request's parameters (``fusion`` is the mode asked for).
        history: the user's history snapshot the request was personalized with.
        related: positions in ``history`` of the related items the prompts showed, best first.
        best_history_cos: the query's cosine with its closest history item (None: no history).
    """

    q: np.ndarray
    anchor: np.ndarray | None
    f_avg: np.ndarray | None
    r: np.ndarray | None
    config: PBRConfig
    history: UserHistory
    related: tuple[int, ...]
    best_history_cos: float | None


#: How ``q*`` is made from a request's terms: ``Personalizer(fusion_rule=...)``. The rule returns
#: a :class:`FusionResult` whose ``vector`` the pipeline normalises; ``used``, ``w1``/``w2``,
#: ``trust`` and ``fallback`` go into the explanation as they are.
FusionRule = Callable[[FusionInputs], FusionResult]


def default_rule(inputs: FusionInputs) -> FusionResult:
    """The library's rule: :func:`fuse` in ``inputs.config.fusion`` mode with its parameters."""
    cfg = inputs.config
    return fuse(
        inputs.q,
        anchor=inputs.anchor,
        f_avg=inputs.f_avg,
        r=inputs.r,
        mode=cfg.fusion,
        trust_low=cfg.trust_low,
        trust_high=cfg.trust_high,
        safe_min_shift=cfg.safe_min_shift,
        best_history_cos=inputs.best_history_cos,
        history_gate=cfg.safe_history_gate,
    )
