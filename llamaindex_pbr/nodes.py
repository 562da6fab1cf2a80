"""LlamaIndex nodes in and out of a user's corpus: type translation only.

In: a node's user is the view's (a view adds its own user's nodes only), else, when a base adds
everyone's nodes (``from_defaults``), the node's ``metadata[user_id_key]``; the index gets copies
(yours are not modified) tagged for the corpus, embedded as LlamaIndex embeds (text and
metadata, ``MetadataMode.EMBED``). Out: pbr's ranked records as the user's nodes, their own ids
and the mode's score; with ``PBRConfig.explain`` beyond ``"none"`` also both legs and the
explanation in metadata hidden from the LLM and embeddings.
:func:`tag_nodes` is the public way to tag nodes for a user before you build your own
``VectorStoreIndex``: the user key is hidden from the embedder and the LLM as pbr hides it.
Ownership and validation are :class:`pbr_core.corpus.Corpus`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from hashlib import sha256
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, TextNode

from pbr_core import HistoryItem
from pbr_core.adapters_support import (
    EXPLANATION_KEY,
    SCORE_KEY,
    SEARCH_KEY,
    owner_of,
    result_metadata,
)
from pbr_core.config import ExplainMode
from pbr_core.corpus import RAW_SCORE_KEY, ScoredRecord, check_user_id, held_item_id

from ._bridge import with_keys
from .stores import user_node

__all__ = [
    "DEFAULT_USER_ID_KEY",
    "HIDDEN_KEYS",
    "Batch",
    "aembed_missing",
    "batch_of",
    "embed_missing",
    "item_groups",
    "kept",
    "result_nodes",
    "tag_nodes",
    "tagged_copies",
]

#: The node metadata key that says whose node it is.
DEFAULT_USER_ID_KEY = "user_id"

#: pbr's per-result metadata: never embedded, never shown to the LLM.
HIDDEN_KEYS = (EXPLANATION_KEY, RAW_SCORE_KEY, SEARCH_KEY)

#: What :meth:`pbr_core.corpus.Corpus.add_many` takes: items, vectors and nodes per user.
Batch = tuple[dict[str, list[HistoryItem]], dict[str, list[list[float]]], dict[str, list[BaseNode]]]


def _user_key_hidden(node: BaseNode, user_key: str, update: Mapping[str, Any]) -> BaseNode:
    """A copy of ``node`` with ``update`` and ``user_key`` hidden from embeddings and the LLM."""
    return node.model_copy(
        update={
            **update,
            "excluded_embed_metadata_keys": with_keys(node.excluded_embed_metadata_keys, user_key),
            "excluded_llm_metadata_keys": with_keys(node.excluded_llm_metadata_keys, user_key),
        }
    )


def tag_nodes(
    nodes: Sequence[BaseNode], user_id: str, *, user_id_key: str = DEFAULT_USER_ID_KEY
) -> list[BaseNode]:
    """Copies of ``nodes`` tagged as ``user_id``'s for pbr, the way pbr tags them itself.

    ``TextNode(metadata={"user_id": "alice"})`` alone makes LlamaIndex embed ``user_id: alice``
    into the node's vector (and show it to the LLM): a ``VectorStoreIndex`` built from such
    nodes ranks differently from ``PBRRetriever.from_defaults(nodes=...)``, which leaves the key
    out. The copies set ``metadata[user_id_key]`` and list the key in
    ``excluded_embed_metadata_keys`` and ``excluded_llm_metadata_keys``; yours are not modified.

    Args:
        nodes: the user's nodes (any ``BaseNode``); a node already tagged for another user is
            refused (``ValueError``), never re-tagged.
        user_id: their user (a non-empty string).
        user_id_key: the metadata key of the user (``PBRRetriever``'s ``user_id_key``).
    """
    user = check_user_id(user_id)
    out: list[BaseNode] = []
    for node in nodes:
        if not isinstance(node, BaseNode):
            raise TypeError(f"tag_nodes takes LlamaIndex nodes, got {type(node).__name__}")
        # a None under the key names no user, as a missing key (the one owner rule)
        owner = owner_of(node.metadata, user, user_id_key, f"node {node.node_id!r}", "")
        if owner != user:
            raise ValueError(
                f"node {node.node_id!r} is tagged {user_id_key}={owner!r}, not {user!r}: "
                "tag each user's nodes with their own user"
            )
        metadata = {**node.metadata, user_id_key: user}
        out.append(_user_key_hidden(node, user_id_key, {"metadata": metadata}))
    return out


def tagged_copies(
    nodes: Sequence[BaseNode], user_key: str, view_user: str | None, *, own_only: bool
) -> tuple[list[BaseNode], list[str]]:
    """Copies of ``nodes`` (the user key hidden from embeddings) and the user each is for."""
    copies: list[BaseNode] = []
    users: list[str] = []
    for node in nodes:
        if own_only and view_user is not None:
            user = view_user  # the corpus refuses a node whose metadata names another user
        else:
            fix = f"set node.metadata[{user_key!r}] or add through retriever.for_user('u1')"
            user = owner_of(node.metadata, view_user, user_key, f"node {node.node_id!r}", fix)
        copies.append(_user_key_hidden(node, user_key, {}))
        users.append(user)
    return copies, users


def _unembedded(copies: Sequence[BaseNode]) -> tuple[list[BaseNode], list[str]]:
    todo = [n for n in copies if n.embedding is None]
    return todo, [n.get_content(metadata_mode=MetadataMode.EMBED) for n in todo]


def embed_missing(copies: Sequence[BaseNode], embed_model: BaseEmbedding) -> None:
    """Embed the copies that carry no embedding, in one batch (as an index insert would)."""
    todo, texts = _unembedded(copies)
    if todo:
        for node, vector in zip(todo, embed_model.get_text_embedding_batch(texts)):
            node.embedding = vector


async def aembed_missing(copies: Sequence[BaseNode], embed_model: BaseEmbedding) -> None:
    """Async :func:`embed_missing` (the model's native async batch)."""
    todo, texts = _unembedded(copies)
    if todo:
        for node, vector in zip(todo, await embed_model.aget_text_embedding_batch(texts)):
            node.embedding = vector


def item_groups(
    copies: Sequence[BaseNode], users: Sequence[str], *, held: bool = False
) -> dict[str, list[HistoryItem]]:
    """The tagged copies as the corpus's items, one group per user. ``held``: nodes an index
    holds already (read from its docstore); one pbr wrote is its user's item of the id its
    metadata names (:func:`~pbr_core.corpus.held_item_id`), not of its scoped node id."""
    groups: dict[str, list[HistoryItem]] = {}
    for node, user in zip(copies, users):
        text = node.get_content(metadata_mode=MetadataMode.NONE)
        item_id = (held_item_id(node.node_id, node.metadata) if held else None) or node.node_id
        groups.setdefault(user, []).append(HistoryItem(item_id, text, node.metadata))
    return groups


def batch_of(
    copies: Sequence[BaseNode], users: Sequence[str], groups: dict[str, list[HistoryItem]]
) -> Batch:
    """The corpus batch of embedded, tagged copies: their :func:`item_groups` ``groups``, with
    each group's vectors and nodes."""
    vectors: dict[str, list[list[float]]] = {}
    extras: dict[str, list[BaseNode]] = {}
    for node, user in zip(copies, users):
        vectors.setdefault(user, []).append(node.get_embedding())
        extras.setdefault(user, []).append(node)
    return groups, vectors, extras


class AnnotatedTextNode(TextNode):
    """A result ``TextNode`` whose :attr:`hash` leaves out pbr's per-request annotations.

    LlamaIndex identifies a node's content by ``node.hash`` (``QueryFusionRetriever`` fuses and
    de-duplicates by it), and ``TextNode.hash`` covers the metadata, where pbr puts this query's
    explanation and scores: the same node would hash differently for every query and never be
    fused. It serialises as a plain ``TextNode`` (same ``class_name``).
    """

    @property
    def hash(self) -> str:
        kept = {k: v for k, v in self.metadata.items() if k not in HIDDEN_KEYS}
        return sha256((str(self.text) + str(kept)).encode("utf-8", "surrogatepass")).hexdigest()


def _annotated(node: BaseNode) -> BaseNode:
    if type(node) is not TextNode:  # another node type keeps its own hash (rarely a result)
        return node
    return AnnotatedTextNode.model_construct(_fields_set=node.model_fields_set, **dict(node))


def kept(results: Sequence[ScoredRecord], stored: Mapping[str, BaseNode]) -> list[ScoredRecord]:
    """The results the host still holds (``stored``), in rank order."""
    return [r for r in results if r.key in stored]


def result_nodes(
    results: Sequence[ScoredRecord],
    stored: Mapping[str, BaseNode],
    mode: str,
    explanation: Mapping[str, Any],
    explain: ExplainMode = "none",
) -> list[NodeWithScore]:
    """pbr's ranking as the user's nodes, each with its ``score``; ``stored`` maps store keys to
    the host's nodes (a result the host no longer holds was deleted since the query started: left
    out, see :func:`kept`). The stored metadata gets what :attr:`PBRConfig.explain` adds
    (:func:`~pbr_core.adapters_support.result_metadata`; the score is the node's own, not a
    metadata key), hidden from the LLM and embeddings."""
    out: list[NodeWithScore] = []
    for scored in kept(results, stored):
        node = user_node(stored[scored.key], scored.hit.id)
        extra = result_metadata(len(out), scored, mode, explain, explanation)
        extra.pop(SCORE_KEY, None)  # NodeWithScore.score
        if not extra:  # the node as stored: nothing per query to hide or to leave out of hash
            out.append(NodeWithScore(node=node, score=scored.hit.score))
            continue
        metadata = {**node.metadata, **extra}
        copied = node.model_copy(
            update={
                "metadata": metadata,
                "excluded_llm_metadata_keys": with_keys(
                    node.excluded_llm_metadata_keys, *HIDDEN_KEYS
                ),
                "excluded_embed_metadata_keys": with_keys(
                    node.excluded_embed_metadata_keys, *HIDDEN_KEYS
                ),
            }
        )
        out.append(NodeWithScore(node=_annotated(copied), score=scored.hit.score))
    return out
