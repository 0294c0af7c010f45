"""The node-side shell scripts, run for real by /bin/sh on this machine (a local 'node')."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hvconform.targets.cluster.access import NodeFiles, script
from hvconform.targets.cluster.kube import ExecResult

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


class LocalAccess:
    """Runs the node commands here: the same argv a kind node or the diagnostic pod gets."""

    where = "local"

    def run(self, argv: list[str], timeout: float = 60) -> ExecResult:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout)
        return ExecResult(proc.returncode, proc.stdout, proc.stderr)

    def wrap(self, argv: list[str]) -> str:
        return " ".join(argv)


@pytest.fixture
def files(tmp_path: Path) -> NodeFiles:
    node = NodeFiles(LocalAccess())
    node.dirs = {"cdi": str(tmp_path / "cdi"), "host_dev": str(tmp_path / "dev")}
    for d in node.dirs.values():
        Path(d).mkdir()
    return node


def test_exact_bytes_round_trip_atomically(files: NodeFiles, tmp_path: Path) -> None:
    data = bytes(range(256)) * 40 + b"\n\n"
    files.write_file("cdi", "spec.json", data)
    assert files.read_file("cdi", "spec.json") == data
    assert (tmp_path / "cdi" / "spec.json").stat().st_mode & 0o777 == 0o644
    assert files.list_files("cdi") == ["spec.json"], "no temp file left behind"
    files.write_file("cdi", "empty.json", b"")
    assert files.read_file("cdi", "empty.json") == b""


def test_missing_directory_and_symlink_read_as_none(files: NodeFiles, tmp_path: Path) -> None:
    assert files.read_file("cdi", "nope.json") is None
    files.make_dir("cdi", "d.json")
    assert files.read_file("cdi", "d.json") is None
    (tmp_path / "cdi" / "link.json").symlink_to("/etc/hostname")
    assert files.read_file("cdi", "link.json") is None
    info = files.stat("cdi", "link.json")
    assert info is not None and info.kind == "symlink"


def test_make_dir_twice_is_file_exists(files: NodeFiles) -> None:
    files.make_dir("cdi", "x")
    with pytest.raises(FileExistsError):
        files.make_dir("cdi", "x")
    files.remove_dir("cdi", "x")
    assert files.stat("cdi", "x") is None


def test_plain_names_only(files: NodeFiles) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        files.read_file("cdi", "../etc/passwd")


@root_only
def test_char_devices_and_metadata(files: NodeFiles) -> None:
    files.make_char_device("host_dev", "kvm", 10, 232)
    info = files.stat("host_dev", "kvm")
    assert info is not None and (info.kind, info.rdev_major, info.rdev_minor, info.mode) == (
        "char",
        10,
        232,
        0o600,
    )
    files.replace_char_device("host_dev", "kvm", 1, 3)
    assert files.device_metadata(f"{files.dirs['host_dev']}/kvm")["minor"] == 3
    assert files.list_files("host_dev") == ["kvm"]
    assert files.device_metadata("/nonexistent") == {"type": "missing"}


def test_scripts_take_operands_as_arguments_never_spliced() -> None:
    argv = script("write", "/x/it's; rm -rf /", "QUJD")
    assert argv[:2] == ["sh", "-c"] and "rm -rf" not in argv[2] and argv[4] == "/x/it's; rm -rf /"
