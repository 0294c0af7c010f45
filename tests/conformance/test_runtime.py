"""The runtime emulation: CDI resolution, a private /dev, --network none, uid 65534, no caps.

Real namespaces, real device nodes, the real KVM guest; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.ledger import Ledger, read_entries, survivors
from hvconform.contract.wait import wait_for
from hvconform.guest.cdi_resolve import UnresolvableCDIDevice
from hvconform.targets.host.procs import alive
from hvconform.targets.local.runtime import (
    WorkloadStartError,
    guest_command,
    run_workload,
    start_workload,
    workload_python,
)
from tests.conformance.process_guard import children, no_leftover_processes  # noqa: F401

KVM = Path("/dev/kvm")
NAME = "hyperlight.dev/hypervisor=kvm"
pytestmark = [
    pytest.mark.root,
    pytest.mark.kvm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mounts, mknod)"),
    pytest.mark.skipif(not KVM.exists(), reason="needs /dev/kvm"),
]

# The spec the plugin writes (upstream content, at the lowest version podman 4.3 resolves).
SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "hyperlight.dev/hypervisor",
    "devices": [
        {
            "name": "kvm",
            "containerEdits": {
                "deviceNodes": [
                    {
                        "path": "/dev/kvm",
                        "type": "c",
                        "permissions": "rw",
                        "uid": 65534,
                        "gid": 65534,
                    }
                ],
                "env": ["HYPERLIGHT_HYPERVISOR=kvm"],
            },
        }
    ],
}

# What a workload sees from inside, as one JSON object.
INSPECT = """
import json, os, socket
def node(p):
    st = os.lstat(p)
    return {"mode": st.st_mode, "rdev": [os.major(st.st_rdev), os.minor(st.st_rdev)],
            "uid": st.st_uid, "gid": st.st_gid}
nodes = {}
for root, dirs, files in os.walk("/dev"):
    for name in files:
        nodes[os.path.join(root, name)] = node(os.path.join(root, name))
status = {}
for line in open("/proc/self/status").read().splitlines():
    key, _, value = line.partition(":")
    status[key] = " ".join(value.split())
raw = open("/proc/self/environ", "rb").read().decode().split(chr(0))  # as given at exec
env = dict(item.split("=", 1) for item in raw if "=" in item)
print(json.dumps({"nodes": nodes, "env": env, "status": status,
                  "links": [name for _, name in socket.if_nameindex()]}))
