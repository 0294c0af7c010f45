"""What the live kind test modules share (tests/kindnode/test_kind_live.py and
test_kind_dra_live.py): the host's /dev/kvm metadata, a kind lifecycle of this machine's engine,
and the check that a torn-down cluster left nothing. The engine fixture they take is conftest's.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvconform.contract.results import validate_results
from hvconform.targets import cluster_options
from hvconform.targets.cluster import kindbin
from hvconform.targets.cluster.access import CommandRunner
from hvconform.targets.cluster.kind import KindLifecycle
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.kindnode import NODE_IMAGE
from hvconform.targets.kindnode.engine import inventory

ROOT = Path(__file__).resolve().parents[2]
serial = itertools.count(1)  # cluster names apart within one pytest process

# Makes the lifecycle from its options and runner: a subclass, or given objects (DRA mode).
Make = Callable[[ClusterOptions, CommandRunner], KindLifecycle]


def kvm() -> tuple[int, int, int, int]:
    st = os.stat("/dev/kvm")
    return st.st_mode, st.st_uid, st.st_gid, st.st_rdev


def _default(options: ClusterOptions, runner: CommandRunner) -> KindLifecycle:
    return KindLifecycle(options, None, runner=runner)


def lifecycle(
    tmp_path: Path,
    env: dict[str, Any],
    config: str = "cluster.yaml",
    *,
    make: Make = _default,
    **kw: Any,
) -> KindLifecycle:
    """A kind cluster of its own (name and run id unique to this process and call) in the
    engine fixture's engine, with the images of `nox -s image`; nothing runs until its runbook."""
    n = next(serial)
    kw = {"image": env["tags"]["plugin"], "guest_image": env["tags"]["guest"], **kw}
    options = cluster_options(
        "kind",
        ClusterOptions(
            target="kind",
            run_id=f"kl{os.getpid()}{n}",
            workdir=str(tmp_path / "work"),
            cluster_name=f"hvt-{os.getpid()}-{n}",
            node_image=NODE_IMAGE,
            kind_config=str(ROOT / "kind" / config),
            **kw,
        ),
    )
    run_env = dict(kindbin.kind_env() or os.environ, DOCKER_HOST=env["host"])
    runner = CommandRunner(tmp_path / "work" / "commands.log", env=run_env)
    return make(options, runner)


def assert_nothing_left(lifecycle: KindLifecycle, env: dict[str, Any], before: Any) -> None:
    """Cleanup and its verification all ok: the cluster, its node containers and kubeconfig
    entry gone, the engine's containers and volumes as before, /dev/kvm exactly as `before`."""
    report = lifecycle.report
    failed = [s for s in report.steps if s.phase != "setup" and s.status != "ok"]
    assert not failed, f"cleanup or verification failed: {failed}"
    for name in ("kind cluster deleted", "kind node containers removed",
                 "kubeconfig entries removed", "host device metadata (final)"):  # fmt: skip
        assert report.verification[name]["ok"], report.verification[name]
    now = inventory(env["engine"])
    assert now["containers"] == env["before"]["containers"]
    assert now["volumes"] == env["before"]["volumes"]
    assert kvm() == before, "/dev/kvm metadata changed"


def run_kind(engine: dict[str, Any], out: Path, *extra: str) -> dict[str, Any]:
    """`hvconform run --target kind` on a cluster of its own (made and deleted by the run) in the
    engine fixture's engine, on the offline node image (or --node-image in extra, last wins);
    results.json validated, cleanup verified, /dev/kvm unchanged."""
    before = kvm()
    argv = [
        sys.executable, "-m", "hvconform.cli", "run", "--target", "kind",
        "--cluster-name", f"hvt-{os.getpid()}-{next(serial)}", "--node-image", NODE_IMAGE,
        "--guest-image", engine["tags"]["guest"], "--out", str(out), *extra,
    ]  # fmt: skip
    env = dict(kindbin.kind_env() or os.environ, DOCKER_HOST=engine["host"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=2200, env=env, cwd=ROOT)
    results = out / "results.json"
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(results.read_text())
    validate_results(data)
    data["_output"] = proc.stdout[-4000:]
    report = json.loads((out / "cluster-kind.json").read_text())
    assert report["cleanup_ok"], report["verification"]
    assert kvm() == before, "/dev/kvm metadata changed"
    return data


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in data["checks"]}
