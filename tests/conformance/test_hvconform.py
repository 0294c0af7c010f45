"""The conformance suite end to end: against our plugin, against broken mutants, and its CLI."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.dra_profile import API_DEVICE_PLUGIN
from hvconform.contract.results import validate_results
from hvconform.scenarios import judging

ROOT = Path(__file__).resolve().parents[2]
EVERY_CHECK = [c.id for c in judging(API_DEVICE_PLUGIN)] + [
    "metadata-two-phase",
    "plugin-identity",
    "cleanup",
]


# A mutant that never notices a kubelet restart still retries its first registration: with
# the default budget (8 attempts, about 10 s) a loaded machine's registration-failure check
# outlasted it once, and the mutant then failed for its retry budget, not its mutation.
MUTANT_ENV = {"tests.mutants.no_reregistration": ("HV_REGISTER_ATTEMPTS=1000",)}


def hvconform(tmp_path: Path, *args: str, plugin: str = "") -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "hvconform.cli",
        "run",
        "--out",
        str(out),
        "--reports-root",
        str(tmp_path),
    ]
    if plugin:
        # The plugin runs with its own working dir: the mutants are found through PYTHONPATH.
        argv = [
            "env",
            f"PYTHONPATH={ROOT}",
            *MUTANT_ENV.get(plugin, ()),
            sys.executable,
            "-m",
            plugin,
        ]
        cmd += ["--plugin-cmd", shlex.join(argv)]  # a checkout path may hold a space
    cmd += args  # last: pytest's own arguments follow "--"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    results = out / "results.json"
    data = json.loads(results.read_text()) if results.exists() else {}
    return proc.returncode, data, proc.stdout + proc.stderr


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in data["checks"]}


def test_every_check_passes_against_our_plugin(tmp_path: Path) -> None:
    code, data, output = hvconform(tmp_path, "-n", "2")
    off = {c["id"]: (c["status"], c.get("reason", "")) for c in data.get("checks", [])
           if c["status"] != "passed"}  # fmt: skip
    assert code == 0, f"{off}\n{output[-3000:]}"
    validate_results(data)
    # the local target deploys no DaemonSet: the rollout check does not apply there
    want = {**dict.fromkeys(EVERY_CHECK, "passed"), "rollout-safety": "not_applicable"}
    assert statuses(data) == want, output[-3000:]
    # issue 27: the console says each thing once (no xdist status lines, no gRPC fork notes, no
    # PASSES section repeating the progress lines)
    for noise in ("bringing up nodes", "fork_posix", "= PASSES ="):
        assert noise not in output, noise
    # One JUnit file per run: a CI glob for *junit*.xml counts every check once.
    junit = [p.name for p in (tmp_path / "run").rglob("*.xml") if "junit" in p.name]
    assert junit == ["junit.xml"], junit
    by_id = {c["id"]: c for c in data["checks"]}
    for check in ("cdi-missing", "cdi-stale", "cdi-malformed"):
        assert by_id[check]["metrics"]["recovery_s"] > 0
    assert by_id["atomic-replacement"]["metrics"]["read_errors"] == 0
    assert by_id["atomic-replacement"]["metrics"]["torn_reads"] == 0
    assert by_id["atomic-replacement"]["metrics"]["reads"] > 1000
    assert by_id["restart-kubelet"]["metrics"]["reregistration_crash_s"] > 0
    assert by_id["cleanup"]["metrics"]["survivors"] == 0
    assert by_id["metadata-two-phase"]["metrics"]["nodes"] == 2  # one node per worker
    assert all("accepted" in n for n in by_id["metadata-two-phase"]["notes"])
    assert data["environment"]["kernel"] and data["environment"]["source_commit"]
    print("suite wall time with -n 2:", data["run"]["duration_s"], "s")


# Each mutant breaks one behaviour; each row runs one check against it (a broken plugin leaves
# its node broken, so checks run one per run to keep every verdict about its own behaviour).
MUTATIONS = [
    ("tests.mutants.no_cdi_repair", "cdi-missing", "failed"),
    ("tests.mutants.no_cdi_repair", "cdi-stale", "failed"),
    ("tests.mutants.no_cdi_repair", "cdi-malformed", "failed"),
    ("tests.mutants.no_cdi_repair", "identity-missing", "passed"),
    ("tests.mutants.never_unhealthy", "identity-missing", "failed"),
    ("tests.mutants.never_unhealthy", "cdi-non-regular", "failed"),
    ("tests.mutants.never_unhealthy", "cdi-missing", "passed"),
    ("tests.mutants.no_reregistration", "restart-kubelet", "failed"),
    # The seed's registration failure starts the plugin into an isolated dir: its first
    # registration is still retried, so this mutant passes it and fails the harder variant.
    ("tests.mutants.no_reregistration", "registration-failure", "passed"),
    ("tests.mutants.no_reregistration", "registration-dir-replaced", "failed"),
    ("tests.mutants.no_reregistration", "restart-plugin", "passed"),
]


@pytest.mark.parametrize(
    ("mutant", "check", "expected"),
    MUTATIONS,
    ids=[f"{m.rsplit('.', 1)[1]}-{c}" for m, c, _ in MUTATIONS],
)
def test_mutant_is_caught_by_exactly_its_checks(
    tmp_path: Path, mutant: str, check: str, expected: str
) -> None:
    code, data, output = hvconform(
        tmp_path, "--recovery-timeout", "8", "--", "-k", check, plugin=mutant
    )
    got = statuses(data)
    assert got[check] == expected, output[-3000:]
    assert got["cleanup"] == "passed", "a failing plugin must not make the harness leak"
    assert code == (1 if expected == "failed" else 0)


def test_selection_matching_nothing_exits_5(tmp_path: Path) -> None:
    code, _, output = hvconform(tmp_path, "-m", "cdi and guest")
    assert code == 5, output
    assert "no checks selected" in output


def test_unknown_marker_is_a_usage_error(tmp_path: Path) -> None:
    code, _, output = hvconform(tmp_path, "-m", "cdi or no_such_marker")
    assert code == 2, output
    assert "no_such_marker" in output and "identity" in output
