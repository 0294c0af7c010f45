"""The container runtime as its daemon says it (issue 38, item 4): `crictl version` and `crictl
info` of real containerds, recorded from this machine's node target (fixtures/contracts/crictl:
containerd 1.7.24 from Debian trixie, config version 2; containerd 2.3.7 built from its module,
config version 3), read into typed facts; what a daemon with CDI off, or one that answers
something else, is read as. The live read is asserted by the node and cluster tests
(tests/realnode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hvconform.contract.runtime_facts import (
    SEPARATOR,
    RuntimeFactsError,
    cdi_off,
    cdi_unread,
    from_crictl,
    from_output,
    runtime_side,
)
from hvconform.report.env_facts import rows

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "contracts" / "crictl"
VERSION = (RECORDED / "containerd-1.7.24-version.txt").read_text()
INFO = (RECORDED / "containerd-1.7.24-info.json").read_text()


def test_a_recorded_containerd_17_is_read_as_it_ran() -> None:
    facts = from_crictl(VERSION, INFO, "crictl on the node")
    assert (facts.name, facts.version, facts.api_version) == ("containerd", "1.7.24~ds1", "v1")
    assert facts.cdi_enabled is True and facts.cdi_spec_dirs == ("/run/hv-node/cdi",)
    assert from_output(f"{VERSION}{SEPARATOR}\n{INFO}", "x").to_json()["cdi_spec_dirs"] == [
        "/run/hv-node/cdi"
    ]


def test_a_recorded_containerd_23_with_config_version_3_is_read_as_it_ran() -> None:
    version = (RECORDED / "containerd-2.3.7-version.txt").read_text()
    info = (RECORDED / "containerd-2.3.7-info.json").read_text()
    facts = from_crictl(version, info, "crictl on the node")
    assert (facts.name, facts.version) == ("containerd", "2.3.7+unknown")
    assert facts.cdi_enabled is True and facts.cdi_spec_dirs == ("/run/hv-node/cdi",)


def test_cdi_off_is_reported_as_the_runtimes_and_said_in_the_report() -> None:
    info = json.loads(INFO)
    info["config"]["enableCDI"] = False
    facts = from_crictl(VERSION, json.dumps(info), "crictl")
    assert facts.cdi_enabled is False
    shown = dict(rows({"container_runtime": [{"worker": "gw0", "node": "n1", **facts.to_json()}]}))
    assert shown["Container runtime (n1)"].startswith("containerd 1.7.24~ds1, CDI OFF")


def test_cdi_off_blames_the_runtime_with_the_fix_and_cdi_on_blames_nobody() -> None:
    on = from_crictl(VERSION, INFO, "crictl")
    assert cdi_off(on, "the pod never ran") == ""
    info = json.loads(INFO)
    info["config"]["enableCDI"] = False
    line = cdi_off(from_crictl(VERSION, json.dumps(info), "crictl"), "the pod never ran")
    assert line.startswith("the container runtime keeps CDI devices from workloads: containerd")
    assert "the pod never ran" in line and "enable_cdi = true" in line


@pytest.mark.parametrize("recorded", ["containerd-1.7.24", "containerd-2.3.7"])
def test_a_spec_dir_the_runtime_does_not_read_blames_the_runtime_saying_both_dirs(
    recorded: str,
) -> None:
    """Which side: the plugin wrote its spec where its deployment says; the runtime (CDI on)
    reads other dirs, so it cannot resolve the names the allocations carry."""
    version = (RECORDED / f"{recorded}-version.txt").read_text()
    info = (RECORDED / f"{recorded}-info.json").read_text()
    facts = from_crictl(version, info, "crictl on node n1")  # reads /run/hv-node/cdi
    for same in ("/run/hv-node/cdi", "/run/hv-node/cdi/", "/var/run/hv-node/cdi"):
        assert cdi_unread(facts, same, "x") == "" == runtime_side(facts, same, "x"), same
    line = runtime_side(facts, "/var/run/cdi", "the allocation names example.org/kvm=kvm0")
    assert line == cdi_unread(facts, "/var/run/cdi", "the allocation names example.org/kvm=kvm0")
    assert line.startswith("the container runtime cannot resolve the plugin's CDI devices: ")
    assert "reads CDI specs from /run/hv-node/cdi (crictl on node n1)" in line
    assert "the plugin writes its spec to /var/run/cdi" in line
    assert "example.org/kvm=kvm0" in line and "fix: add /var/run/cdi" in line


def test_cdi_off_comes_first_and_an_unknown_dir_list_blames_nobody() -> None:
    info = json.loads(INFO)
    info["config"]["enableCDI"] = False
    off = from_crictl(VERSION, json.dumps(info), "crictl")
    assert runtime_side(off, "/elsewhere", "x") == cdi_off(off, "x") != ""
    del info["config"]["cdiSpecDirs"]
    info["config"]["enableCDI"] = True
    unknown = from_crictl(VERSION, json.dumps(info), "crictl")
    assert unknown.cdi_spec_dirs == () and runtime_side(unknown, "/elsewhere", "x") == ""


def test_a_daemon_that_does_not_say_is_unknown_not_off() -> None:
    info = json.loads(INFO)
    del info["config"]["enableCDI"]
    assert from_crictl(VERSION, json.dumps(info), "crictl").cdi_enabled is None


@pytest.mark.parametrize(
    ("version", "info", "said"),
    [
        ("crictl: command not found", INFO, "named no runtime"),
        (VERSION, "FATA[0000] connect: no such file", "not JSON"),
        (VERSION, "[]", "not a JSON object"),
    ],
)
def test_what_is_not_crictls_answer_is_refused_with_its_words(
    version: str, info: str, said: str
) -> None:
    with pytest.raises(RuntimeFactsError, match=said):
        from_crictl(version, info, "crictl")
