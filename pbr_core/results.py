"""What one request takes and produces: given feedback, the personalized query, its explanation,
and the search result.

These types sit below every module that makes or reads them (the pipeline, the request in
:mod:`pbr_core.retrieval`, the ranking in :mod:`pbr_core.hybrid`, the adapters), so none of those
imports another to name a result. :func:`explanation_payload` is the one JSON form of an
explanation that every entry point attaches to its results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .fusion import MODE_TERMS, TERMS
from .items import check_batch
from .protocols import SearchHit

__all__ = [
    "SHOWN_QUERY_CHARS",
    "Explanation",
    "PersonalizedQuery",
    "PseudoFeedback",
    "SearchResult",
    "explanation_payload",
    "missing_terms",
]


#: How much of the query an explanation's JSON form shows (characters).
SHOWN_QUERY_CHARS = 1000


@dataclass(frozen=True)
class PseudoFeedback:
    """Ready-made P-PRF texts (e.g. cached generations of another LLM): skips the LLM calls."""

    utterances: Sequence[str] = ()
    reasoning: str | None = None

    def __post_init__(self) -> None:
        # a bare string would be read as one utterance per character, each embedded and fused
        utterances = check_batch(self.utterances, "PseudoFeedback.utterances")
        if not all(isinstance(u, str) for u in utterances):
            raise TypeError("PseudoFeedback.utterances must be a list of strings")
        if self.reasoning is not None and not isinstance(self.reasoning, str):
            raise TypeError(
                f"PseudoFeedback.reasoning must be a string or None, got "
                f"{type(self.reasoning).__name__}"
            )
        object.__setattr__(self, "utterances", tuple(utterances))


@dataclass
class Explanation:
    """Why the personalized query is what it is. JSON-ready through :meth:`to_dict`.

    Attributes:
        user_id, query: the request.
        fusion: the fusion mode.
        used: the terms that entered ``q*``.
        related: the history items shown to the LLM (score = cosine with the query).
        pseudo_utterances, reasoning: the parsed LLM answers (empty / None when dropped).
        w1, w2: fusion weights (None for a dropped term).
        anchor_items: the most central history items (score = PageRank).
        dropped: term → reason it is not in ``q*`` (every absent term: failures, too little
            history, the fusion mode, and the deliberate choices also listed in ``skipped``).
        skipped: the subset of ``dropped`` that is a deliberate choice, not a failure:
            ``"safe"`` fusion keeping the plain query (its history gate, feedback it does not
            trust, or its pre-generation gate, ``PBRConfig.pre_gate``, which also skips the LLM
            calls). A request is *degraded* only by the other entries of ``dropped``.
        trust: ``"safe"`` fusion only: each LLM term's trust in [0, 1], the closest feedback and
            history cosines (see :class:`~pbr_core.fusion.FusionResult`) and ``"shift"``, the share
            of the paper's shift from ``q`` that ``q*`` applies.
        timings_ms: milliseconds per stage (no ``"llm"`` stage when the pre-generation gate
            skipped the LLM).
        llm_calls: P-PRF prompts sent to the LLM by this request (0, 1 or 2).
        llm_cached: P-PRF prompts answered from the generation cache instead.
    """

    user_id: str
    query: str
    fusion: str
    used: tuple[str, ...] = ()
    related: list[SearchHit] = field(default_factory=list)
    pseudo_utterances: list[str] = field(default_factory=list)
    reasoning: str | None = None
    w1: float | None = None
    w2: float | None = None
    anchor_items: list[SearchHit] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    trust: dict[str, float] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)
    llm_calls: int = 0
    llm_cached: int = 0

    def shown_query(self) -> str:
        """The query as results, events and traces show it: its first
        :data:`SHOWN_QUERY_CHARS` characters (then ``…``). Every result of a request carries the
        explanation, so an uncut 1 MB query would be copied into each one."""
        if len(self.query) <= SHOWN_QUERY_CHARS:
            return self.query
        return self.query[: SHOWN_QUERY_CHARS - 1] + "…"

    def to_dict(self) -> dict[str, Any]:
        def hit(h: SearchHit) -> dict[str, Any]:
            return {"id": h.id, "score": round(h.score, 6), "text": h.text}

        return {
            "user_id": self.user_id,
            "query": self.shown_query(),
            "fusion": self.fusion,
            "used": list(self.used),
            "related": [hit(h) for h in self.related],
            "pseudo_utterances": list(self.pseudo_utterances),
            "reasoning": self.reasoning,
            "w1": self.w1,
            "w2": self.w2,
            "anchor_items": [hit(h) for h in self.anchor_items],
            "dropped": dict(self.dropped),
            "skipped": dict(self.skipped),
            "trust": {k: round(v, 4) for k, v in self.trust.items()},
            "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
            "llm_calls": self.llm_calls,
            "llm_cached": self.llm_cached,
        }


@dataclass
class PersonalizedQuery:
    """The result of :meth:`Personalizer.personalize`.

    Attributes:
        vector: ``q*`` scaled to unit norm (ranking by inner product or cosine is unchanged).
        query_vector: the plain unit query vector ``q``.
        explanation: how ``vector`` was made.
    """

    vector: np.ndarray
    query_vector: np.ndarray
    explanation: Explanation


@dataclass
class SearchResult:
    """What :meth:`Personalizer.search` returns: the ranked hits and the query they answer."""

    hits: list[SearchHit]
    personalized: PersonalizedQuery


def missing_terms(explanation: Explanation) -> dict[str, str]:
    """Terms the fusion mode asked for but ``q*`` lacks because something failed, with reasons.

    Non-empty means the request ran degraded (an LLM call failed or timed out, an answer could
    not be parsed, the user has too little history). Not missing: terms switched off by the
    fusion mode, and terms ``"safe"`` fusion chose to leave out (``Explanation.skipped``:
    personalization skipped on purpose, not a failure).
    """
    wanted = dict(zip(TERMS, MODE_TERMS[explanation.fusion]))  # type: ignore[index]
    return {
        term: explanation.dropped.get(term, "not used")
        for term in TERMS
        if wanted[term] and term not in explanation.used and term not in explanation.skipped
    }


def explanation_payload(explanation: Explanation) -> dict[str, Any]:
    """The JSON-ready explanation an entry point attaches to the results of the request.

    :meth:`Explanation.to_dict` (which holds ``skipped``: term → why ``"safe"`` fusion chose to
    leave it out) plus ``degraded`` (bool: something failed) and ``missing`` (term → reason, the
    failures only).
    """
    missing = missing_terms(explanation)
    return {**explanation.to_dict(), "degraded": bool(missing), "missing": missing}
