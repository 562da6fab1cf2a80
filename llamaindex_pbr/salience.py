"""LlamaIndex node postprocessor: Bayes-factor salience re-ranking and memory gating (spec §3)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from llama_index.core.bridge.pydantic import Field, field_validator
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from pbr_core.salience import SELECT_OPTIONS, SalienceSelection, as_scorer, select_by_salience

__all__ = ["SalienceNodePostprocessor"]

dispatcher = get_dispatcher(__name__)

# Added to every returned node's metadata; hidden from the LLM prompt and from embeddings.
_META_KEYS = ("salience", "salience_mean", "retrieval_score")


class SalienceNodePostprocessor(BaseNodePostprocessor):
    """Re-rank or gate retrieved nodes by ``Sal_q(c; q) = log p(q | c) − log p(q)``.

    A node is salient when it makes the query more likely under a small causal LM (one
    teacher-forced forward pass per node plus one for the empty memory slot, batched). Two
    modes:

    * ``mode="rerank"``: order by salience alone (``method="salience"``) or fused with the
      retrieval score ``NodeWithScore.score`` (``"rrf"``, ``"zsum"``); keep ``top_n``.
    * ``mode="gate"``: use memory only if the best per-token salience exceeds ``tau``; return
      the nodes above ``tau`` (at most ``max_items``) in chronological order
      (``metadata[timestamp_key]``), or no node when the gate stays closed.

    Returned nodes are new ``NodeWithScore`` objects whose ``score`` is the score that ranked
    them (re-rank) or the gate score (gate), wrapping *copies* of the nodes whose metadata gains
    ``salience`` (nats), ``salience_mean`` (nats per query token) and ``retrieval_score`` (the
    incoming score). Those keys are excluded from the LLM and embedding views of the node, and
    the docstore's nodes are never modified. The text scored is the node's content without
    metadata (``MetadataMode.NONE``).

    Instantiate:
        .. code-block:: python

            from llamaindex_pbr.salience import SalienceNodePostprocessor

            pp = SalienceNodePostprocessor(top_n=5)                 # embedded Gemma 270M
            pp = SalienceNodePostprocessor(scorer=my_scorer, method="rrf")
            gate = SalienceNodePostprocessor(mode="gate", tau=0.05, max_items=3)

    Use in a query engine:
        .. code-block:: python

            engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[pp])
            engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[pp])

    Direct / async:
        .. code-block:: python

            nodes = pp.postprocess_nodes(nodes, query_str="What should I eat before my run?")
            nodes = await pp.apostprocess_nodes(nodes, query_str=q)   # scored in a thread
    """

    scorer: Any = Field(
        default=None,
        description="A pbr_core.salience.LogProbScorer; None loads the embedded Gemma 270M "
        "(fp32) on first use.",
        exclude=True,
    )
    mode: Literal["rerank", "gate"] = "rerank"
    method: Literal["salience", "rrf", "zsum"] = "salience"
    top_n: int | None = Field(default=None, ge=1, description="Re-rank mode: nodes kept.")
    rrf_k: int = Field(default=60, ge=0)
    weight: float = Field(default=0.5, ge=0.0, le=1.0, description="Salience's share when fused.")
    tau: float = Field(default=0.0, description="Gate threshold, in units of `reduction`.")
    max_items: int | None = Field(default=5, ge=1, description="Gate mode: nodes kept.")
    reduction: Literal["sum", "mean"] = Field(
        default="mean", description="Gate mode: per-token mean (default) or summed salience."
    )
    timestamp_key: str | None = "timestamp"

    @field_validator("scorer")
    @classmethod
    def _check_scorer(cls, value: Any) -> Any:
        return value if value is None else as_scorer(value)

    @classmethod
    def class_name(cls) -> str:
        return "SalienceNodePostprocessor"

    def select(self, nodes: Sequence[NodeWithScore], query: str) -> SalienceSelection:
        """Score and re-rank / gate ``nodes`` for ``query``; positions refer to the input."""
        nodes = list(nodes)
        key = self.timestamp_key
        return select_by_salience(
            self.scorer,
            query,
            [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes],
            dense_scores=[n.score for n in nodes],
            timestamps=None if key is None else [n.node.metadata.get(key) for n in nodes],
            timestamp_source=f"node.metadata[{key!r}]",
            **{name: getattr(self, name) for name in SELECT_OPTIONS},
        )

    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError(
                "SalienceNodePostprocessor needs the query: call postprocess_nodes(nodes, "
                "query_str=...) or query_bundle=QueryBundle(...)"
            )
        if not nodes:
            return []
        model_name = getattr(self.scorer, "model_id", "default")
        dispatcher.event(
            ReRankStartEvent(
                query=query_bundle,
                nodes=nodes,
                top_n=self.top_n or len(nodes),
                model_name=model_name,
            )
        )
        with self.callback_manager.event(
            CBEventType.RERANKING,
            payload={
                EventPayload.NODES: nodes,
                EventPayload.MODEL_NAME: model_name,
                EventPayload.QUERY_STR: query_bundle.query_str,
                EventPayload.TOP_K: self.top_n,
            },
        ) as event:
            sel = self.select(nodes, query_bundle.query_str)
            out = [
                _with_salience(nodes[pos], score, sel, pos)
                for pos, score in zip(sel.indices.tolist(), sel.scores.tolist())
            ]
            event.on_end(payload={EventPayload.NODES: out})
        dispatcher.event(ReRankEndEvent(nodes=out))
        return out


def _with_salience(
    nws: NodeWithScore, score: float, sel: SalienceSelection, pos: int
) -> NodeWithScore:
    """A new NodeWithScore over a copy of the node with the salience in (hidden) metadata."""
    node = nws.node
    meta = {
        **node.metadata,
        "salience": float(sel.salience.sum[pos]),
        "salience_mean": float(sel.salience.mean[pos]),
        "retrieval_score": nws.score,
    }
    hide = [k for k in _META_KEYS if k not in node.excluded_llm_metadata_keys]
    hide_embed = [k for k in _META_KEYS if k not in node.excluded_embed_metadata_keys]
    copy = node.model_copy(
        update={
            "metadata": meta,
            "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys, *hide],
            "excluded_embed_metadata_keys": [*node.excluded_embed_metadata_keys, *hide_embed],
        }
    )
    return NodeWithScore(node=copy, score=float(score))
