"""actionlint (with shellcheck on every `run:`), zizmor offline and shellcheck on the step scripts.

The tools must be installed (the nox sessions install them; see the noxfile's `_actionlint`): a
missing linter fails here rather than skipping, so a green run always means "linted". Each
linter is also shown a broken workflow and must object, so a no-op tool cannot pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.workflows import actions

# Findings at or above this severity fail: "no findings above low" (there are none at all now,
# in any persona).
ZIZMOR_MIN_SEVERITY = "medium"
BROKEN = """\
name: broken
on: pull_request
jobs:
  x:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}" $UNQUOTED
"""


def tool(name: str) -> str:
    """A linter on PATH, with the interpreter's bin first (nox installs them there)."""
    path = os.pathsep.join([str(actions.venv_bin()), os.environ.get("PATH", "")])
    found = shutil.which(name, path=path)
    if found is None:
        pytest.fail(f"{name} is not installed: run the tests through nox (nox -s workflows)")
    return found


def lint_env() -> dict[str, str]:
    """PATH with the interpreter's bin first, so actionlint finds shellcheck; no GitHub token,
    so nothing could go online even if a tool tried."""
    drop = ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join([str(actions.venv_bin()), os.environ.get("PATH", "")])
    return env


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=actions.ROOT, env=lint_env(), capture_output=True, text=True, timeout=120
    )


def actionlint(*paths: str) -> subprocess.CompletedProcess[str]:
    tool("shellcheck")  # without it actionlint silently skips the shell of every step
    return run([tool("actionlint"), "-no-color", *paths])


def zizmor(target: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    result = run(
        [
            tool("zizmor"),
            "--offline",
            "--no-progress",
            "--format",
            "json",
            "--min-severity",
            ZIZMOR_MIN_SEVERITY,
            target,
        ]
    )
    findings: list[dict[str, object]] = json.loads(result.stdout or "[]")
    return result, findings


def test_actionlint_passes_every_workflow() -> None:
    result = actionlint(*(f".github/workflows/{n}" for n in actions.workflow_names()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_zizmor_offline_finds_nothing_above_low() -> None:
    result, findings = zizmor(".github/workflows")
    assert findings == [], json.dumps(findings, indent=1)[:4000]
    assert result.returncode == 0, result.stderr


def test_shellcheck_passes_the_step_scripts() -> None:
    scripts = sorted(str(p) for p in actions.SCRIPTS.glob("*.sh"))
    assert len(scripts) >= 2
    result = run([tool("shellcheck"), "--shell=bash", "--severity=style", *scripts])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_linters_object_to_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / ".github" / "workflows" / "broken.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(BROKEN)
    lint = actionlint(str(broken))
    assert lint.returncode == 1 and "shellcheck" in lint.stdout, lint.stdout
    _, findings = zizmor(str(broken))
    rules = {str(f["ident"]) for f in findings}
    assert {"template-injection", "unpinned-uses"} <= rules, rules
