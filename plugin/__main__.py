"""Process wiring: the only place that exits. `hv-device-plugin --help` lists every option."""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":  # `python -m plugin`; the console script goes through plugin.entry
    from plugin.entry import exit_on_sigterm

    exit_on_sigterm()

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from plugin import logs, shutdown
from plugin.api.wire import DEVICE_PLUGIN_DIR
from plugin.cdi import CdiReconciler
from plugin.cdi_spec import desired_spec
from plugin.config import Config, ConfigError, env_name, parse_config
from plugin.endpoints import LIVENESS_SERVICE, READINESS_SERVICE, HttpEndpoints
from plugin.health import HealthState
from plugin.inputs import Invalid, parse_seconds, printable
from plugin.monitor import Monitor
from plugin.options import OneLineParser
from plugin.preflight import preflight
from plugin.probe_worker import ProbeWorker
from plugin.registration import Registrar
from plugin.server import DevicePluginServicer
from plugin.version import source_commit, version

SHUTDOWN_FLUSH_S = 2.0
# A refused configuration: one line on stderr, nothing created.
EXIT_CONFIG = 2
# Deadline of one gRPC Health call made by the `probe` subcommand.
PROBE_RPC_TIMEOUT_S = (0.05, 60.0)
# A shutdown step stalled or failed, or a task lost its cancel: logged, and the exit says so.
EXIT_UNCLEAN_STOP = 3


def _reconciler(cfg: Config) -> CdiReconciler | None:
    if cfg.mode == "device-access":
        return None
    desired = desired_spec(
        kind_name=cfg.resource_name,
        device_name=cfg.device_name,
        device_path=cfg.hypervisor_device,
        uid=cfg.device_uid,
        gid=cfg.device_gid,
        cdi_version=cfg.cdi_version,
    )
    return CdiReconciler(cfg.cdi_dir, cfg.cdi_filename, desired)


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


async def run(cfg: Config, listener: socket.socket | None = None) -> int:
    health = HealthState()
    worker = None if cfg.mode == "device-access" else ProbeWorker(timeout_s=cfg.probe_timeout_s)
    monitor = Monitor(cfg, health, worker, _reconciler(cfg))
    registrar = Registrar(cfg, health, lambda: DevicePluginServicer(cfg, health, monitor))
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
        waiter = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        for task in done:
            if task is not waiter and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
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


def probe_main(argv: Sequence[str]) -> int:
    """`probe liveness|readiness`: gRPC Health on the plugin's own socket, for exec probes."""
    parser = OneLineParser(
        prog="hv-device-plugin probe",
        description="Ask the running plugin over gRPC Health v1 on its socket; exit 0 when "
        "SERVING, 1 otherwise. Use as a Kubernetes exec probe.",
    )
    parser.add_argument("which", choices=("liveness", "readiness"))
    parser.add_argument(
        "--device-plugin-dir",
        default=None,
        help=f"plugin socket dir [{env_name('device-plugin-dir')}]",
    )
    parser.add_argument("--mode", default=None, help=f"plugin mode [{env_name('mode')}]")
    low, high = PROBE_RPC_TIMEOUT_S
    parser.add_argument("--timeout", default="2", help=f"seconds per attempt, {low:g} to {high:g}")
    try:
        ns = parser.parse_args(list(argv))
        timeout = parse_seconds(ns.timeout, low, high)
    except (ConfigError, Invalid) as exc:
        where = "--timeout: " if isinstance(exc, Invalid) else ""
        print(f"hv-device-plugin probe: {where}{printable(str(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        base = parse_config([])
    except ConfigError:
        base = None
    plugin_dir = Path(
        ns.device_plugin_dir or (base.device_plugin_dir if base else DEVICE_PLUGIN_DIR)
    )
    mode = ns.mode or (base.mode if base else "hypervisor")
    prefix = "hyperlight-access" if mode == "device-access" else "hyperlight"
    service = LIVENESS_SERVICE if ns.which == "liveness" else READINESS_SERVICE
    sockets = sorted(plugin_dir.glob(f"{prefix}-*.sock"), key=lambda p: -p.lstat().st_mtime)
    answer = {"probe": ns.which, "status": "NO_SOCKET", "socket": ""}
    for sock in sockets:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=timeout
                )
            except grpc.RpcError as exc:
                answer = {
                    "probe": ns.which,
                    "status": f"ERROR {exc.code().name}",
                    "socket": str(sock),
                }
                continue
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        answer = {"probe": ns.which, "status": status, "socket": str(sock)}
        if status == "SERVING":
            break
    print(json.dumps(answer))
    return 0 if answer["status"] == "SERVING" else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["probe"]:
        return probe_main(args[1:])
    # One step, before anything is created: every value, then the directories, then the port.
    try:
        cfg = parse_config(args)
        listener = preflight(cfg)
    except ConfigError as exc:
        print(f"hv-device-plugin: {printable(str(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    logs.setup(
        cfg.log_level, component="hv-device-plugin", mode=cfg.mode, resource=cfg.resource_name
    )
    try:
        return asyncio.run(run(cfg, listener))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
