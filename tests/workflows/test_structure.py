"""What each workflow must hold: triggers, least privilege, pinned actions and images, timeouts,
and the KIND workflow's order of steps around the two metadata phases (the reusable
hvconform-plugin.yml, which conformance-kind.yml calls for this repository's plugin)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from hvconform.contract.plugin import load_profile
from hvconform.targets.cluster.kindbin import KIND_VERSION
from tests.workflows import actions

NAMES = actions.workflow_names()
PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+?)@([0-9a-f]{40}) # v\d+(?:\.\d+){0,2}$")
# A job calling a reusable workflow of this repository: pinned by being this commit's file.
LOCAL_CALL = re.compile(r"^\s*uses:\s*\./\.github/workflows/([\w-]+\.yml)$")
PLUGIN = "hvconform-plugin.yml"  # the reusable KIND workflow
OUTCOME = re.compile(r"^\$\{\{ steps\.([A-Za-z0-9_-]+)\.outcome \}\}$")


def jobs(name: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = actions.load(name)["jobs"]
    return found


def all_steps(name: str) -> list[dict[str, Any]]:
    return [step for job in jobs(name).values() for step in job.get("steps", [])]


def plugin_job() -> dict[str, Any]:
    name, job = actions.only_job(actions.load(PLUGIN))
    assert name == "conformance"
    return job


def test_the_four_workflows_exist() -> None:
    assert NAMES == ["ci.yml", "conformance-aks.yml", "conformance-kind.yml", PLUGIN]


@pytest.mark.parametrize("name", NAMES)
def test_every_action_is_pinned_by_full_sha_with_its_version(name: str) -> None:
    text = (actions.WORKFLOWS / name).read_text()
    uses = [line for line in text.splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
    assert uses
    local = [m.group(1) for line in uses if (m := LOCAL_CALL.match(line))]
    for line in uses:
        ok = PINNED.match(line) or LOCAL_CALL.match(line)
        assert ok, f"not pinned by SHA with a version comment: {line.strip()}"
    assert all((actions.WORKFLOWS / called).is_file() for called in local), local
    parsed = [s["uses"] for s in all_steps(name) if "uses" in s]
    parsed += [j["uses"] for j in jobs(name).values() if "uses" in j]
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
        if "uses" in job:  # a call: the called workflow's jobs are held to the same rules
            assert "permissions" not in job and "steps" not in job
            continue
        assert 0 < job["timeout-minutes"] <= 180
        granted = {**top, **job.get("permissions", {})}
        allowed = {"contents": "read", "id-token": "write"} if name == "conformance-aks.yml" else {}
        assert set(granted.items()) <= {("contents", "read"), *allowed.items()}, granted
        step_minutes = sum(s.get("timeout-minutes", 0) for s in job["steps"])
        assert step_minutes <= job["timeout-minutes"], "cleanup needs time left after the steps"
        checkouts = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
        # the reusable workflow checks out its caller's repository and the suite
        assert len(checkouts) == (2 if name == PLUGIN else 1)
        assert all(c["with"]["persist-credentials"] is False for c in checkouts)


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


SCRIPT = 'bash "$HVCONFORM_SUITE/.github/scripts/hvconform-kind.sh" '


def test_kind_order_of_steps_around_the_metadata_phases() -> None:
    workflow = actions.load(PLUGIN)
    assert list(workflow["on"]) == ["workflow_call"]
    job = plugin_job()
    assert job["runs-on"] == "ubuntu-latest"
    steps = job["steps"]
    kvm = next(i for i, s in enumerate(steps) if "99-kvm4all.rules" in s.get("run", ""))
    order = [
        "install",
        "image",
        "metadata-original",
        "kind-create",
        "metadata-startup",
        "conformance",
        "kind-delete",
        "metadata-final",
        "summary",
    ]
    index = [actions.step_index(job, step_id) for step_id in order]
    assert index == sorted(index), "install, image, snapshot, create, ... final, summary"
    assert index[1] < kvm < index[2], "the image is loaded, then the udev rule, then the snapshot"
    phases = {"metadata-original": "original", "metadata-startup": "startup",
              "metadata-final": "final", "kind-create": "create", "kind-delete": "delete",
              "conformance": "run"}  # fmt: skip
    # Every run step but the udev rule is one phase of the script, which runs off a runner too.
    for step_id in order:
        assert actions.step_by_id(job, step_id)["run"] == SCRIPT + phases.get(step_id, step_id)
    assert job["env"]["HVCONFORM_SUITE"] == "${{ github.workspace }}/.hvconform-suite"
    suite = [s for s in steps if s.get("with", {}).get("path") == ".hvconform-suite"]
    assert len(suite) == 1 and suite[0]["with"]["ref"] == "${{ inputs.suite-ref }}"
    # the kind this repository pins (kindbin, `nox -s kind-image`): one version everywhere
    assert job["env"]["KIND_VERSION"] == KIND_VERSION
    assert job["env"]["KIND_NODE_IMAGE"] == "${{ inputs.node-image }}"
    assert job["env"]["KUBERNETES_VERSION"] == "${{ inputs.kubernetes-version }}"


def test_the_reusable_workflows_inputs_and_output() -> None:
    call = actions.load(PLUGIN)["on"]["workflow_call"]
    required = {k for k, v in call["inputs"].items() if v.get("required")}
    assert required == {"plugin-image", "profile"}
    assert set(call["inputs"]) == required | {
        "plugin-image-artifact", "kubernetes-version", "node-image", "markers", "suite-repository",
        "suite-ref", "report-name",
    }  # fmt: skip
    assert call["inputs"]["kubernetes-version"]["default"] == "v1.37"
    assert call["outputs"]["report-artifact"]["value"] == (
        "${{ jobs.conformance.outputs.report-artifact }}"
    )
    job = plugin_job()
    assert job["outputs"]["report-artifact"] == "${{ inputs.report-name }}"
    uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads[0]["with"]["name"] == "${{ inputs.report-name }}"


def test_this_repository_calls_it_for_its_own_plugin() -> None:
    workflow = actions.load("conformance-kind.yml")
    assert set(workflow["on"]) == {"push", "pull_request", "workflow_dispatch"}
    image, kind = workflow["jobs"]["image"], workflow["jobs"]["kind"]
    assert kind["uses"] == f"./.github/workflows/{PLUGIN}" and kind["needs"] == "image"
    given = kind["with"]
    profile = load_profile(actions.ROOT / given["profile"])
    # the image built is the one the shipped profile deploys, and the one the call names
    assert given["plugin-image"] == workflow["env"]["PLUGIN_IMAGE"] == profile.image
    assert not given["plugin-image"].endswith(":latest")
    build = actions.step_by_id(image, "image")["run"]
    assert 'docker build -t "$PLUGIN_IMAGE"' in build and "docker save" in build
    upload = [s for s in image["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload[0]["with"]["name"] == given["plugin-image-artifact"]
    assert given["suite-ref"] == "${{ github.sha }}", "the suite of this very commit"


def test_kind_final_check_always_runs_against_the_startup_outcome() -> None:
    job = plugin_job()
    startup = actions.step_by_id(job, "metadata-startup")
    assert "if" not in startup, "startup runs only when the cluster was created"
    final = actions.step_by_id(job, "metadata-final")
    assert final["if"].startswith("always()")
    assert final["if"] == "always() && steps.metadata-original.outcome == 'success'"
    outcome = OUTCOME.match(final["env"]["STARTUP_OUTCOME"])
    assert outcome and outcome.group(1) == startup["id"]
    assert actions.step_by_id(job, "kind-delete")["if"] == "always()"


@pytest.mark.parametrize("name", [PLUGIN, "conformance-aks.yml"])
def test_reports_always_uploaded_and_summarised(name: str) -> None:
    _, job = actions.only_job(actions.load(name))
    steps = job["steps"]
    conformance = actions.step_index(job, "conformance")
    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    report = [u for u in uploads if u["with"]["path"] == "reports/latest/"]
    assert len(report) == 1 and report[0]["if"] == "always()"
    summary = [
        i for i, s in enumerate(steps)
        if "hvconform report" in s.get("run", "") or s.get("run", "").endswith("kind.sh\" summary")
    ]  # fmt: skip
    assert len(summary) == 1 and summary[0] > conformance
    assert steps[summary[0]]["if"] == "always()"
    script = (actions.SCRIPTS / "hvconform-kind.sh").read_text()
    shown = steps[summary[0]]["run"] if name != PLUGIN else script
    assert "GITHUB_STEP_SUMMARY" in shown


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
        run = step.get("run", "").replace('"$HVCONFORM_SUITE/', "")
        for script in re.findall(r"bash (\.github/scripts/[\w.-]+\.sh)", run):
            assert (actions.ROOT / script).is_file(), script
