"""Bayes-factor salience of memory items under a causal LM (spec §3; Qin et al., 2026).

A memory item ``c`` is salient for a query ``q`` when it makes the query more likely::

    Sal_q(c; q) = log p(q | c) − log p(q)          (nats; the pointwise mutual information)

Both terms are teacher-forced log-probabilities of the query's tokens after one prompt template:
``log p(q | c)`` fills the template's memory slot with ``c``, ``log p(q)`` leaves the slot empty,
so whatever the template itself does to the query cancels in the difference. One forward pass
per item plus one for the empty slot: ``N + 1`` scored sequences for ``N`` candidates, batched.

What this module gives:

* :class:`LogProbScorer`, the protocol (``model_id`` and ``logprobs(contexts, targets)``), and
  :class:`TransformersLogProbScorer`, its implementation over any Hugging Face causal LM;
  :func:`default_scorer` builds it on the embedded Gemma 3 270M in fp32.
* :func:`salience` (summed and per-token-mean log Bayes factor, numpy arrays);
  :func:`oracle_salience` and :func:`oracle_focus_set` for evaluation with a reference answer.
* :func:`rerank`: re-order dense-search candidates by salience alone, or fused with the dense
  score by reciprocal-rank fusion or a z-score sum.
* :func:`gate`: use memory only when ``max Sal_q > τ``; hand on the items above ``τ`` (capped)
  in chronological order, with the decision and the scores.

torch and transformers are imported inside functions: importing this module costs neither.

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

import functools
import inspect
import math
import threading
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np

from pbr_core.errors import PBRError
from pbr_core.protocols import SearchHit

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

T = TypeVar("T")
U = TypeVar("U")
RerankMethod = Literal["salience", "rrf", "zsum"]
Reduction = Literal["sum", "mean"]
_METHODS: tuple[str, ...] = ("salience", "rrf", "zsum")
_REDUCTIONS: tuple[str, ...] = ("sum", "mean")


class NonFiniteLogProbError(PBRError, FloatingPointError):
    """The language model produced NaN or ±inf log-probabilities, so no ranking can be trusted."""


# --------------------------------------------------------------------------------------------
# Scorer protocol and prompt template
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenLogProbs:
    """Teacher-forced log-probability of one target text after one prompt.

    Attributes:
        logprob: ``Σ_t log p(target_t | prompt, target_<t)`` in nats (≤ 0).
        num_tokens: how many target tokens the sum runs over.
    """

    logprob: float
    num_tokens: int

    @property
    def mean(self) -> float:
        """Per-token mean log-probability (nats per token)."""
        return self.logprob / self.num_tokens if self.num_tokens else 0.0


@runtime_checkable
class LogProbScorer(Protocol):
    """Scores target texts teacher-forced after a prompt that holds a memory item (no generation).

    ``logprobs(contexts, targets)`` returns, per pair, the summed log-probability of the target's
    tokens and their count. ``contexts[i] == ""`` is the same prompt with an empty memory slot.
    ``conditions`` (optional) is text placed between the memory and the target that is conditioned
    on but not scored; the oracle salience puts the query there and scores the answer.
    ``model_id`` names the model and its settings (it may key a cache).
    """

    model_id: str

    def logprobs(
        self,
        contexts: Sequence[str],
        targets: Sequence[str],
        conditions: Sequence[str] | None = None,
    ) -> list[TokenLogProbs]: ...


@dataclass(frozen=True)
class SalienceTemplate:
    """The prompt layout: ``BOS + memory_block + condition_block + target``.

    ``memory_block`` holds the memory item in ``{memory}``; ``log p(q)`` uses the very same block
    with an empty slot, so the template's own effect on the query cancels in the Bayes factor.
    ``condition_block`` (``{condition}``) is only used when conditions are given (the oracle's
    query before the answer). The target is tokenized on its own, so its tokens are identical in
    every prompt and the conditional and unconditional sums run over the same tokens; blocks
    should therefore end at a natural token boundary (a newline), not in a trailing space.

    The default ``"{memory}\\n"`` makes the empty-slot prompt ``BOS + "\\n"``: a neutral context,
    which the notes (§7) found necessary for SmolLM2, whose BOS is a chat marker.
    """

    memory_block: str = "{memory}\n"
    condition_block: str = "{condition}\n"

    def __post_init__(self) -> None:
        if self.memory_block.count("{memory}") != 1:
            raise ValueError(
                f"memory_block must contain the slot '{{memory}}' exactly once, got "
                f"{self.memory_block!r}"
            )
        if self.condition_block.count("{condition}") != 1:
            raise ValueError(
                f"condition_block must contain the slot '{{condition}}' exactly once, got "
                f"{self.condition_block!r}"
            )

    def memory(self, text: str) -> str:
        """The memory block with ``text`` in the slot (``""`` for the unconditional prompt)."""
        return self.memory_block.replace("{memory}", text)

    def condition(self, text: str) -> str:
        """The condition block with ``text`` in the slot."""
        return self.condition_block.replace("{condition}", text)


DEFAULT_TEMPLATE = SalienceTemplate()


# --------------------------------------------------------------------------------------------
# transformers implementation
# --------------------------------------------------------------------------------------------


class TransformersLogProbScorer:
    """:class:`LogProbScorer` over any Hugging Face causal LM, batched, fp32 log-softmax.

    Each pair becomes ``BOS + memory_block(context) [+ condition_block(condition)] + target``.
    Rows are left-padded with explicit ``position_ids`` (so padding changes nothing), every
    target ends at the last position, and the LM head runs only on the last ``K + 1`` positions
    (``logits_to_keep``; ``K`` = longest target in the batch), which matters with Gemma's
    262k-token vocabulary. Pairs are sorted by length before batching to waste little padding;
    identical pairs within one call are scored once (the empty-slot ``log p(q)`` of a query is
    computed once per call however many times it is asked for).

    Caching: the token ids of each memory block are kept in an LRU keyed by the item's text
    (``cache_size`` entries), so an item is tokenized once per scorer, not once per query.
    The KV cache of the item prefix is *not* reused across queries: within one query every
    item appears once, so reuse would only help when one item is scored against many queries,
    at ~36 KB of KV per token per item for Gemma 270M.

    Memory items longer than ``max_item_tokens`` tokens are cut to that length, with a
    :class:`UserWarning` that says how many were cut. NaN or inf in the model's output raises
    :class:`NonFiniteLogProbError` instead of ranking by garbage.

    The model is put in eval mode (dropout would make scores random). Forward passes of one
    scorer are serialised by a lock: on a small CPU two at once are slower than one by one.

    Instantiate:
        .. code-block:: python

            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path)
            lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            scorer = TransformersLogProbScorer(lm, tok, batch_size=16, max_item_tokens=128)
            scorer.logprobs(["ran 10k this morning", ""], ["What should I eat?"] * 2)
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        template: SalienceTemplate | str = DEFAULT_TEMPLATE,
        batch_size: int = 16,
        max_item_tokens: int = 128,
        *,
        model_id: str | None = None,
        cache_size: int = 4096,
    ) -> None:
        """Wrap ``model`` (a ``*ForCausalLM``) and its ``tokenizer``.

        Args:
            model: a Hugging Face causal LM; fp32 is recommended (bf16 sums drift by ~0.1 nats
                per query and bf16 matmuls are slow on AVX2-only CPUs, notes §7).
            tokenizer: its tokenizer (fast or slow).
            template: a :class:`SalienceTemplate`, or a string used as its ``memory_block``.
            batch_size: sequences per forward pass (4–64 measured equally fast on 2 cores).
            max_item_tokens: memory items are cut to this many tokens (with a warning).
            model_id: a name for the model; defaults to the model's ``name_or_path`` and dtype.
            cache_size: how many tokenized memory blocks to keep.
        """
        if isinstance(template, str):
            template = SalienceTemplate(memory_block=template)
        problems: list[str] = []
        if batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {batch_size}")
        if max_item_tokens < 1:
            problems.append(f"max_item_tokens must be >= 1, got {max_item_tokens}")
        if cache_size < 0:
            problems.append(f"cache_size must be >= 0, got {cache_size}")
        if problems:
            raise ValueError("invalid TransformersLogProbScorer: " + "; ".join(problems))
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.batch_size = batch_size
        self.max_item_tokens = max_item_tokens
        self.cache_size = cache_size
        if callable(getattr(model, "eval", None)):
            model.eval()
        if model_id is None:
            name = (
                getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
            )
            dtype = str(getattr(model, "dtype", "")).replace("torch.", "")
            model_id = f"{name}/{dtype}" if dtype else name
        self.model_id = model_id
        self._bos: list[int] = (
            [] if tokenizer.bos_token_id is None else [int(tokenizer.bos_token_id)]
        )
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id
        self._pad = int(pad) if pad is not None else 0  # masked out: any id will do
        try:
            params = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover - exotic callables
            params = {}  # type: ignore[assignment]
        self._keep_logits = "logits_to_keep" in params
        self._blocks: OrderedDict[str, tuple[list[int], bool]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._infer_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"TransformersLogProbScorer(model_id={self.model_id!r}, batch_size={self.batch_size}, "
            f"max_item_tokens={self.max_item_tokens})"
        )

    # -- tokenization ------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _memory_ids(self, item: str) -> tuple[list[int], bool]:
        """Token ids of the memory block holding ``item`` and whether the item was cut (cached)."""
        with self._cache_lock:
            hit = self._blocks.get(item)
            if hit is not None:
                self._blocks.move_to_end(item)
                return hit
        text, cut = item, False
        if item:
            item_ids = self._encode(item)
            if len(item_ids) > self.max_item_tokens:
                text, cut = self.tokenizer.decode(item_ids[: self.max_item_tokens]), True
        entry = (self._encode(self.template.memory(text)), cut)
        if self.cache_size:
            with self._cache_lock:
                self._blocks[item] = entry
                while len(self._blocks) > self.cache_size:
                    self._blocks.popitem(last=False)
        return entry

    # -- scoring -----------------------------------------------------------------------------

    def logprobs(
        self,
        contexts: Sequence[str],
        targets: Sequence[str],
        conditions: Sequence[str] | None = None,
    ) -> list[TokenLogProbs]:
        """Summed log-probability (nats) and token count of each target after its context.

        Args:
            contexts: memory items, one per pair; ``""`` is the empty memory slot.
            targets: the texts to score (the query for ``Sal_q``, the answer for ``Sal_a``).
            conditions: optional text between memory and target, conditioned on, not scored.

        Raises:
            ValueError: lengths differ, a target is empty, or the prompt would be empty.
            NonFiniteLogProbError: the model produced NaN/inf.
        """
        if isinstance(contexts, str) or isinstance(targets, str):
            raise TypeError("contexts and targets are lists of strings, one entry per pair")
        n = len(contexts)
        if len(targets) != n:
            raise ValueError(f"got {n} contexts but {len(targets)} targets; pass one per pair")
        if conditions is not None and len(conditions) != n:
            raise ValueError(f"got {n} contexts but {len(conditions)} conditions")
        if n == 0:
            return []

        keys: list[tuple[str, str, str]] = [
            (c, "" if conditions is None else conditions[i], targets[i])
            for i, c in enumerate(contexts)
        ]
        unique = list(dict.fromkeys(keys))
        target_ids = {t: self._encode(t) for t in {k[2] for k in unique}}
        for t, ids in target_ids.items():
            if not ids:
                raise ValueError(f"target {t!r} has no tokens; salience needs a non-empty text")
        cond_ids = {c: self._encode(self.template.condition(c)) for c in {k[1] for k in unique}}

        seqs: list[list[int]] = []
        tlens: list[int] = []
        n_cut = 0
        for ctx, cond, tgt in unique:
            block, cut = self._memory_ids(ctx)
            n_cut += cut
            prefix = self._bos + block + (cond_ids[cond] if conditions is not None else [])
            if not prefix:
                raise ValueError(
                    "the prompt before the target is empty (no BOS token and an empty memory "
                    "block); use a template whose memory_block has text besides '{memory}'"
                )
            seqs.append(prefix + target_ids[tgt])
            tlens.append(len(target_ids[tgt]))
        if n_cut:
            warnings.warn(
                f"{n_cut} memory item(s) longer than max_item_tokens={self.max_item_tokens} "
                "tokens were truncated for salience scoring; raise max_item_tokens or split long "
                "items",
                UserWarning,
                stacklevel=2,
            )

        # Longest first: similar lengths share a batch, so little compute goes to padding.
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        sums: list[float] = [0.0] * len(seqs)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            values = self._forward([seqs[i] for i in idx], [tlens[i] for i in idx])
            for i, value in zip(idx, values, strict=True):
                sums[i] = value
        by_key = {k: TokenLogProbs(sums[i], tlens[i]) for i, k in enumerate(unique)}
        return [by_key[k] for k in keys]

    def _forward(self, seqs: list[list[int]], tlens: list[int]) -> list[float]:
        """One left-padded forward pass; summed target log-probs per row."""
        import torch

        rows, width, k = len(seqs), max(map(len, seqs)), max(tlens)
        device = _device(self.model)
        ids = torch.full((rows, width), self._pad, dtype=torch.long)
        att = torch.zeros((rows, width), dtype=torch.long)
        for r, s in enumerate(seqs):  # left padding: every target ends at position width - 1
            ids[r, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            att[r, width - len(s) :] = 1
        pos = (att.cumsum(-1) - 1).clamp(min=0)  # real tokens count 0, 1, 2, ... as unpadded
        kwargs: dict[str, Any] = {
            "input_ids": ids.to(device),
            "attention_mask": att.to(device),
            "position_ids": pos.to(device),
            "use_cache": False,
        }
        if self._keep_logits:
            kwargs["logits_to_keep"] = k + 1
        with self._infer_lock, torch.inference_mode():
            logits = self.model(**kwargs).logits[:, -(k + 1) :].float().cpu()
        # logits at position p predict the token at p + 1: the last k + 1 positions predict the
        # last k tokens (the window holds each row's whole target, right-aligned).
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        picked = logp.gather(-1, ids[:, width - k :].unsqueeze(-1)).squeeze(-1)
        mask = torch.arange(k)[None, :] >= (k - torch.tensor(tlens))[:, None]
        bad = mask & ~torch.isfinite(picked)
        if bool(bad.any()):
            raise _non_finite(self.model_id, int(bad.any(-1).sum()), rows, _dtype(self.model))
        return [float(x) for x in torch.where(mask, picked, torch.zeros_like(picked)).sum(-1)]


def _device(model: Any) -> Any:
    device = getattr(model, "device", None)
    if device is not None:
        return device
    return next(model.parameters()).device


def _dtype(model: Any) -> str:
    return str(getattr(model, "dtype", "unknown")).replace("torch.", "")


def _non_finite(model_id: str, bad: int, total: int, dtype: str) -> NonFiniteLogProbError:
    return NonFiniteLogProbError(
        f"the language model {model_id!r} ({dtype}) produced NaN/inf log-probabilities for "
        f"{bad} of {total} sequence(s); salience cannot rank with them. Load the model in "
        "float32 (fp16/bf16 can overflow) and check that its weights loaded correctly"
    )


def _default_lm() -> tuple[Any, Any]:
    try:
        from pbr_core.models import load_causal_lm
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            f"default_scorer needs pbr_core.models and the 'local' extra ({exc}); install "
            "torch==2.13.0 (CPU) first, then `pip install 'personalize-before-retrieve[local]'`"
        ) from exc
    return load_causal_lm(dtype="float32")


