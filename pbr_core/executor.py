"""Bounded, timed LLM calls: the :class:`LLMExecutor` every P-PRF call goes through.

Why: an LLM that hangs must slow only the requests that wait for it, never block ``search`` for
as long as it hangs, and never starve unrelated work (another :class:`~pbr_core.Personalizer`,
asyncio's default executor). So every LLM call

* holds one of its executor's ``max_concurrent`` slots while it runs (a rate-limited API sees at
  most that many calls in flight; a hung call occupies one slot, of *its* executor only);
* is waited for at most ``timeout`` seconds, counted from the request, the wait for a free slot
  included; after that the caller gets :class:`~pbr_core.errors.LLMTimeoutError` at once.

What "at once" means differs by kind of call:

* a coroutine (a generator's native ``agenerate``) is cancelled, and its slot freed once it
  has stopped (one that cleans up slowly after the cancel still counts);
* a sync call runs in a daemon thread of this executor (never asyncio's default executor). A
  thread cannot be killed: a call that outlives its timeout *finishes in the background*, holding
  its slot until it returns, but the request that waited for it has moved on, and the thread does
  not keep the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures import wait as futures_wait
from typing import Any

from .errors import LLMTimeoutError, call_unstopped

__all__ = ["LLMExecutor"]


class _Slots:
    """A counting semaphore that sync and async callers (of any thread or loop) share, FIFO.

    :meth:`request` returns a future that completes when a slot is granted; cancelling it
    before then gives up the place in the queue.
    """

    def __init__(self, n: int) -> None:
        self._lock = threading.Lock()
        self._free = n
        self._waiters: deque[Future[None]] = deque()

    def request(self) -> Future[None]:
        fut: Future[None] = Future()
        with self._lock:
            while self._waiters and self._waiters[0].cancelled():
                self._waiters.popleft()
            granted = self._free > 0 and not self._waiters
            if granted:
                self._free -= 1
            else:
                self._waiters.append(fut)
        if granted:  # outside the lock: done callbacks may call back into this object
            fut.set_running_or_notify_cancel()
            fut.set_result(None)
        return fut

    def release(self) -> None:
        while True:
            with self._lock:
                if not self._waiters:
                    self._free += 1
                    return
                waiter = self._waiters.popleft()
            if waiter.set_running_or_notify_cancel():  # False: that waiter gave up
                waiter.set_result(None)
                return

    def give_up(self, slot: Future[None]) -> None:
        """The caller no longer wants ``slot``: leave the queue, or hand back a granted slot."""
        if not slot.cancel():  # already granted (running or finished)
            self.release()

    @property
    def free(self) -> int:
        with self._lock:
            return self._free


class _Call:
    """One sync call: its slot request and its result."""

    def __init__(self, slot: Future[None], result: Future[Any]) -> None:
        self.slot = slot
        self.result = result

    def abandon(self) -> bool:
        """Stop waiting. True when the call never started (it will not run at all)."""
        self.slot.cancel()  # not granted yet: leaves the queue (a granted slot is kept)
        return self.result.cancel()  # not started yet: the grant callback hands the slot back


class LLMExecutor:
    """At most ``max_concurrent`` LLM calls at a time, each waited for at most a timeout.

    Share one executor between the personalizers that talk to one LLM (the adapters' per-request
    personalizers share theirs through the history store they have in common); give an
    unrelated personalizer its own, and a stuck LLM cannot slow it. See the module docstring for
    what happens to a call that outlives its timeout.

    Args:
        max_concurrent: calls in flight at once (threads and coroutines together), e.g. what a
            rate-limited API allows. Calls beyond it wait, within their timeout, for a free slot.
    """

    def __init__(self, max_concurrent: int = 16) -> None:
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise TypeError(f"max_concurrent must be an int, got {max_concurrent!r}")
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.max_concurrent = max_concurrent
        self._slots = _Slots(max_concurrent)
        self._count = 0
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LLMExecutor(max_concurrent={self.max_concurrent}, in_flight={self.in_flight})"

    @property
    def in_flight(self) -> int:
        """Slots held now: calls running, including given-up sync calls still finishing."""
        return self.max_concurrent - self._slots.free

    # -- sync ---------------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], args: Sequence[Any]) -> _Call:
        """Run ``fn(*args)`` in a thread of its own as soon as a slot is free; returns at once."""
        result: Future[Any] = Future()
        context = contextvars.copy_context()  # tracing parents survive the thread hop
        slot = self._slots.request()

        def run() -> None:
            try:
                result.set_result(context.run(call_unstopped, fn, *args))
            except BaseException as exc:  # handed to the waiting caller
                result.set_exception(exc)
            finally:
                self._slots.release()

        def start(granted: Future[None]) -> None:
            if granted.cancelled():
                return
            if not result.set_running_or_notify_cancel():  # the caller gave up meanwhile
                self._slots.release()
                return
            with self._count_lock:
                self._count += 1
                name = f"pbr-llm-{self._count}"
            try:
                threading.Thread(target=run, name=name, daemon=True).start()
            except BaseException as exc:  # e.g. "can't start new thread": the caller hears it,
                # and the slot is free again (a done-callback's error is only logged)
                result.set_exception(exc)
                self._slots.release()

        slot.add_done_callback(start)
        return _Call(slot, result)

    def call_all(
        self, calls: Sequence[tuple[Callable[..., Any], Sequence[Any]]], timeout: float | None
    ) -> list[Any]:
        """Run sync calls concurrently; each result, or the exception it raised (returned, not
        raised), or :class:`LLMTimeoutError` for a call not done within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        running = [self._submit(fn, args) for fn, args in calls]
        out: list[Any] = []
        for call in running:
            # wait() first: the call's own TimeoutError must not pass for ours.
            done, _ = futures_wait([call.result], timeout=_left(deadline))
            if not done:
                out.append(self._timed_out(call.abandon(), timeout))
                continue
            try:
                out.append(call.result.result())
            except asyncio.CancelledError as exc:  # raised by the LLM call: see _outcome
                out.append(_cancelled_inside(exc))
            except (Exception, CancelledError) as exc:
                out.append(exc)
        return out

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None) -> Any:
        """``fn(*args)`` in a worker thread, waited for at most ``timeout`` seconds (raises)."""
        (result,) = self.call_all([(fn, args)], timeout)
        if isinstance(result, BaseException):
            raise result
        return result

    # -- async --------------------------------------------------------------------------------
    async def acall(self, fn: Callable[..., Any], *args: Any, timeout: float | None) -> Any:
        """Await a sync ``fn(*args)`` run in a thread of this executor (not asyncio's default
        executor). Cancelling the awaiting task frees it at once; the thread finishes alone."""
        call = self._submit(fn, args)
        waiting = asyncio.wrap_future(call.result)
        try:
            done, _ = await asyncio.wait({waiting}, timeout=timeout)
        except asyncio.CancelledError:
            waiting.cancel()  # else its later exception is logged as never retrieved
            call.abandon()
            raise
        if not done:
            waiting.cancel()
            raise self._timed_out(call.abandon(), timeout)
        return _outcome(waiting)

    async def acall_async(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None
    ) -> Any:
        """Await the coroutine ``fn(*args)`` once a slot is free, cancelled after ``timeout``
        seconds (slot wait included)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        slot = self._slots.request()
        granted = asyncio.wrap_future(slot)
        try:
            done, _ = await asyncio.wait({granted}, timeout=timeout)
        except asyncio.CancelledError:
            self._slots.give_up(slot)
            raise
        if not done:
            self._slots.give_up(slot)
            raise self._timed_out(True, timeout)
        try:
            task = asyncio.ensure_future(fn(*args))
        except BaseException:  # not even a coroutine came back: nothing runs, free the slot
            self._slots.release()
            raise
        try:
            done, _ = await asyncio.wait({task}, timeout=_left(deadline))
        except asyncio.CancelledError:
            self._stop(task)
            raise
        if not done:
            self._stop(task)
            raise self._timed_out(False, timeout)
        self._slots.release()
        return _outcome(task)

    def _stop(self, task: asyncio.Future[Any]) -> None:
        """Cancel a given-up coroutine; its slot is freed when it has actually stopped (one that
        shields itself or cleans up slowly still counts against ``max_concurrent``)."""
        task.cancel()
        task.add_done_callback(_retrieve)
        task.add_done_callback(lambda _task: self._slots.release())

    # -- helpers ------------------------------------------------------------------------------
    def _timed_out(self, never_started: bool, timeout: float | None) -> LLMTimeoutError:
        why = (
            f"; all {self.max_concurrent} LLM call slots were busy (is the LLM stuck?)"
            if never_started
            else ""
        )
        return LLMTimeoutError(f"the LLM call timed out after {timeout:g} s{why}", timeout)


def _outcome(done: asyncio.Future[Any]) -> Any:
    """The result of a call we did not cancel. A ``CancelledError`` it carries was raised by the
    LLM call itself (a client cancelled inside it): that is the call's failure, so it becomes a
    ``RuntimeError`` rather than read as the cancellation of the request that awaits it."""
    try:
        return done.result()
    except asyncio.CancelledError as exc:
        raise _cancelled_inside(exc) from exc


def _cancelled_inside(exc: asyncio.CancelledError) -> RuntimeError:
    failure = RuntimeError(f"the LLM call raised CancelledError ({exc!r})")
    failure.__cause__ = exc
    return failure


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a given-up task's outcome as seen (no "exception was never retrieved" noise)."""
    if not task.cancelled():
        task.exception()


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())
