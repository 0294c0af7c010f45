"""One asyncio event loop in one dedicated thread, for synchronous callers.

Why a process should have only one: grpc.aio binds its completion-queue poller to every event
loop that uses it, and with two loops in two threads of one process (the emulator's server in
its thread, a harness's grpc.aio clients in the main thread) core events are lost under load:
channels that never become ready, calls that never finish (grpc/grpc#25364, #42357; seen here as
the bench's "a channel to <plugin socket>" and "a Register after a kubelet restart" waits
expiring for every plugin at once on a busy machine). A process that serves the emulator and
runs grpc.aio clients of its own runs both on one LoopThread: `ThreadedKubeletEmulator(...,
loop=shared)` and `shared.run(coroutine)`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from .accounting import WaitTimeout

T = TypeVar("T")

THREAD_NAME = "kubelet-emulator"
# At close, how long the tasks still pending may take to end before they count as leaked (seen
# on a loaded CI machine: the task of a connection's GOAWAY, done a moment later).
SETTLE_S = 1.0


class LoopThread:
    """start() spawns the thread, run() blocks for a coroutine's result, close() joins it."""

    def __init__(self, call_timeout_s: float = 30.0) -> None:
        self.call_timeout_s = call_timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        # Names of tasks still pending when the loop shut down: should stay empty.
        self.leftover_tasks: list[str] = []

    def start(self) -> asyncio.AbstractEventLoop:
        if self.loop is not None:
            return self.loop
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def body() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                pending = asyncio.all_tasks(loop)
                if pending:  # a task on its last step (grpc's connection teardown) is no leak
                    loop.run_until_complete(asyncio.wait(pending, timeout=SETTLE_S))
                pending = asyncio.all_tasks(loop)
                self.leftover_tasks = sorted(task.get_name() for task in pending)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
                loop.close()

        thread = threading.Thread(target=body, name=THREAD_NAME, daemon=True)
        thread.start()
        if not ready.wait(self.call_timeout_s):
            raise WaitTimeout("the emulator event loop thread to start", self.call_timeout_s, None)
        self.loop, self.thread = loop, thread
        return loop

    def run(
        self,
        coro_fn: Callable[[], Coroutine[Any, Any, T]],
        timeout: float | None = None,
        description: str = "emulator call",
    ) -> T:
        """Run coro_fn() on the loop and block for its result (bounded unless timeout <= 0)."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("blocking call from the emulator's own loop thread")
        loop = self.start()
        limit = self.call_timeout_s if timeout is None else timeout
        future = asyncio.run_coroutine_threadsafe(coro_fn(), loop)
        try:
            return future.result(limit if limit > 0 else None)
        except concurrent.futures.TimeoutError:
            if future.done():  # the coroutine itself raised a TimeoutError: pass it on
                raise
            future.cancel()
            raise WaitTimeout(description, limit, "still running; cancelled") from None

    def close(self, timeout: float | None = None) -> None:
        loop, thread = self.loop, self.thread
        self.loop = self.thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        limit = self.call_timeout_s if timeout is None else timeout
        thread.join(limit)
        if thread.is_alive():
            raise WaitTimeout("the emulator loop thread to exit", limit, "thread alive")

    def __enter__(self) -> LoopThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
