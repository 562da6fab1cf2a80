"""The P-PRF LLM calls of one request: batched where the model batches, concurrent otherwise.

Every call goes through an :class:`~pbr_core.executor.LLMExecutor` (at most
``PBRConfig.max_concurrent_llm_calls`` in flight, each given up after ``llm_timeout_s``), and a
failure comes back as the answer's value, never raised, so the pipeline drops only that term.
Which prompts need the LLM at all (the generation cache) and what an answer means (parsing) are
the pipeline's business; this module only asks.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Sequence

from .config import PBRConfig
from .executor import LLMExecutor
from .history import HistoryStore
from .protocols import TextGenerator

__all__ = ["Answer", "agenerate", "executor_for", "generate", "timeout_for"]

#: One LLM answer: its text, the failure that replaced it, or None (not asked).
Answer = str | BaseException | None


def generate(
    generator: TextGenerator,
    prompts: Sequence[str],
    todo: Sequence[int],
    executor: LLMExecutor,
    timeout: float | None,
) -> dict[int, Answer]:
    """The answers to ``prompts[i]`` for each ``i`` in ``todo``, concurrently and within
    ``timeout`` seconds (one batched call when the model has ``generate_batch``)."""
    if not todo:
        return {}
    batch = getattr(generator, "generate_batch", None)
    if len(todo) == len(prompts) == 2 and batch is not None:
        (got,) = executor.call_all([(batch, (list(prompts),))], timeout)
        return dict(zip((0, 1), _pair(got)))
    results = executor.call_all([(generator.generate, (prompts[i],)) for i in todo], timeout)
    return {i: _as_text(got) for i, got in zip(todo, results)}


async def agenerate(
    generator: TextGenerator,
    prompts: Sequence[str],
    todo: Sequence[int],
    executor: LLMExecutor,
    timeout: float | None,
) -> dict[int, Answer]:
    """Async :func:`generate`: a native ``agenerate`` is awaited on the event loop and cancelled
    after ``timeout``; a sync-only model, and a local one (``generate_batch``, which computes in
    threads anyway), runs in the executor's own threads, never in asyncio's default executor."""
    if not todo:
        return {}
    batch = getattr(generator, "generate_batch", None)
    abatch = getattr(generator, "agenerate_batch", None)
    native = None if batch is not None else getattr(generator, "agenerate", None)
    if len(todo) == len(prompts) == 2 and (batch is not None or abatch is not None):
        pair = list(prompts)
        try:
            if batch is not None:
                got: object = await executor.acall(batch, pair, timeout=timeout)
            else:
                assert abatch is not None
                got = await executor.acall_async(abatch, pair, timeout=timeout)
        except Exception as exc:
            got = exc
        return dict(zip((0, 1), _pair(got)))
    results = await asyncio.gather(
        *(
            executor.acall_async(native, prompts[i], timeout=timeout)
            if native is not None
            else executor.acall(generator.generate, prompts[i], timeout=timeout)
            for i in todo
        ),
        return_exceptions=True,
    )
    return {i: _as_text(got) for i, got in zip(todo, results)}


def timeout_for(generator: object, config: PBRConfig) -> float | None:
    """``config.llm_timeout_s``, except for a generator that computes in this process
    (``in_process = True``: the embedded Gemma / SmolLM2). Its call cannot hang on a network, and
    its first call loads the model, which can take longer than a remote call's timeout."""
    return None if getattr(generator, "in_process", False) else config.llm_timeout_s


_EXECUTORS: weakref.WeakKeyDictionary[HistoryStore, LLMExecutor] = weakref.WeakKeyDictionary()
_EXECUTORS_LOCK = threading.Lock()


def executor_for(store: HistoryStore, size: int) -> LLMExecutor:
    """The executor of every personalizer over ``store`` that was given none: personalizers are
    cheap views (adapters make one per request), the store is what they share."""
    with _EXECUTORS_LOCK:
        executor = _EXECUTORS.get(store)
        if executor is None:
            executor = _EXECUTORS[store] = LLMExecutor(size)
        return executor


def _as_text(out: object) -> Answer:
    """An LLM's return value as text; bytes are decoded, other types become the failure."""
    if out is None or isinstance(out, str | BaseException):
        return out
    if isinstance(out, bytes | bytearray):
        return bytes(out).decode("utf-8", errors="replace")
    return TypeError(f"the LLM returned {type(out).__name__}, not text")


def _pair(got: object) -> tuple[Answer, Answer]:
    """The two answers of a batched call (or its failure, for both)."""
    if isinstance(got, BaseException):
        return got, got
    if isinstance(got, str | bytes) or not isinstance(got, Sequence) or len(got) != 2:
        size = len(got) if isinstance(got, Sequence) else type(got).__name__
        error = ValueError(f"the batched LLM call returned {size} answers for 2 prompts")
        return error, error
    return _as_text(got[0]), _as_text(got[1])