@functools.lru_cache(maxsize=8)
def default_scorer(
    template: SalienceTemplate | str = DEFAULT_TEMPLATE,
    batch_size: int = 16,
    max_item_tokens: int = 128,
) -> TransformersLogProbScorer:
    """A :class:`TransformersLogProbScorer` on the embedded Gemma 3 270M in fp32.

    The model loads once per process (first call: a few seconds, or ~1 minute and ~3 GB RAM if
    the packaged GGUF has never been converted). The same arguments return the same scorer, so
    its tokenized-item cache is shared by every caller (the adapters call this when given no
    scorer). Throughput: ~5 sequences per second on 2 quiet CPU cores (notes §7), several times
    less when other processes compete for the cores; see docs/salience.md, "Cost".
    """
    model, tok = _default_lm()
    return TransformersLogProbScorer(
        model,
        tok,
        template=template,
        batch_size=batch_size,
        max_item_tokens=max_item_tokens,
        model_id="gemma-3-270m-q4_k_m/fp32",
    )


# --------------------------------------------------------------------------------------------
# Salience
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SalienceScores:
    """Log Bayes factors of ``n`` memory items for one query (or, oracle, one answer).

    Attributes:
        query: the query.
        sum: ``log p(q | c_i) − log p(q)`` in nats, shape ``(n,)``. Ranks items for one query.
        mean: the same divided by the number of query tokens (nats per token). Use it for a
            threshold shared across queries of different lengths (the gate does).
        conditional: ``log p(q | c_i)`` summed over the query tokens, shape ``(n,)``.
        unconditional: ``log p(q)`` (empty memory slot); ``None`` when no item was scored.
        num_tokens: query tokens the sums run over (0 when no item was scored).
        answer: for :func:`oracle_salience`, the answer whose tokens were scored (the query
            then sits in the prompt); ``None`` for :func:`salience`.
        model_id: the scorer's model.
    """

    query: str
    sum: np.ndarray
    mean: np.ndarray
    conditional: np.ndarray
    unconditional: float | None
    num_tokens: int
    answer: str | None = None
    model_id: str = ""

    def __len__(self) -> int:
        return int(self.sum.shape[0])

    def get(self, reduction: Reduction = "sum") -> np.ndarray:
        """``sum`` or ``mean`` by name."""
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        return self.sum if reduction == "sum" else self.mean


