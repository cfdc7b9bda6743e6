"""Environment calls run beside the rollout: plain methods on a thread pool, coroutines on one event loop.

Every call gives a `concurrent.futures.Future`, so the rollout waits on any of them the same way and
a slow call holds up only its own trajectory. A call's time is counted from when it starts running,
so calls queued behind a full pool (``multiturn.env_concurrency``) do not time out while they wait.

Tools (`tools.run_tool`) run on the same mechanism. Every thread is a daemon, so a call that never
returns cannot keep the process from exiting, and a call given up on (past its timeout) gives its slot
back at once: after any number of hung calls the next ones still run. A hung call's thread is
abandoned, not killed (Python cannot stop a thread); `EnvCalls.abandoned` counts those still running.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["EnvCalls"]

_QUEUED_POLL_S = 0.01
"""How often `EnvCalls.result` looks whether a queued call has started (its timeout starts then)."""


class EnvCalls:
    """Runs environment calls, at most `concurrency` plain ones at once (1: one call at a time).

    Each plain call runs on a daemon thread of its own once it holds one of `concurrency` slots; a
    call the rollout abandons (`forget`, past its timeout) gives its slot back, so the calls queued
    behind a hung one start, and the hung thread ends whenever its call returns.

    Attributes:
        started: per future, when its call began (`time.monotonic`).
        abandoned: calls forgotten while they ran whose threads have not returned yet (hung calls).
    """

    def __init__(self, concurrency: int) -> None:
        self._slots = threading.Semaphore(concurrency)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._holding: set[concurrent.futures.Future[Any]] = set()  # calls that hold a slot
        self._running_forgotten: set[concurrent.futures.Future[Any]] = set()
        self.started: dict[concurrent.futures.Future[Any], float] = {}

    @property
    def abandoned(self) -> int:
        with self._lock:
            return len(self._running_forgotten)

    def submit(self, method: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        """Call `method(*args)`: awaited on the event loop when it is a coroutine function."""
        if inspect.iscoroutinefunction(method):
            awaited = asyncio.run_coroutine_threadsafe(method(*args), self._event_loop())
            self.started[awaited] = time.monotonic()
            return awaited
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        threading.Thread(
            target=self._run, args=(future, method, args), name="entrepot-env", daemon=True
        ).start()
        return future

    def _run(
        self, future: concurrent.futures.Future[Any], method: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self._slots.acquire()
        with self._lock:
            self._holding.add(future)
            if not future.set_running_or_notify_cancel():  # forgotten while it queued
                self._release(future)
                return
            self.started[future] = time.monotonic()
        try:
            result = method(*args)
        except BaseException as error:
            future.set_exception(error)
        else:
            future.set_result(result)
        finally:
            with self._lock:
                self._release(future)
                self._running_forgotten.discard(future)

    def _release(self, future: concurrent.futures.Future[Any]) -> None:
        """Give `future`'s slot back, once (the caller holds the lock)."""
        if future in self._holding:
            self._holding.discard(future)
            self._slots.release()

    def forget(self, future: concurrent.futures.Future[Any]) -> None:
        """Drop a finished or abandoned call; a running one gives its slot back (its thread ends alone)."""
        with self._lock:
            future.cancel()
            self.started.pop(future, None)
            if future in self._holding and not future.done():
                self._running_forgotten.add(future)  # its thread runs on, holding no slot
            self._release(future)

    def result(self, future: concurrent.futures.Future[Any], timeout_s: float) -> Any:
        """Wait for a call's result, at most `timeout_s` from when it started running, then forget it.

        Raises:
            TimeoutError: the call ran past `timeout_s` (it is abandoned on its daemon thread).
            Exception: whatever the call raised.
        """
        try:
            while (started := self.started.get(future)) is None and not future.done():
                concurrent.futures.wait([future], timeout=_QUEUED_POLL_S)  # queued behind full slots
            left = timeout_s if started is None else started + timeout_s - time.monotonic()
            return future.result(timeout=max(left, 0.0))
        finally:
            self.forget(future)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="entrepot-env-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Stop the event loop (running calls end by themselves)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
