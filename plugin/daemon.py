"""The running plugin: checks, the gRPC servers, registration, HTTP endpoints, and their stop.

Imported by hv_device_plugin.__main__ only after it has started the probe helper, so that the helper's
interpreter boots on another core while this module's imports (grpc, protobuf: most of the
start-up time) load here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys

from hv_device_plugin import logs, shutdown
from hv_device_plugin.cdi import CdiReconciler
from hv_device_plugin.config import Config
from hv_device_plugin.endpoints import HttpEndpoints
from hv_device_plugin.health import HealthState
from hv_device_plugin.monitor import Monitor
from hv_device_plugin.probe_worker import ProbeWorker
from hv_device_plugin.registration import Registrar
from hv_device_plugin.server import DevicePluginServicer
from hv_device_plugin.version import source_commit, version

SHUTDOWN_FLUSH_S = 2.0
# A shutdown step stalled or failed, or a task lost its cancel: logged, and the exit says so.
EXIT_UNCLEAN_STOP = 3


def _reconciler(cfg: Config) -> CdiReconciler | None:
    if cfg.mode == "device-access":
        return None
    return CdiReconciler(cfg.cdi_dir, cfg.cdi_filename, cfg.cdi_spec())


async def _wait_streams_closed(health: HealthState, deadline_s: float) -> None:
    """Give open streams the time to send their final empty list, bounded."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(deadline_s):
            await health.no_streams.wait()


def _loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """asyncio's unhandled errors as one JSON line, never a bare traceback on stderr."""
    exc = context.get("exception")
    logs.error(
        "event_loop_error",
        message=str(context.get("message", "")),
        exception=f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else "",
    )


async def run(
    cfg: Config, listener: socket.socket | None = None, worker: ProbeWorker | None = None
) -> int:
    """Serve until SIGTERM/SIGINT; the exit code. `worker` (hypervisor mode): the probe helper,
    started by the caller, owned (closed) here."""
    health = HealthState()
    monitor = Monitor(cfg, health, worker, _reconciler(cfg))
    # One servicer for every server the registrar starts: its device lists (2000 messages to
    # build) and answers are made once, not again after each kubelet restart.
    servicer = DevicePluginServicer(cfg, health, monitor)
    registrar = Registrar(cfg, health, lambda: servicer)
    monitor.add_mount_listener(registrar.on_mount_change)
    http = HttpEndpoints(health, listener) if listener is not None else None

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_loop_error)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    logs.log(
        "starting",
        version=version(),
        commit=source_commit(),
        mode=cfg.mode,
        device=cfg.hypervisor_device,
        resource=cfg.resource_name,
        slots=cfg.slots,
        plugin_dir=str(cfg.device_plugin_dir),
        cdi_dir=str(cfg.cdi_dir),
        host_dev_dir=str(cfg.host_dev_dir or ""),
    )
    tasks: list[asyncio.Task[None]] = []
    code = EXIT_UNCLEAN_STOP
    try:
        if http is not None:
            await http.start()
        # Devices are checked (and the spec repaired) before anything is advertised.
        await monitor.check_all()
        tasks = [asyncio.ensure_future(monitor.run()), asyncio.ensure_future(registrar.run())]
        await shutdown.serve_until(stop, tasks)
        logs.log("stopping", reason="signal")
        health.shutdown()
        await _wait_streams_closed(health, SHUTDOWN_FLUSH_S)
        code = 0
    finally:
        clean = await shutdown.cancel_tasks(tasks)
        clean &= await shutdown.step("stop the gRPC server", registrar.stop())
        if worker is not None:
            clean &= await shutdown.step("stop the probe helper", worker.close())
        if http is not None:
            clean &= await shutdown.step("stop the HTTP endpoints", http.close())
        logs.log("stopped", clean=clean)
        if any(not task.done() for task in tasks):
            # Every resource was released above; what is left ignored every cancel, and
            # asyncio.run would wait on it forever. Exit now instead.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_UNCLEAN_STOP)
    return code if clean else EXIT_UNCLEAN_STOP