def _empty(query: str, model_id: str, answer: str | None = None) -> SalienceScores:
    e = np.zeros(0, dtype=np.float64)
    return SalienceScores(query, e, e.copy(), e.copy(), None, 0, answer, model_id)


def _bayes_factor(
    scorer: LogProbScorer,
    query: str,
    target: str,
    items: Sequence[str],
    conditions: bool,
    answer: str | None,
) -> SalienceScores:
    items = _as_texts(items)
    if not items:
        return _empty(query, scorer.model_id, answer)
    contexts = ["", *items]
    targets = [target] * len(contexts)
    if conditions:
        out = scorer.logprobs(contexts, targets, [query] * len(contexts))
    else:
        out = scorer.logprobs(contexts, targets)
    if len(out) != len(contexts):
        raise RuntimeError(
            f"scorer {scorer.model_id!r} returned {len(out)} results for {len(contexts)} pairs"
        )
    lp = np.array([r.logprob for r in out], dtype=np.float64)
    counts = {r.num_tokens for r in out}
    if not np.isfinite(lp).all():
        raise _non_finite(scorer.model_id, int((~np.isfinite(lp)).sum()), len(lp), "scorer output")
    if len(counts) != 1 or 0 in counts:
        raise ValueError(
            f"scorer {scorer.model_id!r} scored the same target with different token counts "
            f"{sorted(counts)}; the target must be tokenized on its own, independent of the prompt"
        )
    n_tok = counts.pop()
    base, cond = float(lp[0]), lp[1:]
    total = cond - base
    return SalienceScores(query, total, total / n_tok, cond, base, n_tok, answer, scorer.model_id)


