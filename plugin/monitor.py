"""Keeps the device and CDI conditions true to the node: checks on events, on a timer and on demand.

Every check result is recorded by a shielded task, so a caller that goes away (an Allocate whose
kubelet timed out, a stream that closed) can neither cancel a check nor turn it into a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from hv_device_plugin import metrics
from hv_device_plugin.cdi import CdiStatus
from hv_device_plugin.config import Config
from hv_device_plugin.device import CheckResult, DeviceKind, check_host_entry
from hv_device_plugin.health import HealthState
from hv_device_plugin.logs import log, warn
from hv_device_plugin.probe_worker import ProbeWorker
from hv_device_plugin.shutdown import reap
from hv_device_plugin.watch import DirWatcher, MountTableWatcher

T = TypeVar("T")
_CDI, _DEVICE = "cdi", "device"


class _Flight(Generic[T]):
    """One shared in-flight check; callers who need a result newer than their arrival get one."""

    def __init__(self, run: Callable[[], Awaitable[T]]) -> None:
        self._run = run
        self._task: asyncio.Task[T] | None = None
        self._seq = 0

    def _start(self) -> asyncio.Task[T]:
        self._seq += 1
        self._task = asyncio.ensure_future(self._run())
        return self._task

    async def join(self, fresh: bool) -> T:
        task = self._task
        if task is not None and not task.done():
            if not fresh:
                return await asyncio.shield(task)
            # Started before this caller arrived: it may have read state older than the change
            # the caller must see (a stale spec written just before an Allocate). Wait it out
            # (never cancelling it) and join or start a check that began after arrival.
            seen = self._seq
            await asyncio.wait([task])
            if self._seq != seen and self._task is not None and not self._task.done():
                return await asyncio.shield(self._task)
        task = self._task if self._task is not None and not self._task.done() else self._start()
        return await asyncio.shield(task)


class SpecKeeper(Protocol):
    """What keeps CDI specs exact: the device plugin's one spec (hv_device_plugin.cdi.CdiReconciler), or
    the DRA driver's prepared claims' specs (hv_device_plugin.dra.claim_specs.ClaimSpecs)."""

    def watches(self, name: str) -> bool: ...
    def label(self) -> str: ...
    def inspect(self) -> CdiStatus: ...
    def reconcile(self) -> CdiStatus: ...
    def memory_backed(self) -> bool: ...


class Monitor:
    """Device checks and CDI reconciliation, and the watchers that trigger them."""

    def __init__(
        self,
        cfg: Config,
        health: HealthState,
        worker: ProbeWorker | None,
        reconciler: SpecKeeper | None,
    ) -> None:
        self._cfg = cfg
        self._health = health
        self._worker = worker
        self._reconciler = reconciler
        self._kind = DeviceKind(cfg.device_name)
        self._kick = asyncio.Event()
        self._due: set[str] = set()  # what the next kick re-checks: _CDI, _DEVICE
        host = cfg.host_view_path
        # dir -> the one entry in it that matters: the spec, the device in the host's /dev view,
        # and the device node this process opens (a container's own /dev can change too).
        own = Path(cfg.hypervisor_device)
        self._watched_names: dict[Path, Callable[[str], bool]] = {own.parent: own.name.__eq__}
        if host is not None:
            self._watched_names[host.parent] = host.name.__eq__
        if reconciler is not None:
            self._watched_names[cfg.cdi_dir] = reconciler.watches
        self._cdi_flight = _Flight(self._run_cdi_check)
        self._device_flight = _Flight(self._run_device_check)
        self._mount_watch: MountTableWatcher | None = None
        self._dir_watch: DirWatcher | None = None
        self._mount_listeners: list[Callable[[], None]] = []
        # Start time of the latest passed device check, and when watch events last voided it.
        self._passed_started: float | None = None
        self._voided_at = 0.0
        self._mount_changes = 0  # the watcher's count of changes handled on the loop

    def add_mount_listener(self, listener: Callable[[], None]) -> None:
        """Also tell `listener` (on the event loop) when the mount table changes."""
        self._mount_listeners.append(listener)

    # -- checks -------------------------------------------------------------------------

    async def check_device(self) -> CheckResult:
        """Identity and usability, shared by concurrent callers, recorded whoever waits."""
        return await self._device_flight.join(fresh=False)

    async def verify_for_allocate(self) -> None:
        """Allocate's re-verification: the CDI spec read after arrival (repaired now if it is
        not right) and a device check that started at most --probe-max-age before arrival.

        The common case awaits nothing: a read and compare of the spec, and a recent pass.
        """
        self._catch_up()
        arrived = time.monotonic()
        waits: list[Awaitable[object]] = []
        if not self._cdi_desired_now():
            waits.append(self.check_cdi(fresh=True))
        if not self._recent_pass(arrived):
            waits.append(self.check_device())
        if waits:
            await asyncio.gather(*waits)

    def _catch_up(self) -> None:
        """Handle now every change made before this Allocate arrived: queued inotify events,
        and mount-table changes not yet delivered to the loop. Without this an Allocate read
        before them (the loop runs ready callbacks in its own order) could lean on a pass that
        an event just before it had voided: a device renamed onto the path, then an Allocate,
        and the Allocate was granted (measured by the bench, 1 in 20)."""
        if self._dir_watch is not None:
            self._dir_watch.drain()
        watch = self._mount_watch
        if watch is not None and (watch.changes != self._mount_changes or watch.pending()):
            self._recheck_everything()

    def _cdi_desired_now(self) -> bool:
        if self._reconciler is None:
            return True
        ok = self._reconciler.inspect().ok
        if ok:
            self._health.set_cdi(True, "")
        return ok

    def _recent_pass(self, arrived: float) -> bool:
        started = self._passed_started
        return (
            started is not None
            and started >= self._voided_at
            and arrived - started < self._cfg.probe_max_age_s
            and self._health.device.ok
        )

    def _void_passes(self) -> None:
        """A host /dev or mount-table change: no Allocate may lean on an earlier probe."""
        self._voided_at = time.monotonic()

    async def _run_device_check(self) -> CheckResult:
        started = time.monotonic()
        if self._worker is None:
            host = self._cfg.host_view_path
            result = (
                check_host_entry(str(host))
                if host is not None
                else CheckResult(False, "device-access mode needs --host-dev-dir", 0.0)
            )
        else:
            host = self._cfg.host_view_path
            result = await self._worker.check(
                self._kind, self._cfg.hypervisor_device, None if host is None else str(host)
            )
        metrics.PROBE_SECONDS.labels(result="ok" if result.ok else "failed").observe(
            time.monotonic() - started
        )
        if not result.ok and self._health.device.ok:
            warn("device_check_failed", device=self._cfg.hypervisor_device, reason=result.reason)
        self._health.set_device(result.ok, result.reason)
        if result.ok:
            self._passed_started = started
        elif self._passed_started is not None and self._passed_started <= started:
            self._passed_started = None
        return result

    async def check_cdi(self, fresh: bool = False) -> CdiStatus | None:
        """Verify the owned spec and repair it now if needed (allocation-triggered repair).

        `fresh`: the answer must come from a check that started after this call (Allocate).
        """
        if self._reconciler is None:
            return None
        return await self._cdi_flight.join(fresh)

    async def _run_cdi_check(self) -> CdiStatus:
        assert self._reconciler is not None
        # The common case (spec already right) is a read and a compare: do it on the loop. A
        # repair, which writes and fsyncs, goes to a thread where slow storage cannot stall it,
        # unless the dir is in memory (tmpfs): there the thread hop is the slowest part.
        status = self._reconciler.inspect()
        if not status.ok:
            if self._reconciler.memory_backed():
                status = self._reconciler.reconcile()
            else:
                status = await asyncio.to_thread(self._reconciler.reconcile)
        if status.repaired and status.cause:
            metrics.CDI_REPAIRS.labels(cause=status.cause).inc()
            log("cdi_repaired", cause=status.cause, path=self._reconciler.label())
        if not status.ok:
            metrics.CDI_FAILURES.labels(state=status.state).inc()
            if self._health.cdi.ok or self._health.cdi.reason != status.reason:
                warn("cdi_not_desired", state=status.state, reason=status.reason)
        self._health.set_cdi(status.ok, status.reason)
        return status

    async def check_all(self, due: Collection[str] = (_CDI, _DEVICE)) -> None:
        """The checks in `due` (both by default). CDI first: devices are never advertised
        healthy before the spec is right."""
        if _CDI in due:
            await self.check_cdi()
        if _DEVICE in due:
            await self.check_device()
        if self._reconciler is None:
            self._health.set_cdi(True, "")

    # -- triggers -----------------------------------------------------------------------

    def _on_dir_event(self, where: Path, name: str) -> None:
        # Only what the event can have changed is re-checked: a host /dev event must not wait
        # behind a CDI read, nor a CDI event behind a device probe; and only events on the entry
        # watched for, or on the directory itself (no name): a node's /dev sees many others, and
        # a mknod-then-rename fault would otherwise probe once too early, on the temp name.
        watched = self._watched_names.get(where)
        if name and (watched is None or not watched(name)):
            return
        if self._reconciler is not None and where == self._cfg.cdi_dir:
            self._due.add(_CDI)
        else:
            self._void_passes()
            self._due.add(_DEVICE)
        self._kick.set()

    def _recheck_everything(self) -> None:
        """A mount-table change: any watched path may now be another filesystem."""
        self._void_passes()
        self._due.update((_CDI, _DEVICE))
        self._kick.set()

    def _on_mount_change(self, loop: asyncio.AbstractEventLoop) -> None:
        seen = self._mount_watch.changes if self._mount_watch is not None else 0

        def both() -> None:
            self._mount_changes = max(self._mount_changes, seen)
            self._recheck_everything()
            if self._dir_watch is not None:
                self._dir_watch.rewatch()
            for listener in self._mount_listeners:
                listener()

        with contextlib.suppress(RuntimeError):  # the loop closed: no one left to tell
            loop.call_soon_threadsafe(both)

    async def run(self) -> None:
        """Re-check on inotify events, mount-table changes and every recheck interval."""
        loop = asyncio.get_running_loop()
        dirs = list(self._watched_names)
        contents = [self._cfg.cdi_dir] if self._reconciler is not None else []
        self._dir_watch = DirWatcher(
            dirs, self._on_dir_event, self._cfg.recheck_interval_s, contents=contents
        )
        self._mount_watch = MountTableWatcher(lambda: self._on_mount_change(loop))
        self._mount_watch.start()
        watcher = asyncio.ensure_future(self._dir_watch.run())
        try:
            while True:
                try:
                    async with asyncio.timeout(self._cfg.recheck_interval_s):
                        await self._kick.wait()
                except TimeoutError:
                    self._due.update((_CDI, _DEVICE))
                self._kick.clear()
                due, self._due = self._due, set()
                await self.check_all(due)
        finally:
            await reap(watcher)
            self._mount_watch.close()
