"""An unmet precondition ends the run before its first check, on every target.

`hvconform run` with one component unfit (a stand-in first on PATH, or an interpreter workloads
cannot reach): exit 6 (EXIT_ENVIRONMENT_BLOCKED, README "Exit codes"), every check
`environment_blocked` with the same one line, none failed and none run (no node was made: the
run has no ledger), the line printed once, and results.json naming what was found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.dra_profile import API_DEVICE_PLUGIN
from hvconform.contract.preconditions import EXIT_ENVIRONMENT_BLOCKED
from hvconform.contract.results import validate_results
from hvconform.scenarios import judging
from tests.setup.support import REPO, standin, unreachable_python
from tests.setup.test_preconditions import CONTAINERD_16

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]
EVERY_CHECK = {c.id for c in judging(API_DEVICE_PLUGIN)} | {"cleanup"}


@pytest.fixture(scope="module")
def no_python() -> Iterator[str]:
    with unreachable_python() as python:
        yield str(python)


def blocked_run(
    tmp_path: Path,
    args: list[str],
    *,
    bin_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}" if bin_dir else os.environ["PATH"]
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PATH": path, **(env or {})},
        check=False,
    )
    data = json.loads((out / "results.json").read_text())
    return proc, data


def assert_blocked(
    proc: subprocess.CompletedProcess[str], data: dict[str, Any], component: str, found: str
) -> str:
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_ENVIRONMENT_BLOCKED, output[-3000:]
    validate_results(data)
    checks = data["checks"]
    reasons = {c["reason"] for c in checks}
    assert {c["id"] for c in checks} == EVERY_CHECK, output[-2000:]
    assert {c["status"] for c in checks} == {"environment_blocked"}, checks
    assert len(reasons) == 1, reasons
    (line,) = reasons
    assert line.startswith(f"{component}: found {found}, needs ") and "; fix: " in line, line
    assert "\n" not in line
    assert data["run"]["exit_code"] == EXIT_ENVIRONMENT_BLOCKED
    printed = [ln for ln in output.splitlines() if ln.startswith("hvconform: environment blocked")]
    assert printed == [f"hvconform: environment blocked, no check ran: {line}"], printed
    unmet = [p for p in data["environment"]["preconditions"] if not p["ok"]]
    assert unmet and unmet[0]["component"] == component and unmet[0]["found"] == found
    return line


def no_node_made(tmp_path: Path) -> None:
    ledger = tmp_path / "run" / "ledger"
    assert not ledger.exists() or not any(p.read_text().strip() for p in ledger.glob("*.jsonl"))
    assert not (tmp_path / "run" / "metadata").exists(), "no node: no two-phase check either"


def test_local_without_an_interpreter_for_workloads(tmp_path: Path, no_python: str) -> None:
    proc, data = blocked_run(tmp_path, ["-n", "2"], env={"HV_WORKLOAD_PYTHON": no_python})
    found = data["environment"]["preconditions"][-1]["found"]
    line = assert_blocked(proc, data, "workload interpreter", found)
    assert no_python in line and "HV_WORKLOAD_PYTHON" in line
    no_node_made(tmp_path)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_local_without_mount(tmp_path: Path, workers: str) -> None:
    """Also with xdist workers: the controller's verdict reaches them in their start-up input."""
    standin(tmp_path / "bin", "mount", "mount from util-linux 2.20.1")
    proc, data = blocked_run(tmp_path, ["-n", workers], bin_dir=tmp_path / "bin")
    assert_blocked(proc, data, "mount (util-linux)", "2.20.1")
    no_node_made(tmp_path)


def test_container_runtime_with_an_old_podman(tmp_path: Path) -> None:
    standin(tmp_path / "bin", "podman", "podman version 3.4.4")
    proc, data = blocked_run(tmp_path, ["--runtime", "container"], bin_dir=tmp_path / "bin")
    assert_blocked(proc, data, "podman", "3.4.4")
    no_node_made(tmp_path)


def test_container_runtime_with_an_engine_that_does_not_answer(tmp_path: Path) -> None:
    """--docker-host travels in the run context (issue 37: no HV_* read inside a target); its
    environment variable is only the flag's default, read once by the CLI."""
    host = f"unix://{tmp_path}/absent/docker.sock"
    args = ["--runtime", "container", "--docker-host", host]
    proc, data = blocked_run(tmp_path, args, env={"HV_DOCKER_HOST": "tcp://ignored:2375"})
    line = assert_blocked(proc, data, "Docker engine", "not answering")
    assert f"needs an engine answering at {host}" in line and "start that engine" in line
    from_env = blocked_run(
        tmp_path / "env", ["--runtime", "container"], env={"HV_DOCKER_HOST": host}
    )
    assert_blocked(*from_env, "Docker engine", "not answering")


def test_a_docker_host_that_is_not_an_engine_url_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--runtime", "container",
         "--docker-host", "/var/run/docker.sock", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "an engine URL (unix://..., tcp://..., ssh://...)" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_node_with_bookworms_containerd(tmp_path: Path) -> None:
    standin(tmp_path / "bin", "containerd", CONTAINERD_16)
    proc, data = blocked_run(tmp_path, ["--target", "node"], bin_dir=tmp_path / "bin")
    line = assert_blocked(proc, data, "containerd", "1.6.20~ds1")
    assert line.endswith(
        "fix: nox -s node-deps (containerd 1.7.24 from Debian trixie, pinned; gobuild/README.md)"
    )
    no_node_made(tmp_path)


def test_kind_with_an_old_kind(tmp_path: Path) -> None:
    standin(tmp_path / "bin", "docker", "28.2.2")  # an engine that answers
    standin(tmp_path / "bin", "kind", "kind v0.11.1 go1.16.4 linux/amd64")
    proc, data = blocked_run(tmp_path, ["--target", "kind"], bin_dir=tmp_path / "bin")
    assert_blocked(proc, data, "kind", "0.11.1")
    assert not (tmp_path / "run" / "cluster-kind.json").exists(), "no cluster step ran"


def test_aks_without_az(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("git", "helm"):  # source commit and manifests: everything else is absent
        if (found := shutil.which(tool)) is not None:
            (bare / tool).symlink_to(found)
    args = ["--target", "aks", "--resource-group", "rg", "--cluster", "c"]
    proc, data = blocked_run(tmp_path, args, env={"PATH": str(bare)})
    assert_blocked(proc, data, "az", "missing (not on PATH)")
    assert not (tmp_path / "run" / "cluster-aks.json").exists(), "no cluster step ran"
