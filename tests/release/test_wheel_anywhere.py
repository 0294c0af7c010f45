"""The built wheel runs from anywhere (issue 36 item 1), on every Python requires-python claims.

As a plugin's maintainer would: the wheel built (sdist first, then the wheel from it, as
`python -m build` does), installed with pip into a fresh venv outside the checkout, run from a
temporary directory that is no checkout with an environment that names none (no PYTHONPATH,
the checkout's venv off PATH). `hvconform run` judges this repository's plugin on the local
target, the whole catalogue (root, the real /dev/kvm), and `--plugin-profile` a user's profile:
the go-kvm fixture copied to a temporary directory with its binary (the whole catalogue, its
verdicts those a checkout gives it), and a profile with `command:`
only. The installed package finds its chart, profiles and kind configs in site-packages, and the
wheel puts nothing else at the top level. With its chart gone, the suite stops with one line.

PYTHONS is every Python requires-python claims (tests/release/test_release.py holds the two
equal), and CI (`nox -s tests`) runs each of them (IN_CI): one costs 40 to 60 s here (the
dependencies' install, then three runs; measured by `nox -s tests-py -- 3.11 3.12 3.13`,
--durations). HV_WHEEL_PYTHONS, comma-separated, selects some (`nox -s tests-py -- 3.13`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet

from hvconform.contract.dra_profile import API_DEVICE_PLUGIN
from hvconform.contract.results import validate_results
from hvconform.scenarios import judging
from tests.conformance.test_verdict_matrix import NO_ROLLOUT
from tests.fixture_plugins import GO_KVM_DIR, build_go_kvm
from tests.release.wheelbuild import SELECTION, build_wheel, interpreter

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PYTHONS = ("3.11", "3.12", "3.13")
CLAIMED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
IN_CI = PYTHONS  # every Python requires-python claims: an untested claim is a guess
SELECTED = [v.strip() for v in os.environ.get("HV_WHEEL_PYTHONS", ",".join(IN_CI)).split(",")]
# What `-m "guest or cdi"` runs, from the catalogue, plus the checks every run ends with.
EXPECTED = [c.id for c in judging(API_DEVICE_PLUGIN) if c.marker in ("guest", "cdi")] + [
    "metadata-two-phase",
    "plugin-identity",
    "cleanup",
]
# The whole catalogue, as a checkout judges it on the local target: every check passes but these
# (tests/conformance/test_verdict_matrix.py for go-kvm, tests/setup/test_fresh_clone.py for ours):
# the local target deploys no DaemonSet, and go-kvm declares no optional RPC.
WHOLE = {
    "hv-device-plugin": NO_ROLLOUT,
    "go-kvm": {**NO_ROLLOUT, "optional-rpcs": "not_applicable"},
}
# Asked of the installed package, from the run directory: where it found each of its data files.
PROBE = """
import json, sys, sysconfig
from importlib import metadata, util
import hvconform, hv_device_plugin
from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.plugin import SHIPPED, SHIPPED_DRA, shipped_profiles
from hvconform.manifests.chart import chart_dir
dist = metadata.distribution("hv-device-plugin")
print(json.dumps({
    "site": sysconfig.get_paths()["purelib"],
    "modules": [hvconform.__file__, hv_device_plugin.__file__],
    "folder_names": [n for n in ("plugin", "conformance") if util.find_spec(n) is not None],
    "data": [str(chart_dir()), str(SHIPPED), str(SHIPPED_DRA), ClusterOptions().kind_config],
    "charts": sorted({p.deploy.chart.path for p in shipped_profiles() if p.deploy and p.deploy.chart}),
    "top": sorted({f.parts[0] for f in dist.files or () if f.parts[0] != ".."}),
    "profiles_twice": [str(f) for f in dist.files or () if f.parts[:2] == ("hvconform", "profiles")],
    "requires_python": dist.metadata["Requires-Python"],
    "version": list(sys.version_info[:2]),
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


def clean_env(venv: Path) -> dict[str, str]:
    """This environment without anything that points into the checkout or its venv."""
    ours = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != ours]
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HV_CHART", "PYTHONSAFEPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PATH": os.pathsep.join([str(venv / "bin"), *path])}


def install(python: str, wheel: Path, venv: Path) -> None:
    """A fresh venv (no pip of its own: this pip installs into it) and the wheel with its
    conformance extra, resolved from the index as a user's pip would."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    proc = subprocess.run(
        [*pip, "-q", "--no-compile", "--disable-pip-version-check", f"{wheel}[conformance]"],
        capture_output=True, text=True, timeout=600, cwd=venv,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def hvconform(venv: Path, cwd: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = cwd / "reports" / f"run-{len(list(cwd.glob('reports/run-*')))}"
    cmd = [str(venv / "bin" / "hvconform"), "run", "--out", str(out), *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, cwd=cwd, env=clean_env(venv)
    )
    results = out / "results.json"
    data = json.loads(results.read_text()) if results.exists() else {}
    return proc.returncode, data, proc.stdout + proc.stderr


def judged(
    code: int, data: dict[str, Any], output: str, plugin: str, ours: bool, whole: bool = False
) -> None:
    """Exit 0, the plugin named as it ran, and the verdicts a checkout gives: of the whole
    catalogue (WHOLE's exceptions apart, every check passed), or of the selection (all passed)."""
    assert code == 0, output[-4000:]
    validate_results(data)
    statuses = {c["id"]: c["status"] for c in data["checks"]}
    if whole:
        every = {c.id for c in judging(API_DEVICE_PLUGIN)}
        assert every <= set(statuses), sorted(every - set(statuses))
        want = {check: WHOLE[plugin].get(check, "passed") for check in statuses}
        assert statuses == want, output[-3000:]
    else:
        assert statuses == dict.fromkeys(EXPECTED, "passed"), output[-3000:]
    assert data["run"]["plugin"]["name"] == plugin
    assert data["run"]["plugin"]["this_repository"] is ours


def user_profiles(where: Path) -> tuple[Path, Path]:
    """The go-kvm fixture copied with its binary (built, cached), and a `command:`-only profile
    of this repository's plugin run as a process: no deploy, no paths, no probes."""
    go_kvm = where / "go-kvm"
    shutil.copytree(GO_KVM_DIR / "deploy", go_kvm / "deploy")
    shutil.copy2(GO_KVM_DIR / "profile.yaml", go_kvm / "profile.yaml")
    (go_kvm / "bin").mkdir()
    shutil.copy2(build_go_kvm(), go_kvm / "bin" / "go-kvm")
    minimal = where / "mine" / "profile.yaml"
    minimal.parent.mkdir()
    minimal.write_text('command: ["{python}", "-m", "hv_device_plugin"]\n')
    return go_kvm / "profile.yaml", minimal


@pytest.mark.parametrize("version", SELECTED)
def test_wheel_runs_from_anywhere(version: str, wheel: Path, tmp_path: Path) -> None:
    assert version in PYTHONS, f"HV_WHEEL_PYTHONS names {version}, not one of {PYTHONS}"
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    install(interpreter(version), wheel, venv)
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", PROBE],
        capture_output=True, text=True, timeout=60, cwd=work, env=clean_env(venv),
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout)
    site = Path(found["site"])
    assert found["version"] == [int(n) for n in version.split(".")]
    assert SpecifierSet(found["requires_python"]) == SpecifierSet(CLAIMED)
    assert SpecifierSet(CLAIMED).contains(f"{version}.0")
    assert site.is_relative_to(venv) and not site.is_relative_to(ROOT)
    # The wheel's top level: the two packages under the project's own import names and its
    # metadata; no charts/ or kind/, and no generic `plugin` or `conformance` (issue 36).
    assert found["top"] == ["hv_device_plugin", "hv_device_plugin-0.1.0.dist-info", "hvconform"]
    assert found["folder_names"] == []
    assert found["profiles_twice"] == []  # the shipped profiles travel once, in hvconform/_data
    assert not (site / "plugin").exists() and not (site / "conformance").exists()
    for path in [*found["modules"], *found["data"], *found["charts"]]:
        assert Path(path).is_relative_to(site / "hvconform") or Path(path).is_relative_to(
            site / "hv_device_plugin"
        ), path
        assert Path(path).exists(), path
    assert found["charts"] == [found["data"][0]]  # both shipped profiles name the shipped chart
    assert not (site / "charts").exists() and not (site / "kind").exists()

    # the whole catalogue for ours and go-kvm; the selection for a `command:`-only profile
    judged(*hvconform(venv, work, "-n", "2"), "hv-device-plugin", True, whole=True)
    go_kvm, minimal = user_profiles(tmp_path / "profiles")
    judged(*hvconform(venv, work, "--plugin-profile", str(go_kvm)), "go-kvm", False, whole=True)
    judged(*hvconform(venv, work, "--plugin-profile", str(minimal), *SELECTION), "mine", False)

    # An installation without its chart: one line and exit 2, for ours and a user's profile.
    shutil.rmtree(Path(found["data"][0]))
    for args in ((), ("--plugin-profile", str(minimal))):
        code, data, output = hvconform(venv, work, *args, *SELECTION)
        assert (code, data) == (2, {}), output[-3000:]
        assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output
        assert "is not a directory" in output and "reinstall" in output, output


def test_sdist_carries_what_the_wheel_ships(wheel: Path) -> None:
    """The wheel was built from the sdist: the sdist holds the sources setup.py copies."""
    sdist = next(wheel.parent.glob("*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for rel in ("charts/hv-device-plugin/Chart.yaml", "kind/cluster.yaml", "setup.py",
                "conformance/profiles/hv-device-plugin.yaml", "MANIFEST.in"):  # fmt: skip
        assert rel in names, rel
    assert not any(n.startswith("conformance/_data") or "__pycache__" in n for n in names)
