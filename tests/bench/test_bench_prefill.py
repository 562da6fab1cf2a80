"""Bench.prefill: every prompt the runs will send is generated once, in batches, into the cache."""

from __future__ import annotations

from pathlib import Path

from test_bench_baselines import CountingEncoder

from pbr_bench.datasets import Dataset, Doc, Query, UserCorpus
from pbr_bench.embed import EmbeddingCache
from pbr_bench.runner import Bench
from pbr_core.cache import GenerationCache

UTTERANCES = "1. do I roast the beets again?\n2. kale chips tonight?"


class BatchingGenerator:
    """A completion-style local model stand-in that records the batches it was given."""

    model_id = "test/batching"
    prompt_style = "completion"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.single_calls = 0

    def generate(self, prompt: str) -> str:
        self.single_calls += 1
        return UTTERANCES

    def generate_batch(self, prompts: list[str]) -> list[str]:
        self.batches.append(list(prompts))
        return [UTTERANCES for _ in prompts]


def tiny_dataset() -> Dataset:
    docs = {
        "ann": ["kale salad for lunch", "roasted beets", "a long run at dawn", "oat porridge"],
        "ben": ["sushi omakase", "ghost pepper sauce", "street tacos"],
    }
    corpora = {
        u: UserCorpus(u, [Doc(f"{u}{i}", t) for i, t in enumerate(texts)])
        for u, texts in docs.items()
    }
    queries = [
        Query(f"q{i}", user, text, "cat", [[f"{user}0"]])
        for i, (user, text) in enumerate(
            [("ann", "what should I cook?"), ("ann", "a dinner idea?"), ("ben", "spicy food?")]
        )
    ]
    return Dataset("tiny", corpora, queries)


def make_bench(tmp_path: Path, gen: BatchingGenerator) -> Bench:
    cache = EmbeddingCache("fake", CountingEncoder(), cache_dir=tmp_path / "emb")
    return Bench(
        tiny_dataset(),
        generator=gen,
        llm_name="batching",
        embeddings=cache,
        generation_cache=GenerationCache(tmp_path / "gen.jsonl"),
        k=3,
    )


def test_prefill_batches_every_prompt_once_and_the_run_reads_only_the_cache(
    tmp_path: Path,
) -> None:
    gen = BatchingGenerator()
    bench = make_bench(tmp_path, gen)
    generated = bench.prefill(["pbr", "pbr-safe", "hyde"], batch_size=4)
    # 3 questions x (utterance + reasoning prompt) shared by both PBR modes, + 3 HyDE prompts
    assert generated == 9
    assert [len(b) for b in gen.batches] == [4, 4, 1]
    assert len({p for b in gen.batches for p in b}) == 9
    for method in ("pbr", "pbr-safe", "hyde"):
        run = bench.run(method, progress=False)
        assert set(run.rankings) == {"q0", "q1", "q2"}
    assert gen.single_calls == 0  # nothing left to generate one by one
    assert bench.prefill(["pbr", "hyde"], batch_size=4) == 0  # a re-run generates nothing


def test_prefill_skips_methods_without_an_llm_and_authors_generations(tmp_path: Path) -> None:
    gen = BatchingGenerator()
    bench = make_bench(tmp_path, gen)
    assert bench.prefill(["plain", "bm25", "pbr-no-prf"]) == 0
    assert gen.batches == []
    bench.llm_name = "authors"  # their generations are given, never generated
    assert bench.prefill(["pbr"]) == 0
    assert gen.batches == []


def test_prefill_generates_thinkqe_second_calls_in_a_second_batched_round(tmp_path: Path) -> None:
    # ThinkQE's second prompt holds the items its first expansion retrieved, so it can only be
    # built once the first answers exist: prefill batches the first calls, then the second.
    gen = BatchingGenerator()
    bench = make_bench(tmp_path, gen)
    generated = bench.prefill(["thinkqe"], batch_size=8)
    assert generated == 6  # 3 questions x 2 calls
    first, second = gen.batches
    assert len(first) == len(second) == 3
    assert all("Document: " not in p for p in first)
    assert all("Document: " in p for p in second)  # the retrieved items are in the prompt
    run = bench.run("thinkqe", progress=False)
    assert set(run.rankings) == {"q0", "q1", "q2"}
    assert gen.single_calls == 0
    assert bench.prefill(["thinkqe"]) == 0
