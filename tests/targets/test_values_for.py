"""Any conformant cluster through --target cluster (issue 37 item 2): the chart values to render
with are an option of the run, never a new target. `--values-for KEY` picks a key the profile
names for a cluster of its kind (openshift, k3s, ...); `--values FILE` layers the user's own
values on top. Rendered for real (helm, the shipped chart); refusals through the CLI, one line,
exit 2, before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.plugin import SHIPPED, load_profile
from hvconform.targets.cluster.plan import ClusterOptions
from hvconform.targets.cluster.run import render_objects

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = ROOT / "fixtures" / "plans" / "kubeconfig.yaml"
GO_KVM = ROOT / "fixtures" / "plugins" / "go-kvm" / "profile.yaml"
CHART = ROOT / "charts" / "hv-device-plugin"


def _profile(tmp_path: Path) -> Path:
    """The shipped profile with a key of its own: k3s renders with the chart's AKS values."""
    data = yaml.safe_load(SHIPPED.read_text())
    data["deploy"]["chart"]["path"] = str(CHART)
    data["deploy"]["chart"]["values"]["k3s"] = ["targets/aks.yaml"]
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _pull_policy(options: ClusterOptions, profile: Path) -> str:
    rendered, _ = render_objects(options, load_profile(profile))
    for obj in rendered.objects:
        if obj["kind"] == "DaemonSet" and "plugin" in obj["metadata"]["name"]:
            for container in obj["spec"]["template"]["spec"]["containers"]:
                if container["name"] == "plugin":
                    return str(container["imagePullPolicy"])
    raise AssertionError("no plugin DaemonSet rendered")


def _options(**changes: Any) -> ClusterOptions:
    return ClusterOptions(
        target="cluster", kubeconfig=str(KUBECONFIG), nodes=("n1",), run_id="r1", **changes
    ).validate()


def test_values_for_renders_the_profiles_own_key(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    assert _pull_policy(_options(), profile) == "Never"  # the cluster key: kind's values
    assert _pull_policy(_options(values_for="k3s"), profile) == "IfNotPresent"  # aks.yaml's


def test_a_values_file_of_the_users_goes_on_top(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("image:\n  pullPolicy: Always\n")
    profile = _profile(tmp_path)
    assert _pull_policy(_options(values_files=(str(mine),)), profile) == "Always"


def _run(*extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hvconform.cli", "run", "--dry-run", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _cluster(profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _run("--target", "cluster", "--kubeconfig", str(KUBECONFIG), "--node", "n1",
                "--plugin-profile", str(profile), *extra)  # fmt: skip


def _one_line(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_the_plan_says_which_key_it_renders(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("{}\n")
    done = _cluster(_profile(tmp_path), "--values-for", "k3s", "--values", str(mine))
    assert done.returncode == 0, done.stderr
    assert "# rendered with the profile's values key k3s (--values-for)" in done.stdout
    assert f"# values of yours on top (--values): {mine}" in done.stdout
    default = _cluster(_profile(tmp_path))
    assert "# rendered with the profile's values key cluster\n" in default.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--values-for", "openshift"), ("--values-for openshift", "no such key", "k3s")),
        (("--values-for", "K3S!"), ("neither a target's",)),
    ],
)
def test_a_key_the_profile_lacks_is_refused(
    tmp_path: Path, args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    _one_line(_cluster(_profile(tmp_path), *args), *needles)


def test_values_files_are_refused_for_manifests_and_when_not_a_mapping(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("image:\n  pullPolicy: Always\n")
    _one_line(_cluster(GO_KVM, "--values", str(mine)), "manifest files, not a chart")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    _one_line(_cluster(_profile(tmp_path), "--values", str(listed)), "want a mapping")
    _one_line(_cluster(_profile(tmp_path), "--values", str(tmp_path / "nope.yaml")), "cannot read")


def test_not_for_the_targets_without_a_cluster(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("{}\n")
    _one_line(_run("--target", "local", "--values", str(mine)), "--values", "--target local")
