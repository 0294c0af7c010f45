"""The report names the plugin that ran: the read-back from its process or pod, never this
repository's version next to a third party's command line; older results read as written."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hvconform.report.model import build, environment_rows
from hvconform.report.render import load_results, render_html, render_markdown
from tests.report.conftest import FIXTURES

GO_KVM = "/work/fixtures/plugins/go-kvm/bin/go-kvm"
THIRD_PARTY = {
    "plugin_cmd": f"{GO_KVM} -v=2",
    "plugin": {"name": "go-kvm", "source": "fixtures/plugins/go-kvm/profile.yaml",
               "command": f"{GO_KVM} -v=2", "image": "hv-fixture-go-kvm:0.1.0",
               "this_repository": False},
    "plugin_ran": [
        {"worker": "gw0", "node": "local", "phase": "setup", "how": "process",
         "argv": [GO_KVM, "-v=2"], "exe": GO_KVM, "pid": 4242, "where": "sandbox hvsbx1"},
        {"worker": "gw0", "node": "local", "phase": "end", "how": "process",
         "argv": [GO_KVM, "-v=2"], "exe": GO_KVM, "pid": 4242, "where": "sandbox hvsbx1"},
        {"worker": "gw1", "node": "local", "phase": "setup", "error": "RuntimeError: exited"},
    ],
}  # fmt: skip
POD = {
    "worker": "main", "node": "kind", "phase": "setup", "how": "pod", "argv": [],
    "image": "hv-fixture-go-kvm@sha256:" + "a" * 64,
    "image_id": "docker.io/library/hv-fixture-go-kvm@sha256:" + "a" * 64,
    "where": "hvconform-plugin/go-kvm-x1", "notes": [],
}  # fmt: skip


def results(tmp_path: Path, run: dict[str, Any], **env: Any) -> Path:
    data = json.loads((FIXTURES / "all-passed.json").read_text())
    data["run"].update(copy.deepcopy(run))
    data["environment"].update(env)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    return path


def rows(path: Path) -> list[tuple[str, str]]:
    data = load_results(path)
    return environment_rows(data["environment"], data["run"])


def test_a_third_party_plugin_is_named_by_what_ran_not_by_our_version(tmp_path: Path) -> None:
    unknown = "unknown: not this repository's plugin (what ran: run.plugin_ran)"
    path = results(tmp_path, THIRD_PARTY, plugin_version=unknown, source_commit="f78bc53")
    got = rows(path)
    plugin = [v for k, v in got if k == "Plugin"]
    assert plugin == [
        "go-kvm, profile fixtures/plugins/go-kvm/profile.yaml: not this repository's plugin; "
        "what ran is below"
    ]
    ran = [v for k, v in got if k == "Plugin ran"]
    assert ran == [
        f"process {GO_KVM} -v=2 (executable {GO_KVM}, pid 4242) (gw0 at setup, gw0 at end)",
        "not read back: RuntimeError: exited (gw1 at setup)",
    ]
    assert ("Suite source commit", "f78bc53") in got
    text = render_markdown(build(load_results(path), tmp_path, tmp_path))
    env = text.split("## Environment\n", 1)[1].split("\n## ", 1)[0]
    assert "0.1.0, source commit" not in env and "version 0.1.0" not in env
    assert f"- Plugin ran: process {GO_KVM} -v=2" in env
    assert f"{GO_KVM} -v=2" in render_html(build(load_results(path), tmp_path, tmp_path))


def test_a_pod_shows_its_image_and_the_kubelets_image_id(tmp_path: Path) -> None:
    run = {**THIRD_PARTY, "plugin_ran": [POD]}
    got = dict(rows(results(tmp_path, run)))
    assert got["Plugin ran"] == (
        f"pod hvconform-plugin/go-kvm-x1: image {POD['image']}, image ID {POD['image_id']}, "
        "command the image's entrypoint (main at setup)"
    )
    assert got["Plugin image (profile)"] == "hv-fixture-go-kvm:0.1.0"


def test_our_plugin_keeps_its_version_and_a_run_without_a_node_says_so(tmp_path: Path) -> None:
    ours = {"plugin": {"name": "hv-device-plugin", "this_repository": True}, "plugin_ran": []}
    got = dict(rows(results(tmp_path, ours, plugin_version="0.1.0")))
    assert got["Plugin"] == "hv-device-plugin 0.1.0 (this repository's plugin)"
    assert got["Plugin ran"] == "not read back: no node came up"


def test_results_before_the_read_back_read_as_they_were_written() -> None:
    got = dict(rows(FIXTURES / "all-passed.json"))
    assert got["Plugin"].startswith("version ") and ", source commit " in got["Plugin"]
    assert "Plugin ran" not in got and "Suite source commit" not in got
