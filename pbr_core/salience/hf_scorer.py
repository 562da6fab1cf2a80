"""The scorer over a Hugging Face causal LM: batched, left-padded, fp32 log-softmax.

The one module that runs a model, kept apart so the math and the selection rules can be read
(and tested) without torch. Scores are nats summed over a target's tokens; ``batch_size`` counts
sequences per forward pass, ``max_item_tokens`` tokens per memory item, ``cache_size`` tokenized
memory blocks. torch is imported inside the forward pass: importing this module costs nothing.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from .protocol import DEFAULT_TEMPLATE, SalienceTemplate, TokenLogProbs, _non_finite

__all__ = ["TransformersLogProbScorer"]


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
                per query and bf16 matmuls are slow on CPUs without AVX-512 BF16, notes §7).
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
        self._template = template
        self.batch_size = batch_size
        self._max_item_tokens = max_item_tokens
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

    # Read-only: the tokenized memory blocks are cached by item text alone, so a template or a
    # cut changed after use would mix two templates (or two cuts) in one result.
    @property
    def template(self) -> SalienceTemplate:
        """The prompt template (fixed at construction; build another scorer to change it)."""
        return self._template

    @property
    def max_item_tokens(self) -> int:
        """Memory items are cut to this many tokens (fixed at construction)."""
        return self._max_item_tokens

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
