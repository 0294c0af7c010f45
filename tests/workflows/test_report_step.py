"""The report step of both cluster workflows (the reusable KIND one's is a phase of
hvconform-kind.sh), run in a scratch workspace: it adds the Markdown report to the job summary
exactly once, whatever point the run reached."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.workflows import actions

RESULTS = actions.ROOT / "fixtures" / "results"
NAMES = [actions.PLUGIN_WORKFLOW, "conformance-aks.yml"]


def report_step(name: str) -> tuple[actions.Workflow, dict[str, Any], actions.Step]:
    workflow = actions.load(name)
    _, job = actions.only_job(workflow)
    found = [
        s
        for s in job["steps"]
        if "hvconform report" in s.get("run", "") or s.get("id") == "summary"
    ]
    assert len(found) == 1
    return workflow, job, found[0]


def run_report(name: str, tmp: Path) -> tuple[int, str, str]:
    workflow, job, step = report_step(name)
    runner = actions.Runner(tmp / "runner")
    workspace = tmp / "workspace"
    contexts = {
        **(actions.plugin_call(workspace) if name == actions.PLUGIN_WORKFLOW else {}),
        "inputs.resource-group": "rg",
        "inputs.cluster": "c",
        "inputs.region": "westeurope",
        "inputs.hypervisor": "kvm",
        "inputs.registry": "hvconformacr",
    }
    result = runner.run(workflow, job, step, contexts, workspace=workspace)
    return result.returncode, result.stdout + result.stderr, runner.summary.read_text()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "workspace" / "reports").mkdir(parents=True)
    return tmp_path / "workspace"


def latest(workspace: Path) -> Path:
    run = workspace / "reports" / "20260101T000000Z-1"
    run.mkdir()
    (workspace / "reports" / "latest").symlink_to(run.name)
    return run


@pytest.mark.parametrize("name", NAMES)
def test_rendered_by_the_run_is_not_added_twice(name: str, workspace: Path) -> None:
    run = latest(workspace)
    (run / "results.json").write_text((RESULTS / "all-passed.json").read_text())
    (run / "report.md").write_text("# already in the summary\n")
    code, out, summary = run_report(name, workspace.parent)
    assert code == 0, out
    assert summary == ""


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("fixture", "code"), [("all-passed", 0), ("failed-wait-expired", 0)])
def test_results_without_a_report_are_rendered_into_the_summary(
    name: str, fixture: str, code: int, workspace: Path
) -> None:
    run = latest(workspace)
    (run / "results.json").write_text((RESULTS / f"{fixture}.json").read_text())
    if (RESULTS / "evidence").is_dir():
        shutil.copytree(RESULTS / "evidence", run / "evidence")
    got, out, summary = run_report(name, workspace.parent)
    assert got == code, out  # a failed check is the run step's failure, not this step's
    assert (run / "report.md").is_file()
    assert summary.strip() and summary.rstrip("\n") == (run / "report.md").read_text().rstrip("\n")


@pytest.mark.parametrize("name", NAMES)
def test_no_results_says_so_in_the_summary(name: str, workspace: Path) -> None:
    code, out, summary = run_report(name, workspace.parent)
    assert code == 0, out
    assert "No conformance results" in summary
