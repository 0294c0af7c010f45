"""Issue 35, items 1 and 2 on the local target, live: liveness is what would kill the plugin
(never its readiness), and a restore is verified on the plugin's own word, so a plugin that
never comes back leaves every later check `blocked`, never failed."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.plugin import SHIPPED, load_profile
from hvconform.contract.results import validate_results
from hvconform.targets.local.liveness import kubelet_live

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "hvconform.cli", "run", "--out", str(out)]
    cmd += ["--reports-root", str(tmp_path), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    results = out / "results.json"
    output = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert results.exists(), output
    data: dict[str, Any] = json.loads(results.read_text())
    validate_results(data)
    return proc.returncode, data, output


def _by_id(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in data["checks"]}


@pytest.mark.kvm
def test_a_plugin_that_never_comes_back_blocks_every_later_check(tmp_path: Path) -> None:
    state = tmp_path / "mutant-state"
    argv = ["env", f"PYTHONPATH={ROOT}", f"HV_MUTANT_STATE={state}", sys.executable, "-m",
            "tests.mutants.never_back_after_stream_lost"]  # fmt: skip
    selection = "cdi-missing or stream-lost or restart-plugin or restart-kubelet"
    code, data, output = _run(
        tmp_path, "--plugin-cmd", shlex.join(argv), "--recovery-timeout", "8", "--", "-k", selection
    )
    checks = _by_id(data)
    got = {i: c["status"] for i, c in checks.items()}
    assert got == {
        "cdi-missing": "passed",  # before the stream is lost: the plugin is fine
        "stream-lost": "failed",  # its own verdict
        "restart-plugin": "blocked",  # never failed on account of stream-lost
        "restart-kubelet": "blocked",
        "metadata-two-phase": "passed",
        "plugin-identity": "passed",
        "cleanup": "passed",
    }, output
    assert state.read_text() == "stream lost\n"  # the mutant really lost its stream
    for blocked in ("restart-plugin", "restart-kubelet"):
        reason = checks[blocked]["reason"]
        assert "stream-lost left the node dirty" in reason, reason
        # in words: what the kubelet counted, and that the plugin restart did not help
        assert "the kubelet counts 0 allocatable" in reason, reason
        assert "also after a restart of the plugin" in reason, reason
    # the check before it restored on both sides (the plugin's word included) and passed on
    assert not [n for n in checks["cdi-missing"]["notes"] if "not restored" in n]
    assert code == 1


@pytest.mark.kvm
def test_readiness_dropping_during_faults_is_never_read_as_death(tmp_path: Path) -> None:
    """This repository's plugin with no liveness probe at all: readiness drops during each of
    these faults (the checks require it) while the process is never restarted; liveness, read
    from the process as the kubelet would, holds through every one of them."""
    data = yaml.safe_load(SHIPPED.read_text())
    data["liveness"] = {"type": "none"}
    data.pop("deploy")  # its chart path is relative to the shipped profile's dir
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(data))
    load_profile(profile)  # still a valid profile
    selection = "cdi-read-only or registration-failure or registration-dir-replaced"
    code, run, output = _run(tmp_path, "--plugin-profile", str(profile), "--", "-k", selection)
    checks = _by_id(run)
    for check in ("cdi-read-only", "registration-failure", "registration-dir-replaced"):
        assert checks[check]["status"] == "passed", output
        notes = checks[check]["notes"]
        assert not [n for n in notes if "liveness not observable" in n], notes
    assert code == 0, output


def test_liveness_fails_only_after_the_kubelets_threshold(tmp_path: Path) -> None:
    """One or two failed liveness probes kill nothing; three in a row, or the process gone,
    do. A real process stands for the plugin."""
    proc = subprocess.Popen(["sleep", "60"])
    try:

        def running() -> bool:
            return proc.poll() is None

        answers: list[bool] = []

        def probe(script: list[bool]) -> bool:
            answers.append(script[len(answers)] if len(answers) < len(script) else False)
            return answers[-1]

        assert kubelet_live(running, lambda: probe([False, False, True]), period_s=0.05)
        assert answers == [False, False, True]
        answers.clear()
        assert not kubelet_live(running, lambda: probe([False, False, False, True]), period_s=0.05)
        assert answers == [False, False, False]  # the fourth is never asked: it was killed
        assert kubelet_live(running, None)  # no probe: the process alone
    finally:
        proc.kill()
        proc.wait()
    assert not kubelet_live(running, None)
    assert not kubelet_live(running, lambda: True)
