"""The local runner of conformance-kind.yml (hvconform.targets.kindnode.workflow): every
expression and condition the real workflow uses is understood, GitHub's step semantics hold
(success() by default, always(), step outcomes, GITHUB_ENV/GITHUB_PATH between steps), and a
failing step is reported as a failure, never hidden. Steps run as real bash processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.targets.kindnode.workflow import (
    JOB,
    REPLACED,
    SKIPPED,
    WORKFLOW,
    StepResult,
    call_inputs,
    expand,
    run_steps,
    should_run,
)


def _steps() -> list[dict[str, Any]]:
    return list(yaml.safe_load(WORKFLOW.read_text())["jobs"][JOB]["steps"])


def test_every_expression_and_condition_of_the_real_workflow_is_understood() -> None:
    env = {"RUNNER_TEMP": "/t", "GITHUB_SHA": "abc", "KIND_CLUSTER": "c", "GITHUB_WORKSPACE": "/w"}
    outcomes = {"metadata-original": "success"}
    inputs = call_inputs(env)
    assert inputs["suite-ref"] == "abc" and inputs["plugin-image"] == "hv-device-plugin:0.1.0"
    job = yaml.safe_load(WORKFLOW.read_text())["jobs"][JOB]
    for value in job["env"].values():
        expand(str(value), env, {}, inputs)  # raises on an unknown expression
    steps = _steps()
    for step in steps:
        if "uses" in step:
            continue  # actions are listed, not run: their with: and if: are GitHub's
        should_run(str(step.get("if", "")), False, outcomes)  # raises on an unknown form
        for value in [*step.get("env", {}).values(), step.get("run", "")]:
            expand(str(value), env, outcomes, inputs)
    names = {s.get("name") for s in steps}
    assert set(SKIPPED) <= names and set(REPLACED) <= names, "the runner names steps that moved"


def test_conditions_follow_githubs_rules() -> None:
    assert should_run("", False, {}) and not should_run("", True, {})
    assert should_run("always()", True, {})
    assert should_run("${{ always() && steps.a.outcome == 'success' }}", True, {"a": "success"})
    assert not should_run("always() && steps.a.outcome == 'success'", True, {"a": "failure"})
    assert not should_run("success()", True, {})
    with pytest.raises(ValueError, match="not supported"):
        should_run("failure()", False, {})
    with pytest.raises(ValueError, match="not supported"):
        expand("${{ github.event.number }}", {}, {})


def test_steps_run_for_real_with_env_files_and_a_failure(tmp_path: Path) -> None:
    files = {k: tmp_path / k for k in ("path", "env")}
    for f in files.values():
        f.write_text("")
    env = {
        "PATH": "/usr/bin:/bin",
        "GITHUB_PATH": str(files["path"]),
        "GITHUB_ENV": str(files["env"]),
        "RUNNER_TEMP": str(tmp_path),
    }
    out = tmp_path / "seen"
    steps = [
        {"uses": "actions/checkout@v4"},
        {"name": "set", "id": "set", "run": 'echo "COLOUR=blue" >>"$GITHUB_ENV"'},
        {"name": "read", "run": f'echo "$COLOUR" >{out}'},
        {"name": "breaks", "id": "b", "run": "exit 3"},
        {"name": "after", "run": "echo never"},
        {"name": "report", "if": "always() && steps.b.outcome == 'failure'", "run": "true"},
    ]
    seen: list[StepResult] = []
    results = run_steps(steps, env, lambda n, e: None, seen.append)
    assert [(r.how, r.outcome) for r in results] == [
        ("action", "skipped"),
        ("ran", "success"),
        ("ran", "success"),
        ("ran", "failure"),
        ("not-run", "skipped"),
        ("ran", "success"),
    ]
    assert out.read_text().strip() == "blue", "GITHUB_ENV was not applied to the next step"
    assert results[3].note == "exit 3" and seen == results
