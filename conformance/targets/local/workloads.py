"""Workloads on the local node: admission through the kubelet emulator, real KVM guests.

Guests run through the CDI-resolving runtime emulation (or a DeviceSpec's node, as a runtime
injects one) as uid/gid 65534 with zero capabilities; a long-running guest keeps a counter in its
state file so a check can see it survive faults.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

from hvconform.contract.ledger import Ledger
from hvconform.contract.node import Allocation, DeviceSpec, GuestOutcome
from hvconform.guest.cdi_resolve import resolve
from hvconform.kubelet import ThreadedKubeletEmulator
from hvconform.targets.local.runtime import guest_command, run_workload, start_workload

# Long guests are started from the emulator's runtime thread too: their handles (container IDs)
# come from one locked counter, never from the size of a dict another thread may be growing.
_HANDLES = itertools.count()
_HANDLES_LOCK = threading.Lock()


class LocalWorkloads:
    """Mixin of LocalNode: the workload half of the Node contract."""

    resource: str
    dirs: dict[str, Path]
    guest_dir: Path
    ledger: Ledger
    _guests: dict[str, subprocess.Popen[bytes]]
    _guest_runs: int
    _allocations: dict[int, Any]

    def _kubelet(self) -> ThreadedKubeletEmulator:
        raise NotImplementedError

    def allocate(self) -> Allocation:
        outcome = self._kubelet().allocate(self.resource, 1)
        response = outcome.response
        devs = response.devices if response else []
        allocation = Allocation(
            ok=outcome.ok,
            device_ids=list(outcome.device_ids),
            cdi_devices=[d.name for d in response.cdi_devices] if response else [],
            device_specs=[DeviceSpec(d.container_path, d.host_path, d.permissions) for d in devs],
            envs=dict(response.envs) if response else {},
            phase=outcome.phase,
            reason=outcome.reason,
            message=outcome.message,
            preferred=None if outcome.preferred is None else list(outcome.preferred),
        )
        if outcome.allocation is not None:
            self._allocations[id(allocation)] = outcome.allocation
        return allocation

    def release(self, allocation: Allocation) -> None:
        record = self._allocations.pop(id(allocation), None)
        if record is not None:
            self._kubelet().release(record)

    def _device_in_workload(self, allocation: Allocation) -> str:
        """Where the runtime puts the hypervisor node: as the CDI spec says, else the DeviceSpec."""
        if not allocation.cdi_devices:
            return allocation.device_specs[0].container_path
        resolved = resolve(allocation.cdi_devices[0], [str(self.dirs["cdi"])])
        return resolved.node_paths[0]

    def run_guest(self, allocation: Allocation) -> GuestOutcome:
        # Different inputs every run: equal outputs could not come from a cached answer.
        self._guest_runs += 1
        a, b = 7 + self._guest_runs, 3 * self._guest_runs
        # The device where the runtime put it, from the CDI spec: what any plugin's workload
        # would be told by its own image, never a variable only one plugin sets.
        device = self._device_in_workload(allocation)
        argv, env = guest_command("run", "--json", "--device", device, "--a", str(a), "--b", str(b))
        proc = run_workload(
            allocation.cdi_devices,
            [self.dirs["cdi"]],
            argv,
            env={**allocation.envs, **env},
            timeout=60,
            ledger=self.ledger,
            device_specs=allocation.device_specs,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
        value = json.loads(lines[-1]).get("value") if lines else None
        detail = (proc.stdout + proc.stderr).strip()[-600:]
        return GuestOutcome(ok=proc.returncode == 0, detail=detail, value=value)

    def start_long_guest(self, allocation: Allocation) -> str:
        with _HANDLES_LOCK:
            handle = f"guest-{next(_HANDLES)}"
        state = self.guest_dir / f"{handle}.json"
        argv, env = guest_command(
            "counter",
            "--device",
            self._device_in_workload(allocation),
            "--state-file",
            str(state),
            "--interval",
            "0.05",
        )
        proc = start_workload(
            allocation.cdi_devices,
            [self.dirs["cdi"]],
            argv,
            env={**allocation.envs, **env},
            ledger=self.ledger,
            device_specs=allocation.device_specs,
        )
        self._guests[handle] = proc
        record = self._allocations.get(id(allocation))
        kubelet = self._kubelet()
        if record is not None and kubelet.emulator.pods is not None:
            kubelet.container_started(record.pod_uid, handle)  # its bare pod's container
        return handle

    def long_guest_counter(self, handle: str) -> int:
        proc = self._guests[handle]
        assert proc.poll() is None, f"long-running guest {handle} exited {proc.returncode}"
        try:
            return int(json.loads((self.guest_dir / f"{handle}.json").read_text())["counter"])
        except (OSError, ValueError, KeyError):
            return 0
