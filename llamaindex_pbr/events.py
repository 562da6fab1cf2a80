"""Instrumentation events of :class:`~llamaindex_pbr.PBRRetriever`, one class per PBR stage.

Every event is a :class:`PBREvent` with the stage ``name`` and a JSON-ready ``data`` dict, as
:func:`pbr_core.adapters_support.explanation_events` defines them for every adapter. They are
dispatched inside the retrieval's span, so ``event.span_id`` ties them to it.

Listen to them:
    .. code-block:: python

        from llama_index.core.instrumentation import get_dispatcher
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler

        from llamaindex_pbr import PBREvent


        class PBRPrinter(BaseEventHandler):
            def handle(self, event, **kwargs):
                if isinstance(event, PBREvent):
                    print(event.name, event.data)


        get_dispatcher().add_event_handler(PBRPrinter())
"""

from __future__ import annotations

from typing import Any

from llama_index.core.instrumentation.events import BaseEvent
from pydantic import Field

__all__ = [
    "PBRAnchorEvent",
    "PBRDegradedEvent",
    "PBREvent",
    "PBRFusionEvent",
    "PBRPseudoUtterancesEvent",
    "PBRReasoningEvent",
    "PBRResultsEvent",
    "event_for",
]


class PBREvent(BaseEvent):
    """A PBR stage finished. ``data`` always holds ``user_id`` and ``query``."""

    name: str
    data: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def class_name(cls) -> str:
        return "PBREvent"


class PBRAnchorEvent(PBREvent):
    """``pbr.anchor``: the related history items and the most central ones (PageRank)."""

    @classmethod
    def class_name(cls) -> str:
        return "PBRAnchorEvent"


class PBRPseudoUtterancesEvent(PBREvent):
    """``pbr.pseudo_utterances``: what the LLM imagined the user might say (P-PRF)."""

    @classmethod
    def class_name(cls) -> str:
        return "PBRPseudoUtterancesEvent"


class PBRReasoningEvent(PBREvent):
    """``pbr.reasoning``: the LLM's step-by-step reading of the query (P-PRF)."""

    @classmethod
    def class_name(cls) -> str:
        return "PBRReasoningEvent"


class PBRFusionEvent(PBREvent):
    """``pbr.fusion``: the terms in ``q*``, the weights ``w1``/``w2``, dropped terms, timings."""

    @classmethod
    def class_name(cls) -> str:
        return "PBRFusionEvent"


class PBRResultsEvent(PBREvent):
    """``pbr.results``: the results in rank order, each its ``id`` and scores (``score``,
    ``store_score``, ``pbr_search``), with the stage timings including the search."""

    @classmethod
    def class_name(cls) -> str:
        return "PBRResultsEvent"


class PBRDegradedEvent(PBREvent):
    """``pbr.degraded``: a term the fusion mode wanted is missing (``data["missing"]`` says why)."""

    @classmethod
    def class_name(cls) -> str:
        return "PBRDegradedEvent"


_CLASSES: dict[str, type[PBREvent]] = {
    "pbr.anchor": PBRAnchorEvent,
    "pbr.pseudo_utterances": PBRPseudoUtterancesEvent,
    "pbr.reasoning": PBRReasoningEvent,
    "pbr.fusion": PBRFusionEvent,
    "pbr.degraded": PBRDegradedEvent,
    "pbr.results": PBRResultsEvent,
}


def event_for(name: str, data: dict[str, Any]) -> PBREvent:
    """The event of a stage by its name (an unknown name gives a plain :class:`PBREvent`)."""
    return _CLASSES.get(name, PBREvent)(name=name, data=data)
