"""Workloads under podman get /dev/kvm only through CDI: the negative controls."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from hv_device_plugin.cdi import CdiReconciler, desired_spec, qualified_name
from hvconform.contract.ledger import Ledger, read_entries, survivors
from hvconform.targets.container.images import ImageSet, image_config
from hvconform.targets.container.podman import PodmanRuntime

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]
KVM = qualified_name("hyperlight.dev/hypervisor", "kvm")


@pytest.fixture
def podman(
    tmp_path: Path, client: docker.DockerClient, images: ImageSet, guest_rootfs: Path
) -> Iterator[PodmanRuntime]:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    spec = desired_spec(device_name="kvm", device_path="/dev/kvm")
    CdiReconciler(cdi, "hyperlight.json", spec).reconcile()
    ledger = Ledger(tmp_path / "ledger.jsonl", owner="test")
    runtime = PodmanRuntime(
        cdi_dir=cdi, rootfs=guest_rootfs, image_config=image_config(client, images.guest),
        work_dir=tmp_path, ledger=ledger, label="t",
    )  # fmt: skip
    yield runtime
    assert runtime.close() == []
    left = survivors(read_entries([ledger.path]))
    assert not left, left


def guest(podman: PodmanRuntime, **kw: object) -> tuple[int, dict[str, object], str]:
    proc = podman.run(podman.new_name(), ["run", "--json"], timeout=60, **kw)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, json.loads(lines[-1]) if lines else {}, proc.stdout + proc.stderr


def test_with_the_cdi_device_the_guest_runs_as_nobody(podman: PodmanRuntime) -> None:
    code, record, out = guest(podman, cdi_devices=[KVM])
    assert code == 0, out
    assert record["ok"] and record["value"] == record["expected"]
    assert (record["uid"], record["gid"]) == (65534, 65534)
    assert record["device"] == "/dev/kvm"  # from HYPERLIGHT_DEVICE_PATH, a CDI env edit


def test_without_the_cdi_device_kvm_cannot_be_opened(podman: PodmanRuntime) -> None:
    code, record, out = guest(podman, env={"HYPERLIGHT_DEVICE_PATH": "/dev/kvm"})
    assert code != 0, out
    assert record["ok"] is False
    assert "open /dev/kvm failed: No such file or directory" in str(record["reason"]), out


def test_a_hostpath_alone_is_denied_by_the_device_cgroup(podman: PodmanRuntime) -> None:
    # The host node bind-mounted with no device rule: what a hostPath volume gives a pod. Run as
    # uid 0 (no capabilities), the node's owner, so the file mode allows it and only the device
    # cgroup can refuse: EPERM, not EACCES.
    code, record, out = guest(
        podman,
        env={"HYPERLIGHT_DEVICE_PATH": "/dev/kvm"},
        extra=["--volume", "/dev/kvm:/dev/kvm"],
        user="0:0",
    )
    assert code != 0, out
    assert record["uid"] == 0
    assert "Operation not permitted" in str(record["reason"]), out


def test_an_unknown_cdi_device_is_unresolvable(podman: PodmanRuntime) -> None:
    code, _, out = guest(podman, cdi_devices=["hyperlight.dev/hypervisor=mshv"])
    assert code != 0
    assert "unresolvable CDI devices hyperlight.dev/hypervisor=mshv" in out


def test_nothing_lands_in_the_hosts_container_storage(podman: PodmanRuntime) -> None:
    before = os.path.exists("/var/lib/containers")
    code, _, out = guest(podman, cdi_devices=[KVM])
    assert code == 0, out
    assert os.path.exists("/var/lib/containers") == before
