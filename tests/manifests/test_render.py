"""What each target renders, which parameters are refused, the goldens and the CLI."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

from hv_device_plugin.config import parse_config
from hv_device_plugin.probe_cli import probe_main
from hvconform.manifests import (
    DEFAULT_POOL_TAINT,
    ManifestError,
    check_image,
    default_image,
    render_manifests,
    render_objects,
)
from hvconform.manifests.cli import register
from tests.manifests.common import ALL_TARGETS, DAEMONSETS, IMAGE, daemonset, objects, pod_spec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "manifests"
HYPERVISOR = {"kind": "kvm", "aks": "kvm", "aks-mshv": "mshv"}


def container(ds: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_spec(ds)["containers"]
    c: dict[str, Any] = only
    return c


def pod_labels(ds: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = ds["spec"]["template"]["metadata"]["labels"]
    return labels


def match_expressions(ds: dict[str, Any]) -> dict[str, list[str]]:
    affinity = pod_spec(ds)["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(e["operator"] == "In" for e in term["matchExpressions"])
    return {e["key"]: e["values"] for e in term["matchExpressions"]}


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_daemonsets_by_target(target: str) -> None:
    hv = HYPERVISOR[target]
    objs = objects(target)
    assert objs[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "hyperlight-system",
            "labels": {
                "app.kubernetes.io/part-of": "hyperlight",
                "pod-security.kubernetes.io/enforce": "privileged",
            },
        },
    }
    for component in DAEMONSETS:
        ds = daemonset(objs, component)
        assert ds["metadata"]["namespace"] == "hyperlight-system"
        assert (
            ds["spec"]["selector"]["matchLabels"].items()
            <= ds["spec"]["template"]["metadata"]["labels"].items()
        )
        assert pod_spec(ds)["priorityClassName"] == "system-node-critical"
        expected = {"hyperlight.dev/hypervisor": [hv]}
        if target == "aks-mshv":
            expected["kubernetes.io/arch"] = ["amd64"]
        assert match_expressions(ds) == expected
        assert pod_spec(ds)["tolerations"] == [{"key": DEFAULT_POOL_TAINT, "operator": "Exists"}]
        c = container(ds)
        assert c["image"] == IMAGE
        assert c["imagePullPolicy"] == ("Never" if target == "kind" else "IfNotPresent")
        assert c["command"] == ["hv-device-plugin"]
        args = c["args"]
        assert args[args.index("--hypervisor-device") + 1] == f"/dev/{hv}"
        assert args[args.index("--host-dev-dir") + 1] == "/host-dev"
        # Metrics leave the pod's loopback, on a named port the Service targets.
        assert args[args.index("--health-addr") + 1] == "0.0.0.0:9400"
        assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    (service,) = [o for o in objs if o["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9400, "targetPort": "metrics", "protocol": "TCP"}
    ]
    # It selects the pods of both DaemonSets of this hypervisor, and nothing else.
    selector = service["spec"]["selector"].items()
    assert all(selector <= pod_labels(daemonset(objs, c)).items() for c in DAEMONSETS)
    other = "mshv" if hv == "kvm" else "kvm"
    assert (
        not selector
        <= pod_labels(
            daemonset(
                objects(next(t for t in ALL_TARGETS if HYPERVISOR[t] == other)), "device-access"
            )
        ).items()
    )


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_bootstrap_and_plugin_roles(target: str) -> None:
    objs = objects(target)
    boot, plugin = (container(daemonset(objs, c)) for c in DAEMONSETS)
    assert boot["args"][:2] == ["--mode", "device-access"]
    assert plugin["args"][:2] == ["--mode", "hypervisor"]
    # The bootstrap never needs the device: it requests nothing and has no CDI dir.
    assert "hyperlight.dev/device-access" not in boot["resources"]["limits"]
    assert "cdi" not in {m["name"] for m in boot["volumeMounts"]}
    for part in ("requests", "limits"):
        assert plugin["resources"][part]["hyperlight.dev/device-access"] == "1"
    mounts = {m["mountPath"] for m in plugin["volumeMounts"]}
    assert mounts == {"/tmp", "/var/lib/kubelet/device-plugins", "/var/run/cdi", "/host-dev"}
    # Each probe asks the socket of its own mode (the socket name prefix depends on it).
    for c, mode in ((boot, "device-access"), (plugin, "hypervisor")):
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["exec"]["command"][-2:] == ["--mode", mode]


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_rendered_args_are_accepted_by_the_plugin(target: str) -> None:
    for component in DAEMONSETS:
        c = container(daemonset(objects(target), component))
        cfg = parse_config(c["args"], environ={})
        assert cfg.hypervisor_device == f"/dev/{HYPERVISOR[target]}"
        assert str(cfg.host_dev_dir) == "/host-dev"
        assert cfg.mode == c["args"][1]


def test_probe_commands_are_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The exec probe's arguments parse; with no socket it answers NO_SOCKET and exit 1."""
    for component in DAEMONSETS:
        c = container(daemonset(objects("kind"), component))
        for probe in ("livenessProbe", "readinessProbe"):
            argv = [*c[probe]["exec"]["command"][2:], "--device-plugin-dir", str(tmp_path)]
            assert probe_main(argv) == 1
            assert '"NO_SOCKET"' in capsys.readouterr().out


