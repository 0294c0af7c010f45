"""The GitHub Actions workflows as data, and a step runner that executes a `run:` step the way a
hosted Linux runner does: the step's exact shell text, `bash --noprofile --norc -eo pipefail`,
the workflow, job and step `env:` merged in that order, `${{ }}` expressions replaced from the
contexts a test gives (an unknown expression fails the test instead of passing silently), and the
runner's RUNNER_TEMP and GITHUB_STEP_SUMMARY files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.scripts import python_script

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
SCRIPTS = ROOT / ".github" / "scripts"
# `bash` in a step's shell: GitHub runs the step file with exactly these options.
BASH = ("bash", "--noprofile", "--norc", "-eo", "pipefail")
_EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")

Workflow = dict[str, Any]
Step = dict[str, Any]


def load(name: str) -> Workflow:
    """One workflow file, parsed; PyYAML's YAML 1.1 reads the `on` key as True: put it back."""
    raw: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    data: Workflow = {("on" if key is True else str(key)): value for key, value in raw.items()}
    return data


def workflow_names() -> list[str]:
    return sorted(p.name for p in WORKFLOWS.glob("*.yml"))


def only_job(workflow: Workflow) -> tuple[str, dict[str, Any]]:
    jobs = workflow["jobs"]
    assert len(jobs) == 1, sorted(jobs)
    name, job = next(iter(jobs.items()))
    return str(name), dict(job)


def step_by_id(job: dict[str, Any], step_id: str) -> Step:
    found: list[Step] = [s for s in job["steps"] if s.get("id") == step_id]
    assert len(found) == 1, f"{len(found)} steps with id {step_id!r}"
    return found[0]


def step_index(job: dict[str, Any], step_id: str) -> int:
    steps: list[Step] = job["steps"]
    return steps.index(step_by_id(job, step_id))


def expand(text: str, contexts: dict[str, str]) -> str:
    """Replace every `${{ expr }}`; each expr must be a key of `contexts`."""

    def value(match: re.Match[str]) -> str:
        expr = match.group(1)
        assert expr in contexts, f"no value given for the expression {expr!r} in {text!r}"
        return contexts[expr]

    return _EXPRESSION.sub(value, text)


def venv_bin() -> Path:
    """The running interpreter's bin: where `hvconform` is installed (the nox session's venv)."""
    return Path(sys.executable).parent


@dataclass
class Runner:
    """A hosted runner's view for one test: its temp dir, step summary and PATH."""

    root: Path
    path_first: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.temp = self.root / "runner-temp"
        self.temp.mkdir(parents=True, exist_ok=True)
        self.summary = self.root / "step-summary.md"
        self.summary.touch()

    def base_env(self) -> dict[str, str]:
        path = [*map(str, self.path_first), str(venv_bin()), "/usr/local/bin", "/usr/bin", "/bin"]
        return {
            "PATH": os.pathsep.join(path),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "RUNNER_TEMP": str(self.temp),
            "GITHUB_STEP_SUMMARY": str(self.summary),
        }

    def run(
        self,
        workflow: Workflow,
        job: dict[str, Any],
        step: Step,
        contexts: dict[str, str],
        extra_env: dict[str, str] | None = None,
        workspace: Path = ROOT,
    ) -> subprocess.CompletedProcess[str]:
        """Run one `run:` step in the workspace (the checkout), as its job would."""
        defaults = job.get("defaults") or workflow.get("defaults") or {}
        shell = step.get("shell") or defaults.get("run", {}).get("shell")
        assert shell == "bash", f"step {step.get('id')} runs with shell {shell!r}, not bash"
        script = step["run"]
        assert "${{" not in script, "expressions belong in env:, never in the shell text"
        defined: dict[str, str] = {}  # the `env` context: what workflow, job and step set
        for level in (workflow, job, step):
            for key, raw in (level.get("env") or {}).items():
                scope = {**contexts, **{f"env.{k}": v for k, v in defined.items()}}
                defined[key] = expand(str(raw), scope)
        env = {**self.base_env(), **defined, **(extra_env or {})}
        step_file = self.root / f"step-{step.get('id', 'anonymous')}.sh"
        step_file.write_text(script)
        return subprocess.run(
            [*BASH, str(step_file)],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def write_tool(path: Path, text: str) -> Path:
    """An executable stand-in on the test's PATH (docker, az, a snapshot source). A Python one
    (`#!` + this interpreter) goes through tests.scripts: its path may hold a space."""
    shebang = f"#!{sys.executable}\n"
    if text.startswith(shebang):
        return python_script(path, text[len(shebang) :])
    path.write_text(text)
    path.chmod(0o755)
    return path


PLUGIN_WORKFLOW = "hvconform-plugin.yml"  # the reusable KIND workflow
SUITE_CHECKOUT = ".hvconform-suite"  # where it checks the suite out, in the caller's workspace


def plugin_call(workspace: Path) -> dict[str, str]:
    """The contexts of hvconform-plugin.yml as conformance-kind.yml calls it: `inputs.*` (the
    call's `with:` over the inputs' defaults) and `github.workspace`, where the suite's checkout
    is this checkout (a symlink, made here)."""
    inputs = load(PLUGIN_WORKFLOW)["on"]["workflow_call"]["inputs"]
    given = load("conformance-kind.yml")["jobs"]["kind"]["with"]
    contexts = {f"inputs.{k}": str(given.get(k, v.get("default", ""))) for k, v in inputs.items()}
    suite = workspace / SUITE_CHECKOUT
    workspace.mkdir(parents=True, exist_ok=True)
    if not suite.exists():
        suite.symlink_to(ROOT)
    return {**contexts, "github.workspace": str(workspace)}
