"""The Go fixture's defect variants on `--runtime container`, each selected in its DaemonSet's
env: the verdicts are those of the process runtime (tests/conformance/test_verdict_matrix.py),
check by check. A variant that never recovers is given short recovery waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.container.fixture_image import FixtureImage
from tests.container.gokvm import run_container, statuses, target_report, variant_profile

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]
CDI = ("cdi-missing", "cdi-stale", "cdi-malformed", "cdi-non-regular", "cdi-read-only")
CLEAN = {"metadata-two-phase": "passed", "plugin-identity": "passed", "cleanup": "passed"}


def test_a_plugin_that_never_repairs_fails_every_cdi_check(
    tmp_path: Path, go_kvm_image: FixtureImage
) -> None:
    data = run_container(tmp_path, variant_profile(tmp_path, "no-cdi-repair"), "cdi", "5")
    # Never repaired, and never noticed: neither the spec comes back nor readiness goes false.
    assert statuses(data) == {**dict.fromkeys(CDI, "failed"), **CLEAN}, data["_output"]
    env = target_report(data)["plugin_spec"]["env"]
    assert env == {"GOKVM_DEFECT": "no-cdi-repair"}, "the variant is its DaemonSet's env"


def test_a_plugin_that_never_probes_fails_the_device_checks(
    tmp_path: Path, go_kvm_image: FixtureImage
) -> None:
    data = run_container(tmp_path, variant_profile(tmp_path, "no-probe"), "identity", "5")
    # Never checks the device: /dev/null's node is allocated, and a missing one goes unnoticed.
    want = {"identity-missing": "failed", "device-unusable": "failed",
            "device-late": "not_applicable", **CLEAN}  # fmt: skip
    assert statuses(data) == want, data["_output"]
    by_id = {c["id"]: c for c in data["checks"]}
    assert (
        "allocation succeeded on a device that is not a hypervisor"
        in (by_id["device-unusable"]["reason"])
    )


def test_slow_reregistration_passes_and_shows_the_delay(
    tmp_path: Path, go_kvm_image: FixtureImage
) -> None:
    data = run_container(tmp_path, variant_profile(tmp_path, "slow-reregister"), "restart")
    want = {"restart-plugin": "passed", "restart-kubelet": "passed",
            "health-after-kubelet-restart": "passed",  # its streams follow each registration
            "rollout-safety": "not_applicable", **CLEAN}  # fmt: skip
    assert statuses(data) == want, data["_output"]
    by_id = {c["id"]: c for c in data["checks"]}
    assert 4.5 < by_id["restart-kubelet"]["metrics"]["reregistration_s"] < 15
