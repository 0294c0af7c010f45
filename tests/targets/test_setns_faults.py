"""The in-container faults for a shell-less plugin image, made by system calls through setns(2)
(hvconform.targets.cluster.setns_faults), for real: a process in a mount namespace of its own
stands for the plugin container (a root with no shell, no mount tools: only the process), and
what the faults did is read from its mount table (/proc/<pid>/mountinfo) and its view of the
paths, from outside."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvconform.targets.cluster.access import NodeAccessError
from hvconform.targets.cluster.kube import ExecResult
from hvconform.targets.cluster.setns_faults import SetnsFaults

pytestmark = [pytest.mark.root]


class ThisMachine:
    """The node is this machine; the container runtime is asked nothing (the pid is known)."""

    where = "this machine"

    def run(self, argv: list[str], timeout: float = 60) -> ExecResult:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        return ExecResult(done.returncode, done.stdout, done.stderr)

    def wrap(self, argv: list[str]) -> str:
        return " ".join(argv)


class KnownPid(SetnsFaults):
    def __init__(self, pid: int, access: ThisMachine) -> None:
        super().__init__(access)
        self.known = pid

    def _pid(self, container: str) -> str:
        return str(self.known)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A process in its own (private) mount namespace, holding tmp_path's dirs as its view."""
    (tmp_path / "cdi").mkdir()
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kvm").touch()
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "echo up; exec sleep 300"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    try:
        yield proc.pid, tmp_path
    finally:
        proc.kill()
        proc.wait(10)


def mounts_at(pid: int, path: Path) -> list[str]:
    """The file system type and options of each mount at `path` in pid's namespace."""
    found = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            sep = fields.index("-")
            found.append(f"{fields[sep + 1]} {fields[5]}")
    return found


def test_read_only_and_empty_views_made_and_undone_by_system_calls(
    plugin: tuple[int, Path],
) -> None:
    pid, root = plugin
    faults = KnownPid(pid, ThisMachine())
    assert faults.probe("c0ffee") == ""
    cdi = root / "cdi"
    (cdi / "spec.json").write_text("{}")
    faults.run("c0ffee", "ro-empty", str(cdi))
    assert [m.split()[0] for m in mounts_at(pid, cdi)] == ["tmpfs"]
    assert mounts_at(pid, cdi)[0].split()[1].startswith("ro")
    assert not any(Path(f"/proc/{pid}/root{cdi}").iterdir())  # the plugin sees it empty ...
    assert mounts_at(os.getpid(), cdi) == [] and (cdi / "spec.json").exists()  # ... only it
    faults.run("c0ffee", "undo", str(cdi))
    assert mounts_at(pid, cdi) == []
    assert [p.name for p in Path(f"/proc/{pid}/root{cdi}").iterdir()] == ["spec.json"]


def test_unusable_device_view_and_back(plugin: tuple[int, Path]) -> None:
    pid, root = plugin
    faults = KnownPid(pid, ThisMachine())
    assert faults.probe("c0ffee") == ""
    view, device = root / "dev", root / "dev" / "kvm"
    other = root / "device"
    other.touch()
    faults.run("c0ffee", "unusable", str(view), "kvm", str(other))
    node = os.stat(f"/proc/{pid}/root{device}")
    assert (os.major(node.st_rdev), os.minor(node.st_rdev)) == (1, 3)  # /dev/null's
    assert mounts_at(pid, other) != []  # /dev/null bound over the device path
    faults.run("c0ffee", "usable", str(view), "kvm", str(other))
    assert mounts_at(pid, view) == [] and mounts_at(pid, other) == []


def test_failures_are_one_line_errors(plugin: tuple[int, Path]) -> None:
    pid, root = plugin
    faults = KnownPid(pid, ThisMachine())
    with pytest.raises(NodeAccessError, match="before a successful probe"):
        faults.run("c0ffee", "empty", str(root))
    assert faults.probe("c0ffee") == ""
    with pytest.raises(NodeAccessError, match=r"umount .*: Invalid argument"):
        faults.run("c0ffee", "undo", str(root / "cdi"))  # nothing mounted there
    gone = KnownPid(2**22 + 1, ThisMachine())
    assert "setns from the node failed" in gone.probe("c0ffee")


@pytest.fixture
def own_dev(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A process whose dev dir is a tmpfs of its own holding `kvm`, a bind of a file of the
    host's (as a runtime gives a container /dev and a hostPath CharDevice mount)."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "hostkvm").write_text("the host's device\n")
    setup = (
        f'mount -t tmpfs -o size=64k hvt-dev "{tmp_path}/dev" && touch "{tmp_path}/dev/kvm" && '
        f'mount --bind "{tmp_path}/hostkvm" "{tmp_path}/dev/kvm" && echo up && exec sleep 300'
    )
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", setup], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    try:
        yield proc.pid, tmp_path
    finally:
        proc.kill()
        proc.wait(10)


def test_the_plugins_own_device_mount_taken_away_and_back(own_dev: tuple[int, Path]) -> None:
    pid, root = own_dev
    faults = KnownPid(pid, ThisMachine())
    assert faults.probe("c0ffee") == ""
    device, view = root / "dev" / "kvm", Path(f"/proc/{pid}/root{root}/dev")
    faults.run("c0ffee", "device-absent", str(device))
    assert not (view / "kvm").exists(), "the plugin still sees its device"
    assert (root / "hostkvm").read_text() == "the host's device\n"  # the host's, untouched
    with pytest.raises(NodeAccessError, match="absent already"):
        faults.run("c0ffee", "device-absent", str(device))
    faults.run("c0ffee", "device-present", str(device))
    assert (view / "kvm").read_text() == "the host's device\n"  # the same bind, back
    assert sorted(p.name for p in view.iterdir()) == ["kvm"], "a stash was left"
    assert mounts_at(pid, device) != [] and (root / "dev").is_dir()


def test_a_dev_that_is_the_nodes_own_is_never_touched(plugin: tuple[int, Path]) -> None:
    pid, root = plugin  # no tmpfs of its own: its dev dir is the node's
    faults = KnownPid(pid, ThisMachine())
    assert faults.probe("c0ffee") == ""
    with pytest.raises(NodeAccessError, match="is the node's own: refused"):
        faults.run("c0ffee", "device-absent", str(root / "dev" / "kvm"))
    assert (root / "dev" / "kvm").exists()