def salience(scorer: LogProbScorer, query: str, items: Sequence[str]) -> SalienceScores:
    """``Sal_q(c_i; q) = log p(q | c_i) − log p(q)`` for every memory item (spec §3).

    One scorer call with ``N + 1`` sequences: the ``N`` items and the empty memory slot.
    Positive: the item makes the query more likely than no memory at all.

    Args:
        scorer: any :class:`LogProbScorer` (e.g. :func:`default_scorer`).
        query: the user's query; must contain text.
        items: the memory items' texts (e.g. the top-N of a dense search).

    Returns:
        :class:`SalienceScores` with ``sum`` and ``mean`` arrays aligned with ``items``;
        empty arrays (and no LM call) for no items.

    Raises:
        ValueError: the query is empty.
        NonFiniteLogProbError: the LM produced NaN/inf.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError("salience needs a non-empty query; got " + repr(query))
    return _bayes_factor(scorer, query, query, items, conditions=False, answer=None)


def oracle_salience(
    scorer: LogProbScorer, query: str, answer: str, items: Sequence[str]
) -> SalienceScores:
    """Oracle salience ``Sal_a(c_i) = log p(a | q, c_i) − log p(a | q)`` (evaluation only).

    Needs the reference answer, so it can only label data: it measures how much each item helps
    the LM produce the right answer to the query. The prompt is
    ``memory_block(c) + condition_block(q)`` and the answer's tokens are scored.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError("oracle_salience needs a non-empty query; got " + repr(query))
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError("oracle_salience needs a non-empty reference answer; got " + repr(answer))
    return _bayes_factor(scorer, query, answer, items, conditions=True, answer=answer)


