"""`hvconform profile init`: real DaemonSets and a real chart in, a profile the run loads out.

Every case runs the real CLI entry in a subprocess on files in tmp_path, and loads what it wrote
with the run's own loader (load_profile): a starter that writes what a run refuses is useless.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.plugin import load_profile
from hvconform.profile_tool.daemonset import StarterError, facts

ROOT = Path(__file__).resolve().parents[2]
GO_KVM = ROOT / "fixtures" / "plugins" / "go-kvm"
CHART = ROOT / "charts" / "hv-device-plugin"
HVCONFORM = [sys.executable, "-m", "hvconform.cli"]


def hvconform(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HVCONFORM, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def daemonset(**container: Any) -> dict[str, Any]:
    """A minimal plugin DaemonSet; `container` replaces fields of its one container."""
    base: dict[str, Any] = {
        "name": "plugin",
        "image": "example.com/kvm-plugin:1.2.3",
        "volumeMounts": [
            {"name": "sockets", "mountPath": "/var/lib/kubelet/device-plugins"},
            {"name": "kvm", "mountPath": "/dev/kvm"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "kvm-plugin"},
        "spec": {
            "selector": {"matchLabels": {"app": "kvm-plugin"}},
            "template": {
                "metadata": {"labels": {"app": "kvm-plugin"}},
                "spec": {
                    "containers": [{**base, **container}],
                    "volumes": [
                        {
                            "name": "sockets",
                            "hostPath": {"path": "/var/lib/kubelet/device-plugins"},
                        },
                        {"name": "kvm", "hostPath": {"path": "/dev/kvm"}},
                    ],
                },
            },
        },
    }


def test_go_kvm_daemonset_gives_a_profile_the_run_loads(tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    manifest = tmp_path / "deploy" / "ds.yaml"
    shutil.copyfile(GO_KVM / "deploy" / "daemonset-cluster.yaml", manifest)
    out = tmp_path / "profile.yaml"
    done = hvconform(
        "profile", "init", "--from-manifest", str(manifest), "-o", str(out),
        "--resource", "example.org/kvm", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "profile check" in done.stdout
    plugin = load_profile(out)
    assert plugin.name == "go-kvm"
    assert plugin.command == ("{profile_dir}/bin/go-kvm", "-v=2")  # no command: the entrypoint
    assert plugin.env == {"GOKVM_DEFECT": ""}
    assert plugin.paths.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert plugin.paths.cdi_dir == "/var/run/cdi"
    assert plugin.paths.devices == ("/dev/kvm",)
    assert plugin.paths.host_dev_dir is None
    assert plugin.resource == "example.org/kvm"
    assert plugin.readiness.type == plugin.liveness.type == "none"  # it declares no probes
    assert plugin.deploy is not None
    assert plugin.deploy.image == "hv-fixture-go-kvm:0.1.0"
    assert dict(plugin.deploy.pods.labels) == {"app.kubernetes.io/name": "go-kvm"}
    assert plugin.deploy.pods.container == "go-kvm"
    assert plugin.deploy.manifests_for("kind") == (str(manifest.resolve()),)
    text = out.read_text()
    assert '"*": ["deploy/ds.yaml"]' in text  # relative: profile and manifest move together
    lines = {line.split(":", 1)[0].strip(): line for line in text.splitlines() if "#" in line}
    assert "# GUESSED:" in lines["command"]
    assert "# read:" in lines["image"] and "# read:" in lines["devicePluginDir"]


def test_stdout_profile_names_the_manifest_absolutely(tmp_path: Path) -> None:
    manifest = tmp_path / "ds.json"
    manifest.write_text(json.dumps(daemonset()))
    done = hvconform("profile", "init", "--from-manifest", "ds.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "other" / "p.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(done.stdout)
    plugin = load_profile(elsewhere)
    assert plugin.deploy is not None
    assert plugin.deploy.manifests_for("local") == (str(manifest),)
    assert plugin.deploy.image == "example.com/kvm-plugin:1.2.3"
    assert plugin.paths.devices == ("/dev/kvm",)
    assert plugin.command == ("{profile_dir}/bin/plugin",)
    assert plugin.resource is None  # never invented: left commented for the maintainer


def test_repository_chart_gives_the_plugin_daemonset(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    done = hvconform("profile", "init", "--from-chart", str(CHART), "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plugin = load_profile(out)
    assert plugin.deploy is not None and plugin.deploy.chart is not None
    assert plugin.deploy.chart.path == str(CHART)
    # two DaemonSets: the bootstrap device-access one mounts no CDI dir, the plugin does
    assert plugin.name == "hv-device-plugin-kvm"
    assert dict(plugin.deploy.pods.labels) == {"app.kubernetes.io/name": "hv-device-plugin-kvm"}
    assert plugin.deploy.pods.container == "plugin"
    assert plugin.paths.host_dev_dir == "/host-dev"
    assert plugin.paths.cdi_dir == "/var/run/cdi"
    assert plugin.readiness.type == "exec" and "readiness" in plugin.readiness.command
    assert plugin.liveness.type == "exec" and "liveness" in plugin.liveness.command
    assert plugin.command[0] == "hv-device-plugin"


def test_existing_output_is_kept_without_force(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(daemonset()))
    out = tmp_path / "p.yaml"
    out.write_text("keep me\n")
    args = ("profile", "init", "--from-manifest", "ds.json", "-o", "p.yaml")
    refused = hvconform(*args, cwd=tmp_path)
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1 and "--force" in refused.stderr
    assert out.read_text() == "keep me\n"
    forced = hvconform(*args, "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert load_profile(out).name == "kvm-plugin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json", "p.yaml"]  # no temp left


def _parent_mount_and_named_port() -> dict[str, Any]:
    ds = daemonset(
        volumeMounts=[{"name": "kubelet", "mountPath": "/kubelet"}],
        ports=[{"name": "health", "containerPort": 8081}],
        readinessProbe={"httpGet": {"path": "/ready", "port": "health"}},
        livenessProbe={"grpc": {"port": 9000, "service": "live"}},
    )
    ds["spec"]["template"]["spec"]["volumes"] = [
        {"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet"}}
    ]
    return ds


def test_a_kubelet_root_mount_and_a_named_probe_port_are_read() -> None:
    found = facts([_parent_mount_and_named_port()], "test")
    assert found.device_plugin_dir.value == "/kubelet/device-plugins"
    assert found.device_plugin_dir.read
    assert found.readiness.value == {"type": "http", "url": "http://{health_host}:8081/ready"}
    # a kubelet gRPC probe is TCP; the suite's asks the plugin's socket: a guess to confirm
    assert found.liveness.value == {"type": "grpc-health", "service": "live"}
    assert not found.liveness.read
    assert found.devices.value == ["/dev/kvm"] and not found.devices.read


@pytest.mark.parametrize(
    ("name", "probe", "said"),
    [
        ("bad path", {"httpGet": {"path": "/x y", "port": 1}}, "not a URL path"),
        ("bad port", {"httpGet": {"path": "/", "port": 70000}}, "not a port"),
        ("empty exec", {"exec": {"command": []}}, "empty"),
    ],
)
def test_unusable_probes_are_one_line(name: str, probe: dict[str, Any], said: str) -> None:
    with pytest.raises(StarterError, match=said) as caught:
        facts([daemonset(readinessProbe=probe)], "test")
    assert "\n" not in str(caught.value)
