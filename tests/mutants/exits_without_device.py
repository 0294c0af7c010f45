"""Mutant: the plugin exits at start when its device does not exist yet (a `log.Fatal` on a
missing /dev/kvm), instead of waiting for it: kubevirt/kubevirt#4748."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from hv_device_plugin import __main__ as entry
from hv_device_plugin import daemon
from hv_device_plugin.config import Config
from hv_device_plugin.logs import warn
from hv_device_plugin.probe_worker import ProbeWorker

_run = daemon.run


async def _run_only_with_device(
    cfg: Config, listener: socket.socket | None = None, worker: ProbeWorker | None = None
) -> int:
    device = cfg.host_view_path or Path(cfg.hypervisor_device)
    if not device.exists():
        warn("device_absent_exit", device=str(device))
        if worker is not None:  # run() owns the helper: closed here instead
            await worker.close()
        return 1
    return await _run(cfg, listener, worker)


daemon.run = _run_only_with_device

if __name__ == "__main__":
    sys.exit(entry.main())
