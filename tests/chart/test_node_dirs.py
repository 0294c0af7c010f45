"""The kubelet root and the CDI dir are chart values (issue 27): distributions that move them
(k0s, microk8s: kubevirt/kubevirt#3017, k0sproject/k0s#7585) get hostPaths where their node
keeps them, while the plugin inside the pod keeps the standard paths it looks at."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from hvconform.manifests.policy import check_policy

K0S = "/var/lib/k0s/kubelet"
MICROK8S = "/var/snap/microk8s/common/var/lib/kubelet"


def render(*extra: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "manifests", "--target", "kind", *extra],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def volumes_and_mounts(objects: list[dict[str, object]]) -> list[tuple[str, str]]:
    pairs = []
    for obj in objects:
        if obj.get("kind") != "DaemonSet":
            continue
        spec = obj["spec"]["template"]["spec"]  # type: ignore[index]
        host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        for c in spec["containers"]:
            pairs += [
                (host[m["name"]], m["mountPath"]) for m in c["volumeMounts"] if m["name"] in host
            ]
    return pairs


@pytest.mark.parametrize(("root", "cdi"), [(K0S, "/run/k0s/cdi"), (MICROK8S, "/etc/cdi")])
def test_host_paths_follow_the_values_and_the_pod_keeps_standard_paths(root: str, cdi: str) -> None:
    objects = render("--kubelet-root-dir", root, "--cdi-dir", cdi, "--check")
    pairs = volumes_and_mounts(objects)
    assert (f"{root}/device-plugins", "/var/lib/kubelet/device-plugins") in pairs
    assert (cdi, "/var/run/cdi") in pairs
    assert not any(h.startswith("/var/lib/kubelet") for h, _ in pairs)
    assert check_policy(objects) == []


def test_the_default_is_the_standard_kubelet_root() -> None:
    pairs = volumes_and_mounts(render())
    assert ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins") in pairs
    assert ("/var/run/cdi", "/var/run/cdi") in pairs


@pytest.mark.parametrize("root", ["/proc/1/root", "relative/dir", "/var/lib/../../etc"])
def test_an_unusable_root_is_refused_with_one_line(root: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "manifests", "--target", "kind",
         "--kubelet-root-dir", root],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "kubeletRootDir" in proc.stderr and not proc.stdout
