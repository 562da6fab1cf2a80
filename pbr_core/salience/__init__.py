"""Bayes-factor salience of memory items under a causal LM (spec §3; Qin et al., 2026).

A memory item ``c`` is salient for a query ``q`` when it makes the query more likely::

    Sal_q(c; q) = log p(q | c) − log p(q)          (nats; the pointwise mutual information)

Both terms are teacher-forced log-probabilities of the query's tokens after one prompt template:
``log p(q | c)`` fills the template's memory slot with ``c``, ``log p(q)`` leaves the slot empty,
so whatever the template itself does to the query cancels in the difference. One forward pass
per item plus one for the empty slot: ``N + 1`` scored sequences for ``N`` candidates, batched.

One concept per module; import everything from here:

* ``protocol``: :class:`LogProbScorer` (``model_id`` and ``logprobs(contexts, targets)``),
  :class:`TokenLogProbs` and the prompt layout :class:`SalienceTemplate`.
* ``hf_scorer``: :class:`TransformersLogProbScorer`, the scorer over any Hugging Face causal LM.
* ``loading``: :func:`default_scorer`, that scorer on the embedded Gemma 3 270M in fp32.
* ``score``: :func:`salience` (summed and per-token-mean log Bayes factor, numpy arrays);
  :func:`oracle_salience` and :func:`oracle_focus_set` for evaluation with a reference answer.
* ``select``: :func:`rerank` (by salience alone, or fused with the dense score by
  reciprocal-rank fusion or a z-score sum) and :func:`gate` (use memory only when
  ``max Sal_q > τ``; the items above ``τ``, capped, in chronological order).
* ``postprocess``: :func:`select_by_salience`, the one call the LangChain and LlamaIndex
  adapters make.

:class:`~pbr_core.errors.NonFiniteLogProbError` lives in :mod:`pbr_core.errors`.
torch and transformers are imported inside functions: importing this package costs neither.

Use:
    .. code-block:: python

        from pbr_core.salience import default_scorer, gate, rerank, salience

        scorer = default_scorer()                       # Gemma 3 270M, fp32 (loads once)
        s = salience(scorer, "What should I eat before my long run?", texts)
        s.sum, s.mean                                   # (n,) float64 arrays, nats
        ranked = rerank(hits, s, method="rrf")          # hits: SearchHit list from a dense search
        decision = gate(texts, s, tau=0.05, max_items=3, timestamps=times)
        decision.open, decision.selected, decision.reason
"""

from __future__ import annotations

from ..errors import NonFiniteLogProbError
from .hf_scorer import TransformersLogProbScorer
from .loading import default_scorer
from .postprocess import SELECT_OPTIONS, SalienceSelection, as_scorer, select_by_salience
from .postprocess import Mode as Mode
from .protocol import DEFAULT_TEMPLATE, LogProbScorer, SalienceTemplate, TokenLogProbs
from .score import Reduction as Reduction
from .score import SalienceScores, oracle_focus_set, oracle_salience, salience
from .select import GateDecision, Reranked, RerankMethod, gate, rerank

__all__ = [
    "DEFAULT_TEMPLATE",
    "SELECT_OPTIONS",
    "GateDecision",
    "LogProbScorer",
    "NonFiniteLogProbError",
    "RerankMethod",
    "Reranked",
    "SalienceScores",
    "SalienceSelection",
    "SalienceTemplate",
    "TokenLogProbs",
    "TransformersLogProbScorer",
    "as_scorer",
    "default_scorer",
    "gate",
    "oracle_focus_set",
    "oracle_salience",
    "rerank",
    "salience",
    "select_by_salience",
]
