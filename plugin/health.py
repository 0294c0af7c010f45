"""Shared health state: device and CDI conditions, readiness reasons, snapshot broadcast.

One instance per process. Streams never write to it except to count themselves in and out,
so a cancelled stream can never change shared health, readiness or the other streams.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hv_device_plugin import metrics
from hv_device_plugin.logs import log


@dataclass
class Condition:
    ok: bool
    reason: str
    since: float = field(default_factory=time.monotonic)


class HealthState:
    """Conditions behind liveness, readiness and the advertised device health."""

    def __init__(self, *, streams_required: bool = True) -> None:
        # A DRA driver has no ListAndWatch stream: its readiness never waits for one.
        self.streams_required = streams_required
        self._changed = asyncio.Event()
        self.generation = 0
        self.shutting_down = False
        self.registered = Condition(False, "not registered with the kubelet yet")
        self.device = Condition(False, "device not checked yet")
        self.cdi = Condition(False, "CDI spec not checked yet")
        self.streams = 0
        # server tag -> [open now, opened ever]: which gRPC server a stream came through
        self._by_server: dict[int, list[int]] = {}
        self._on_stream_closed: list[Callable[[], None]] = []
        self.no_streams = asyncio.Event()
        self.no_streams.set()
        self._healthy = False

    @property
    def healthy(self) -> bool:
        """Whether devices are advertised Healthy: usable device AND CDI spec in desired state."""
        return self._healthy

    def readiness_reasons(self) -> list[str]:
        reasons = []
        if not self.registered.ok:
            reasons.append(f"registered: {self.registered.reason}")
        if self.streams < 1 and self.streams_required:
            reasons.append("list_and_watch: no open ListAndWatch stream")
        if not self.device.ok:
            reasons.append(f"device: {self.device.reason}")
        if not self.cdi.ok:
            reasons.append(f"cdi: {self.cdi.reason}")
        if self.shutting_down:
            reasons.append("shutting down")
        return reasons

    @property
    def ready(self) -> bool:
        return not self.readiness_reasons()

    def readiness_report(self) -> dict[str, object]:
        return {
            "ready": self.ready,
            "conditions": {
                "registered": {"ok": self.registered.ok, "reason": self.registered.reason},
                "list_and_watch": {"ok": self.streams > 0, "streams": self.streams},
                "device": {"ok": self.device.ok, "reason": self.device.reason},
                "cdi": {"ok": self.cdi.ok, "reason": self.cdi.reason},
            },
            "reasons": self.readiness_reasons(),
        }

    def _set(self, cond: Condition, ok: bool, reason: str, name: str) -> None:
        if cond.ok == ok and cond.reason == reason:
            return
        if cond.ok != ok:
            cond.since = time.monotonic()
            log("condition_changed", condition=name, ok=ok, reason=reason)
        cond.ok, cond.reason = ok, reason
        self._publish()

    def set_device(self, ok: bool, reason: str) -> None:
        self._set(self.device, ok, reason, "device")

    def set_cdi(self, ok: bool, reason: str) -> None:
        self._set(self.cdi, ok, reason, "cdi")

    def set_registered(self, ok: bool, reason: str) -> None:
        self._set(self.registered, ok, reason, "registered")

    def _bump(self) -> None:
        # Swap in a fresh event before setting the old one: every waiter of the old
        # generation wakes exactly once, and no waiter can miss a change.
        self.generation += 1
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    def _publish(self) -> None:
        healthy = self.device.ok and self.cdi.ok
        if healthy != self._healthy:
            self._healthy = healthy
            self._bump()
            metrics.HEALTH_TRANSITIONS.labels(to="healthy" if healthy else "unhealthy").inc()
            log(
                "health_transition",
                healthy=healthy,
                generation=self.generation,
                reasons=self.readiness_reasons(),
            )
        metrics.READY.set(1 if self.ready else 0)
        metrics.HEALTHY.set(1 if healthy else 0)

    def reassert(self) -> None:
        """Send the same device list again on every stream. The kubelet keys devices by
        resource name, not by endpoint: a predecessor that goes after this instance registered
        (its empty list on SIGTERM, or its stream's end) zeroes the devices the kubelet holds
        for this one, until this one sends a list again."""
        if not self.shutting_down:
            self._bump()

    def shutdown(self) -> None:
        self.shutting_down = True
        self._bump()

    async def wait_change(self, seen_generation: int) -> int:
        """Block until the advertised health changes after seen_generation; return the new one."""
        while self.generation == seen_generation:
            await self._changed.wait()
        return self.generation

    def add_stream_closed_listener(self, listener: Callable[[], None]) -> None:
        """Also call `listener` (sync, on the loop) each time a stream closes."""
        self._on_stream_closed.append(listener)

    def server_streams(self, server: int) -> tuple[int, int]:
        """(open now, opened ever) of the streams that came through server `server`."""
        open_now, ever = self._by_server.get(server, (0, 0))
        return open_now, ever

    def forget_servers_but(self, server: int) -> None:
        """Drop the counts of every other server (retired ones): bounded over a long life."""
        self._by_server = {tag: n for tag, n in self._by_server.items() if tag == server}

    # Sync on purpose: called from a stream's finally block, which may run during cancellation.
    def stream_opened(self, server: int = 0) -> None:
        self.streams += 1
        counts = self._by_server.setdefault(server, [0, 0])
        counts[0] += 1
        counts[1] += 1
        self.no_streams.clear()
        metrics.STREAMS.set(self.streams)
        self._publish()

    def stream_closed(self, server: int = 0) -> None:
        self.streams -= 1
        if server in self._by_server:  # a retired server's may be forgotten already
            self._by_server[server][0] -= 1
        if self.streams == 0:
            self.no_streams.set()
        metrics.STREAMS.set(self.streams)
        self._publish()
        for listener in self._on_stream_closed:
            listener()
