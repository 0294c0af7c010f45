"""Release hygiene: the licence, the Python versions claimed, the changelog and the contributor
guide say what the project really is and does."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet

from tests.release import test_wheel_anywhere as wheel_test

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def test_license_file_is_the_declared_licence() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert PROJECT["license"] == {"text": "Apache-2.0"}
    assert "License :: OSI Approved :: Apache Software License" in PROJECT["classifiers"]
    dockerfile = (ROOT / "plugin/Dockerfile").read_text()
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in dockerfile
    chart = yaml.safe_load((ROOT / "charts/hv-device-plugin/Chart.yaml").read_text())
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"


def pythons_in_use() -> set[str]:
    """Every Python version something here runs the project on."""
    found = set()
    noxfile = (ROOT / "noxfile.py").read_text()
    found |= set(re.findall(r'HV_NOX_PYTHON", "(3\.\d+)"', noxfile))
    for workflow in (ROOT / ".github/workflows").glob("*.yml"):
        found |= set(re.findall(r'python-version: "(3\.\d+)"', workflow.read_text()))
    for dockerfile in ("plugin/Dockerfile", "images/guest/Dockerfile"):
        found |= set(re.findall(r"python:(3\.\d+)-slim", (ROOT / dockerfile).read_text()))
    return found


def test_exactly_the_tested_pythons_are_claimed() -> None:
    used = pythons_in_use()
    assert used == {"3.11"}, used
    # The wheel is installed and run outside the checkout on each claimed Python, in CI
    # (test_wheel_anywhere's IN_CI); `nox -s tests-py` runs the ones beside the sessions' own.
    assert set(wheel_test.IN_CI) == set(wheel_test.PYTHONS) >= used
    noxfile = (ROOT / "noxfile.py").read_text()
    assert '"HV_WHEEL_PYTHONS": ",".join(versions)' in noxfile
    session_default = re.search(r"^WHEEL_PYTHONS = \((.*?)\)", noxfile, re.M)
    assert session_default, "noxfile.py: WHEEL_PYTHONS, the Pythons of `nox -s tests-py`"
    in_session = set(re.findall(r'"(3\.\d+)"', session_default.group(1)))
    assert in_session == set(wheel_test.PYTHONS) - used
    tested = set(wheel_test.PYTHONS)
    spec = SpecifierSet(PROJECT["requires-python"])
    claimed = {f"3.{minor}" for minor in range(8, 20) if spec.contains(f"3.{minor}.0")}
    assert claimed == tested, f"requires-python {spec} claims {sorted(claimed)}"
    classified = {
        c.rsplit(" :: ", 1)[1]
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert classified == tested
    # Code is written for the oldest claimed Python (ruff and mypy hold it to that).
    oldest = min(tested, key=lambda v: tuple(map(int, v.split("."))))
    assert PYPROJECT["tool"]["mypy"]["python_version"] == oldest
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + oldest.replace(".", "")


def test_changelog_has_unreleased_and_the_current_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    assert f"## [{PROJECT['version']}]" in text


def nox_sessions() -> set[str]:
    """The session names noxfile.py defines: `name=` where given, else the function's name."""
    found = set()
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "nox.session":
                names = [k.value for k in deco.keywords if k.arg == "name"]
                found.add(ast.literal_eval(names[0]) if names else node.name)
    return found


def test_contributing_names_the_commands_and_every_nox_session() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert "./dev conform" in text and "./dev test" in text
    sessions = nox_sessions()
    assert sessions >= {"lint", "typecheck", "tests", "chart"}
    missing = sorted(s for s in sessions if f"`{s}`" not in text)
    assert not missing, f"CONTRIBUTING.md does not describe the nox sessions {missing}"