def test_kvm_and_mshv_can_share_a_cluster() -> None:
    names = [
        (o["kind"], o["metadata"]["name"])
        for t in ("kind", "aks-mshv")
        for o in objects(t)
        if o["kind"] != "Namespace"
    ]
    # Two DaemonSets and the metrics Service per hypervisor, no name shared.
    assert len(names) == len(set(names)) == 6


def test_pool_taint_is_configurable() -> None:
    custom = render_objects("aks", image=IMAGE, pool_taint="example.com/pool")
    for component in DAEMONSETS:
        tolerations = pod_spec(daemonset(custom, component))["tolerations"]
        assert tolerations == [{"key": "example.com/pool", "operator": "Exists"}]
    untainted = render_objects("aks", image=IMAGE, pool_taint=None)
    assert all("tolerations" not in pod_spec(daemonset(untainted, c)) for c in DAEMONSETS)


def test_namespace_is_configurable() -> None:
    objs = render_objects("kind", image=IMAGE, namespace="hv-conform-1")
    assert [o["metadata"].get("namespace", o["metadata"]["name"]) for o in objs] == [
        "hv-conform-1"
    ] * 4


@pytest.mark.parametrize(
    "image",
    [
        "hv-device-plugin:latest",
        "registry.example:5000/team/hv-device-plugin:latest",
        "hv-device-plugin:LATEST",
        "hv-device-plugin",
        "localhost:5000/hv-device-plugin",
        "",
        "Upper/Case:1.0",
        "hv:1.0\nkind: Pod",
        "hv:1.0\n",
        'hv:1.0" ,x',
        "hv:latest@sha256:" + "a" * 64,
    ],
)
def test_unpinned_or_invalid_images_are_refused(image: str) -> None:
    with pytest.raises(ManifestError, match=r"is not pinned|is not an image reference"):
        render_manifests("kind", image=image)


@pytest.mark.parametrize(
    "image",
    [
        "hv-device-plugin:0.1.0",
        "localhost:5000/hv-device-plugin:0.1.0",
        "myacr.azurecr.io/hyperlight/hv-device-plugin:v1.2.3-rc.1",
        "hv-device-plugin@sha256:" + "b" * 64,
        "ghcr.io/org/hv-device-plugin:1.0@sha256:" + "c" * 64,
    ],
)
def test_pinned_images_are_accepted(image: str) -> None:
    assert check_image(image) == image
    plugin = daemonset(render_objects("aks", image=image), "hypervisor-plugin")
    assert container(plugin)["image"] == image


def test_latest_error_is_clear() -> None:
    with pytest.raises(ManifestError) as info:
        check_image("hv-device-plugin:latest")
    assert "':latest'" in str(info.value) and "digest" in str(info.value)


def test_default_image_is_pinned() -> None:
    assert check_image(default_image()) == default_image()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target": "gke"}, "unknown target 'gke'; choose one of kind, aks, aks-mshv"),
        ({"namespace": "Hyperlight"}, "DNS-1123"),
        ({"namespace": "a" * 64}, "DNS-1123"),
        ({"namespace": "hyperlight\n"}, "DNS-1123"),
        ({"pool_taint": "example.com/pool\n"}, "qualified name"),
        ({"pool_taint": "bad key!"}, "qualified name"),
        ({"pool_taint": ""}, "qualified name"),
        ({"pool_taint": "Bad_Prefix/x"}, "qualified name"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"target": "kind", "image": IMAGE, **kwargs}
    target = args.pop("target")
    with pytest.raises(ManifestError, match=match):
        render_manifests(target, **args)


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_golden(target: str) -> None:
    """Any change to the rendered output shows in review; HV_UPDATE_GOLDENS=1 rewrites them."""
    golden = FIXTURES / f"{target}.yaml"
    text = render_manifests(target, image=IMAGE)
    if os.environ.get("HV_UPDATE_GOLDENS") == "1":
        golden.write_text(text)
    assert golden.read_text() == text, f"regenerate with HV_UPDATE_GOLDENS=1 after review: {golden}"


def test_render_is_deterministic() -> None:
    assert render_manifests("aks-mshv", image=IMAGE) == render_manifests("aks-mshv", image=IMAGE)


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hvconform")
    register(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args(argv)
    code: int = ns.func(ns)
    return code


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_cli_prints_the_render(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["manifests", "--target", target, "--image", IMAGE, "--check"]) == 0
    assert capsys.readouterr().out == render_manifests(target, image=IMAGE)


def test_cli_refuses_latest(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["manifests", "--target", "kind", "--image", "hv:latest"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("hvconform manifests: image 'hv:latest' is not pinned: ':latest'")


def test_cli_defaults_from_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HV_IMAGE", "hv-device-plugin:9.9.9")
    monkeypatch.setenv("HV_POOL_TAINT", "")
    assert cli(["manifests", "--target", "aks"]) == 0
    out = capsys.readouterr().out
    assert out == render_manifests("aks", image="hv-device-plugin:9.9.9", pool_taint=None)
