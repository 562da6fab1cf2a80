"""The embedded Gemma's own P-PRF prompts and its decoding cost, for the LLM speed scripts.

``gemma_latency.py``, ``vocab_trim.py`` and ``prompt_lookup.py`` time or inspect the prompts that
``Personalizer()`` sends for a few PersonaBench 0.0 questions; they share these two helpers.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import torch

from pbr_core import PBRConfig, Personalizer

from .datasets import load_personabench

__all__ = ["decode_parts", "prompt_pairs"]


def prompt_pairs(queries: int, seed: int) -> list[tuple[str, tuple[str, str]]]:
    """``(question id, (utterance prompt, reasoning prompt))`` as the default pipeline builds."""
    ds = load_personabench("0.0")
    questions = random.Random(seed).sample(ds.scored_queries, queries)
    pbr = Personalizer()
    for user in sorted({q.user_id for q in questions}):
        pbr.add_texts(user, ds.corpora[user].texts, ids=ds.corpora[user].ids)
    no_gate = PBRConfig(pre_gate=None)
    pairs = []
    for q in questions:
        pair = pbr.feedback_prompts(q.user_id, q.text, config=no_gate)
        if pair is not None:
            pairs.append((q.id, pair))
    return pairs


def decode_parts(model: Any, tok: Any, prompts: list[str], steps: int = 20) -> tuple[float, float]:
    """Seconds of the batched prefill, and the median ms of one greedy decoding step after it."""
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(**enc, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        cache, mask = out.past_key_values, enc["attention_mask"]
        ids = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones(len(prompts), 1, dtype=mask.dtype)], dim=1)
            t0 = time.perf_counter()
            out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache, ids = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    return prefill, 1000 * statistics.median(times)
