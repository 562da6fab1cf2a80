"""An LLM that hangs, raises or talks nonsense: what the user of ``search`` sees.

Real pbr_core objects throughout; fake generators only inject the fault. Timeouts are short
(``llm_timeout_s`` well under a second) so the suite stays fast; bounds on wall time are generous
(what is asserted is "returns", not a latency).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import HashEmbedder, ScriptedGenerator

from pbr_core import (
    COMPLETION_PROMPTS,
    GenerationCache,
    GenerationError,
    LLMExecutor,
    LLMTimeoutError,
    PBRConfig,
    Personalizer,
    PseudoFeedback,
    parse_reasoning,
    parse_utterances,
)
from pbr_core.adapters_support import explanation_events, explanation_payload
from pbr_core.cache import generation_key
from pbr_core.prf import split_inline_list
from pbr_core.results import missing_terms

UTTER = '{"candidates": ["I could roast some beets tonight", "maybe kale chips again"]}'
REASON = "Step 1: the user cooks vegetables. Step 2: they want a dinner idea."
TIMEOUT = 0.3
FAST = PBRConfig(fusion="paper", llm_timeout_s=TIMEOUT)
NESTED = "[" * 5000 + "]" * 5000
USER = "alice@example.com"


def make(generator, *, config: PBRConfig = FAST, **kwargs) -> Personalizer:
    p = Personalizer(HashEmbedder(), generator, config=config, **kwargs)
    p.add_texts(USER, ["kale salad", "roasted beets", "morning run", "oat porridge"])
    return p


#: A wall-clock bound that only tells a hang from a wait: the waits themselves are checked by
#: what the executor asked for (:func:`waits`), not by the clock of a shared, noisy machine.
HANG = TIMEOUT + 10.0


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Every timeout the LLM executor passes to a wait, sync and async, in order."""
    import pbr_core.executor as executor_mod

    asked: list[float | None] = []
    real_wait, real_async_wait = executor_mod.futures_wait, asyncio.wait

    def recording_wait(fs, timeout=None, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(timeout)
        return real_wait(fs, timeout=timeout, **kwargs)

    async def recording_async_wait(fs, *, timeout=None, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(timeout)
        return await real_async_wait(fs, timeout=timeout, **kwargs)

    monkeypatch.setattr(executor_mod, "futures_wait", recording_wait)
    monkeypatch.setattr(executor_mod.asyncio, "wait", recording_async_wait)
    return asked


def assert_waited_within(asked: list[float | None], timeout: float) -> None:
    """The executor waited, and no wait was longer than ``timeout`` (the request's budget)."""
    assert asked, "the executor never waited"
    assert all(t is not None and t <= timeout + 1e-6 for t in asked), asked


def assert_request_waited_within(asked: list[float | None], timeout: float) -> None:
    """A sync request whose every call hangs waits, one call after the other, at most
    ``timeout`` in all: the calls share one deadline (a wait of ``timeout`` per call would take
    that many times longer). (Where a call returns early, the next may ask for more than what
    is left of the sum; every test using this hangs all its calls.)"""
    assert_waited_within(asked, timeout)
    assert sum(t for t in asked if t is not None) <= timeout + 1e-6, asked


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """What a hung LLM waits for; released at the end of the test, whatever happens."""
    event = threading.Event()
    yield event
    event.set()


class Hanging(ScriptedGenerator):
    """A sync LLM that blocks until the gate opens."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(UTTER, REASON)
        self.gate = gate
        self.started = 0

    def generate(self, prompt: str) -> str:
        self.started += 1
        self.gate.wait()
        return super().generate(prompt)


class AsyncHanging(ScriptedGenerator):
    """A native async LLM that never answers (until cancelled)."""

    def __init__(self) -> None:
        super().__init__(UTTER, REASON)
        self.cancelled = 0

    async def agenerate(self, prompt: str) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return prompt


class Answering(ScriptedGenerator):
    """Answers every prompt with the same text (or object)."""

    def __init__(self, answer: object) -> None:
        super().__init__(UTTER, REASON)
        self.answer = answer

    def generate(self, prompt: str):  # type: ignore[no-untyped-def]
        self.prompts.append(prompt)
        return self.answer


def dropped_both(p: Personalizer, **kwargs) -> dict[str, str]:
    result = p.search(USER, "dinner?", k=2, **kwargs)
    assert len(result.hits) == 2  # the search still answers, with the plain query's terms
    expl = result.personalized.explanation
    assert expl.used == ("query", "anchor")
    return expl.dropped


# -- a hung LLM --------------------------------------------------------------------------------
def test_a_hung_llm_times_out_and_the_search_answers(
    gate: threading.Event, waits: list[float | None]
) -> None:
    p = make(Hanging(gate))
    start = time.monotonic()
    dropped = dropped_both(p)
    assert time.monotonic() - start < HANG
    assert_request_waited_within(waits, TIMEOUT)
    assert dropped["utterances"] == f"the LLM call timed out after {TIMEOUT:g} s"
    assert dropped["reasoning"] == f"the LLM call timed out after {TIMEOUT:g} s"
    with pytest.raises(LLMTimeoutError, match=r"timed out after 0\.3 s") as info:
        p.search(USER, "dinner?", strict=True)
    assert isinstance(info.value, GenerationError)


async def test_a_hung_native_async_llm_is_cancelled_at_the_timeout(
    waits: list[float | None],
) -> None:
    gen = AsyncHanging()
    p = make(gen)
    start = time.monotonic()
    result = await p.asearch(USER, "dinner?", k=2)
    assert time.monotonic() - start < HANG
    assert_waited_within(waits, TIMEOUT)
    assert "timed out after 0.3 s" in result.personalized.explanation.dropped["reasoning"]
    await asyncio.sleep(0.05)
    assert gen.cancelled == 2  # a coroutine is stopped, so its slots are free again
    assert p.llm_executor.in_flight == 0


async def test_a_hung_sync_llm_in_async_code_leaves_asyncio_s_default_executor_alone(
    gate: threading.Event,
) -> None:
    # The default executor has min(32, cpus + 4) threads; the issue filled it with 3 requests.
    p = make(Hanging(gate), config=FAST.with_(max_concurrent_llm_calls=64))
    results = await asyncio.gather(*(p.asearch(USER, f"dinner {i}?") for i in range(20)))
    for r in results:
        assert "timed out" in r.personalized.explanation.dropped["utterances"]
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), timeout=2) == "free"


async def test_cancelling_a_request_frees_it_at_once(gate: threading.Event) -> None:
    p = make(Hanging(gate), config=FAST.with_(llm_timeout_s=None))  # waits forever
    start = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(p.asearch(USER, "dinner?"), timeout=0.2)
    # no timeout of its own: the cancel ends it at once (generous for a loaded machine; a
    # request that held on after the cancel for seconds fails it)
    assert time.monotonic() - start < 2.5
    assert p.llm_executor.in_flight == 2  # the two sync calls still run, holding their slots
    # The threads cannot be killed: they finish in the background once the LLM answers, and
    # hand their slots back.
    gate.set()
    for _ in range(100):
        if p.llm_executor.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert p.llm_executor.in_flight == 0


def test_requests_beyond_the_slots_wait_at_most_the_timeout_and_say_why(
    gate: threading.Event, waits: list[float | None]
) -> None:
    p = make(Hanging(gate), config=FAST.with_(max_concurrent_llm_calls=2))
    first = p.search(USER, "dinner?").personalized.explanation  # both slots now hang
    assert "timed out" in first.dropped["utterances"]
    waits.clear()
    again = p.search(USER, "lunch?").personalized.explanation
    assert "all 2 LLM call slots were busy" in again.dropped["utterances"]
    assert_request_waited_within(waits, TIMEOUT)  # a slot is waited for within the timeout


# -- one personalizer's stuck LLM does not slow another ----------------------------------------
def test_a_hung_llm_does_not_slow_another_personalizer(gate: threading.Event) -> None:
    hung = make(Hanging(gate), config=FAST.with_(llm_timeout_s=5.0))
    instant = make(ScriptedGenerator(UTTER, REASON))
    assert hung.llm_executor is not instant.llm_executor
    # 8 hung requests (16 hung calls: every slot of the hung personalizer's executor)
    blockers = [threading.Thread(target=hung.search, args=(USER, f"q{i}")) for i in range(8)]
    for t in blockers:
        t.start()
    deadline = time.monotonic() + 5
    while hung.generator.started < 16 and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    start = time.monotonic()
    for i in range(20):
        expl = instant.search(USER, f"dinner {i}?").personalized.explanation
        assert expl.dropped == {}, expl.dropped
    assert time.monotonic() - start < 10.0
    gate.set()
    for t in blockers:
        t.join(timeout=10)


async def test_a_hung_llm_does_not_slow_another_personalizer_under_gather() -> None:
    hung_gen = AsyncHanging()
    hung = make(hung_gen, config=FAST.with_(llm_timeout_s=2.0))
    instant = make(ScriptedGenerator(UTTER, REASON))
    start = time.monotonic()
    hung_tasks = [asyncio.ensure_future(hung.asearch(USER, f"q{i}")) for i in range(8)]
    fast = await asyncio.gather(*(instant.asearch(USER, f"dinner {i}?") for i in range(20)))
    assert time.monotonic() - start < 10.0
    assert all(r.personalized.explanation.dropped == {} for r in fast)
    assert not any(t.done() for t in hung_tasks)  # still waiting for their own stuck LLM
    for r in await asyncio.gather(*hung_tasks):
        assert "timed out after 2 s" in r.personalized.explanation.dropped["utterances"]


def test_personalizers_over_one_store_share_one_executor() -> None:
    # The adapters build a personalizer per request over shared state: they share the limit.
    p = make(ScriptedGenerator(UTTER, REASON))
    view = Personalizer(HashEmbedder(), store=p.store, config=FAST)
    assert view.llm_executor is p.llm_executor
    assert p.llm_executor.max_concurrent == FAST.max_concurrent_llm_calls
    own = LLMExecutor(3)
    assert Personalizer(HashEmbedder(), store=p.store, llm_executor=own).llm_executor is own
    with pytest.raises(ValueError, match="max_concurrent"):
        LLMExecutor(0)


def test_the_llm_timeout_is_validated() -> None:
    # 1e10 s is beyond what a thread may wait: a sync request failed with OverflowError
    for bad in (0, -1, float("nan"), float("inf"), "30", 1e10):
        with pytest.raises(ValueError, match="llm_timeout_s"):
            PBRConfig(llm_timeout_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_concurrent_llm_calls"):
        PBRConfig(max_concurrent_llm_calls=0)
    assert PBRConfig().llm_timeout_s == 30.0 and PBRConfig(llm_timeout_s=None).llm_timeout_s is None


# -- an LLM that raises or answers nonsense -----------------------------------------------------
def test_an_llm_that_raises_degrades_with_the_reason_and_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(ScriptedGenerator):
        def generate(self, prompt: str) -> str:
            raise AttributeError("'NoneType' object has no attribute 'choices'")

    p = make(Broken(UTTER, REASON))
    with caplog.at_level(logging.WARNING, logger="pbr"):
        dropped = dropped_both(p)
    assert "AttributeError: 'NoneType' object has no attribute 'choices'" in dropped["utterances"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].name == "pbr.pipeline"
    message = warnings[0].getMessage()
    assert "degraded" in message and "AttributeError" in message
    assert USER not in message and "dinner" not in message
    assert hashlib.sha256(USER.encode()).hexdigest()[:8] in message


class RaisesWithin(ScriptedGenerator):
    """A sync LLM (one prompt at a time, or both in one batch) raising ``exc`` from inside."""

    def __init__(self, exc: BaseException, batch: bool = False) -> None:
        super().__init__(UTTER, REASON)
        self.exc = exc
        if batch:
            self.generate_batch = self._raise

    def generate(self, prompt: str) -> str:
        raise self.exc

    def _raise(self, prompts: list[str]) -> list[str]:
        raise self.exc


@pytest.mark.parametrize("batch", [False, True], ids=["two-calls", "batch"])
@pytest.mark.parametrize(
    "exc", [StopIteration(), asyncio.CancelledError("client cancelled")], ids=repr
)
async def test_an_llm_raising_stopiteration_or_cancellederror_degrades_alike_sync_and_async(
    exc: BaseException, batch: bool
) -> None:
    # StopIteration (next() on an empty stream) once hung asearch; an asyncio CancelledError
    # raised inside the call passed for the cancellation of the request
    p = make(RaisesWithin(exc, batch), config=PBRConfig(fusion="paper", llm_timeout_s=None))
    sync = dropped_both(p)
    result = await asyncio.wait_for(p.asearch(USER, "dinner?", k=2), timeout=10)
    assert result.personalized.explanation.dropped == sync
    assert type(exc).__name__ in sync["utterances"] and "RuntimeError" in sync["utterances"]


async def test_an_embedder_raising_stopiteration_is_an_error_not_a_missing_result() -> None:
    class Stops(HashEmbedder):
        def embed_query(self, text: str) -> list[float]:
            raise StopIteration

    p = Personalizer(Stops(), ScriptedGenerator(UTTER, REASON), config=FAST)
    p.add_texts(USER, ["kale salad", "roasted beets"])
    with pytest.raises(RuntimeError, match="raised StopIteration"):
        p.search(USER, "dinner?")
    with pytest.raises(RuntimeError, match="raised StopIteration"):
        await asyncio.wait_for(p.asearch(USER, "dinner?"), timeout=10)


async def test_a_cancelled_coroutine_keeps_its_slot_until_it_has_stopped() -> None:
    release = asyncio.Event()

    async def slow_to_stop(prompt: str) -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()  # cleans up for a while before it stops
            raise
        return "never"

    executor = LLMExecutor(1)
    with pytest.raises(LLMTimeoutError):
        await executor.acall_async(slow_to_stop, "p", timeout=0.05)
    assert executor.in_flight == 1  # still running: the slot is still taken
    release.set()
    for _ in range(100):
        if executor.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert executor.in_flight == 0


def test_a_good_request_and_given_feedback_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    p = make(ScriptedGenerator(UTTER, REASON))
    with caplog.at_level(logging.WARNING, logger="pbr"):
        p.search(USER, "dinner?")
        p.search(USER, "dinner?", feedback=PseudoFeedback(["roast beets with thyme"], "notes"))
    assert [r for r in caplog.records if r.name.startswith("pbr")] == []


@pytest.mark.parametrize(
    "answer",
    [NESTED, '{"candidates": ' + NESTED + "}", "```json\n" + NESTED + "\n```"],
    ids=["bare", "in-object", "fenced"],
)
def test_deeply_nested_brackets_degrade_instead_of_raising(answer: str) -> None:
    assert parse_utterances(answer).items == ()
    assert parse_reasoning(answer).items == ()
    dropped = dropped_both(make(Answering(answer)))
    assert set(dropped) == {"utterances", "reasoning"}
    with pytest.raises(GenerationError):
        make(Answering(answer)).search(USER, "dinner?", strict=True)


def test_a_parser_that_raises_anyway_degrades_the_term(monkeypatch: pytest.MonkeyPatch) -> None:
    import pbr_core.pipeline as pipeline

    def explode(*args: object, **kwargs: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(pipeline, "parse_utterances", explode)
    result = make(ScriptedGenerator(UTTER, REASON)).search(USER, "dinner?")
    expl = result.personalized.explanation
    assert expl.dropped["utterances"] == (
        "the LLM answer could not be parsed: RecursionError: maximum recursion depth exceeded"
    )
    assert "reasoning" in expl.used


@pytest.mark.parametrize(
    "answer",
    [
        bytes(range(256)) * 4,
        (bytes(range(256)) * 4).decode("latin-1"),
        "\x00\x01\x02\x7f" * 500,
        "#$%^&*(){}<>|~" * 200,
    ],
    ids=["bytes", "latin-1", "control", "symbols"],
)
def test_garbage_degrades_with_a_reason(answer: object) -> None:
    dropped = dropped_both(make(Answering(answer)))
    assert set(dropped) == {"utterances", "reasoning"}
    assert all(reason for reason in dropped.values())


def test_an_answer_of_another_type_is_a_failure() -> None:
    dropped = dropped_both(make(Answering({"text": "hi"})))
    assert "the LLM returned dict, not text" in dropped["utterances"]


def test_an_answer_that_echoes_the_prompt_never_raises() -> None:
    class Echo(ScriptedGenerator):
        def generate(self, prompt: str) -> str:
            return prompt

    # Only the prompt: parsed like any answer (an echoing LLM such as LlamaIndex's MockLLM
    # keeps working); the template's placeholder "..." is not taken for an utterance.
    for strict in (False, True):
        result = make(Echo(UTTER, REASON)).search(USER, "dinner?", k=2, strict=strict)
        assert len(result.hits) == 2
        assert "..." not in result.personalized.explanation.pseudo_utterances

    class EchoThenAnswer(ScriptedGenerator):  # what return_full_text pipelines do
        prompt_style = "completion"

        def generate(self, prompt: str) -> str:
            return prompt + " roast beets with thyme tonight\n2. kale chips in the oven"

    expl = make(EchoThenAnswer(UTTER, REASON)).search(USER, "dinner?").personalized.explanation
    assert expl.pseudo_utterances == ["roast beets with thyme tonight", "kale chips in the oven"]
    assert expl.reasoning is not None and "Here are some past messages" not in expl.reasoning


def test_a_huge_answer_is_cut_before_parsing() -> None:
    lines = "\n".join(f"{i}. something I might say number {i}" for i in range(1, 200_001))
    start = time.monotonic()
    expl = make(Answering(lines)).search(USER, "dinner?").personalized.explanation
    assert time.monotonic() - start < 10.0
    assert len(expl.pseudo_utterances) == FAST.num_utterances
    assert expl.reasoning is not None and len(expl.reasoning) <= FAST.max_answer_chars + 3
    huge = "word " * 2_000_000  # 10 MB without a single line break
    expl = make(Answering(huge)).search(USER, "dinner?").personalized.explanation
    assert expl.reasoning is not None and len(expl.reasoning) <= FAST.max_answer_chars


# -- the cache keeps only what parsed -----------------------------------------------------------
def test_an_unparsable_answer_is_not_cached(tmp_path) -> None:
    path = tmp_path / "gen.jsonl"
    broken = Answering(NESTED)
    broken.model_id = ScriptedGenerator.model_id  # the same model, recovering later
    dropped_both(make(broken, cache=GenerationCache(path)))
    assert len(GenerationCache(path)) == 0
    # the LLM recovers: the same request now succeeds, and is cached
    good = ScriptedGenerator(UTTER, REASON)
    p = make(good, cache=GenerationCache(path))
    assert p.search(USER, "dinner?").personalized.explanation.dropped == {}
    assert len(good.prompts) == 2 and len(GenerationCache(path)) == 2
    # a restart with the cache file: served from the cache, even with the LLM down again
    down = Answering(NESTED)
    down.model_id = ScriptedGenerator.model_id
    restarted = make(down, cache=GenerationCache(path))
    assert restarted.search(USER, "dinner?").personalized.explanation.dropped == {}
    assert down.prompts == []


def test_a_poisoned_cache_entry_is_ignored_and_generated_again(tmp_path) -> None:
    path = tmp_path / "gen.jsonl"
    good = ScriptedGenerator(UTTER, REASON)
    p = make(good, cache=GenerationCache(path))
    prompts = p.feedback_prompts(USER, "dinner?")
    assert prompts is not None
    poisoned = GenerationCache(path)  # e.g. written by an older version that cached first
    for prompt in prompts:
        poisoned.put(good.model_id, prompt, NESTED)
    p = make(good, cache=GenerationCache(path))
    assert p.search(USER, "dinner?").personalized.explanation.dropped == {}
    assert len(good.prompts) == 2  # asked again, not raised
    again = ScriptedGenerator(UTTER, REASON)
    assert make(again, cache=GenerationCache(path)).search(USER, "dinner?")
    assert again.prompts == []  # the good answers replaced the poisoned ones


def test_a_lone_surrogate_in_an_answer_or_a_prompt_is_cached_and_read_back(tmp_path) -> None:
    path = tmp_path / "gen.jsonl"
    odd = ScriptedGenerator(UTTER.replace("beets", "beets \ud800"), REASON)
    p = make(odd, cache=path)  # a path is a cache file too
    expl = p.search(USER, "dinner?").personalized.explanation
    # the surrogate is dropped from the utterance (no UTF-8 embedder could encode it), and the
    # answer as written is cached: a restarted process reads it back (two spaces, not one)
    kept = "I could roast some beets  tonight"
    assert expl.dropped == {} and kept in expl.pseudo_utterances
    restarted = make(ScriptedGenerator(UTTER, REASON), cache=path)
    assert kept in restarted.search(USER, "dinner?").personalized.explanation.pseudo_utterances
    GenerationCache(path).put("m", "a prompt with \udcff in it", "kept")  # a prompt's, too
    assert GenerationCache(path).get("m", "a prompt with \udcff in it") == "kept"


def test_a_cache_file_torn_inside_a_character_loads_and_the_next_line_survives(tmp_path) -> None:
    path = tmp_path / "gen.jsonl"
    cache = GenerationCache(path)
    cache.put("m", "p1", "one")
    with path.open("ab") as fh:  # a crash mid-write, inside the two bytes of "é"
        fh.write(b'{"key": "x", "model": "m", "text": "caf' + "é".encode()[:1])
    reopened = GenerationCache(path)  # loads, skipping the torn line
    assert len(reopened) == 1
    reopened.put("m", "p3", "three")  # starts on a new line, not glued to the torn one
    assert GenerationCache(path).get("m", "p3") == "three"


def test_a_cache_line_damaged_in_a_way_that_still_parses_is_not_served(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """A flipped bit in a cached text still parses as JSON: its checksum tells, and the line is
    skipped with a warning (before, the damaged text was served). A line written before the
    checksum is read as it is."""
    path = tmp_path / "gen.jsonl"
    GenerationCache(path).put("m", "p1", "vegetarian recipes")
    GenerationCache(path).put("m", "p2", "kale chips")
    data = path.read_bytes()
    path.write_bytes(data.replace(b"vegetarian", b"vegetaRian", 1))
    with path.open("a", encoding="utf-8") as fh:  # an older version's line: no checksum
        fh.write(json.dumps({"key": generation_key("m", "p3"), "model": "m", "text": "old"}))
        fh.write("\n")
    with caplog.at_level("WARNING", logger="pbr"):
        reopened = GenerationCache(path)
    assert reopened.get("m", "p1") is None and "1 damaged line" in caplog.text
    assert reopened.get("m", "p2") == "kale chips" and reopened.get("m", "p3") == "old"


def test_a_cache_write_that_fails_is_logged_and_the_answer_still_used(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a-file").write_text("")
    cache = GenerationCache(tmp_path / "a-file" / "gen.jsonl")  # its folder cannot be made
    with caplog.at_level(logging.WARNING, logger="pbr"):
        cache.put("m", "p", "text")
    assert cache.get("m", "p") == "text"
    assert any("could not write the generation cache" in r.getMessage() for r in caplog.records)


# -- honest flags: degraded (a failure) vs skipped (a choice) -----------------------------------
def test_safe_fusion_choosing_the_plain_query_is_skipped_not_degraded() -> None:
    # The query is one of the user's items: the history gate keeps the plain query on purpose.
    p = make(ScriptedGenerator(UTTER, REASON), config=PBRConfig(llm_timeout_s=TIMEOUT))
    expl = p.search(USER, "kale salad").personalized.explanation
    assert expl.used == ("query",)
    assert set(expl.skipped) == {"anchor", "utterances", "reasoning"}
    assert expl.dropped == expl.skipped  # backward compatible: dropped names every absent term
    payload = explanation_payload(expl)
    assert payload["degraded"] is False and payload["missing"] == {}
    assert "safe fusion kept the plain query" in payload["skipped"]["utterances"]
    assert "pbr.degraded" not in [name for name, _ in explanation_events(expl)]


def test_a_failure_under_safe_fusion_is_degraded(gate: threading.Event) -> None:
    p = make(Hanging(gate), config=PBRConfig(llm_timeout_s=TIMEOUT))
    expl = p.search(USER, "dinner?").personalized.explanation
    payload = explanation_payload(expl)
    assert payload["degraded"] is True
    assert set(payload["missing"]) == {"utterances", "reasoning"}
    assert "timed out" in payload["missing"]["utterances"]
    assert set(payload["skipped"]) == {"anchor"}  # never used alone: a choice


# -- prompts of bounded size ---------------------------------------------------------------------
def test_a_huge_query_is_cut_in_the_prompts_but_embedded_whole() -> None:
    gen = ScriptedGenerator(UTTER, REASON)
    embedder = HashEmbedder()
    seen: list[str] = []
    embed_query = embedder.embed_query
    embedder.embed_query = lambda text: seen.append(text) or embed_query(text)  # type: ignore[method-assign]
    p = Personalizer(embedder, gen, config=FAST)
    p.add_texts(USER, ["kale salad", "roasted beets"])
    query = "what should I cook " + "x" * 1_000_000
    p.search(USER, query)
    assert seen == [query]  # q is the embedding of the whole query
    assert len(gen.prompts) == 2
    for prompt in gen.prompts:
        assert len(prompt) < 3_000
        assert "what should I cook " in prompt and "x" * (FAST.max_query_chars - 30) in prompt
    with pytest.raises(ValueError, match="max_query_chars"):
        PBRConfig(max_query_chars=0)


# -- a numbered list on one line -----------------------------------------------------------------
def test_a_one_line_numbered_list_is_split_into_its_items() -> None:
    got = parse_utterances(
        " roast beets tonight 2. kale chips again 3. a big oat porridge", style="completion"
    )
    assert got.items == ("roast beets tonight", "kale chips again", "a big oat porridge")
    assert parse_utterances("1. alpha one 2. beta two 3. gamma three").items == (
        "alpha one",
        "beta two",
        "gamma three",
    )
    # only markers that count up split the line
    assert split_inline_list("1. we ran 5. km today 2. then ate") == [
        "1. we ran 5. km today",
        "2. then ate",
    ]
    assert split_inline_list("no list here 2. at all") == ["no list here 2. at all"]


def test_a_one_line_list_from_a_completion_model_gives_several_utterances() -> None:
    class OneLine(ScriptedGenerator):
        prompt_style = "completion"

        def generate(self, prompt: str) -> str:
            return " roast beets tonight 2. kale chips again 3. porridge for breakfast"

    p = make(OneLine(UTTER, REASON))
    assert p.prompts_for(p.generator) is COMPLETION_PROMPTS
    expl = p.search(USER, "dinner?").personalized.explanation
    assert expl.pseudo_utterances == [
        "roast beets tonight",
        "kale chips again",
        "porridge for breakfast",
    ]


# -- the executor's bookkeeping ------------------------------------------------------------------
def test_every_slot_comes_back_after_calls_that_time_out_race_and_finish() -> None:
    executor = LLMExecutor(3)

    def work(i: int) -> int:
        time.sleep((i % 5) * 0.01)
        return i

    def client(i: int) -> None:
        executor.call_all([(work, (i,)), (work, (i + 1,))], timeout=0.02 + (i % 3) * 0.01)

    clients = [threading.Thread(target=client, args=(i,)) for i in range(30)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(timeout=10)
    for _ in range(200):
        if executor.in_flight == 0:
            break
        time.sleep(0.01)
    assert executor.in_flight == 0
    assert executor.call(work, 7, timeout=5) == 7


def test_a_worker_thread_that_cannot_start_fails_its_call_and_frees_its_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "can't start new thread" (a process at its thread limit): the error was only logged by
    the slot's callback, the call never completed and the slot was lost for good, so an
    in-process model's request (no timeout) waited forever."""
    real_start = threading.Thread.start
    refused: list[str] = []

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("pbr-llm") and not refused:
            refused.append(thread.name)
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    executor = LLMExecutor(1)
    start_time = time.monotonic()
    (failed,) = executor.call_all([(lambda: "ok", ())], timeout=30)  # None waited forever
    assert isinstance(failed, RuntimeError) and refused
    assert time.monotonic() - start_time < 20  # failed at once, not at the timeout
    assert executor.in_flight == 0
    assert executor.call(lambda: "ok", timeout=5) == "ok"


async def test_a_cancelled_request_whose_sync_llm_fails_later_logs_nothing(
    gate: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    """The call's future was left uncancelled: its later exception was logged by asyncio as
    "Future exception was never retrieved", once per abandoned call."""
    import gc

    class FailsLate(ScriptedGenerator):
        def generate(self, prompt: str) -> str:
            gate.wait(5)
            raise RuntimeError("the API went away")

    p = make(FailsLate(UTTER, REASON), config=FAST.with_(llm_timeout_s=None))
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(p.asearch(USER, "dinner?"), timeout=0.2)
        gate.set()
        for _ in range(100):
            if p.llm_executor.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)  # the loop runs the futures' done-callbacks
        gc.collect()  # a never-retrieved exception is logged when its future is collected
    assert p.llm_executor.in_flight == 0
    assert "never retrieved" not in caplog.text


# -- through an adapter --------------------------------------------------------------------------
def test_a_langchain_retriever_with_a_hung_model_answers_degraded(
    gate: threading.Event, waits: list[float | None]
) -> None:
    from langchain_core.documents import Document
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    from langchain_pbr import PBRRetriever

    class HungChat(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "hung"

        def _generate(self, messages, stop=None, run_manager=None, **kw):  # type: ignore[no-untyped-def]
            gate.wait()
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=UTTER))])

    docs = [
        Document(page_content=t, metadata={"user_id": "alice"})
        for t in ("kale salad", "roasted beets", "morning run")
    ]
    retriever = PBRRetriever.from_documents(
        docs,
        llm=HungChat(),
        embeddings=DeterministicFakeEmbedding(size=32),
        k=2,
        config=FAST.with_(explain="all"),
    )
    # its per-request personalizers share one executor: the limit holds across requests
    assert retriever._personalizer().llm_executor is retriever._personalizer().llm_executor
    start = time.monotonic()
    got = retriever.invoke("dinner?", user_id="alice")
    assert time.monotonic() - start < HANG
    assert_request_waited_within(waits, TIMEOUT)
    pbr = got[0].metadata["pbr"]
    assert pbr["degraded"] is True
    assert pbr["missing"]["utterances"] == f"the LLM call timed out after {TIMEOUT:g} s"


