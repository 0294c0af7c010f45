"""Issue 26's checks, each proved by a mutant of this plugin that only it catches.

One run per mutant over every check the issue added (on the local target: the kubelet emulator
with pods, re-admission, node reboot and kubelet-ended streams): the mutant's own check fails,
every other one of them passes, the node is restored between them (nothing blocked) and cleanup
passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.test_hvconform import hvconform, statuses

NEW_CHECKS = (
    "device-late",
    "stream-lost",
    "workloads-survive-kubelet-restart",
    "health-in-pod-status",
    "node-reboot",
)
SELECTION = " or ".join(NEW_CHECKS)

# mutant -> the checks of NEW_CHECKS that must fail (every other one passes). Each of the
# issue's mutants is caught by exactly its check; a plugin that never reports a device
# unhealthy is caught by each check that needs health, the pod-status one among them.
FAILING = {
    "tests.mutants.exits_without_device": {"device-late"},
    "tests.mutants.no_stream_reregistration": {"stream-lost"},
    "tests.mutants.healthy_before_usable": {"node-reboot"},
    "tests.mutants.never_unhealthy": {"device-late", "health-in-pod-status", "node-reboot"},
}


@pytest.mark.parametrize(
    ("mutant", "failing"), FAILING.items(), ids=[m.rsplit(".", 1)[1] for m in FAILING]
)
def test_each_mutant_fails_exactly_its_checks(
    tmp_path: Path, mutant: str, failing: set[str]
) -> None:
    code, data, output = hvconform(
        tmp_path, "--recovery-timeout", "8", "--", "-k", SELECTION, plugin=mutant
    )
    got = statuses(data)
    want = {check: "failed" if check in failing else "passed" for check in NEW_CHECKS}
    assert {check: got.get(check) for check in NEW_CHECKS} == want, output[-3000:]
    assert got["cleanup"] == "passed", "a failing plugin must not make the harness leak"
    assert code == 1


def test_our_plugin_passes_them_and_the_figures_are_measured(tmp_path: Path) -> None:
    code, data, output = hvconform(tmp_path, "--", "-k", SELECTION)
    assert code == 0, output[-3000:]
    by_id = {c["id"]: c for c in data["checks"]}
    assert {check: by_id[check]["status"] for check in NEW_CHECKS} == dict.fromkeys(
        NEW_CHECKS, "passed"
    )
    reboot = by_id["node-reboot"]["metrics"]
    assert reboot["boot_to_registered_s"] > 0
    # Requests go on for a while after registration, the device still unusable: some refused.
    assert reboot["refused_while_unusable"] > 0
    assert reboot["refused_while_unusable"] >= reboot["refused_before_registered"] >= 0
    assert by_id["stream-lost"]["metrics"]["reregistration_s"] > 0
    kept = by_id["workloads-survive-kubelet-restart"]["metrics"]
    assert kept["pods_kept_graceful"] >= 1 and kept["pods_kept_crash"] >= 1