"""


@pytest.fixture(autouse=True)
def _host_kvm_untouched() -> Iterator[None]:
    fields = ("st_rdev", "st_mode", "st_uid", "st_gid", "st_ino")
    before = [getattr(KVM.stat(), f) for f in fields]
    yield
    assert [getattr(KVM.stat(), f) for f in fields] == before, "the host's /dev/kvm changed"


@pytest.fixture
def python() -> str:
    try:
        return workload_python()
    except LookupError as exc:
        pytest.skip(f"ENVIRONMENT_BLOCKED: {exc}")


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(tmp_path / "ledger.jsonl", owner="test-runtime")
    yield ledger
    assert survivors(read_entries([ledger.path])) == [], "a workload survived"


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    (cdi / "hyperlight.json").write_text(json.dumps(SPEC))
    return cdi


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory uid 65534 can write (pytest's tmp_path is 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="hv-runtime-"))
    path.chmod(0o1777)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def _inspect(names: list[str], spec_dirs: list[Path], python: str, **kw: Any) -> dict[str, Any]:
    res = run_workload(names, spec_dirs, [python, "-c", INSPECT], timeout=60, **kw)
    assert res.returncode == 0, res.stderr
    seen: dict[str, Any] = json.loads(res.stdout)
    return seen


def test_guest_runs_through_cdi_as_nobody(spec_dir: Path, ledger: Ledger, python: str) -> None:
    argv, env = guest_command("run", "--device", "/dev/kvm", "--json", "--runs", "2")
    assert argv[0] == python and argv[-1] == "--drop-privileges"
    res = run_workload([NAME], [spec_dir], argv, env=env, timeout=60, ledger=ledger)
    assert res.returncode == 0, res.stdout + res.stderr
    runs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["ok"] for r in runs] == [True, True]
    assert all(r["value"] == r["expected"] for r in runs)
    assert {(r["uid"], r["gid"]) for r in runs} == {(65534, 65534)}
    assert runs[0]["privileges"]["CapBnd"] == "0000000000000000"


def test_workload_sees_only_the_resolved_nodes(spec_dir: Path, python: str) -> None:
    seen = _inspect([NAME], [spec_dir], python, env={"EXTRA": "1"})
    host = KVM.stat()
    assert set(seen["nodes"]) == {"/dev/kvm", "/dev/null", "/dev/zero", "/dev/urandom"}
    kvm = seen["nodes"]["/dev/kvm"]
    assert stat.S_ISCHR(kvm["mode"]) and stat.S_IMODE(kvm["mode"]) == 0o666  # as podman did
    assert (kvm["uid"], kvm["gid"]) == (65534, 65534)
    assert kvm["rdev"] == [os.major(host.st_rdev), os.minor(host.st_rdev)]  # from lstat
    assert seen["nodes"]["/dev/null"]["rdev"] == [1, 3]
    assert seen["env"]["HYPERLIGHT_HYPERVISOR"] == "kvm" and seen["env"]["EXTRA"] == "1"
    assert set(seen["env"]) == {"PATH", "HOME", "HYPERLIGHT_HYPERVISOR", "EXTRA"}
    status = seen["status"]
    assert status["Uid"] == status["Gid"] == "65534 65534 65534 65534"
    assert status["NoNewPrivs"] == "1" and status["Groups"] == ""
    assert {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {
        "CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0
    }  # fmt: skip
    assert seen["links"] == ["lo"], "--network none: a fresh namespace with loopback only"


def test_spec_numbers_mode_owner_and_host_path(tmp_path: Path, python: str) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    edits = {
        "deviceNodes": [
            {"path": "/dev/hv/kvm", "hostPath": "/dev/kvm", "fileMode": 0o640, "uid": 1, "gid": 2},
            {"path": "/dev/ronull", "type": "c", "major": 1, "minor": 3, "permissions": "r"},
        ]
    }
    spec = {"cdiVersion": "0.5.0", "kind": "example.com/test",
            "devices": [{"name": "pair", "containerEdits": edits}]}  # fmt: skip
    (cdi / "test.json").write_text(json.dumps(spec))
    nodes = _inspect(["example.com/test=pair"], [cdi], python)["nodes"]
    alias, ronull = nodes["/dev/hv/kvm"], nodes["/dev/ronull"]
    assert alias["rdev"] == [10, 232] and stat.S_IMODE(alias["mode"]) == 0o640
    assert (alias["uid"], alias["gid"]) == (1, 2)
    assert ronull["rdev"] == [1, 3] and stat.S_IMODE(ronull["mode"]) == 0o444
    assert (ronull["uid"], ronull["gid"]) == (0, 0)


def test_guest_fails_without_the_cdi_device(spec_dir: Path, python: str) -> None:
    argv, env = guest_command("run", "--device", "/dev/kvm", "--json")
    res = run_workload([], [spec_dir], argv, env=env, timeout=60)
    assert res.returncode == 1
    (run,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert run["ok"] is False and "No such file or directory" in run["reason"]


def test_unresolvable_name_fails_like_a_runtime(spec_dir: Path, python: str) -> None:
    before = children()
    with pytest.raises(UnresolvableCDIDevice) as info:
        run_workload(["hyperlight.dev/hypervisor=mshv"], [spec_dir], [python, "-c", "0"])
    assert str(info.value) == "unresolvable CDI devices hyperlight.dev/hypervisor=mshv"
    assert children() == before, "nothing may start for an unresolvable device"


def test_start_errors_say_the_workload_never_ran(tmp_path: Path) -> None:
    with pytest.raises(WorkloadStartError, match=r"exit 127.*No such file") as missing:
        run_workload([], [], ["/nonexistent/workload"])
    assert missing.value.code == 127
    private = tmp_path / "tool.sh"  # tmp_path is 0700 root: unreachable for uid 65534
    private.write_text("#!/bin/sh\nexit 0\n")
    private.chmod(0o755)
    with pytest.raises(WorkloadStartError, match="Permission denied") as denied:
        run_workload([], [], [str(private)])
    assert denied.value.code == 126
    assert run_workload([], [], [str(private)], uid=0, gid=0).returncode == 0


def test_long_running_counter_stops_cleanly(
    spec_dir: Path, shared_dir: Path, ledger: Ledger, python: str
) -> None:
    state = shared_dir / "counter.json"
    argv, env = guest_command(
        "counter", "--device", "/dev/kvm", "--state-file", str(state), "--interval", "0.02"
    )
    proc = start_workload([NAME], [spec_dir], argv, env=env, ledger=ledger,
                          stderr=subprocess.PIPE)  # fmt: skip
    try:

        def counter() -> int:
            try:
                data = json.loads(state.read_text())
            except (OSError, ValueError):
                return 0
            assert data["ok"], data
            return int(data["counter"])

        wait_for(lambda: counter() >= 3, 20, "the guest counter to reach 3")
        reached = counter()
        wait_for(lambda: counter() > reached, 10, f"the guest counter to pass {reached}")
        assert json.loads(state.read_text())["pid"] == proc.pid  # exec'ed: same process
        assert state.stat().st_uid == 65534
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert not alive(proc.pid)
