"""The default scorer: the embedded Gemma 3 270M in fp32, loaded once per process.

Kept apart from the scorer so that wrapping a model of your own never loads the embedded one.
Cost: the first load takes a few seconds (~1 minute and ~3 GB RAM if the packaged GGUF has never
been converted); scoring runs at ~5 sequences per second on 2 quiet CPU cores.
"""

from __future__ import annotations

import functools
from typing import Any

from .hf_scorer import TransformersLogProbScorer
from .protocol import DEFAULT_TEMPLATE, SalienceTemplate

__all__ = ["default_scorer"]


def _default_lm() -> tuple[Any, Any]:
    try:
        from pbr_core.models import load_causal_lm
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            f"default_scorer needs pbr_core.models and the 'local' extra ({exc}); install "
            "torch==2.13.0 first (the CPU wheel: `--index-url "
            "https://download.pytorch.org/whl/cpu`), then "
            "`pip install 'personalize-before-retrieve[local]'`"
        ) from exc
    return load_causal_lm(dtype="float32")


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
    # One scorer per setting however it is spelled (a template as text or object, arguments
    # by position or keyword): lru_cache alone keys on the spelling.
    if isinstance(template, str):
        template = SalienceTemplate(memory_block=template)
    return _default_scorer(template, batch_size, max_item_tokens)


@functools.lru_cache(maxsize=8)
def _default_scorer(
    template: SalienceTemplate, batch_size: int, max_item_tokens: int
) -> TransformersLogProbScorer:
    model, tok = _default_lm()
    return TransformersLogProbScorer(
        model,
        tok,
        template=template,
        batch_size=batch_size,
        max_item_tokens=max_item_tokens,
        model_id="gemma-3-270m-q4_k_m/fp32",
    )
