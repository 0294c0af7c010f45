"""values.schema.json refuses what would break a node or the policy, and `hvconform manifests`
prints exactly what the documented `helm template` command prints, for every target."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hvconform.manifests import DEFAULT_POOL_TAINT, TARGETS
from tests.chart.helm import CHART, DEFAULTS, NAMESPACE, ROOT, SCHEMA, refusal, run_helm

DIGEST = "sha256:" + "e" * 64
# (values, a piece of helm's error naming the value): every one is refused by helm and by the
# schema read with Python's jsonschema (two implementations, one schema).
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "unknown-hypervisor": ({"hypervisor": "xen"}, "/hypervisor"),
    "tag-latest": ({"image": {"tag": "latest"}}, "/image/tag"),
    "tag-Latest": ({"image": {"tag": "Latest"}}, "/image/tag"),
    "short-digest": ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
    "repository-injection": ({"image": {"repository": "hv\nkind: Pod"}}, "/image/repository"),
    "chart-owned-flag": ({"extraArgs": ["--mode=device-access"]}, "/extraArgs/0"),
    "chart-owned-flag-split": ({"extraArgs": ["--health-addr", "0.0.0.0:1"]}, "/extraArgs/0"),
    "newline-in-arg": ({"extraArgs": ["--log-level\ndebug"]}, "/extraArgs/0"),
    "zero-slots": ({"slots": 0}, "/slots"),
    "no-cpu-limit": ({"resources": {"limits": {"cpu": None, "memory": "1Gi"}}}, "/resources"),
    "mshv-on-arm": (
        {"hypervisor": "mshv", "nodeSelector": {"kubernetes.io/arch": "arm64"}},
        "kubernetes.io~1arch",
    ),
    "monitor-without-service": (
        {"metrics": {"serviceMonitor": {"enabled": True}, "service": {"enabled": False}}},
        "/metrics",
    ),
    "monitor-without-metrics": (
        {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
        "/metrics",
    ),
    "privileged-switch": ({"privileged": True}, "privileged"),
    "privileged-port": ({"metrics": {"port": 80}}, "/metrics/port"),
    "bad-env-name": ({"extraEnv": [{"name": "1BAD", "value": "x"}]}, "/extraEnv/0"),
    "bad-pull-secret": ({"image": {"pullSecrets": ["Bad_Name"]}}, "/image/pullSecrets/0"),
    "bad-toleration": ({"tolerations": [{"key": "a", "operator": "In"}]}, "/tolerations/0"),
    "bad-priority-class": ({"priorityClassName": "Not Valid"}, "/priorityClassName"),
    # issue 27: what Kubernetes or the runtime refuses at apply time, refused here first
    "env-value-nul": ({"extraEnv": [{"name": "A", "value": "a\x00b"}]}, "/extraEnv/0/value"),
    "annotation-key-newline": (
        {"metrics": {"service": {"annotations": {"a\nb": "x"}}}},
        "invalid propertyName",  # helm's validator names the wrong path for propertyNames
    ),
    "label-value-control": (
        {"metrics": {"serviceMonitor": {"labels": {"team": "a\x07"}}}},
        "/metrics/serviceMonitor/labels/team",
    ),
    "kubelet-root-relative": ({"kubeletRootDir": "var/lib/kubelet"}, "/kubeletRootDir"),
    "kubelet-root-dotdot": ({"kubeletRootDir": "/var/lib/../../proc"}, "/kubeletRootDir"),
    "kubelet-root-proc": ({"kubeletRootDir": "/proc/1/root"}, "/kubeletRootDir"),
    "cdi-dir-sys": ({"cdiDir": "/sys/kernel"}, "/cdiDir"),
}


def _merged(overlay: dict[str, Any], base: dict[str, Any] = DEFAULTS) -> dict[str, Any]:
    """Helm's merge of a values overlay onto the defaults (null deletes a key)."""
    out = dict(base)
    for key, value in overlay.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merged(value, base[key])
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_schema_refuses(case: str) -> None:
    values, where = REFUSED[case]
    assert where in refusal(values)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(SCHEMA).validate(_merged(values))


def test_accepted_values_are_accepted_by_both() -> None:
    """The refusals are specific: near misses render."""
    ok = {
        "hypervisor": "mshv",
        "nodeSelector": {"kubernetes.io/arch": "amd64"},
        "image": {"tag": "latest-but-not-quite", "digest": DIGEST},
        "extraArgs": ["--modest=1", "--log-level", "debug"],
        "metrics": {"port": 1024},
    }
    jsonschema.Draft7Validator(SCHEMA).validate(_merged(ok))
    done = run_helm("template", "x", str(CHART), values=ok)
    assert done.returncode == 0, done.stderr


def operator_command(target: str, image: dict[str, str], taint: str | None) -> list[str]:
    """What an operator types to get what `hvconform manifests --target <target>` prints."""
    argv = [
        "template", "hv-device-plugin", "charts/hv-device-plugin", "--namespace", NAMESPACE,
        "--values", f"charts/hv-device-plugin/targets/{target}.yaml",
        "--set", "namespace.create=true",
    ]  # fmt: skip
    for key, value in image.items():
        argv += ["--set", f"image.{key}={value}"]
    if taint is not None:
        argv += ["--set", f"tolerations[0].key={taint}", "--set", "tolerations[0].operator=Exists"]
    return argv


def hvconform(*args: str) -> str:
    exe = Path(sys.executable).parent / "hvconform"
    done = subprocess.run(
        [str(exe), "manifests", *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("image", "parts"),
    [
        ("hv-device-plugin:1.2.3", {"repository": "hv-device-plugin", "tag": "1.2.3"}),
        (
            f"myacr.azurecr.io/team/hv-device-plugin@{DIGEST}",
            {"repository": "myacr.azurecr.io/team/hv-device-plugin", "digest": DIGEST},
        ),
    ],
)
@pytest.mark.parametrize("target", TARGETS)
def test_hvconform_manifests_is_the_chart(target: str, image: str, parts: dict[str, str]) -> None:
    ours = hvconform("--target", target, "--image", image, "--namespace", NAMESPACE)
    done = run_helm(*operator_command(target, parts, DEFAULT_POOL_TAINT))
    assert done.returncode == 0, done.stderr
    assert ours == done.stdout
    assert f'image: "{image}"' in ours


def test_hvconform_without_a_taint_is_the_chart_without_tolerations() -> None:
    ours = hvconform("--target", "aks", "--image", "hv-device-plugin:1.2.3", "--pool-taint", "")
    parts = {"repository": "hv-device-plugin", "tag": "1.2.3"}
    done = run_helm(*operator_command("aks", parts, None))
    assert ours == done.stdout and "tolerations" not in ours


def test_every_target_has_a_values_file_and_nothing_else() -> None:
    files = {p.stem for p in (ROOT / "charts/hv-device-plugin/targets").glob("*.yaml")}
    assert files == set(TARGETS)
