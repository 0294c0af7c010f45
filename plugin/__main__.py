"""Process wiring: the only place that exits. `hv-device-plugin --help` lists every option.

Start-up order is a measured choice: configuration (light modules), then the probe helper is
spawned, and only then are grpc and protobuf imported (hv_device_plugin.daemon), about 70 ms that the
helper's own interpreter start overlaps on another core. The device is still checked, and the
spec repaired, before anything is advertised.
"""

from __future__ import annotations

import sys

if (
    __name__ == "__main__"
):  # `python -m hv_device_plugin`; the console script goes through hv_device_plugin.entry
    from hv_device_plugin.entry import exit_on_sigterm

    exit_on_sigterm()

import asyncio
import socket
from collections.abc import Sequence

from hv_device_plugin import logs
from hv_device_plugin.config import EXIT_CONFIG, Config, ConfigError, parse_config
from hv_device_plugin.inputs import printable
from hv_device_plugin.preflight import preflight
from hv_device_plugin.probe_worker import ProbeWorker


def probe_main(argv: Sequence[str]) -> int:
    """`probe liveness|readiness` (hv_device_plugin.probe_cli): loaded only when asked for."""
    from hv_device_plugin.probe_cli import (
        probe_main as probe,  # grpc: not on the serving path's clock
    )

    return probe(argv)


async def _start(cfg: Config, listener: socket.socket | None) -> int:
    worker = None if cfg.mode == "device-access" else ProbeWorker(timeout_s=cfg.probe_timeout_s)
    try:
        if worker is not None:
            await worker.start()
        # Deliberately here, after the spawn (see the module docstring), not at the top.
        if cfg.mode == "dra":
            from hv_device_plugin.dra.daemon import run_dra

            return await run_dra(cfg, listener, worker)
        from hv_device_plugin.daemon import run
    except BaseException:
        if worker is not None:
            await worker.close()
        raise
    return await run(cfg, listener, worker)


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
        return asyncio.run(_start(cfg, listener))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
