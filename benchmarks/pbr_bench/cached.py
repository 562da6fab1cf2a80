"""Benches that score LLM answers from the generation cache only (a miss is an error, never a
new generation): what the benchmark scripts use to rescore runs made earlier."""

from __future__ import annotations

from collections.abc import Iterator

from pbr_core import GenerationCache, PBRConfig, Personalizer

from .datasets import Dataset, Query
from .embed import EmbeddingCache
from .histories import Built
from .runner import Bench, CachedEmbedder, generation_cache_of

__all__ = [
    "CacheOnly",
    "answered_by_each_llm",
    "answers_cached",
    "cache_only_personalizer",
    "cached_bench",
    "cached_questions",
    "local_ids",
]


class CacheOnly:
    """Serves a local model's cached generations under its model id; a miss is an error."""

    prompt_style = "completion"

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.misses = 0  # prompts asked for that the cache did not hold

    def generate(self, prompt: str) -> str:
        self.misses += 1
        raise LookupError(
            f"no cached {self.model_id} generation for this prompt; run python -m pbr_bench"
        )


def cache_only_personalizer(
    built: Built,
    emb_cache: EmbeddingCache,
    model_id: str,
    gen_cache: GenerationCache | None = None,
) -> Personalizer:
    """The library's default pipeline over ``built``'s windowed store, its answers only from
    the generation cache of ``model_id`` (``gen_cache`` when the caller has it open already;
    what the hybrid LLM benchmarks score)."""
    return Personalizer(
        CachedEmbedder(emb_cache),
        CacheOnly(model_id),
        config=PBRConfig(),
        store=built.windowed,
        cache=gen_cache if gen_cache is not None else generation_cache_of(model_id),
    )


def answered_by_each_llm(
    built: Built, emb_cache: EmbeddingCache
) -> Iterator[tuple[str, Personalizer, list[Query]]]:
    """Per local LLM: its label, :func:`cache_only_personalizer` over ``built``, and the
    questions whose every ungated answer it has cached (the ones a script may score)."""
    for llm, model_id in local_ids().items():
        gen_cache = generation_cache_of(model_id)  # read once, shared with the personalizer
        personalizer = cache_only_personalizer(built, emb_cache, model_id, gen_cache)
        answered = [
            q
            for q in built.queries
            if answers_cached(personalizer, gen_cache, model_id, q.user_id, q.text)
        ]
        yield llm, personalizer, answered


def local_ids() -> dict[str, str]:
    """The generation-cache model ids of the two local LLMs, as their bench runs created them."""
    from .llms import harness_generator

    return {
        "gemma-270m": harness_generator("local").model_id,
        "smollm2-135m": harness_generator("smollm2").model_id,
    }


def cached_questions(
    ds: Dataset, name: str, model_id: str, limit: int | None, seed: int = 0
) -> tuple[Bench | None, int]:
    """A bench over the questions whose every P-PRF answer of ``model_id`` is cached (``None``
    when there are none), and how many questions were asked for: score only what the LLM
    answered; never generate here.

    The prompts checked are those of the ungated pipeline (``"safe"`` fusion without
    ``pre_gate``): with the pre-generation gate a question it skips asks for no prompt, so it
    would pass as cached without the answers that always-call and the paper's fusion need.
    """
    bench = Bench(ds, generator=CacheOnly(model_id), llm_name=name, limit=limit, seed=seed)
    cache = bench.generation_cache
    assert cache is not None
    total = len(bench.queries)
    bench.queries = [
        q
        for q in bench.queries
        if answers_cached(bench.personalizer, cache, model_id, q.user_id, q.text)
    ]
    print(f"{ds.name} {name}: {len(bench.queries)} of {total} questions have cached answers")
    return (bench if bench.queries else None), total


def answers_cached(
    personalizer: Personalizer,
    cache: GenerationCache,
    model_id: str,
    user_id: str,
    query: str,
) -> bool:
    """Whether every P-PRF answer of ``model_id`` for this question is in ``cache``, for the
    prompts of the ungated pipeline (``"safe"`` fusion without ``pre_gate``, see
    :func:`cached_questions`); a question that asks for no prompt counts as cached."""
    prompts = ungated_prompts(personalizer, user_id, query)
    return all(cache.get(model_id, prompt) is not None for prompt in prompts)


def ungated_prompts(personalizer: Personalizer, user_id: str, query: str) -> tuple[str, ...]:
    """The P-PRF prompts of the ungated pipeline (``"safe"`` fusion without ``pre_gate``): the
    ones a question needs cached to be scored, whatever the gate then decides."""
    ungated = personalizer.config.with_(fusion="safe", pre_gate=None)
    return tuple(personalizer.feedback_prompts(user_id, query, config=ungated) or ())


def cached_bench(
    ds: Dataset, name: str, model_id: str, limit: int | None, seed: int = 0
) -> Bench | None:
    """:func:`cached_questions`' bench alone."""
    return cached_questions(ds, name, model_id, limit, seed)[0]
