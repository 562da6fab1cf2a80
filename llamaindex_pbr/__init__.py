"""LlamaIndex integration of Personalize Before Retrieve (PBR): a per-user retriever."""

try:  # the `llamaindex` extra: say so, rather than fail deep inside a submodule
    import llama_index.core  # noqa: F401
except ModuleNotFoundError as exc:
    raise ImportError(
        "llamaindex_pbr needs LlamaIndex: pip install 'personalize-before-retrieve[llamaindex]'"
    ) from exc

from pbr_core.adapters_support import EXPLANATION_KEY

from .embeddings import LocalMiniLMEmbedding
from .events import (
    PBRAnchorEvent,
    PBRDegradedEvent,
    PBREvent,
    PBRFusionEvent,
    PBRPseudoUtterancesEvent,
    PBRReasoningEvent,
    PBRResultsEvent,
)
from .llms import LocalGemmaLLM
from .memory import PBRMemoryBlock
from .nodes import tag_nodes
from .retrievers import DEFAULT_SIMILARITY_TOP_K, DEFAULT_USER_ID_KEY, PBRRetriever
from .salience import SalienceNodePostprocessor

__all__ = [
    "DEFAULT_SIMILARITY_TOP_K",
    "DEFAULT_USER_ID_KEY",
    "EXPLANATION_KEY",
    "LocalGemmaLLM",
    "LocalMiniLMEmbedding",
    "PBRAnchorEvent",
    "PBRDegradedEvent",
    "PBREvent",
    "PBRFusionEvent",
    "PBRMemoryBlock",
    "PBRPseudoUtterancesEvent",
    "PBRReasoningEvent",
    "PBRResultsEvent",
    "PBRRetriever",
    "SalienceNodePostprocessor",
    "tag_nodes",
]
