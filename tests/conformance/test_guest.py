"""Tests for hvconform.guest: real KVM guests, real subprocesses, real device nodes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.wait import wait_for
from hvconform.guest import kvm_guest
from hvconform.guest.kvm_guest import (
    COUNTER_ADDR,
    COUNTER_CODE,
    GUEST_BASE,
    OUT_PORT,
    KvmError,
    KvmVm,
    expected_value,
    run_counter,
    run_guest,
)
from hvconform.targets.local.runtime import guest_command
from tests.conformance.guest_specs import write_spec as _spec
from tests.conformance.process_guard import children, no_leftover_processes  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
KVM = "/dev/kvm"
NAME = "hyperlight.dev/hypervisor=kvm"

kvm_usable = pytest.mark.skipif(
    not os.access(KVM, os.R_OK | os.W_OK), reason="needs a usable /dev/kvm"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, chown, setuid)")


def _fd_count() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """A world-traversable temp dir (pytest's tmp_path is 0700 root, unreachable for 65534)."""
    path = Path(tempfile.mkdtemp(prefix="guest-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)
    assert not path.exists()


def _mknod(path: Path, major: int, minor: int, owner: int = 0) -> Path:
    os.mknod(path, 0o600 | 0o020000, os.makedev(major, minor))  # S_IFCHR
    os.chown(path, owner, owner)
    path.chmod(0o600)  # mknod honours the umask; set the mode explicitly
    return path


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "hvconform.guest", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def _json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# ---------------------------------------------------------------- KVM guest, in process


@kvm_usable
@pytest.mark.kvm
def test_guest_computes_value_from_inputs() -> None:
    inputs = [(0, 0), (6, 7), (100, 200), (255, 256), (1234, 4321), (65535, 65535)]
    values = []
    for a, b in inputs:
        res = run_guest(KVM, a, b)
        assert res.ok, res.reason
        assert res.value == res.expected == expected_value(a, b)
        assert res.exits == [f"IO:out:{OUT_PORT:#x}:2:{res.value:#x}", "HLT"]
        assert res.duration_s > 0
        values.append(res.value)
    # distinct inputs, distinct outputs: the number comes from the guest, not a constant
    assert len(set(values)) == len(inputs)


@kvm_usable
@pytest.mark.kvm
def test_fresh_execution_after_disposal() -> None:
    fds = _fd_count()
    first, second = run_guest(KVM, 3, 4), run_guest(KVM, 5, 6)
    assert first.ok and second.ok and first.value != second.value
    # guest memory belongs to its VM: a counter advanced in vm1 starts from 0 in vm2
    with KvmVm(KVM) as vm1, KvmVm(KVM) as vm2:
        for vm in (vm1, vm2):
            vm.write(GUEST_BASE, COUNTER_CODE)
        for _ in range(3):
            vm1.enter(GUEST_BASE)
        _, outs = vm2.enter(GUEST_BASE)
        assert (vm1.read_u32(COUNTER_ADDR), outs) == (3, [1])
    vm3 = KvmVm(KVM)
    vm3.write(GUEST_BASE, COUNTER_CODE)
    assert vm3.enter(GUEST_BASE) == ([f"IO:out:{OUT_PORT:#x}:4:0x1", "HLT"], [1])
    vm3.close()
    vm3.close()  # idempotent
    assert _fd_count() == fds, "a VM leaked file descriptors"
    assert "anon_inode:kvm" not in Path("/proc/self/maps").read_text()


@kvm_usable
@pytest.mark.kvm
def test_guest_run_time_is_small() -> None:
    durations = [run_guest(KVM, i, i + 1).duration_s for i in range(20)]
    assert statistics.median(durations) < 0.5


def test_bad_inputs_and_paths_are_reported() -> None:
    with pytest.raises(ValueError, match=r"0\.\.65535"):
        run_guest(KVM, -1, 2)
    res = run_guest("/nonexistent/kvm", 1, 2)
    assert not res.ok and "No such file" in res.reason and res.value is None


# ---------------------------------------------------------------- device nodes, subprocesses


@kvm_usable
@needs_root
@pytest.mark.kvm
@pytest.mark.root
def test_guest_unprivileged_with_zero_capabilities(node_dir: Path) -> None:
    node = _mknod(node_dir / "kvm", 10, 232, owner=65534)  # what CDI uid/gid give a pod
    proc = _cli("run", "--device", str(node), "--runs", "3", "--drop-privileges", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = _json_lines(proc.stdout)
    assert len(runs) == 3 and len({r["value"] for r in runs}) == 3
    for rec in runs:
        assert rec["ok"] and rec["value"] == rec["expected"], rec
        assert (rec["uid"], rec["gid"]) == (65534, 65534)
        privs = rec["privileges"]
        for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
            assert int(privs[cap], 16) == 0
        assert privs["NoNewPrivs"] == "1"
        assert privs["Uid"] == "65534 65534 65534 65534" and privs["Groups"] == ""
    # the root-owned 0600 host node is refused to the same unprivileged process
    denied = _cli("run", "--device", KVM, "--drop-privileges", "--json")
    assert denied.returncode == 1
    assert "Permission denied" in _json_lines(denied.stdout)[0]["reason"]


@kvm_usable
@needs_root
@pytest.mark.kvm
@pytest.mark.root
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_drop_privileges_in_an_already_unprivileged_process(node_dir: Path) -> None:
    node = _mknod(node_dir / "kvm", 10, 232, owner=65534)
    ids = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    # As uid 65534 the checkout may be out of reach (below a 0700 home): the staged guest.
    guest, staged = guest_command("run", "--device", str(node), "--json")
    env = {**os.environ, **staged}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [*ids, *extra, *guest]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)

    # like a pod with runAsUser 65534 and capabilities drop ALL: nothing left to drop, still ok
    hardened = run("--bounding-set=-all", "--inh-caps=-all")
    assert hardened.returncode == 0, hardened.stdout + hardened.stderr
    assert _json_lines(hardened.stdout)[0]["ok"]
    # a bounding set that can no longer be emptied is a setup failure with a clear reason
    partial = run()
    assert partial.returncode == 3
    (rec,) = _json_lines(partial.stdout)
    assert rec["stage"] == "privileges" and "PR_CAPBSET_DROP" in rec["reason"]


@kvm_usable
@needs_root
@pytest.mark.kvm
@pytest.mark.root
def test_cli_resolves_cdi_then_runs(node_dir: Path) -> None:
    node = _mknod(node_dir / "kvm", 10, 232, owner=65534)
    cdi = node_dir / "cdi"
    cdi.mkdir()
    _spec(cdi / "hyperlight.json", str(node), env=["HYPERLIGHT_HYPERVISOR=kvm"])
    proc = _cli("run", "--cdi-device", NAME, "--cdi-dir", str(cdi), "--drop-privileges", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = _json_lines(proc.stdout)
    assert rec["ok"] and rec["device"] == str(node)
    assert rec["cdi"]["spec_file"] == str(cdi / "hyperlight.json")
    assert rec["cdi"]["env"] == {"HYPERLIGHT_HYPERVISOR": "kvm"}


@needs_root
@pytest.mark.root
def test_dev_null_numbered_node_fails_clearly(node_dir: Path) -> None:
    node = _mknod(node_dir / "not-kvm", 1, 3)
    proc = _cli("run", "--device", str(node), "--json")
    assert proc.returncode == 1
    (rec,) = _json_lines(proc.stdout)
    assert not rec["ok"] and rec["value"] is None
    assert "(char 1:3) is not a KVM device" in rec["reason"]
    assert "KVM_GET_API_VERSION" in rec["reason"] and "errno 25" in rec["reason"]


def test_cli_rejects_bad_input() -> None:
    assert _cli("--help").returncode == 0 and "examples:" in _cli("--help").stdout
    no_device = _cli("run")
    assert no_device.returncode == 2 and "no device" in no_device.stderr
    assert _cli("run", "--device", KVM, "--runs", "0").returncode == 2
    bad_name = _cli("run", "--cdi-device", "kvm")
    assert bad_name.returncode == 2 and "want vendor/class=name" in bad_name.stderr
    assert _cli("counter", "--device", KVM).returncode == 2  # --state-file missing


def test_cli_unresolvable_cdi_device(tmp_path: Path) -> None:
    proc = _cli("run", "--cdi-device", NAME, "--cdi-dir", str(tmp_path), "--json")
    assert proc.returncode == 3
    (rec,) = _json_lines(proc.stdout)
    assert rec["stage"] == "cdi" and rec["reason"].startswith(f"unresolvable CDI devices {NAME}")


# ---------------------------------------------------------------- long-running counter


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return state


@kvm_usable
@pytest.mark.kvm
def test_counter_rises_and_stops_on_sigterm(node_dir: Path) -> None:
    state_file = node_dir / "state.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "hvconform.guest", "counter", "--device", KVM]
    cmd += ["--state-file", str(state_file), "--interval", "0.02"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    seen: list[int] = []

    def passed_five() -> bool:
        state = _read_state(state_file)  # rename-replaced: never a torn read
        if state is None:
            assert proc.poll() is None, "counter exited early"
            return False
        assert state["ok"] and state["pid"] == proc.pid, state
        seen.append(state["counter"])
        return bool(state["counter"] > 5)

    try:
        wait_for(passed_five, 30, "the guest counter to pass 5")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert seen == sorted(seen)
    final = _read_state(state_file)
    assert final is not None and final["ok"] and final["counter"] >= seen[-1]
    assert not Path(f"/proc/{proc.pid}").exists()
    assert [p.name for p in node_dir.iterdir()] == ["state.json"]  # no temp files left


@kvm_usable
@pytest.mark.kvm
def test_counter_exits_nonzero_when_kvm_run_fails(
    node_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_enter = KvmVm.enter
    calls = []

    def flaky_enter(self: KvmVm, rip: int) -> tuple[list[str], list[int]]:
        calls.append(rip)
        if len(calls) > 3:
            raise KvmError("KVM_RUN failed: Bad address (errno 14)")
        return real_enter(self, rip)

    monkeypatch.setattr(kvm_guest.KvmVm, "enter", flaky_enter)
    state_file = node_dir / "state.json"
    assert run_counter(KVM, str(state_file), 0, None) == 1
    state = _read_state(state_file)
    assert state is not None and state["counter"] == 3 and not state["ok"]
    assert "KVM_RUN failed" in state["last_error"]
    assert run_counter("/nonexistent", str(state_file), 0, 1) == 1


@kvm_usable
@pytest.mark.kvm
def test_counter_max_iterations_in_process(node_dir: Path) -> None:
    fds = _fd_count()
    state_file = node_dir / "s.json"
    assert run_counter(KVM, str(state_file), 0, 25) == 0
    state = _read_state(state_file)
    assert state is not None and state == {**state, "counter": 25, "ok": True, "pid": os.getpid()}
    assert _fd_count() == fds
