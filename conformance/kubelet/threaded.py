"""A blocking facade: the emulator's event loop runs in one dedicated thread.

Every blocking call has a timeout; when it expires the call is cancelled on the loop and a
WaitTimeout naming the call is raised. Reads go straight to the thread-safe accounting.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from . import checkpoint
from .accounting import (
    AllocationRecord,
    EventKind,
    PluginOptions,
    RegistrationRecord,
    ResourceState,
    TimelineEvent,
    counts_wait,
)
from .admission import AllocationOutcome
from .emulator import KubeletEmulator
from .loopthread import LoopThread
from .pods import ContainerRuntime, PodManager, PodRecord

T = TypeVar("T")


class ThreadedKubeletEmulator:
    """KubeletEmulator for synchronous code; start() spawns the loop thread, stop() joins it."""

    def __init__(
        self,
        plugin_dir: Path,
        grace_period_s: float = 300.0,
        dial_timeout_s: float = 10.0,
        *,
        emulate_stale_client_bug: bool = False,
        call_timeout_s: float = 30.0,
        loop: LoopThread | None = None,
    ) -> None:
        self.emulator = KubeletEmulator(
            plugin_dir,
            grace_period_s,
            dial_timeout_s,
            emulate_stale_client_bug=emulate_stale_client_bug,
        )
        self.accounting = self.emulator.accounting
        self.call_timeout_s = call_timeout_s
        # A shared loop (see loopthread) is its owner's to close; an own one closes with stop().
        self._own_loop = loop is None
        self._lt = loop or LoopThread(call_timeout_s)

    # --- loop thread ------------------------------------------------------------------------

    @property
    def leftover_tasks(self) -> list[str]:
        """Names of tasks still pending when the loop shut down: should stay empty."""
        return self._lt.leftover_tasks

    def call(
        self,
        coro_fn: Callable[[], Coroutine[Any, Any, T]],
        timeout: float | None = None,
        description: str = "emulator call",
    ) -> T:
        """Run coro_fn() on the emulator loop and block for its result (bounded)."""
        limit = self.call_timeout_s if timeout is None else timeout
        return self._lt.run(coro_fn, limit, description)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        self.call(self.emulator.start, timeout, "kubelet emulator start")

    def stop(self, timeout: float | None = None, *, graceful: bool = True) -> None:
        """Stop the emulator, then the loop; the thread is joined (bounded)."""
        if self._lt.loop is None:
            return
        try:
            self.call(lambda: self.emulator.stop(graceful=graceful), timeout, "emulator stop")
        finally:
            self._close_loop(timeout)

    def restart(self, graceful: bool, timeout: float | None = None) -> None:
        self.call(lambda: self.emulator.restart(graceful), timeout, "kubelet emulator restart")

    def crash(self, timeout: float | None = None) -> None:
        """Stop like a crash (kubelet.sock left behind) but keep the loop for start()."""
        self.call(lambda: self.emulator.stop(graceful=False), timeout, "kubelet crash")

    def _close_loop(self, timeout: float | None) -> None:
        if self._own_loop:
            self._lt.close(self.call_timeout_s if timeout is None else timeout)

    def __enter__(self) -> ThreadedKubeletEmulator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- admission ----------------------------------------------------------------------

    def allocate(
        self,
        resource: str,
        count: int = 1,
        container: str = "c0",
        *,
        pod_uid: str | None = None,
        timeout: float | None = None,
    ) -> AllocationOutcome:
        return self.call(
            lambda: self.emulator.allocate(resource, count, container, pod_uid=pod_uid),
            timeout,
            f"Allocate of {count} {resource} for container {container}",
        )

    def release(self, allocation: AllocationRecord | int, timeout: float | None = None) -> bool:
        async def release() -> bool:
            return self.emulator.release(allocation)

        return self.call(release, timeout, "release of an allocation")

    # --- pods (with a container runtime attached) -------------------------------------------

    def attach_runtime(self, runtime: ContainerRuntime) -> None:
        """Model pods (see pods.py); before start(): the manager lives on the loop."""

        async def attach() -> None:
            self.emulator.attach_runtime(runtime)

        self.call(attach, None, "attach a container runtime")

    def _pods(self) -> PodManager:
        if self.emulator.pods is None:
            raise RuntimeError("no container runtime attached: the emulator models no pods")
        return self.emulator.pods

    def create_pod(
        self, resource: str, count: int = 1, owner: str = "", timeout: float | None = None
    ) -> PodRecord:
        pods = self._pods()
        return self.call(lambda: pods.create(resource, count, owner), timeout, "create a pod")

    def delete_pod(self, uid: str, timeout: float | None = None) -> None:
        pods = self._pods()
        self.call(lambda: pods.delete(uid), timeout, f"delete pod {uid}")

    def pods(self) -> list[PodRecord]:
        return self._pods().pods()

    def container_started(self, uid: str, container_id: str) -> None:
        self._pods().container_started(uid, container_id)

    def pod_devices(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """pod-resources List: active pod uid -> resource -> device IDs."""
        pods = self._pods()

        async def listed() -> dict[str, dict[str, tuple[str, ...]]]:
            return pods.list_devices()  # on the loop: it may free devices (gc)

        return self.call(listed, None, "pod-resources List")

    def device_health(self, uid: str) -> dict[str, str]:
        return self._pods().device_health(uid)

    def end_stream(self, resource: str, timeout: float | None = None) -> float:
        return self.call(
            lambda: self.emulator.end_stream(resource), timeout, f"end the {resource} stream"
        )

    def checkpoint_pod_uids(self) -> set[str]:
        """Pods with an assignment in the checkpoint file as it is on disk."""
        data = checkpoint.read(self.emulator.checkpoint_path)
        return set() if data is None else {a.pod_uid for a in data.allocations}

    # --- queries and waits ---------------------------------------------------------------

    def capacity(self, resource: str) -> int:
        return self.accounting.capacity(resource)

    def allocatable(self, resource: str) -> int:
        return self.accounting.allocatable(resource)

    def state(self, resource: str) -> ResourceState:
        return self.accounting.state(resource)

    def registrations(self, resource: str) -> list[RegistrationRecord]:
        return self.accounting.registrations(resource)

    def registered_resources(self) -> list[str]:
        return self.accounting.registered_resources()

    def allocations(self) -> list[AllocationRecord]:
        return self.accounting.allocations()

    def timeline(
        self, kind: EventKind | None = None, resource: str | None = None, since: float = 0.0
    ) -> list[TimelineEvent]:
        return self.accounting.timeline(kind, resource, since)

    def options(self, resource: str) -> PluginOptions | None:
        async def options() -> PluginOptions | None:
            return self.emulator.options(resource)

        return self.call(options, None, f"options of {resource}")

    def reregistration_latency(self, resource: str) -> float | None:
        return self.emulator.reregistration_latency(resource)

    def wait_for(
        self,
        predicate: Callable[[], bool],
        timeout: float,
        description: str,
        observe: Callable[[], object] | None = None,
    ) -> None:
        """Block until predicate() holds; WaitTimeout (naming `description`) at the deadline."""
        self.accounting.wait_for_blocking(predicate, timeout, description, observe)

    def wait_for_counts(
        self,
        resource: str,
        *,
        capacity: int | None = None,
        allocatable: int | None = None,
        timeout: float,
    ) -> None:
        predicate, description, observe = counts_wait(
            self.accounting, resource, capacity, allocatable
        )
        self.accounting.wait_for_blocking(predicate, timeout, description, observe)