class SlowLocal(ScriptedGenerator):
    """An in-process model (like the embedded Gemma): slower than the timeout, never hung."""

    in_process = True

    def generate(self, prompt: str) -> str:
        time.sleep(TIMEOUT * 2)
        return super().generate(prompt)


def test_an_in_process_model_is_not_timed_out() -> None:
    expl = make(SlowLocal(UTTER, REASON)).search(USER, "dinner?", k=2).personalized.explanation
    assert "utterances" in expl.used and "reasoning" in expl.used
    assert not any("timed out" in reason for reason in expl.dropped.values())


def test_the_embedded_models_adapters_say_they_run_in_process() -> None:
    from langchain_pbr import LocalGemmaChatModel
    from langchain_pbr._bridge import generator_for
    from llamaindex_pbr import LocalGemmaLLM
    from llamaindex_pbr._bridge import LlamaIndexGenerator

    assert generator_for(LocalGemmaChatModel(), None, "completion").in_process  # model not loaded
    assert LlamaIndexGenerator(LocalGemmaLLM()).in_process


@pytest.mark.parametrize(
    ("mode", "utterances_asked"), [("no_utterances", False), ("no_reasoning", True)]
)
def test_a_term_the_fusion_mode_switches_off_is_neither_asked_nor_waited_for(
    mode: str, utterances_asked: bool, gate: threading.Event
) -> None:
    """Before, both P-PRF prompts went to the LLM whatever the mode: the call for the unused
    term held a slot, and one that hung delayed the request by the whole timeout and logged a
    degraded request for a term the mode had switched off."""

    def wanted(prompt: str) -> bool:  # the utterance prompt asks for "candidates"
        return ("candidates" in prompt) == utterances_asked

    class HangsOnTheOther(ScriptedGenerator):
        def generate(self, prompt: str) -> str:
            if not wanted(prompt):
                gate.wait()  # the switched-off term's call would hang
            return super().generate(prompt)

    generator = HangsOnTheOther(UTTER, REASON)
    p = make(generator, config=PBRConfig(fusion=mode, llm_timeout_s=TIMEOUT))  # type: ignore[arg-type]
    for pq in (p.personalize(USER, "dinner?"), asyncio.run(p.apersonalize(USER, "dinner?"))):
        explanation = pq.explanation
        assert explanation.llm_calls == 1 and not missing_terms(explanation)
        assert all(wanted(prompt) for prompt in generator.prompts)


