"""Profiles that deploy (issue 25): the cluster targets apply what the profile's `deploy` section
describes, the dry-run plan shows it, the overrides are the documented ones, and a target that
cannot run what a profile describes refuses before anything runs (exit 2, one line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvconform.contract import runcontext
from hvconform.contract.plugin import ProfileError, load_profile, resolve
from hvconform.contract.runcontext import RunContext
from hvconform.manifests.profile import render_deploy
from hvconform.manifests.render import ManifestError
from hvconform.targets.honour import refusal

HVCONFORM = [sys.executable, "-m", "hvconform.cli"]
IMAGE = "example.org/acme/kvm-plugin:2.3.4"
DAEMONSET = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "acme-kvm", "namespace": "acme-system"},
    "spec": {
        "selector": {"matchLabels": {"app": "acme-kvm"}},
        "template": {
            "metadata": {"labels": {"app": "acme-kvm", "tier": "node"}},
            "spec": {
                "containers": [
                    {"name": "sidecar", "image": "example.org/acme/logger:1.0"},
                    {
                        "name": "plugin",
                        "image": "example.org/acme/kvm-plugin:0.0.1",
                        "volumeMounts": [
                            {"name": "dp", "mountPath": "/var/lib/kubelet/device-plugins"}
                        ],
                    },
                ],
                "volumes": [
                    {"name": "dp", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}
                ],
            },
        },
    },
}
ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "acme-kvm-reader"},
    "rules": [],
}


def acme_profile(tmp_path: Path, **deploy: object) -> Path:
    (tmp_path / "deploy").mkdir(exist_ok=True)
    (tmp_path / "deploy" / "ds.yaml").write_text(yaml.safe_dump_all([ROLE, DAEMONSET]))
    profile = {
        "name": "acme-kvm",
        "command": ["/usr/bin/acme-kvm"],
        "resource": "example.org/kvm",
        "deploy": {
            "image": IMAGE,
            "manifests": ["deploy/ds.yaml"],
            "pods": {"labels": {"app": "acme-kvm"}, "container": "plugin"},
            **deploy,
        },
    }
    path = tmp_path / "acme.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def test_manifests_are_applied_as_given_with_the_documented_overrides(tmp_path: Path) -> None:
    plugin = load_profile(acme_profile(tmp_path))
    assert plugin.deploy is not None and plugin.image == IMAGE
    made = render_deploy(plugin.deploy, "kind", namespace="run-ns")
    role, ds = made.objects
    assert role == ROLE, "a cluster-scoped object is applied exactly as given"
    assert ds["metadata"]["namespace"] == "run-ns"
    containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    assert containers["plugin"]["image"] == IMAGE, "the plugin runs the profile's image"
    assert containers["sidecar"]["image"] == "example.org/acme/logger:1.0", "others untouched"
    assert any("namespace run-ns" in n for n in made.notes)
    assert any("example.org/acme/kvm-plugin:0.0.1 -> " + IMAGE in n for n in made.notes)
    # --image overrides the profile's image, the same way
    other = render_deploy(plugin.deploy, "kind", namespace="x", image="example.org/acme/k:9")
    assert other.image == "example.org/acme/k:9"


def test_pods_that_match_nothing_are_named_in_the_error(tmp_path: Path) -> None:
    plugin = load_profile(
        acme_profile(tmp_path, pods={"labels": {"app": "other"}, "container": "plugin"})
    )
    assert plugin.deploy is not None
    with pytest.raises(ManifestError, match=r"deploy\.pods"):
        render_deploy(plugin.deploy, "kind", namespace="n")


@pytest.mark.parametrize(
    ("deploy", "needle"),
    [
        ({"image": "example.org/acme/kvm-plugin:latest"}, "not pinned"),
        ({"image": "example.org/acme/kvm-plugin"}, "not pinned"),
        ({"manifests": ["deploy/missing.yaml"]}, "not a regular file"),
        ({"chart": {"path": "deploy"}}, "exactly one of chart and manifests"),
        ({"pods": {"labels": {}, "container": "plugin"}}, "non-empty mapping"),
        ({"pods": {"labels": {"app": "x"}, "container": "Bad_Name"}}, "container name"),
    ],
)
def test_unusable_deploy_sections_are_refused(
    tmp_path: Path, deploy: dict[str, object], needle: str
) -> None:
    with pytest.raises(ProfileError, match=needle):
        load_profile(acme_profile(tmp_path, **deploy))


def test_the_kind_dry_run_deploys_the_profiles_objects_and_image(tmp_path: Path) -> None:
    profile = acme_profile(tmp_path)
    proc = subprocess.run(
        [*HVCONFORM, "run", "--target", "kind", "--dry-run", "--plugin-profile", str(profile),
         "--reports-root", str(tmp_path / "reports")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = proc.stdout
    assert f"# plugin under test: acme-kvm ({profile})" in plan
    assert f"kind load docker-image {IMAGE} " in plan, "the profile's image reaches the node"
    assert "DaemonSet hyperlight-system/acme-kvm" in plan and "ClusterRole acme-kvm-reader" in plan
    assert f"image: {IMAGE}" in plan and "hv-device-plugin" not in plan.split("## setup")[1]
    assert "# override: image example.org/acme/kvm-plugin:0.0.1 -> " + IMAGE in plan


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--target", "kind"], "deploy: plugin 'go-kvm'"),
        (["--target", "kind", "--plugin-profile", "{no_resource}"], "resource: plugin 'acme'"),
        (["--target", "cluster", "--kubeconfig", "/dev/null", "--node", "n"], "deploy:"),
        (["--runtime", "container"], "--runtime container"),
        (["--image", "x.org/y:1"], "--image: --target local runs the profile's command"),
    ],
)
def test_a_target_that_cannot_run_the_profile_refuses_before_anything(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    no_deploy = tmp_path / "go-kvm.yaml"
    no_deploy.write_text("name: go-kvm\ncommand: [/bin/true]\n")
    acme = yaml.safe_load(acme_profile(tmp_path).read_text())
    acme.pop("resource")
    (tmp_path / "acme.yaml").write_text(yaml.safe_dump({**acme, "name": "acme"}))
    args = [a.replace("{no_resource}", str(tmp_path / "acme.yaml")) for a in args]
    proc = subprocess.run(
        [*HVCONFORM, "run", "--plugin-profile", str(no_deploy), "--reports-root",
         str(tmp_path / "reports"), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "reports").exists()


def test_refusals_name_the_field_and_the_target() -> None:
    ours = resolve()
    assert refusal(ours, "kind", "process") == ""
    assert refusal(ours, "local", "container") == ""
    mshv = ours.with_env()
    assert refusal(mshv, "local", "process", image="a/b:1").startswith("--image:")


def test_the_run_context_carries_the_deploy_section_unchanged(tmp_path: Path) -> None:
    plugin = load_profile(acme_profile(tmp_path))
    ctx = RunContext("r1", str(tmp_path), "kind", plugin, recovery_timeout_s=12.5)
    back = runcontext.read(ctx.write())
    assert back == ctx and back.plugin.deploy == plugin.deploy


def test_the_container_runtime_refuses_what_it_cannot_honour_before_anything(
    tmp_path: Path,
) -> None:
    """An env value from the downward API cannot be given to a plain container: exit 2, one
    line naming the field, nothing written (it used to fail every check instead)."""
    ds = yaml.safe_load(yaml.safe_dump(DAEMONSET))
    plugin = ds["spec"]["template"]["spec"]["containers"][1]
    plugin["env"] = [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    profile = acme_profile(tmp_path)
    (tmp_path / "deploy" / "ds.yaml").write_text(yaml.safe_dump_all([ds]))
    proc = subprocess.run(
        [*HVCONFORM, "run", "--runtime", "container", "--plugin-profile", str(profile),
         "--reports-root", str(tmp_path / "reports")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "valueFrom" in proc.stderr, proc.stderr
    assert not (tmp_path / "reports").exists()
