"""The runtime emulation given an Allocate answer's DeviceSpecs instead of CDI devices.

A container runtime makes each DeviceSpec's host node at its container path in the container's
/dev; the local runtime does the same with mknod (kind and numbers from lstat of host_path, mode
from permissions, owner 0). Real namespaces, real device nodes, the real KVM guest as uid 65534.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.ledger import Ledger, read_entries, survivors
from hvconform.contract.node import DeviceSpec
from hvconform.targets.local.runtime import (
    WorkloadStartError,
    guest_command,
    run_workload,
    workload_python,
)
from tests.conformance.process_guard import children

KVM = Path("/dev/kvm")
pytestmark = [
    pytest.mark.root,
    pytest.mark.kvm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mounts, mknod)"),
    pytest.mark.skipif(not KVM.exists(), reason="needs /dev/kvm"),
]

# Every node of the workload's /dev, as it sees them, as one JSON object.
NODES = """
import json, os
out = {}
for root, _, files in os.walk("/dev"):
    for name in files:
        st = os.lstat(os.path.join(root, name))
        out[os.path.join(root, name)] = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid,
                                         "rdev": [os.major(st.st_rdev), os.minor(st.st_rdev)]}
print(json.dumps(out))
"""


@pytest.fixture(autouse=True)
def _host_kvm_untouched() -> Iterator[None]:
    fields = ("st_rdev", "st_mode", "st_uid", "st_gid", "st_ino")
    before = [getattr(KVM.stat(), f) for f in fields]
    yield
    assert [getattr(KVM.stat(), f) for f in fields] == before, "the host's /dev/kvm changed"


@pytest.fixture
def python() -> str:
    return workload_python()


def _nodes(specs: list[DeviceSpec], python: str) -> dict[str, Any]:
    res = run_workload([], [], [python, "-c", NODES], timeout=60, device_specs=specs)
    assert res.returncode == 0, res.stderr
    seen: dict[str, Any] = json.loads(res.stdout)
    return seen


def test_guest_runs_through_a_device_spec_as_nobody(tmp_path: Path, python: str) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl", owner="test-runtime-devspec")
    argv, env = guest_command("run", "--device", "/dev/kvm", "--json", "--runs", "2")
    spec = DeviceSpec("/dev/kvm", "/dev/kvm", "rw")
    res = run_workload([], [], argv, env=env, timeout=60, ledger=ledger, device_specs=[spec])
    assert res.returncode == 0, res.stdout + res.stderr
    runs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["ok"] for r in runs] == [True, True]
    assert all(r["value"] == r["expected"] for r in runs)
    assert {(r["uid"], r["gid"]) for r in runs} == {(65534, 65534)}
    assert survivors(read_entries([ledger.path])) == [], "a workload survived"


def test_the_host_node_is_made_at_the_container_path(python: str) -> None:
    host = KVM.stat()
    specs = [DeviceSpec("/dev/hv0", "/dev/kvm", "rw"), DeviceSpec("/dev/ro", "/dev/null", "r")]
    nodes = _nodes(specs, python)
    assert set(nodes) == {"/dev/hv0", "/dev/ro", "/dev/null", "/dev/zero", "/dev/urandom"}
    hv0, ro = nodes["/dev/hv0"], nodes["/dev/ro"]
    assert stat.S_ISCHR(hv0["mode"]) and stat.S_IMODE(hv0["mode"]) == 0o666
    assert hv0["rdev"] == [os.major(host.st_rdev), os.minor(host.st_rdev)]
    assert (hv0["uid"], hv0["gid"]) == (0, 0)
    assert ro["rdev"] == [1, 3] and stat.S_IMODE(ro["mode"]) == 0o444


def test_the_guest_fails_without_the_device_spec(python: str) -> None:
    argv, env = guest_command("run", "--device", "/dev/kvm", "--json")
    res = run_workload([], [], argv, env=env, timeout=60)
    (run,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert res.returncode == 1 and run["ok"] is False


@pytest.mark.parametrize(
    ("host_path", "message"),
    [("/dev/no-such-node", "failed to stat DeviceSpec host path"), ("/etc/hostname", "no device")],
)
def test_a_host_path_that_is_no_device_fails_before_anything_starts(
    python: str, host_path: str, message: str
) -> None:
    before = children()
    with pytest.raises(WorkloadStartError) as info:
        run_workload([], [], [python, "-c", "0"], device_specs=[DeviceSpec("/dev/x", host_path)])
    assert info.value.code == 125 and message in str(info.value)
    assert children() == before, "nothing may start for an unusable DeviceSpec"
