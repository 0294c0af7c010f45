"""The AKS workflow's region check and pool steps (record, always-run cleanup) against a
stand-in `az`.

The stand-in keeps the cluster's node pools in a JSON file and answers exactly the two queries
the script makes; the steps run from the workflow's own `run:` text and `env:`, with the
workflow_dispatch inputs filled in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.workflows import actions

AKS = actions.load("conformance-aks.yml")
_, JOB = actions.only_job(AKS)
INPUTS = {
    "inputs.resource-group": "rg-conform",
    "inputs.cluster": "aks-conform",
    "inputs.region": "westeurope",
    "inputs.hypervisor": "kvm",
    "inputs.registry": "hvconformacr",
}
TAG = "hvconform-run"
FAKE_AZ = """#!{python}
import json, sys
from pathlib import Path

state_file = Path({state!r})
state = json.loads(state_file.read_text())
argv = sys.argv[1:]
state["calls"].append(argv)
opts = dict(zip(argv[3::2], argv[4::2]))
assert opts["--resource-group"] == "rg-conform" and opts["--cluster-name"] == "aks-conform", argv
code = 0
if argv[:3] == ["aks", "nodepool", "list"] and state["broken_list"]:
    code = 1  # e.g. the Azure token expired during a long run
elif argv[:3] == ["aks", "nodepool", "list"]:
    assert opts["--output"] == "tsv", argv
    pools = state["pools"]
    if opts["--query"] == '[?tags."{tag}"].name':
        pools = [p for p in pools if "{tag}" in p["tags"]]
    else:
        assert opts["--query"] == "[].name", argv
    print("\\n".join(p["name"] for p in pools))
elif argv[:3] == ["aks", "nodepool", "delete"]:
    if opts["--name"] in state["undeletable"]:
        code = 1
    else:
        state["pools"] = [p for p in state["pools"] if p["name"] != opts["--name"]]
else:
    code = 99
state_file.write_text(json.dumps(state))
sys.exit(code)
"""


class Cluster:
    def __init__(self, tmp: Path, pools: dict[str, dict[str, str]]) -> None:
        self.state = tmp / "az-state.json"
        self.save({"pools": [], "calls": [], "undeletable": [], "broken_list": False})
        self.set_pools(pools)
        tools = tmp / "tools"
        tools.mkdir()
        actions.write_tool(
            tools / "az", FAKE_AZ.format(python=sys.executable, state=str(self.state), tag=TAG)
        )
        self.runner = actions.Runner(tmp / "runner", [tools])

    def load(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state.read_text())
        return data

    def save(self, data: dict[str, Any]) -> None:
        self.state.write_text(json.dumps(data))

    def set_pools(self, pools: dict[str, dict[str, str]]) -> None:
        data = self.load()
        data["pools"] = [{"name": n, "tags": t} for n, t in pools.items()]
        self.save(data)

    def add_pool(self, name: str, tags: dict[str, str]) -> None:
        data = self.load()
        data["pools"].append({"name": name, "tags": tags})
        self.save(data)

    def pools(self) -> list[str]:
        return [p["name"] for p in self.load()["pools"]]

    def deleted(self) -> list[str]:
        calls = self.load()["calls"]
        return [c[c.index("--name") + 1] for c in calls if c[:3] == ["aks", "nodepool", "delete"]]

    def step(self, step_id: str) -> subprocess.CompletedProcess[str]:
        return self.runner.run(AKS, JOB, actions.step_by_id(JOB, step_id), INPUTS)


def test_cleanup_deletes_only_this_runs_tagged_pool(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"system": {}, "hvkold": {TAG: "old"}})
    assert cluster.step("pools-record").returncode == 0
    cluster.add_pool("hvkabc123", {TAG: "abc123"})  # what hvconform adds
    cluster.add_pool("userpool2", {})  # someone else's, meanwhile
    result = cluster.step("pools-cleanup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert cluster.deleted() == ["hvkabc123"]
    assert cluster.pools() == ["system", "hvkold", "userpool2"]
    assert "::warning title=AKS node pool::hvkold" in result.stdout


def test_cleanup_after_hvconform_deleted_its_pool_is_quiet(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"system": {}})
    assert cluster.step("pools-record").returncode == 0
    result = cluster.step("pools-cleanup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert cluster.deleted() == [] and "deleted: none" in result.stdout


def test_cleanup_without_a_record_touches_nothing(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"system": {}, "hvkabc123": {TAG: "abc123"}})
    result = cluster.step("pools-cleanup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert cluster.deleted() == [] and "never started" in result.stdout


def test_a_pool_that_survives_deletion_fails_the_step(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"system": {}})
    assert cluster.step("pools-record").returncode == 0
    cluster.add_pool("hvkstuck1", {TAG: "stuck1"})
    cluster.add_pool("hvkother2", {TAG: "other2"})
    data = cluster.load()
    data["undeletable"] = ["hvkstuck1"]
    cluster.save(data)
    result = cluster.step("pools-cleanup")
    assert result.returncode == 1
    assert cluster.deleted() == ["hvkstuck1", "hvkother2"], "one failure never stops the rest"
    assert "::error title=AKS node pool::hvkstuck1 is still there" in result.stdout


def test_a_failed_listing_fails_the_cleanup_instead_of_reading_as_no_pool(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"system": {}})
    assert cluster.step("pools-record").returncode == 0
    cluster.add_pool("hvkabc123", {TAG: "abc123"})
    data = cluster.load()
    data["broken_list"] = True
    cluster.save(data)
    result = cluster.step("pools-cleanup")
    assert result.returncode != 0, result.stdout
    assert "deleted" not in result.stdout


def region_check(tmp: Path, location: str, region: str) -> subprocess.CompletedProcess[str]:
    tools = tmp / "tools"
    tools.mkdir()
    expected = (
        "aks show --resource-group rg-conform --name aks-conform --query location --output tsv"
    )
    actions.write_tool(
        tools / "az",
        f"""#!/usr/bin/env bash
[[ "$*" == "{expected}" ]] || {{ echo "unexpected: az $*" >&2; exit 97; }}
echo {location}
""",
    )
    runner = actions.Runner(tmp / "runner", [tools])
    contexts = {**INPUTS, "inputs.region": region}
    return runner.run(AKS, JOB, actions.step_by_id(JOB, "region"), contexts)


def test_region_check_accepts_either_spelling(tmp_path: Path) -> None:
    result = region_check(tmp_path, "westeurope", "West Europe")
    assert result.returncode == 0, result.stdout + result.stderr


def test_region_check_refuses_another_region(tmp_path: Path) -> None:
    result = region_check(tmp_path, "eastus", "westeurope")
    assert result.returncode == 1
    assert "::error title=AKS region::aks-conform is in eastus, not westeurope" in result.stdout
