"""Workloads of the container runtime: podman from the guest image's filesystem, the device
only through CDI (targets.container.podman), as uid/gid 65534.

Each guest is told where the device is as the process runtime tells it: the path the CDI spec
puts it at (any plugin's workload would know it from its own image), never a variable only one
plugin sets. A negative control at setup (no CDI device) must fail: else nothing is shown.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from hvconform.contract.ledger import Ledger
from hvconform.contract.node import Allocation, GuestOutcome
from hvconform.contract.target_report import TargetReport
from hvconform.targets.container.podman import PodmanRuntime
from hvconform.targets.local.workloads import LocalWorkloads

GUEST_TIMEOUT_S = 60.0
KVM = "/dev/kvm"


def _guest_json(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("{")]
    if not lines:
        return {}
    data: dict[str, Any] = json.loads(lines[-1])
    return data


class ContainerWorkloads(LocalWorkloads):
    """Mixin of ContainerNode: the workload half of the Node contract, under podman."""

    dirs: dict[str, Path]
    state: Path
    guest_dir: Path
    ledger: Ledger
    worker: str
    report: TargetReport
    podman: PodmanRuntime | None
    _guest_rootfs: Path
    _guest_config: dict[str, Any]
    _runs: int

    def _podman(self) -> PodmanRuntime:
        if self.podman is None:
            self.podman = PodmanRuntime(
                cdi_dir=self.dirs["cdi"], rootfs=self._guest_rootfs,
                image_config=self._guest_config, work_dir=self.state, ledger=self.ledger,
                label=self.worker,
            )  # fmt: skip
        return self.podman

    def _negative_control(self) -> None:
        """A workload WITHOUT the CDI device must not open /dev/kvm."""
        podman = self._podman()
        name = podman.new_name()
        proc = podman.run(
            name, ["run", "--json", "--device", KVM], env={"HYPERLIGHT_DEVICE_PATH": KVM},
            timeout=GUEST_TIMEOUT_S,
        )  # fmt: skip
        record = _guest_json(proc.stdout)
        entry = {"container": name, "cdi_devices": [], "exit": proc.returncode,
                 "ok": bool(record.get("ok")), "reason": str(record.get("reason", ""))[:300]}  # fmt: skip
        self.report.set("negative_control", entry)
        if proc.returncode == 0 or record.get("ok"):
            raise RuntimeError(f"negative control: a workload without CDI opened /dev/kvm: {entry}")

    def run_guest(self, allocation: Allocation) -> GuestOutcome:
        podman = self._podman()
        name = podman.new_name()
        # Different inputs every run: equal outputs could not come from a cached answer.
        self._runs += 1
        device = self._device_in_workload(allocation)
        argv = ["run", "--json", "--device", device]
        argv += ["--a", str(7 + self._runs), "--b", str(3 * self._runs)]
        proc = podman.run(
            name, argv, cdi_devices=allocation.cdi_devices, env=allocation.envs,
            timeout=GUEST_TIMEOUT_S,
        )  # fmt: skip
        record = _guest_json(proc.stdout)
        ok = proc.returncode == 0 and bool(record.get("ok"))
        cdi = ",".join(allocation.cdi_devices)
        entry = {
            "container": name, "cdi_devices": allocation.cdi_devices, "exit": proc.returncode,
            "device": record.get("device"), "uid": record.get("uid"), "gid": record.get("gid"),
            "value": record.get("value"), "expected": record.get("expected"), "ok": ok,
            **({"cdi_view": podman.view_notes} if podman.view_notes else {}),
        }  # fmt: skip
        note = f"guest {name}: device {record.get('device')} injected by CDI {cdi}, "
        note += f"uid {record.get('uid')}, value {record.get('value')}, {'ok' if ok else 'FAILED'}"
        note += f" ({'; '.join(podman.view_notes)})" if podman.view_notes else ""
        self.report.append("guest_runs", entry, note)
        detail = (proc.stdout + proc.stderr).strip()[-600:]
        return GuestOutcome(ok=ok, detail=detail, value=record.get("value"))

    def start_long_guest(self, allocation: Allocation) -> str:
        handle = f"guest-{len(self._guests)}"
        state = self.guest_dir / f"{handle}.json"
        argv = [
            "counter", "--device", self._device_in_workload(allocation),
            "--state-file", str(state), "--interval", "0.05",
        ]  # fmt: skip
        podman = self._podman()
        name = podman.new_name()
        log = (self.state / f"{handle}.log").open("ab")
        try:
            proc: subprocess.Popen[bytes] = podman.start(
                name, argv, cdi_devices=allocation.cdi_devices, env=allocation.envs,
                volumes=[self.guest_dir], stdout=log,
            )  # fmt: skip
        finally:
            log.close()
        self._guests[handle] = proc
        entry = {"container": name, "cdi_devices": allocation.cdi_devices, "long_running": True,
                 **({"cdi_view": podman.view_notes} if podman.view_notes else {})}  # fmt: skip
        self.report.append(
            "guest_runs", entry, f"long guest {name} via CDI {allocation.cdi_devices}"
        )
        return handle