def oracle_focus_set(
    scores: SalienceScores | Sequence[float] | np.ndarray,
    tau: float = 0.0,
    max_items: int | None = None,
    reduction: Reduction = "sum",
) -> np.ndarray:
    """Indices of the items whose oracle salience exceeds ``tau``, most salient first.

    With the default ``tau = 0`` this is every item that makes the reference answer more likely
    than no memory; ``max_items`` caps it. An int64 array (possibly empty).
    """
    s = _scores_array(scores, reduction)
    _check_cap(max_items)
    above = np.flatnonzero(s > tau)
    ranked = above[np.argsort(-s[above], kind="stable")]
    return ranked if max_items is None else ranked[:max_items]


def _as_texts(items: Sequence[str]) -> list[str]:
    if isinstance(items, str):
        raise TypeError("items is a list of texts; wrap a single item as [text]")
    out = list(items)
    for i, x in enumerate(out):
        if not isinstance(x, str):
            raise TypeError(f"items[{i}] is {type(x).__name__}, expected str (the item's text)")
    return out


def _scores_array(
    scores: SalienceScores | Sequence[float] | np.ndarray, reduction: Reduction
) -> np.ndarray:
    raw = scores.get(reduction) if isinstance(scores, SalienceScores) else scores
    s = np.asarray(raw, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be one-dimensional, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ValueError(
            "scores contain NaN/inf; compute them with salience(), which checks the LM output"
        )
    return s


def _check_cap(max_items: int | None) -> None:
    if max_items is not None and max_items < 1:
        raise ValueError(f"max_items must be >= 1 or None (no cap), got {max_items}")


# --------------------------------------------------------------------------------------------
# Re-ranking
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reranked(Generic[T]):
    """Candidates in their new order and the scores that decided it.

    Attributes:
        items: the candidates, best first.
        order: ``items[j] is candidates[order[j]]``.
        scores: the score the order was sorted by (salience, RRF score or z-sum), aligned with
            ``items``.
        salience: each item's salience, aligned with ``items``.
        dense: each item's dense score, aligned with ``items`` (``None`` if not given).
        method: ``"salience"``, ``"rrf"`` or ``"zsum"``.
    """

    items: list[T]
    order: np.ndarray
    scores: np.ndarray
    salience: np.ndarray
    dense: np.ndarray | None
    method: str


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, highest value first; ties keep the input order."""
    r = np.empty(len(x), dtype=np.int64)
    r[np.argsort(-x, kind="stable")] = np.arange(1, len(x) + 1)
    return r


def _zscore(x: np.ndarray) -> np.ndarray:
    sd = float(x.std())
    return np.zeros_like(x) if sd == 0.0 or not math.isfinite(sd) else (x - x.mean()) / sd


def rerank(
    candidates: Sequence[T],
    salience: SalienceScores | Sequence[float] | np.ndarray,
    method: RerankMethod = "salience",
    rrf_k: int = 60,
    weight: float = 0.5,
    *,
    dense_scores: Sequence[float] | np.ndarray | None = None,
) -> Reranked[T]:
    """Re-order dense-search candidates by salience, alone or fused with the dense score.

    Methods (higher is better for every score):

    * ``"salience"``: by salience; ties by dense score, then by input order.
    * ``"rrf"``: reciprocal-rank fusion, ``weight / (rrf_k + rank_sal) + (1 − weight) /
      (rrf_k + rank_dense)`` with 1-based ranks. Without dense scores the input order is the
      dense rank (candidates come from a search, best first).
    * ``"zsum"``: ``weight · z(salience) + (1 − weight) · z(dense)``, z-scores over the
      candidates (a constant score has z = 0). Needs dense scores.

    Summed and mean salience give the same order and the same fused scores for one query (they
    differ by a constant factor, which ranks and z-scores ignore).

    Args:
        candidates: the top-N of a dense search, best first; any objects. For
            :class:`~pbr_core.protocols.SearchHit` the dense score is ``hit.score``.
        salience: :class:`SalienceScores` (its ``sum`` is used) or an array aligned with
            ``candidates``.
        method: ``"salience"``, ``"rrf"`` or ``"zsum"``.
        rrf_k: the RRF constant (60, as in Cormack et al. 2009).
        weight: salience's share in ``[0, 1]`` of the fused score.
        dense_scores: the dense scores, if the candidates are not ``SearchHit``.
    """
    items = list(candidates)
    sal = _scores_array(salience, "sum")
    if len(sal) != len(items):
        raise ValueError(f"got {len(items)} candidates but {len(sal)} salience scores")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if rrf_k < 0:
        raise ValueError(f"rrf_k must be >= 0, got {rrf_k}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight is salience's share and must lie in [0, 1], got {weight}")
    dense: np.ndarray | None
    if dense_scores is not None:
        dense = np.asarray(dense_scores, dtype=np.float64)
    elif items and all(isinstance(c, SearchHit) for c in items):
        dense = np.array([c.score for c in items], dtype=np.float64)  # type: ignore[attr-defined]
    else:
        dense = None
    if dense is not None:
        if dense.shape != sal.shape:
            raise ValueError(f"got {len(items)} candidates but dense scores of shape {dense.shape}")
        if not np.isfinite(dense).all():
            raise ValueError("dense scores contain NaN/inf")

    n = len(items)
    if method == "salience":
        score = sal
        tiebreak = -dense if dense is not None else np.zeros(n)
        order = np.lexsort((np.arange(n), tiebreak, -sal))
    else:
        if method == "rrf":
            dense_rank = _ranks(dense) if dense is not None else np.arange(1, n + 1)
            score = weight / (rrf_k + _ranks(sal)) + (1.0 - weight) / (rrf_k + dense_rank)
        else:
            if dense is None:
                raise ValueError(
                    "method='zsum' needs dense scores: pass dense_scores=[...] or SearchHit "
                    "candidates (or use method='rrf', which only needs the input order)"
                )
            score = weight * _zscore(sal) + (1.0 - weight) * _zscore(dense)
        order = np.argsort(-score, kind="stable")
    return Reranked(
        items=[items[i] for i in order],
        order=order.astype(np.int64),
        scores=np.asarray(score, dtype=np.float64)[order],
        salience=sal[order],
        dense=None if dense is None else dense[order],
        method=method,
    )


# --------------------------------------------------------------------------------------------
# Memory gate
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateDecision(Generic[T]):
    """Whether to use memory for a query, and which items.

    Attributes:
        open: ``max(scores) > tau``.
        selected: the items above ``tau`` (the ``max_items`` most salient of them), in
            chronological order when timestamps were given, else in input order. Empty when
            closed.
        indices: positions of ``selected`` in the input, same order.
        scores: every item's score as used by the gate (aligned with the input items).
        tau: the threshold.
        reason: one line that explains the decision.
    """

    open: bool
    selected: list[T]
    indices: np.ndarray
    scores: np.ndarray
    tau: float
    reason: str

    def take(self, items: Sequence[U]) -> GateDecision[U]:
        """The same decision over ``items`` (aligned with the gated ones, e.g. their documents)."""
        if len(items) != len(self.scores):
            raise ValueError(f"the gate saw {len(self.scores)} items, got {len(items)}")
        selected = [items[i] for i in self.indices.tolist()]
        return GateDecision(self.open, selected, self.indices, self.scores, self.tau, self.reason)


def gate(
    items: Sequence[T],
    scores: SalienceScores | Sequence[float] | np.ndarray,
    tau: float = 0.0,
    max_items: int | None = None,
    timestamps: Sequence[Hashable] | None = None,
    *,
    reduction: Reduction = "mean",
) -> GateDecision[T]:
    """Memory gate (spec §3): open iff ``max_c Sal_q(c; q) > tau``.

    Selects the items whose score exceeds ``tau``; if more than ``max_items``, keeps the most
    salient ones. The selection is handed on in chronological order (``timestamps``: any
    mutually comparable values, e.g. datetimes, epoch seconds or ISO strings; ties keep input
    order), else in input order.

    Args:
        items: the memory items (any objects), aligned with ``scores``.
        scores: :class:`SalienceScores` (``reduction`` picks ``mean``, the default, because a
            threshold shared across queries must not depend on query length) or an array.
        tau: the threshold, in the units of the scores (nats per query token for ``mean``).
        max_items: cap on the selection; ``None`` for no cap.
        timestamps: one per item, or ``None``.
        reduction: which :class:`SalienceScores` array to use.
    """
    items = list(items)
    s = _scores_array(scores, reduction)
    _check_cap(max_items)
    if len(s) != len(items):
        raise ValueError(f"got {len(items)} items but {len(s)} scores")
    if timestamps is not None and len(timestamps) != len(items):
        raise ValueError(f"got {len(items)} items but {len(timestamps)} timestamps")
    tau = float(tau)
    if not math.isfinite(tau):
        raise ValueError(f"tau must be a finite number, got {tau}")
    none = np.zeros(0, dtype=np.int64)
    if not items:
        return GateDecision(False, [], none, s, tau, "closed: no memory items to gate")
    best = float(s.max())
    if best <= tau:
        return GateDecision(
            False,
            [],
            none,
            s,
            tau,
            f"closed: max score {best:.4g} <= tau {tau:.4g} over {len(items)} item(s)",
        )
    above = np.flatnonzero(s > tau)
    kept = above[np.argsort(-s[above], kind="stable")]
    if max_items is not None:
        kept = kept[:max_items]
    if timestamps is not None:
        ts = list(timestamps)
        try:
            chosen = sorted(kept.tolist(), key=lambda i: (ts[i], i))
        except TypeError as exc:
            raise TypeError(f"timestamps must be mutually comparable: {exc}") from exc
        order_note = "chronological order"
    else:
        chosen = sorted(kept.tolist())
        order_note = "input order"
    idx = np.asarray(chosen, dtype=np.int64)
    capped = max_items is not None and len(above) > max_items
    cap_note = f", capped at {max_items}" if capped else ""
    reason = (
        f"open: {len(above)} of {len(items)} item(s) above tau {tau:.4g} (max {best:.4g}); "
        f"kept {len(idx)}{cap_note}, in {order_note}"
    )
    return GateDecision(True, [items[i] for i in chosen], idx, s, tau, reason)


# --------------------------------------------------------------------------------------------
# One call for the adapters: score, then re-rank or gate
# --------------------------------------------------------------------------------------------

Mode = Literal["rerank", "gate"]
_MODES: tuple[str, ...] = ("rerank", "gate")


@dataclass(frozen=True)
class SalienceSelection:
    """What :func:`select_by_salience` kept, in output order, with everything it computed.

    Attributes:
        indices: positions (in the input) of the kept items, in output order.
        scores: per kept item, the score that ranked it (re-rank: salience / RRF / z-sum) or
            gated it (gate: the ``reduction`` salience).
        salience: the salience of *every* input item.
        reranked: the full re-ranking (re-rank mode), else ``None``.
        decision: the gate decision (gate mode), else ``None``.
    """

    indices: np.ndarray
    scores: np.ndarray
    salience: SalienceScores
    reranked: Reranked[int] | None = None
    decision: GateDecision[int] | None = None


#: The options of :func:`select_by_salience` that the adapters expose as their own fields.
SELECT_OPTIONS: tuple[str, ...] = (
    "mode",
    "method",
    "top_n",
    "rrf_k",
    "weight",
    "tau",
    "max_items",
    "reduction",
)


def as_scorer(value: Any) -> LogProbScorer:
    """``value`` if it implements :class:`LogProbScorer`; ``None`` gives :func:`default_scorer`."""
    if value is None:
        return default_scorer()
    if not isinstance(value, LogProbScorer):
        raise TypeError(
            "scorer must implement pbr_core.salience.LogProbScorer (a model_id attribute and a "
            f"logprobs(contexts, targets) method), got {type(value).__name__}"
        )
    return value


def _usable_dense(values: Sequence[Any] | np.ndarray | None) -> np.ndarray | None:
    """Dense scores if every item has a real number, else ``None`` (rank by input order)."""
    if values is None:
        return None
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.float64)
    return None


def _usable_timestamps(values: Sequence[Any] | None, what: str) -> list[Hashable] | None:
    """Timestamps if every item has one; none at all: ``None``; some missing: warn, ``None``."""
    if values is None or all(v is None for v in values):
        return None
    if any(v is None for v in values):
        warnings.warn(
            f"only some items have a timestamp ({what}); the gate keeps input order instead of "
            "chronological order",
            UserWarning,
            stacklevel=4,
        )
        return None
    return list(values)


def select_by_salience(
    scorer: LogProbScorer | None,
    query: str,
    texts: Sequence[str],
    *,
    mode: Mode = "rerank",
    method: RerankMethod = "salience",
    top_n: int | None = None,
    rrf_k: int = 60,
    weight: float = 0.5,
    tau: float = 0.0,
    max_items: int | None = None,
    reduction: Reduction = "mean",
    dense_scores: Sequence[float | None] | np.ndarray | None = None,
    timestamps: Sequence[Hashable | None] | None = None,
    timestamp_source: str = "timestamps",
) -> SalienceSelection:
    """Score ``texts`` for ``query``, then re-rank them (keep ``top_n``) or gate them.

    This is the whole post-processing step that the LangChain compressor and the LlamaIndex
    postprocessor run; they only map documents / nodes to texts and back. Re-rank mode: see
    :func:`rerank` (``top_n=None`` keeps all). Gate mode: see :func:`gate` (a closed gate keeps
    nothing).

    Lenient where :func:`rerank` and :func:`gate` are strict, because retrieved items come
    with whatever metadata they have: ``scorer=None`` uses :func:`default_scorer`; dense scores
    with a missing (``None``) entry are ignored (RRF then uses the input order, z-sum fails);
    timestamps with a missing entry are ignored with a warning that names ``timestamp_source``.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if top_n is not None and top_n < 1:
        raise ValueError(f"top_n must be >= 1 or None (keep all), got {top_n}")
    texts = _as_texts(texts)
    if not texts:  # nothing to score: do not load a model for it
        if not isinstance(query, str) or not query.strip():
            raise ValueError("salience needs a non-empty query; got " + repr(query))
        model_id = getattr(scorer, "model_id", "")
        return SalienceSelection(np.zeros(0, dtype=np.int64), np.zeros(0), _empty(query, model_id))
    sal = salience(as_scorer(scorer), query, texts)
    positions = list(range(len(texts)))
    if mode == "rerank":
        dense = _usable_dense(dense_scores)
        ranked = rerank(positions, sal, method, rrf_k, weight, dense_scores=dense)
        keep = len(positions) if top_n is None else top_n
        return SalienceSelection(ranked.order[:keep], ranked.scores[:keep], sal, reranked=ranked)
    times = _usable_timestamps(timestamps, timestamp_source)
    decision = gate(positions, sal, tau, max_items, times, reduction=reduction)
    return SalienceSelection(
        decision.indices, decision.scores[decision.indices], sal, decision=decision
    )
