"""`--runtime container` end to end, the whole catalogue, through the CLI: this repository's
plugin from the shipped profile (its chart's container, this tree's image) and the Go fixture
plugin from its own (its image and DaemonSet). Both must pass every applicable check; what
results.json records must show what ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.plugin import SHIPPED, resolve
from tests.container.fixture_image import FixtureImage
from tests.container.gokvm import run_container, statuses, target_report, variant_profile

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]
# The local target deploys no DaemonSet: the rollout check never applies there.
NOT_APPLICABLE = {
    "rollout-safety",
    "workloads-survive-kubelet-restart",
    "node-reboot",
    "device-late",
    "stream-lost",
    "health-in-pod-status",
}  # issue 26: local process runtime only


def _all_pass(data: dict[str, Any], also_not_applicable: frozenset[str] = frozenset()) -> None:
    got = statuses(data)
    skipped = NOT_APPLICABLE | also_not_applicable
    want = {c: "not_applicable" if c in skipped else "passed" for c in got}
    assert got == want, data["_output"]
    assert len(got) >= 17  # the catalogue, metadata and cleanup: nothing deselected


def test_this_repositorys_plugin_passes_the_whole_catalogue(tmp_path: Path) -> None:
    data = run_container(tmp_path, None)
    _all_pass(data)
    assert data["_exit"] == 0 and data["run"]["runtime"] == "container"
    target = target_report(data)
    assert {"base", "plugin", "guest"} <= set(target["images"])
    image = target["images"]["plugin_under_test"]
    assert image["ref"] == resolve().image and image["built_from_this_tree"]
    assert image["id"] == target["images"]["plugin"]["id"]
    spec = target["plugin_spec"]
    assert spec["entrypoint"] == ["hv-device-plugin"] and spec["health_port"] == 9400
    for container in target["plugin_containers"]:
        assert container["CapEff"] == 0 and container["NoNewPrivs"] == 1
        assert container["image_id"] == image["id"] and container["network_mode"] == "none"
        assert container["args"] == spec["args"], "the chart's args, nothing appended"
        assert container["devices"] == ["/dev/kvm:/dev/kvm:rw"]
    assert any(b.endswith(":/host-dev:ro,rslave") for b in target["plugin_containers"][0]["binds"])
    ran = data["run"]["plugin_ran"][0]
    assert ran["how"] == "container" and ran["image_id"] == image["id"]
    assert ran["argv"][-len(spec["args"]) :] == spec["args"] and ran["pid"] > 0
    # The chart's own exec probes, run as a kubelet runs them.
    assert target["exec_probes"]["readiness"]["exit"] == 0
    assert target["exec_probes"]["readiness"]["argv"].startswith("hv-device-plugin probe")
    assert target["negative_control"]["exit"] != 0
    runs = [r for r in target["guest_runs"] if r["check"] == "guest-execution" and "value" in r]
    assert len(runs) == 6
    assert all(r["ok"] and r["cdi_devices"] == ["hyperlight.dev/hypervisor=kvm"] for r in runs)
    assert target["cleanup_leftovers"] == []


def test_the_go_fixture_passes_the_whole_catalogue_from_its_profile(
    tmp_path: Path, go_kvm_image: FixtureImage
) -> None:
    data = run_container(tmp_path, variant_profile(tmp_path))
    # It declares no optional RPC (GetDevicePluginOptions is empty): that check does not apply.
    _all_pass(data, frozenset({"optional-rpcs"}))
    assert data["run"]["plugin"]["name"] == "go-kvm"
    target = target_report(data)
    assert target["images"]["plugin_under_test"]["id"] == go_kvm_image.id
    ran = data["run"]["plugin_ran"][0]
    assert ran["image"] == go_kvm_image.tag and ran["image_id"] == go_kvm_image.id
    assert ran["argv"] == ["/usr/local/bin/go-kvm", "-v=2"], "its DaemonSet's args, as is"
    container = target["plugin_containers"][0]
    assert container["binds"] == [
        f"{b.split(':')[0]}:{p}:rw,rslave"
        for b, p in zip(container["binds"], ["/var/lib/kubelet/device-plugins", "/var/run/cdi"],
                        strict=True)
    ]  # fmt: skip
    assert target["exec_probes"] == {}, "its DaemonSet has no exec probe"
    runs = [r for r in target["guest_runs"] if r["check"] == "guest-execution" and "value" in r]
    assert runs and all(r["ok"] and r["device"] == "/dev/kvm" for r in runs)
    assert all(r["cdi_devices"] == ["example.org/hypervisor=kvm"] for r in runs)


def test_exec_probes_of_the_profile_run_in_the_container(tmp_path: Path) -> None:
    # The shipped profile, its health observed as a kubelet's exec probe would (the command is
    # the image's, found on the container's PATH): readiness must drop and come back.
    data = yaml.safe_load(SHIPPED.read_text())
    data["deploy"]["chart"]["path"] = str(SHIPPED.parent / data["deploy"]["chart"]["path"])
    for kind in ("readiness", "liveness"):
        data[kind] = {"type": "exec", "command": ["hv-device-plugin", "probe", kind]}
    profile = tmp_path / "exec.yaml"
    profile.write_text(yaml.safe_dump(data))
    run = run_container(tmp_path, profile, "registration")
    got = statuses(run)
    assert got["registration-failure"] == got["registration-dir-replaced"] == "passed", got
    assert run["run"]["plugin"]["readiness"] == "exec"
