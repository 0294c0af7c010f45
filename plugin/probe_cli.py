"""`hv-device-plugin probe liveness|readiness`: gRPC Health v1 on the plugin's own socket."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hv_device_plugin.api.dra_wire import PLUGINS_DIR
from hv_device_plugin.api.names import DRA_DRIVER, DRA_SOCKET
from hv_device_plugin.api.wire import DEVICE_PLUGIN_DIR
from hv_device_plugin.config import EXIT_CONFIG, ConfigError, env_name, parse_config
from hv_device_plugin.endpoints import LIVENESS_SERVICE, READINESS_SERVICE
from hv_device_plugin.inputs import Invalid, parse_seconds, printable
from hv_device_plugin.options import OneLineParser

# Deadline of one gRPC Health call made by the `probe` subcommand.
PROBE_RPC_TIMEOUT_S = (0.05, 60.0)


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
    parser.add_argument(
        "--dra-plugin-dir",
        default=None,
        help=f"--mode dra: the driver's socket dir [{env_name('dra-plugin-dir')}]",
    )
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
    if mode == "dra":  # the DRA driver answers Health on its DRAPlugin endpoint
        dra_dir = ns.dra_plugin_dir or (
            str(base.dra.plugin_dir) if base and base.dra else f"{PLUGINS_DIR}/{DRA_DRIVER}"
        )
        sockets = [p for p in [Path(dra_dir) / DRA_SOCKET] if p.exists()]
    else:
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