def test_a_bounded_generation_cache_keeps_the_most_recently_used_answers(tmp_path) -> None:
    """``max_entries`` bounds what it holds in memory (the least recently used go first); its
    file keeps every answer."""
    path = tmp_path / "gen.jsonl"
    cache = GenerationCache(path, max_entries=2)
    cache.put("m", "p1", "one")
    cache.put("m", "p2", "two")
    assert cache.get("m", "p1") == "one"  # now the most recently used
    cache.put("m", "p3", "three")
    assert [cache.get("m", p) for p in ("p1", "p2", "p3")] == ["one", None, "three"]
    assert len(GenerationCache(path)) == 3 and len(GenerationCache(path, max_entries=1)) == 1
    with pytest.raises(ValueError, match="max_entries"):
        GenerationCache(max_entries=0)
    cache.put("m", "p1", "one")  # the same answer put again (two requests generated it) is used
    cache.put("m", "p4", "four")
    assert [cache.get("m", p) for p in ("p1", "p3", "p4")] == ["one", None, "four"]
    # an answer dropped from memory and generated again is written again: read back after a
    # restart it counts as used when written last (it counted where first written, and the
    # answer used last was the one dropped)
    cache.put("m", "p2", "two, again")
    again = GenerationCache(path, max_entries=2)
    assert [again.get("m", p) for p in ("p2", "p4")] == ["two, again", "four"]
