"""From any checkout: the whole local suite passes in a fresh clone below a 0700 directory and
in one whose path has a space, with the clone's own interpreter where uid 65534 cannot reach it.

Before the guest program was staged, every guest check failed there ("no Python usable as uid
65534 gid 65534: .../.venv/bin/python: Permission denied"). The host's /dev/kvm metadata is
snapshotted by the test itself and must be exactly as before; the run's results.json and both
reports must name the environment of schema 1.1.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hvconform.contract.results import SCHEMA_VERSION
from hvconform.targets.local.workload_program import STAGE_PARENT, STAGE_PREFIX
from tests.setup.support import Checkout, fresh_checkout

KVM = "/dev/kvm"
NOBODY = 65534
pytestmark = [
    pytest.mark.root,
    pytest.mark.kvm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mounts, mknod)"),
]


def kvm_metadata() -> tuple[int, int, int, int]:
    st = os.lstat(KVM)
    return st.st_mode, st.st_uid, st.st_gid, st.st_rdev


def nobody_can_reach(path: Path) -> bool:
    """Whether uid/gid 65534 (no supplementary groups) can search every directory to path."""
    for parent in [*reversed(path.parents), path]:
        st = parent.stat()
        if st.st_uid == NOBODY:
            bit = stat.S_IXUSR
        elif st.st_gid == NOBODY:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


def leaked_stages(before: set[Path]) -> list[Path]:
    """Staged guest copies made since `before` whose process is gone (other runs on this
    machine may be staging their own right now: those are alive)."""
    made = set(STAGE_PARENT.glob(f"{STAGE_PREFIX}*")) - before
    return [
        p
        for p in made
        if not Path("/proc", p.name.removeprefix(STAGE_PREFIX).split("-")[0]).exists()
    ]


@pytest.fixture(params=["0700-parent", "path with space"])
def checkout(request: pytest.FixtureRequest) -> Iterator[Checkout]:
    # mkdtemp makes the directory 0700, as `mktemp -d` and root's home are.
    top = Path(tempfile.mkdtemp(prefix="hv-fresh-"))
    try:
        assert stat.S_IMODE(top.stat().st_mode) == 0o700
        dest = top / ("hv" if request.param == "0700-parent" else "my checkouts/hv device plugin")
        if request.param == "path with space":
            top.chmod(0o755)  # only the space differs from a plain checkout
            dest.parent.mkdir(parents=True)
        yield fresh_checkout(dest)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_whole_local_suite_passes_from_a_fresh_clone(
    checkout: Checkout, record_property: pytest.RecordProperty
) -> None:
    if " " not in str(checkout.root):
        assert not nobody_can_reach(checkout.python.parent), "the venv must be out of reach"
    before = kvm_metadata()
    staged_before = set(STAGE_PARENT.glob(f"{STAGE_PREFIX}*"))
    t0 = time.monotonic()
    run = checkout.hvconform("run", "-n", "2", "--out", str(checkout.root / "reports" / "run"))
    seconds = time.monotonic() - t0
    record_property("clone_s", round(checkout.seconds, 1))
    record_property("suite_s", round(seconds, 1))
    print(
        f"fresh clone at {checkout.root}: clone+venv {checkout.seconds:.1f} s, suite {seconds:.1f} s"
    )
    assert kvm_metadata() == before, "the run changed the host's /dev/kvm"
    out = checkout.root / "reports" / "run"
    data = json.loads((out / "results.json").read_text())
    statuses = {c["id"]: (c["status"], c["reason"]) for c in data["checks"]}
    assert run.returncode == 0, f"{statuses}\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
    # the local target deploys no DaemonSet: the rollout check never applies there
    off = {i: v for i, v in statuses.items() if v[0] != "passed" and i != "rollout-safety"}
    assert not off, off
    assert statuses["rollout-safety"][0] == "not_applicable", statuses["rollout-safety"]
    assert len(statuses) >= 14 and not data["run"].get("partial")
    assert not leaked_stages(staged_before), "a staged guest outlived its process"

    env = data["environment"]
    assert data["schema_version"] == SCHEMA_VERSION
    # The clone's own code ran (its commit), with the clone's interpreter.
    assert env["source_commit"].removesuffix("-dirty") == checkout.commit
    assert env["cgroup"]["version"] in ("v1", "v2", "hybrid") and env["cgroup"]["driver"]
    for key in ("kernel", "distribution", "python", "suite_version", "plugin_version"):
        assert env[key] and env[key] != "unknown", key
    assert env["components"]["workload python"]["version"] != "unavailable"
    assert all(p["ok"] for p in env["preconditions"]), env["preconditions"]
    markdown = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for text in ("Cgroups", "Suite", "workload python", env["kernel"], checkout.commit):
        assert text in markdown and text in html, text


# The tests whose stand-in programs once started `#!` + the interpreter's path, which a path
# with a space breaks (issue 27: 50 tests failed with "executable not found" there).
STAND_IN_TESTS = (
    "tests/kindnode/test_units.py",
    "tests/targets/test_cluster_target.py",
    "tests/workflows/test_aks_pools.py",
    "tests/conformance/test_profile_hostile.py",
)


def test_stand_in_programs_run_from_a_path_with_a_space(checkout: Checkout) -> None:
    if " " not in str(checkout.root):
        pytest.skip("the 0700 checkout has no space: the other parameter covers this")
    proc = subprocess.run(
        [str(checkout.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         *STAND_IN_TESTS],
        cwd=checkout.root, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
