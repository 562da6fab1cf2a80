"""pbr_core: Personalize Before Retrieve (PBR), framework-free.

PBR rewrites the *query vector* for one user before searching that user's own corpus: pseudo
feedback written by an LLM in the user's style (P-PRF), the PageRank centre of the user's history
(P-Anchor), and a query-adaptive fusion of both with the query.
"""

from .anchor import AnchorResult, compute_anchor, knn_graph, pagerank
from .cache import GenerationCache
from .config import FUSION_MODES, FusionMode, PBRConfig
from .errors import (
    EmbeddingError,
    GenerationError,
    LLMTimeoutError,
    PBRError,
    PersistenceError,
    UnknownUserError,
    VectorStoreUnavailableError,
)
from .executor import LLMExecutor
from .fusion import FusionResult, fuse
from .history import HistoryItem, HistoryStore, UserHistory
from .pipeline import (
    Explanation,
    HistoryVectorSearch,
    PersonalizedQuery,
    Personalizer,
    PseudoFeedback,
    SearchResult,
    UnknownUserPolicy,
)
from .prf import CHAT_PROMPTS, COMPLETION_PROMPTS, PromptSet, parse_reasoning, parse_utterances
from .protocols import (
    AsyncEmbedder,
    AsyncTextGenerator,
    Embedder,
    SearchHit,
    TextGenerator,
    VectorSearch,
)

__all__ = [
    "CHAT_PROMPTS",
    "COMPLETION_PROMPTS",
    "FUSION_MODES",
    "AnchorResult",
    "AsyncEmbedder",
    "AsyncTextGenerator",
    "Embedder",
    "EmbeddingError",
    "Explanation",
    "FusionMode",
    "FusionResult",
    "GenerationCache",
    "GenerationError",
    "HistoryItem",
    "HistoryStore",
    "HistoryVectorSearch",
    "LLMExecutor",
    "LLMTimeoutError",
    "PBRConfig",
    "PBRError",
    "PersistenceError",
    "PersonalizedQuery",
    "Personalizer",
    "PromptSet",
    "PseudoFeedback",
    "SearchHit",
    "SearchResult",
    "TextGenerator",
    "UnknownUserError",
    "UnknownUserPolicy",
    "UserHistory",
    "VectorSearch",
    "VectorStoreUnavailableError",
    "compute_anchor",
    "fuse",
    "knn_graph",
    "pagerank",
    "parse_reasoning",
    "parse_utterances",
]
