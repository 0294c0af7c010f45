"""Bounded shutdown: every step has a deadline, and a step that misses it is named in the log.

The kubelet's pod grace period ends in SIGKILL; a plugin that hangs on the way out leaves a
socket and a probe helper behind and tells the operator nothing. Each step here is logged as it
finishes, and a stalled one is logged with the stacks of the tasks it was waiting on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
from typing import Any

from hv_device_plugin.logs import log, warn

STEP_DEADLINE_S = 5.0
# Past the gRPC server's 0.5 s stop grace: a task not ended by then is cancelled again.
RECANCEL_S = 2.0


async def serve_until(stop: asyncio.Event, tasks: list[asyncio.Task[None]]) -> None:
    """Wait for the stop signal; a serving task that ended with an error ends the wait with it
    (the caller's finally then stops everything, and the error reaches its exit code)."""
    waiter = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    for task in done:
        if task is not waiter and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _stack(task: asyncio.Task[Any]) -> str:
    """Where a suspended task waits: its await chain, outermost first."""
    where: list[str] = []
    link: object = task.get_coro()
    while link is not None and len(where) < 16:
        frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None)
        if frame is None:
            where.append(type(link).__name__)
            break
        where.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None)
    return f"{task.get_name()}: " + " > ".join(where)


async def cancel_tasks(
    tasks: Iterable[asyncio.Task[None]], deadline_s: float = STEP_DEADLINE_S
) -> bool:
    """Cancel and reap `tasks`; False (and a warning with their stacks) if any needed more.

    A cancel can be lost (a library swallowing CancelledError), so it is repeated until the
    deadline: the plugin still stops, and the lost cancel is still reported.
    """
    pending = {t for t in tasks if not t.done()}
    if not pending:
        return True
    started = time.monotonic()
    rounds = 0
    while pending and time.monotonic() - started < deadline_s:
        for task in pending:
            task.cancel()
        rounds += 1
        if rounds == 2:
            warn("shutdown_cancel_lost", step="cancel tasks", stacks=[_stack(t) for t in pending])
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    if pending:
        warn(
            "shutdown_step_stalled",
            step="cancel tasks",
            deadline_s=deadline_s,
            stacks=[_stack(t) for t in pending],
        )
        return False
    took_ms = round((time.monotonic() - started) * 1e3, 3)
    log("shutdown_step", step="cancel tasks", took_ms=took_ms, cancel_rounds=rounds)
    return rounds == 1


async def step(name: str, work: Awaitable[None], deadline_s: float = STEP_DEADLINE_S) -> bool:
    """Run one shutdown step within `deadline_s`; False (and a warning) if it did not finish."""
    started = time.monotonic()
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait([task], timeout=deadline_s)
    if not done:
        warn("shutdown_step_stalled", step=name, deadline_s=deadline_s, stacks=[_stack(task)])
        task.cancel()
        return False
    took_ms = round((time.monotonic() - started) * 1e3, 3)
    if task.exception() is not None:
        warn("shutdown_step_failed", step=name, error=repr(task.exception()), took_ms=took_ms)
        return False
    log("shutdown_step", step=name, took_ms=took_ms)
    return True


async def reap(task: asyncio.Future[Any]) -> None:
    """Cancel a child task and wait for it to end, without eating a cancel meant for the caller.

    `task.cancel(); with suppress(CancelledError): await task` loses the caller's own cancel
    when it lands during that await; the caller then runs on as if never asked to stop.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
