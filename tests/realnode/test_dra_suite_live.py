"""The suite judging a DRA driver from its profile on the real node target (issue 28), live:
this repository's driver (`conformance/profiles/hv-dra-driver.yaml`) passes every check that
judges DRA, and each mutant driver is caught by exactly the checks of what it lacks:

- without claim-spec repair (tests/mutants/dra_no_claim_repair.py): the CDI repair checks;
- without a republished ResourceSlice (tests/mutants/dra_no_republish.py): dra-kubelet-restart
  (the checks after it on that node end blocked, never failed for it).

Each run is a real `hvconform run --target node` in a subprocess; the node stack is brought up
and down by the run itself (one node stack per machine: conftest's lock). Runs in `nox -s
dra-live` (apart from `tests` for CI's time).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hvconform.contract.dra_profile import API_DRA
from hvconform.scenarios import CATALOGUE
from hvconform.targets.realnode import BIN, REPO
from tests.realnode.live_runs import live_module, run_node, skip_unless_live, statuses

# the machine's one node stack, locked only when this module really runs: apart from `tests`
# (nox -s dra-live) for CI's time, 274 s of the node stack's serialized time in a CI log
USES_NODE_STACK = live_module("HV_DRA_LIVE")

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]
PROFILE = REPO / "conformance" / "profiles" / "hv-dra-driver.yaml"
DRA_CHECKS = {c.id for c in CATALOGUE if API_DRA in c.apis}
CDI_REPAIR = {"cdi-missing", "cdi-stale", "cdi-malformed", "cdi-non-regular"}


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    skip_unless_live("HV_DRA_LIVE", "dra-live")
    missing = [n for n in ("kubelet", "kube-apiserver", "kube-scheduler") if not (BIN / n).exists()]
    if missing:
        pytest.skip(f"the node is not built ({', '.join(missing)}): run `nox -s node-build`")


def _mutant(tmp_path: Path, module: str) -> Path:
    data = yaml.safe_load(PROFILE.read_text())
    command = list(data["command"])
    command[command.index("hv_device_plugin")] = (
        module  # `{python} -m <module>`: the mutant's entry
    )
    data["command"] = command
    data["name"] = module.rpartition(".")[2]
    data["env"] = {"PYTHONPATH": str(REPO)}  # the mutants live in tests/, not installed
    data.pop("deploy", None)  # the node target runs the command (and the chart path is relative)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.timeout(2500)
def test_this_repositorys_driver_passes_every_dra_check(tmp_path: Path) -> None:
    data = run_node(tmp_path, PROFILE, timeout=2400)
    got = statuses(data)
    assert set(got) >= DRA_CHECKS, f"checks judging DRA not run: {DRA_CHECKS - set(got)}"
    assert not {c.id for c in CATALOGUE} - DRA_CHECKS & set(got), "a device-plugin check ran"
    assert {k: v for k, v in got.items() if v != "passed"} == {}, data["_output"]
    for read in data["run"]["plugin_ran"]:
        assert read["how"] == "process" and "--mode" in read["argv"], read
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["dra-kubelet-restart"]["metrics"]["republish_graceful_s"] > 0
    assert by_id["dra-unprepare-retried"]["metrics"]["unprepared_s"] > 0
    assert by_id["dra-registration-socket-removed"]["metrics"]["reregistered_s"] > 0
    assert by_id["cdi-missing"]["metrics"]["recovery_s"] > 0
    # the environment names the gates: none set here, the API server's own word on the rest
    gates = data["environment"]["feature_gates"]
    assert gates["set_by_target"] == {}
    assert gates["api_server"]["DRAExtendedResource"].startswith("on")


@pytest.mark.timeout(2500)
def test_a_driver_without_claim_spec_repair_fails_exactly_the_repair_checks(
    tmp_path: Path,
) -> None:
    profile = _mutant(tmp_path, "tests.mutants.dra_no_claim_repair")
    data = run_node(tmp_path, profile, "-m", "cdi", "--recovery-timeout", "15", timeout=2400)
    got = statuses(data)
    failed = {k for k, v in got.items() if v == "failed"}
    assert failed == CDI_REPAIR, data["_output"]
    # its unprepare is intact: retried across a kubelet restart, it removes the claim's spec
    assert got["dra-unprepare-retried"] == "passed", got
    assert got["cdi-read-only"] == "passed" and got["dra-no-spec-left"] == "passed", got
    assert got["cleanup"] == "passed", data["_output"]


@pytest.mark.timeout(2500)
def test_a_driver_that_never_republishes_fails_exactly_the_republish_check(
    tmp_path: Path,
) -> None:
    profile = _mutant(tmp_path, "tests.mutants.dra_no_republish")
    data = run_node(tmp_path, profile, "-m", "restart", "--recovery-timeout", "20", timeout=2400)
    got = statuses(data)
    assert {k for k, v in got.items() if v == "failed"} == {"dra-kubelet-restart"}, data["_output"]
    assert got["restart-plugin"] == "passed", data["_output"]
    assert got["cleanup"] == "passed", data["_output"]
