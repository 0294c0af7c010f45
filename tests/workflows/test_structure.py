"""What each workflow must hold: triggers, least privilege, pinned actions and images, timeouts,
and the KIND workflow's order of steps around the two metadata phases."""

from __future__ import annotations

import re
from typing import Any

import pytest

from conformance.targets.cluster.kindbin import KIND_VERSION
from tests.workflows import actions

NAMES = actions.workflow_names()
PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+?)@([0-9a-f]{40}) # v\d+(?:\.\d+){0,2}$")
OUTCOME = re.compile(r"^\$\{\{ steps\.([A-Za-z0-9_-]+)\.outcome \}\}$")


def jobs(name: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = actions.load(name)["jobs"]
    return found


def all_steps(name: str) -> list[dict[str, Any]]:
    return [step for job in jobs(name).values() for step in job["steps"]]


def test_the_three_workflows_exist() -> None:
    assert NAMES == ["ci.yml", "conformance-aks.yml", "conformance-kind.yml"]


@pytest.mark.parametrize("name", NAMES)
def test_every_action_is_pinned_by_full_sha_with_its_version(name: str) -> None:
    text = (actions.WORKFLOWS / name).read_text()
    uses = [line for line in text.splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
    assert uses
    for line in uses:
        assert PINNED.match(line), f"not pinned by SHA with a version comment: {line.strip()}"
    parsed = [s["uses"] for s in all_steps(name) if "uses" in s]
    assert len(parsed) == len(uses)


@pytest.mark.parametrize("name", NAMES)
def test_no_floating_tags_and_no_secrets_in_shell(name: str) -> None:
    text = (actions.WORKFLOWS / name).read_text()
    assert ":latest" not in text
    assert "secrets." not in text, "these workflows need no stored secret"
    for step in all_steps(name):
        # Expressions reach the shell through env:, never spliced into its text.
        assert "${{" not in step.get("run", ""), step.get("name")


@pytest.mark.parametrize("name", NAMES)
def test_least_privilege_timeouts_concurrency(name: str) -> None:
    workflow = actions.load(name)
    assert "concurrency" in workflow and workflow["concurrency"]["group"]
    assert workflow["defaults"]["run"]["shell"] == "bash"
    top = workflow["permissions"]
    assert top in ({}, {"contents": "read"}), top
    for job in workflow["jobs"].values():
        assert 0 < job["timeout-minutes"] <= 180
        granted = {**top, **job.get("permissions", {})}
        allowed = {"contents": "read", "id-token": "write"} if name == "conformance-aks.yml" else {}
        assert set(granted.items()) <= {("contents", "read"), *allowed.items()}, granted
        step_minutes = sum(s.get("timeout-minutes", 0) for s in job["steps"])
        assert step_minutes <= job["timeout-minutes"], "cleanup needs time left after the steps"
        checkouts = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
        assert len(checkouts) == 1
        assert checkouts[0]["with"]["persist-credentials"] is False


def test_ci_runs_the_project_ci_sessions() -> None:
    workflow = actions.load("ci.yml")
    assert set(workflow["on"]) == {"push", "pull_request"}
    _, job = actions.only_job(workflow)
    runs = [s["run"] for s in job["steps"] if "run" in s]
    assert runs == ['sudo env "PATH=$PATH" CI=true bash .ci/run']
    # .ci/run -> ./dev test -> exactly the sessions this workflow promises.
    assert "exec ./dev test" in (actions.ROOT / ".ci" / "run").read_text()
    assert "nox -s lint typecheck tests" in (actions.ROOT / "dev").read_text()
    python = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
    assert python[0]["with"]["python-version"] == "3.11"


def test_kind_order_of_steps_around_the_metadata_phases() -> None:
    workflow = actions.load("conformance-kind.yml")
    assert set(workflow["on"]) == {"push", "pull_request", "workflow_dispatch"}
    _, job = actions.only_job(workflow)
    assert job["runs-on"] == "ubuntu-latest"
    steps = job["steps"]
    kvm = next(i for i, s in enumerate(steps) if "99-kvm4all.rules" in s.get("run", ""))
    order = [
        "metadata-original",
        "kind-create",
        "metadata-startup",
        "conformance",
        "kind-delete",
        "metadata-final",
    ]
    index = [actions.step_index(job, step_id) for step_id in order]
    assert kvm < index[0] and index == sorted(index), "udev rule, snapshot, create, ... final"
    run = {step_id: actions.step_by_id(job, step_id)["run"] for step_id in order}
    assert run["metadata-original"] == "bash .github/scripts/kvm-metadata.sh original"
    assert run["metadata-startup"] == "bash .github/scripts/kvm-metadata.sh startup"
    assert run["metadata-final"] == "bash .github/scripts/kvm-metadata.sh final"
    assert "--config kind/cluster.yaml" in run["kind-create"]
    assert '--image "$KIND_NODE_IMAGE"' in run["kind-create"]
    assert run["conformance"].startswith("nox -s conformance-kind -- ")
    assert "--existing-cluster" in run["conformance"], (
        "the workflow makes and deletes the cluster itself"
    )
    assert '--image "$PLUGIN_IMAGE"' in run["conformance"]
    assert actions.step_index(job, "image") < index[0], "built before the original snapshot"
    assert not workflow["env"]["PLUGIN_IMAGE"].endswith(":latest")
    assert 'kind delete cluster --name "$KIND_CLUSTER"' in run["kind-delete"]
    install = next(s["run"] for s in steps if "go install" in s.get("run", ""))
    assert 'go install "sigs.k8s.io/kind@${KIND_VERSION}"' in install
    # the kind this repository pins (kindbin, `nox -s kind-image`): one version everywhere
    assert workflow["env"]["KIND_VERSION"] == KIND_VERSION
    assert re.fullmatch(
        r"kindest/node:v[\d.]+@sha256:[0-9a-f]{64}", workflow["env"]["KIND_NODE_IMAGE"]
    )


def test_kind_final_check_always_runs_against_the_startup_outcome() -> None:
    _, job = actions.only_job(actions.load("conformance-kind.yml"))
    startup = actions.step_by_id(job, "metadata-startup")
    assert startup["env"]["KIND_NODE"] == "${{ env.KIND_CLUSTER }}-control-plane"
    assert "if" not in startup, "startup runs only when the cluster was created"
    final = actions.step_by_id(job, "metadata-final")
    assert final["if"].startswith("always()")
    assert final["if"] == "always() && steps.metadata-original.outcome == 'success'"
    outcome = OUTCOME.match(final["env"]["STARTUP_OUTCOME"])
    assert outcome and outcome.group(1) == startup["id"]
    assert actions.step_by_id(job, "kind-delete")["if"] == "always()"


@pytest.mark.parametrize("name", ["conformance-kind.yml", "conformance-aks.yml"])
def test_reports_always_uploaded_and_summarised(name: str) -> None:
    _, job = actions.only_job(actions.load(name))
    steps = job["steps"]
    conformance = actions.step_index(job, "conformance")
    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    report = [u for u in uploads if u["with"]["path"] == "reports/latest/"]
    assert len(report) == 1 and report[0]["if"] == "always()"
    summary = [i for i, s in enumerate(steps) if "hvconform report" in s.get("run", "")]
    assert len(summary) == 1 and summary[0] > conformance
    assert steps[summary[0]]["if"] == "always()"
    assert "GITHUB_STEP_SUMMARY" in steps[summary[0]]["run"]


def test_aks_is_manual_with_oidc_and_always_deletes_the_pool() -> None:
    workflow = actions.load("conformance-aks.yml")
    assert list(workflow["on"]) == ["workflow_dispatch"]
    inputs = workflow["on"]["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"resource-group", "cluster", "region", "hypervisor", "registry"}
    assert inputs["hypervisor"]["type"] == "choice"
    assert inputs["hypervisor"]["options"] == ["kvm", "mshv"]
    assert all(inputs[k]["required"] for k in inputs)
    assert workflow["permissions"] == {}
    _, job = actions.only_job(workflow)
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    login = [s for s in job["steps"] if s.get("uses", "").startswith("azure/login@")]
    assert len(login) == 1
    assert set(login[0]["with"]) == {"client-id", "tenant-id", "subscription-id"}
    assert all(v.startswith("${{ vars.") for v in login[0]["with"].values())
    assert job["env"]["HV_HYPERVISOR"] == "${{ inputs.hypervisor }}"
    conformance = actions.step_by_id(job, "conformance")
    for flag in ("--resource-group", "--cluster", "--hypervisor", "--image"):
        assert flag in conformance["run"]
    # Deployed by the digest the push step returned, never by a tag.
    assert conformance["env"]["PLUGIN_IMAGE"] == "${{ steps.push.outputs.image }}"
    record = actions.step_index(job, "pools-record")
    cleanup = actions.step_by_id(job, "pools-cleanup")
    assert (
        record < actions.step_index(job, "conformance") < actions.step_index(job, "pools-cleanup")
    )
    assert cleanup["if"] == "always()"
    assert cleanup["run"] == "bash .github/scripts/aks-pools.sh cleanup"
    assert workflow["concurrency"]["cancel-in-progress"] is False, "never cancel mid-cleanup"


@pytest.mark.parametrize("name", NAMES)
def test_every_script_a_step_calls_exists(name: str) -> None:
    for step in all_steps(name):
        for script in re.findall(r"bash (\.github/scripts/\S+\.sh)", step.get("run", "")):
            assert (actions.ROOT / script).is_file(), script
