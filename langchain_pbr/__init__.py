"""LangChain integration of Personalize Before Retrieve (PBR): a per-user retriever."""

from typing import TYPE_CHECKING, Any

try:  # the `langchain` extra: say so, rather than fail deep inside a submodule
    import langchain_core  # noqa: F401
except ModuleNotFoundError as exc:
    raise ImportError(
        "langchain_pbr needs LangChain: pip install 'personalize-before-retrieve[langchain]'"
    ) from exc

from langchain_pbr.chat_models import LocalGemmaChatModel
from langchain_pbr.retrievers import PBRRetriever
from langchain_pbr.salience import SalienceCompressor

if TYPE_CHECKING:
    from langchain_pbr.memory_store import PBRStore

__all__ = ["LocalGemmaChatModel", "PBRRetriever", "PBRStore", "SalienceCompressor"]


def __getattr__(name: str) -> Any:
    # PBRStore needs langgraph (the `langgraph` extra): imported on first use, so that
    # `import langchain_pbr` works without it.
    if name == "PBRStore":
        try:
            from langchain_pbr.memory_store import PBRStore
        except ModuleNotFoundError as exc:
            if exc.name is None or not exc.name.startswith("langgraph"):
                raise
            raise ImportError(
                "langchain_pbr.PBRStore needs LangGraph: "
                "pip install 'personalize-before-retrieve[langgraph]'"
            ) from exc
        return PBRStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
