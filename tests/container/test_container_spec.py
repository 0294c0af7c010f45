"""What `--runtime container` derives from a profile's objects, and what it refuses (no engine)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.errors import Unhonoured
from hvconform.contract.plugin import PluginUnderTest, load_profile, resolve
from hvconform.targets.container.spec import container_spec, expand, health_port
from tests.container.gokvm import PROFILE as GO_KVM_PROFILE

CONTAINER: dict[str, Any] = {
    "name": "plugin",
    "image": "example.org/acme/kvm:1.0",
    "command": ["/acme-plugin"],
    "args": ["--listen", "$(ADDR)", "--literal", "$$(ADDR)", "--unknown", "$(NOPE)"],
    "env": [{"name": "PORT", "value": "9100"}, {"name": "ADDR", "value": "127.0.0.1:$(PORT)"}],
    "securityContext": {"readOnlyRootFilesystem": True, "runAsUser": 0},
    "volumeMounts": [
        {"name": "dp", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "cdi", "mountPath": "/var/run/cdi"},
        {"name": "tmp", "mountPath": "/scratch"},
    ],
}
VOLUMES: list[dict[str, Any]] = [
    {"name": "dp", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}},
    {"name": "cdi", "hostPath": {"path": "/var/run/cdi"}},
    {"name": "tmp", "emptyDir": {"sizeLimit": "8Mi"}},
]


def acme(tmp_path: Path, container: dict[str, Any], pod: dict[str, Any] | None = None,
         readiness: str = "{type: grpc-health}") -> PluginUnderTest:  # fmt: skip
    spec = {"containers": [container], "volumes": VOLUMES, **(pod or {})}
    ds = {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "acme"},
        "spec": {"selector": {"matchLabels": {"app": "acme"}},
                 "template": {"metadata": {"labels": {"app": "acme"}}, "spec": spec}},
    }  # fmt: skip
    (tmp_path / "ds.yaml").write_text(yaml.safe_dump(ds))
    (tmp_path / "profile.yaml").write_text(
        "name: acme\ncommand: [/acme-plugin]\n"
        f"readiness: {readiness}\n"
        "deploy:\n  image: example.org/acme/kvm:2.0\n  manifests: [ds.yaml]\n"
        "  pods: {labels: {app: acme}, container: plugin}\n"
    )
    return load_profile(tmp_path / "profile.yaml")


def test_expansion_is_the_kubelets() -> None:
    env = {"A": "x", "B": "y"}
    assert expand("$(A)-$(B)", env) == "x-y"
    assert expand("$$(A) $$ $(C) $( $A", env) == "$(A) $ $(C) $( $A"


def test_the_container_is_the_objects_own(tmp_path: Path) -> None:
    spec = container_spec(acme(tmp_path, CONTAINER))
    assert spec.image == "example.org/acme/kvm:2.0", "the profile's image, not the manifest's"
    assert spec.entrypoint == ("/acme-plugin",)
    assert spec.args == ("--listen", "127.0.0.1:9100", "--literal", "$(ADDR)", "--unknown",
                         "$(NOPE)")  # fmt: skip
    assert spec.env == {"PORT": "9100", "ADDR": "127.0.0.1:9100"}
    assert spec.user == "0" and spec.read_only
    assert spec.tmpfs == {"/scratch": "size=8m,mode=1777"}
    assert spec.health_port == 9100  # from the ADDR:PORT argument
    assert spec.workload == "hvconform/acme/plugin"


def test_args_alone_keep_the_images_entrypoint(tmp_path: Path) -> None:
    container = {k: v for k, v in CONTAINER.items() if k != "command"}
    spec = container_spec(acme(tmp_path, container))
    assert spec.entrypoint is None and spec.args is not None


def test_the_shipped_profile_runs_the_charts_container() -> None:
    spec = container_spec(resolve())
    assert spec.entrypoint == ("hv-device-plugin",)
    assert spec.args is not None and "--health-addr" in spec.args
    assert spec.health_port == 9400 and spec.read_only and "/tmp" in spec.tmpfs
    assert spec.read_only_paths == {"/host-dev"}
    assert spec.exec_probes["readiness"][:3] == ("hv-device-plugin", "probe", "readiness")


def test_the_go_kvm_fixture_runs_its_daemonset() -> None:
    plugin = load_profile(GO_KVM_PROFILE)
    spec = container_spec(plugin)
    assert spec.image == plugin.image and spec.entrypoint is None and spec.args == ("-v=2",)
    assert spec.env == {"GOKVM_DEFECT": ""} and spec.health_port is None
    assert spec.exec_probes == {}
    assert plugin.deploy is not None
    for files in plugin.deploy.manifests.values():  # local and the clusters' ("*")
        manifest = yaml.safe_load(Path(files[0]).read_text())
        image = manifest["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == plugin.image, "the manifest names the image the profile pins"


def test_an_http_probe_uses_the_httpget_port() -> None:
    container = {"ports": [{"name": "health", "containerPort": 8081}],
                 "readinessProbe": {"httpGet": {"port": "health", "path": "/ready"}}}  # fmt: skip
    assert health_port(container, ["--x=0.0.0.0:9000"]) == 8081
    assert health_port({"ports": [{"containerPort": 7000}]}, []) == 7000
    assert health_port({}, ["--metrics=:9000"]) == 9000
    assert health_port({}, ["--peer", "10.0.0.1:9000"]) is None


SUB_PATH = {"name": "dp", "mountPath": "/var/run/cdi", "subPath": "x"}
CONFIG_MAP = {"volumes": [*VOLUMES, {"name": "cm", "configMap": {"name": "x"}}]}


def _with(path: str, value: Any) -> dict[str, Any]:
    container = copy.deepcopy(CONTAINER)
    *parents, last = path.split(".")
    node = container
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return container


@pytest.mark.parametrize(
    ("container", "pod", "needle"),
    [
        (
            _with("env", [{"name": "N", "valueFrom": {"fieldRef": {}}}]),
            None,
            "env[0] (N).valueFrom",
        ),
        (_with("envFrom", [{"configMapRef": {"name": "x"}}]), None, "envFrom"),
        (_with("securityContext.privileged", True), None, "securityContext.privileged"),
        (_with("securityContext.capabilities", {"add": ["SYS_ADMIN"]}), None, "capabilities.add"),
        (CONTAINER, {"hostNetwork": True}, "hostNetwork"),
        (CONTAINER, {"initContainers": [{"name": "i"}]}, "initContainers"),
        (_with("volumeMounts", [{"name": "dp", "mountPath": "/elsewhere"}]), None, "/elsewhere"),
        (_with("volumeMounts", [SUB_PATH]), None, "subPath"),
        (_with("volumeMounts", [{"name": "cm", "mountPath": "/etc/x"}]), CONFIG_MAP, "configMap"),
    ],
)
def test_what_cannot_be_honoured_is_refused_in_one_line(
    tmp_path: Path, container: dict[str, Any], pod: dict[str, Any] | None, needle: str
) -> None:
    with pytest.raises(Unhonoured) as info:
        container_spec(acme(tmp_path, container, pod))
    message = str(info.value)
    assert needle in message and "--runtime container" in message
    assert "\n" not in message


def test_an_http_probe_without_a_port_is_refused(tmp_path: Path) -> None:
    container = {**CONTAINER, "args": ["--verbose"]}
    plugin = acme(tmp_path, container, readiness='{type: http, url: "http://{health_addr}/ok"}')
    with pytest.raises(Unhonoured, match=r"^readiness\.url: .* names none"):
        container_spec(plugin)
