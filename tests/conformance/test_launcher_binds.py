"""The launcher's binds survive the host removing the directories around them.

Seen in CI: a node stack's teardown removed the host's /var/lib/kubelet while a local-target
plugin (its plugin dir bound at /var/lib/kubelet/device-plugins in its own mount namespace)
was running; the kernel detaches mounts on a removed dentry from every namespace, the plugin's
dir became the deleted host one, and its device never came back (device-late: allocatable 0 for
60 s). A bind's mount point now sits in a tmpfs shadowing the host's own level (STABLE_DEPTH),
never on a dentry that another party may make and remove.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvconform.targets.host import binds
from hvconform.targets.host.launcher import LAUNCHER

pytestmark = pytest.mark.root

# Inside the namespace: say ready, wait for the go, then write through the bound dir.
CHILD = r"""
import sys
print("ready", flush=True)
sys.stdin.readline()
open(sys.argv[1] + "/written-after", "w").write("ok")
print("written", flush=True)
"""


@pytest.fixture
def host_tree() -> Iterator[Path]:
    # depth 2 like /var/lib: /tmp/<dir> is the host's own level, what is below it comes and goes
    base = Path(tempfile.mkdtemp(prefix="hvbind-", dir="/tmp"))
    (base / "kubelet" / "device-plugins").mkdir(parents=True)
    (base / "keep").write_text("a sibling entry the shadow must keep visible")
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("host_has_it", [True, False])
def test_a_bind_outlives_the_host_removing_its_parent(
    host_tree: Path, tmp_path: Path, host_has_it: bool
) -> None:
    source = tmp_path / "plugin-dir"
    source.mkdir()
    target = host_tree / "kubelet" / "device-plugins"
    if not host_has_it:
        shutil.rmtree(host_tree / "kubelet")
    argv = [sys.executable, "-I", str(LAUNCHER), "--bind", f"{source}:{target}", "--",
            sys.executable, "-c", CHILD, str(target)]  # fmt: skip
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        # what a node stack's teardown does to a kubelet root it made
        shutil.rmtree(host_tree / "kubelet", ignore_errors=True)
        assert not (host_tree / "kubelet").exists()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "written"
    finally:
        child.kill()
        child.wait(10)
    assert (source / "written-after").read_text() == "ok", "the bind was detached"
    assert not (host_tree / "kubelet").exists(), "a mount point was made on the host"


def test_the_shadow_moves_up_to_the_hosts_own_level_only_for_host_dentries() -> None:
    made: list[str] = []
    assert binds._stable_anchor("/var/lib/kubelet", "device-plugins", made) == (
        "/var/lib",
        "kubelet",
    )
    assert binds._stable_anchor("/run", "cdi", made) == ("/run", "cdi")
    assert binds._stable_anchor("/var/lib", "kubelet", made) == ("/var/lib", "kubelet")
    made.append("/var/lib")  # a tmpfs of this namespace: what lies in it stays where it is
    assert binds._stable_anchor("/var/lib/kubelet", "", made) == ("/var/lib/kubelet", "")
