"""What the live node-stack tests share: the host's /dev/kvm identity (it must never change)
and a real `hvconform run --target node` in a subprocess, its results read back."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.targets.realnode import REPO


def kvm() -> tuple[int, int, int, int]:
    """/dev/kvm's mode, owner, group and device number."""
    st = os.stat("/dev/kvm")
    return st.st_mode, st.st_uid, st.st_gid, st.st_rdev


EVIDENCE_LINES = 40  # of each evidence file of a failed check, in the assertion message


def failed_evidence(out: Path) -> str:
    """The evidence of every failed check of the run in `out` (the last lines of its plugin and
    kubelet logs): a CI log then shows what the plugin did, not only that a wait expired."""
    try:
        checks = json.loads((out / "results.json").read_text())["checks"]
    except (OSError, ValueError, KeyError):
        return ""
    parts = []
    for check in checks:
        if check.get("status") != "failed":
            continue
        for name in (f"{check['id']}-plugin.log", f"{check['id']}-kubelet.log"):
            path = out / "evidence" / name
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-EVIDENCE_LINES:]
                parts.append(f"\n--- {name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "".join(parts)


def run_output(proc: subprocess.CompletedProcess[str], out: Path) -> str:
    """What an assertion on a run shows: the tail of what it printed, then its failed checks'
    evidence."""
    return proc.stdout[-3000:] + proc.stderr[-2000:] + failed_evidence(out)


def run_node(tmp_path: Path, profile: Path, *extra: str, timeout: float = 1500) -> dict[str, Any]:
    """`hvconform run --target node` of `profile`; its results.json, with `_output` (the tail
    of what it printed) for assertion messages. /dev/kvm must be the same afterwards."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "hvconform.cli", "run", "--target", "node", "--out", str(out),
            "--reports-root", str(tmp_path), "--plugin-profile", str(profile), *extra]  # fmt: skip
    before = kvm()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert kvm() == before, "/dev/kvm changed"
    results = out / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(results.read_text())
    data["_output"] = proc.stdout[-5000:] + proc.stderr[-2000:] + failed_evidence(out)
    return data


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in data["checks"]}


@contextlib.contextmanager
def cluster_mode_nodes(count: int, runtime: str = "") -> Iterator[dict[str, str]]:
    """`node-up --nodes COUNT` with the images imported into each node's containerd; node-down
    verified after (nothing left, /dev/kvm unchanged). Skips, naming the fix, when the node is
    not built or another node is up on this machine."""
    from hvconform.targets.realnode import node_images, nodes, procs, stack

    if missing := nodes.has_tools(runtime):
        pytest.skip(f"the node is not built ({', '.join(missing)}): run `nox -s node-build`")
    if nodes.recorded_nodes() or ((p := procs.recorded("kubelet")) and p.alive):
        pytest.skip("a node is already up on this machine: `nox -s node-down` first")
    before = kvm()
    try:
        stack.up_nodes(count, runtime)
        tags = node_images.build_images()
        node_images.load(list(tags.values()))
        yield {**tags, "kubeconfig": str(nodes.ADMIN_KUBECONFIG)}
    finally:
        left = stack.down()
        assert not left, f"node-down left: {left}"
        assert kvm() == before, "/dev/kvm changed"


def live_module(env: str) -> bool:
    """Whether a live node-stack module gated on `env` really runs (its USES_NODE_STACK: only
    then does it take the machine's node lock)."""
    return bool(os.environ.get(env))


def skip_unless_live(env: str, session: str) -> None:
    """Skip, naming the session that runs it, unless `env` is set: apart from `tests` for CI's
    time."""
    if not os.environ.get(env):
        pytest.skip(f"runs in `nox -s {session}` ({env}=1): apart from `tests` for CI's time")
