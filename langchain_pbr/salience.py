"""LangChain document compressor: Bayes-factor salience re-ranking and memory gating (spec §3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.runnables import (
    Runnable,
    RunnableLambda,
    RunnableParallel,
    RunnablePassthrough,
)
from pydantic import ConfigDict, Field, field_validator

from pbr_core.salience import (
    SELECT_OPTIONS,
    GateDecision,
    SalienceSelection,
    as_scorer,
    select_by_salience,
)

__all__ = ["SalienceCompressor"]


class SalienceCompressor(BaseDocumentCompressor):
    """Re-rank or gate retrieved documents by ``Sal_q(c; q) = log p(q | c) − log p(q)``.

    A document is salient when it makes the query more likely under a small causal LM (one
    teacher-forced forward pass per document plus one for the empty memory slot, batched). Two
    modes:

    * ``mode="rerank"``: order the documents by salience, alone (``method="salience"``) or fused
      with the retriever's score (``"rrf"``, ``"zsum"``; the dense score is read from
      ``metadata[dense_score_key]``, e.g. what ``PBRRetriever`` puts in ``metadata["score"]``
      with ``config=PBRConfig(explain="scores")``);
      keep ``top_n``.
    * ``mode="gate"``: use memory only if the best per-token salience exceeds ``tau``; return
      the documents above ``tau`` (at most ``max_items``) in chronological order
      (``metadata[timestamp_key]``), or nothing when the gate stays closed.

    Every returned document is a copy whose metadata gains ``salience`` (nats),
    ``salience_mean`` (nats per query token) and, in re-rank mode, ``rerank_score``. The input
    documents are not modified. Nothing is stored per request: one instance serves any number of
    queries and users, sync, async and batched.

    Setup:
        .. code-block:: bash

            pip install 'personalize-before-retrieve[langchain,local]'

    Instantiate:
        .. code-block:: python

            from langchain_pbr.salience import SalienceCompressor

            compressor = SalienceCompressor(top_n=5)                  # embedded Gemma 270M
            compressor = SalienceCompressor(scorer=my_scorer, method="rrf")
            gate = SalienceCompressor(mode="gate", tau=0.05, max_items=3)

    Compress:
        .. code-block:: python

            docs = compressor.compress_documents(docs, "What should I eat before my run?")
            docs[0].metadata["salience"]

    Async:
        .. code-block:: python

            docs = await compressor.acompress_documents(docs, query)   # scored in a thread

    Use after any retriever (LCEL):
        .. code-block:: python

            chain = compressor.after(retriever)          # Runnable[str, list[Document]]
            chain.invoke("What should I eat before my run?")

    Use in ``ContextualCompressionRetriever`` (``langchain-classic``):
        .. code-block:: python

            from langchain_classic.retrievers import ContextualCompressionRetriever

            r = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=retriever)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    scorer: Any = Field(
        default=None,
        description="A pbr_core.salience.LogProbScorer; None loads the embedded Gemma 270M "
        "(fp32) on first use.",
    )
    mode: Literal["rerank", "gate"] = "rerank"
    method: Literal["salience", "rrf", "zsum"] = "salience"
    top_n: int | None = Field(default=None, ge=1, description="Re-rank mode: documents kept.")
    rrf_k: int = Field(default=60, ge=0)
    weight: float = Field(default=0.5, ge=0.0, le=1.0, description="Salience's share when fused.")
    tau: float = Field(default=0.0, description="Gate threshold, in units of `reduction`.")
    max_items: int | None = Field(default=5, ge=1, description="Gate mode: documents kept.")
    reduction: Literal["sum", "mean"] = Field(
        default="mean", description="Gate mode: per-token mean (default) or summed salience."
    )
    dense_score_key: str = "score"
    timestamp_key: str | None = "timestamp"

    @field_validator("scorer")
    @classmethod
    def _check_scorer(cls, value: Any) -> Any:
        return value if value is None else as_scorer(value)

    def _timestamps(self, docs: Sequence[Document]) -> list[Any] | None:
        key = self.timestamp_key
        return None if key is None else [d.metadata.get(key) for d in docs]

    def select(
        self,
        documents: Sequence[Document],
        query: str,
        *,
        mode: Literal["rerank", "gate"] | None = None,
    ) -> SalienceSelection:
        """Score and re-rank / gate ``documents`` for ``query``; positions refer to the input.

        ``mode`` overrides the compressor's own for this call.
        """
        docs = list(documents)
        options = {name: getattr(self, name) for name in SELECT_OPTIONS}
        if mode is not None:
            options["mode"] = mode
        key = self.timestamp_key
        dense = [d.metadata.get(self.dense_score_key) for d in docs]
        zsum = options["mode"] == "rerank" and options["method"] == "zsum"
        if zsum and docs and any(v is None for v in dense):
            raise ValueError(
                f"method='zsum' fuses salience with each document's "
                f"metadata[{self.dense_score_key!r}], which these documents lack: a PBRRetriever "
                "writes it with config=PBRConfig(explain='scores') (or 'first', 'all'); or use "
                "method='rrf', which only needs the input order"
            )
        return select_by_salience(
            self.scorer,
            query,
            [d.page_content for d in docs],
            dense_scores=dense,
            timestamps=None if key is None else [d.metadata.get(key) for d in docs],
            timestamp_source=f"Document.metadata[{key!r}]",
            **options,
        )

    def decide(self, documents: Sequence[Document], query: str) -> GateDecision[Document]:
        """The gate's decision for ``documents`` (whatever ``mode`` is): open, selection, reason."""
        docs = list(documents)
        decision = self.select(docs, query, mode="gate").decision
        assert decision is not None  # gate mode always decides
        return decision.take(docs)

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
    ) -> Sequence[Document]:
        """Re-ranked (top ``top_n``) or gated copies of ``documents`` with salience metadata.

        No documents: returns ``[]`` without running the LM. An empty query raises
        ``ValueError``; an LM that yields NaN raises ``NonFiniteLogProbError``.
        """
        docs = list(documents)
        if not docs:
            return []
        sel = self.select(docs, query)
        sal = sel.salience
        out: list[Document] = []
        for pos, score in zip(sel.indices.tolist(), sel.scores.tolist()):
            extra: dict[str, Any] = {
                "salience": float(sal.sum[pos]),
                "salience_mean": float(sal.mean[pos]),
            }
            if sel.reranked is not None:
                extra["rerank_score"] = float(score)
            doc = docs[pos]
            out.append(doc.model_copy(update={"metadata": {**doc.metadata, **extra}}))
        return out

    def after(self, retriever: Runnable[str, list[Document]]) -> Runnable[str, list[Document]]:
        """``retriever`` followed by this compressor, as one ``Runnable[str, list[Document]]``.

        The LCEL equivalent of ``ContextualCompressionRetriever`` without ``langchain-classic``:
        the query goes to the retriever and, unchanged, to the compressor. Config (callbacks,
        ``configurable`` such as a ``user_id``) reaches the retriever as usual.
        """

        def _compress(inputs: dict[str, Any]) -> list[Document]:
            return list(self.compress_documents(inputs["docs"], inputs["query"]))

        async def _acompress(inputs: dict[str, Any]) -> list[Document]:
            return list(await self.acompress_documents(inputs["docs"], inputs["query"]))

        step = RunnableLambda(_compress, afunc=_acompress, name="SalienceCompressor")
        return RunnableParallel(docs=retriever, query=RunnablePassthrough()) | step
