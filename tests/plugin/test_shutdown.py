"""Shutdown ends every task it cancels, even one whose cancel was lost, and says so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import types
from collections.abc import Iterator

import pytest

from hv_device_plugin import shutdown
from hv_device_plugin.registration import Registrar


class _Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def named(self, event: str) -> list[dict[str, object]]:
        return [getattr(r, "fields", {}) for r in self.records if r.getMessage() == event]


@pytest.fixture
def events() -> Iterator[_Events]:
    handler = _Events()
    logger = logging.getLogger("hv-device-plugin")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


async def _ends(task: asyncio.Task[None], seconds: float, what: str) -> None:
    done, _ = await asyncio.wait([task], timeout=seconds)
    assert done, f"wait for {what} expired after {seconds} s"


def test_a_cancel_landing_as_the_kick_arrives_still_stops_the_registrar() -> None:
    """The CI failure: wait_for on Python 3.11 returned the kick and dropped the cancel."""

    async def scenario() -> None:
        fake = types.SimpleNamespace(_kick=asyncio.Event())
        rounds = 0

        async def wait_forever() -> None:  # the shape of Registrar._wait_restart_needed
            nonlocal rounds
            while True:
                await Registrar._wait_kick(fake, 30)  # type: ignore[arg-type]
                rounds += 1

        task = asyncio.ensure_future(wait_forever())
        await asyncio.sleep(0)
        fake._kick.set()
        await asyncio.sleep(0)  # the Event's waiter has run; the wait itself has not resumed
        task.cancel()
        await _ends(task, 2.0, "the waiting task to end on its cancel")
        assert task.cancelled(), f"the cancel was lost after {rounds} kick(s)"

    asyncio.run(scenario())


def test_reap_passes_on_a_cancel_meant_for_the_caller() -> None:
    async def scenario() -> None:
        reaped = asyncio.Event()
        went_on = False

        async def slow_to_die() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                reaped.set()
                await asyncio.sleep(0.05)  # still cleaning up when the caller is cancelled

        async def caller() -> None:
            nonlocal went_on
            child = asyncio.ensure_future(slow_to_die())
            await asyncio.sleep(0)  # the child is inside its wait before it is cancelled
            await shutdown.reap(child)
            went_on = True

        parent = asyncio.ensure_future(caller())
        await asyncio.sleep(0)
        async with asyncio.timeout(2):
            await reaped.wait()
        parent.cancel()
        await _ends(parent, 2.0, "the caller to end")
        assert parent.cancelled() and not went_on

    asyncio.run(scenario())


def test_reap_returns_normally_when_only_the_child_was_cancelled() -> None:
    async def scenario() -> None:
        child = asyncio.ensure_future(asyncio.Event().wait())
        await asyncio.sleep(0)
        await shutdown.reap(child)
        assert child.cancelled()

    asyncio.run(scenario())


def test_a_lost_cancel_is_repeated_reported_and_counted_unclean(
    events: _Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutdown, "RECANCEL_S", 0.05)

    async def scenario() -> bool:
        async def swallows_one_cancel() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # the bug: a cancel eaten
                await asyncio.Event().wait()
            await asyncio.Event().wait()

        task = asyncio.ensure_future(swallows_one_cancel())
        await asyncio.sleep(0)
        clean = await shutdown.cancel_tasks([task], deadline_s=2.0)
        assert task.cancelled()
        return clean

    assert asyncio.run(scenario()) is False
    (lost,) = events.named("shutdown_cancel_lost")
    stacks = lost["stacks"]
    assert isinstance(stacks, list) and "swallows_one_cancel" in stacks[0]
    assert events.named("shutdown_step")[0]["cancel_rounds"] == 2


def test_a_task_that_never_ends_is_named_after_the_deadline(
    events: _Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutdown, "RECANCEL_S", 0.05)

    async def scenario() -> bool:
        release = asyncio.Event()

        async def ignores_every_cancel() -> None:
            while not release.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ignores_every_cancel())
        await asyncio.sleep(0)
        clean = await shutdown.cancel_tasks([task], deadline_s=0.3)
        release.set()
        await _ends(task, 2.0, "the task once released")
        return clean

    assert asyncio.run(scenario()) is False
    (stalled,) = events.named("shutdown_step_stalled")
    assert stalled["step"] == "cancel tasks"
    assert "ignores_every_cancel" in str(stalled["stacks"])


def test_a_clean_cancel_is_one_round(events: _Events) -> None:
    async def scenario() -> bool:
        task = asyncio.ensure_future(asyncio.Event().wait())
        await asyncio.sleep(0)
        return await shutdown.cancel_tasks([task])  # type: ignore[list-item]

    assert asyncio.run(scenario()) is True
    assert events.named("shutdown_step")[0]["cancel_rounds"] == 1
    assert not events.named("shutdown_cancel_lost")


def test_a_step_past_its_deadline_or_failing_is_reported(events: _Events) -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        async def hangs() -> None:
            await asyncio.Event().wait()

        async def fails() -> None:
            raise OSError("socket gone")

        async def works() -> None:
            await asyncio.sleep(0)

        return (
            await shutdown.step("hang", hangs(), deadline_s=0.05),
            await shutdown.step("fail", fails()),
            await shutdown.step("work", works()),
        )

    assert asyncio.run(scenario()) == (False, False, True)
    assert [e["step"] for e in events.named("shutdown_step_stalled")] == ["hang"]
    assert "socket gone" in str(events.named("shutdown_step_failed")[0]["error"])
    assert [e["step"] for e in events.named("shutdown_step")] == ["work"]
