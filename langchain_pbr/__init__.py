"""LangChain integration of Personalize Before Retrieve (PBR): a per-user retriever."""

from langchain_pbr.chat_models import LocalGemmaChatModel
from langchain_pbr.retrievers import PBRRetriever
from langchain_pbr.salience import SalienceCompressor

__all__ = ["LocalGemmaChatModel", "PBRRetriever", "SalienceCompressor"]
