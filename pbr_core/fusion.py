"""Fusion (spec §2.4, §2.5): the personalized query vector from its terms.

    mid = (q + c_anchor) / 2          (mid = q without the anchor)
    w1  = 1 + cos(mid, f_avg)
    w2  = 1 + cos(mid, r)
    q*  = q + c_anchor + w1·f_avg + w2·r

A term that is missing (no history, an LLM answer that could not be used) or switched off by the
fusion mode is simply left out; the caller records why.

``"safe"`` mode (this library's addition, not in the paper) keeps the paper's formula but scales
each pseudo-feedback term by a *trust* in [0, 1] read off at query time: its cosine with the plain
query, ramped linearly from ``trust_low`` (no weight) to ``trust_high`` (the paper's weight).
Feedback from a strong LLM is on-topic and keeps its full weight; generic or off-target text from
a tiny model fades out, and with it the anchor (scaled by the largest trust), because the anchor
alone pulls every query towards the centre of the user's corpus. With nothing trusted, ``q*``
is the plain query: personalization can fall back, it cannot drag the query away.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import FusionMode

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
    """

    vector: np.ndarray
    w1: float | None
    w2: float | None
    used: tuple[str, ...]
    trust: dict[str, float] = field(default_factory=dict)


def trust(q: np.ndarray, term: np.ndarray, low: float, high: float) -> float:
    """How much ``"safe"`` fusion trusts a pseudo-feedback term: its cosine with the query,
    mapped linearly from ``low`` (0) to ``high`` (1) and clipped."""
    return float(np.clip((cosine(q, term) - low) / (high - low), 0.0, 1.0))


def fuse(
    q: np.ndarray,
    *,
    anchor: np.ndarray | None = None,
    f_avg: np.ndarray | None = None,
    r: np.ndarray | None = None,
    mode: FusionMode = "full",
    trust_low: float = 0.3,
    trust_high: float = 0.45,
) -> FusionResult:
    """Combine the query with whichever of anchor, utterances and reasoning the mode allows.

    Args:
        q: the unit query vector.
        anchor: ``c_anchor`` or ``None``.
        f_avg: mean of the unit pseudo-utterance vectors or ``None``.
        r: the unit reasoning vector or ``None``.
        mode: one of :data:`MODE_TERMS`.
        trust_low, trust_high: the trust ramp of ``"safe"`` mode (ignored by the others).
    """
    want_anchor, want_f, want_r = MODE_TERMS[mode]
    q = np.asarray(q, dtype=np.float64)
    scale = {"anchor": 1.0, "utterances": 1.0, "reasoning": 1.0}
    trusts: dict[str, float] = {}
    if mode == "safe":
        for name, vec in (("utterances", f_avg), ("reasoning", r)):
            if vec is not None:
                trusts[name] = scale[name] = trust(q, np.asarray(vec), trust_low, trust_high)
        trusts["anchor"] = scale["anchor"] = max(trusts.values(), default=0.0)
    used = ["query"]
    total = q.copy()
    mid = q
    if want_anchor and anchor is not None and scale["anchor"] > 0:
        a = np.asarray(anchor, dtype=np.float64)
        total += scale["anchor"] * a
        mid = (q + a) / 2.0
        used.append("anchor")
    w1 = w2 = None
    if want_f and f_avg is not None and scale["utterances"] > 0:
        f = np.asarray(f_avg, dtype=np.float64)
        w1 = scale["utterances"] * (1.0 + cosine(mid, f))
        total += w1 * f
        used.append("utterances")
    if want_r and r is not None and scale["reasoning"] > 0:
        rr = np.asarray(r, dtype=np.float64)
        w2 = scale["reasoning"] * (1.0 + cosine(mid, rr))
        total += w2 * rr
        used.append("reasoning")
    return FusionResult(
        vector=total.astype(np.float32), w1=w1, w2=w2, used=tuple(used), trust=trusts
    )
