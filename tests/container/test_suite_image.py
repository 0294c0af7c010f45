"""The suite's own image (hvconform.targets.kindnode.suite_image): hvconform with its pinned
helm, kind, kubectl and crictl, built offline; `--version` names the source commit and each tool.

The first tests need no engine: the Go build information the tools' versions are read from, the
build-info file `hvconform --version` prints, and the builder's refusal of a missing tool (one
line, exit 2, before any engine starts). The live tests build the image (cached by content, the
tag `hvconform:<version>-<key>` pruned as the plugin image's are) and run it with --network none;
they run in `nox -s suite-image` (HV_SUITE_IMAGE_LIVE=1), which builds it first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from hv_device_plugin.api.names import installed_version
from hvconform.contract import buildinfo
from hvconform.targets.kindnode import gobinary, suite_image
from hvconform.targets.kindnode.suite_image import ToolProblem, ToolSpec

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "fixtures" / "results" / "all-passed.json"
LIVE = os.environ.get("HV_SUITE_IMAGE_LIVE") == "1"


def go_binary(path: Path, package: str, modules: list[tuple[str, str, str]]) -> Path:
    """A file carrying Go 1.18+ build information as the linker lays it out (16-byte aligned
    header, inline varint-prefixed strings, 16-byte sentinels around the module info)."""

    def varint(n: int) -> bytes:
        out = b""
        while n >= 0x80:
            out += bytes([n & 0x7F | 0x80])
            n >>= 7
        return out + bytes([n])

    lines = [f"path\t{package}"] + [f"{kind}\t{mod}\t{ver}\th1:x=" for kind, mod, ver in modules]
    modinfo = (b"0" * 16) + ("\n".join(lines) + "\n").encode() + (b"1" * 16)
    go = b"go1.26.8"
    header = gobinary.MAGIC + bytes([8, gobinary.INLINE]) + bytes(16)
    body = header + varint(len(go)) + go + varint(len(modinfo)) + modinfo
    # a stray, unaligned copy of the magic first: data, not the header
    path.write_bytes(b"\x7fELF" + b"\0" * 3 + gobinary.MAGIC + b"\0" * (48 - 7 - 14) + body)
    return path


def test_build_information_names_the_module_of_the_main_package(tmp_path: Path) -> None:
    binary = go_binary(
        tmp_path / "kubectl",
        "k8s.io/kubernetes/cmd/kubectl",
        [("mod", "hv.local/build", "(devel)"), ("dep", "k8s.io/kubernetes", "v1.37.2"),
         ("dep", "k8s.io/kube", "v9.9.9")],
    )  # fmt: skip
    build = gobinary.read(binary)
    assert build.go == "go1.26.8"
    assert build.release() == ("k8s.io/kubernetes", "v1.37.2")
    (tmp_path / "text").write_text("#!/bin/sh\n")
    with pytest.raises(gobinary.NotGoBinary, match="not a Go binary"):
        gobinary.read(tmp_path / "text")


def test_a_tool_is_refused_unless_it_is_the_pinned_release(tmp_path: Path) -> None:
    binary = go_binary(
        tmp_path / "kind", "sigs.k8s.io/kind", [("mod", "sigs.k8s.io/kind", "v0.31.0")]
    )
    spec = ToolSpec("kind", binary, "sigs.k8s.io/kind", "v0.33.0", "`nox -s kind-image` builds it")
    with pytest.raises(ToolProblem, match=re.escape("is v0.31.0, not the pinned v0.33.0")):
        suite_image.inspect(spec)
    other = ToolSpec("kind", binary, "sigs.k8s.io/other", "", "")
    with pytest.raises(
        ToolProblem, match=re.escape("built from sigs.k8s.io/kind, not sigs.k8s.io/other")
    ):
        suite_image.inspect(other)
    assert suite_image.inspect(ToolSpec("kind", binary, "sigs.k8s.io/kind", "v0.31.0", "")) == (
        buildinfo.Tool("kind", "v0.31.0", "sigs.k8s.io/kind", "go1.26.8")
    )


def test_a_missing_tool_is_one_line_exit_2_naming_how_to_build_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-helm"
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.targets.kindnode.suite_image", "--helm", str(missing)],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip() == f"suite-image: helm missing ({missing}): `nox -s helm` builds it"


def test_the_wheel_sources_carry_its_data() -> None:
    sources = {str(p) for p in suite_image.wheel_sources()}
    assert {"setup.py", "pyproject.toml", "kind/cluster.yaml", "charts/hv-device-plugin/Chart.yaml",
            "conformance/profiles/hv-device-plugin.yaml", "conformance/cli.py"} <= sources  # fmt: skip
    assert not any("__pycache__" in s or s.startswith("conformance/_data") for s in sources)
    reqs = suite_image.suite_requirements()
    assert {"pyyaml>=6.0", "kubernetes>=37", "jinja2>=3.1"} <= set(reqs)  # the conformance extra
    assert reqs[0] == "pip"


def hvconform(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvconform.cli", *args],
        capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **env},
    )  # fmt: skip


def test_version_prints_the_build_information_when_present(tmp_path: Path) -> None:
    info = buildinfo.BuildInfo(
        "0123456789abcdef0123456789abcdef01234567",
        (buildinfo.Tool("helm", "v4.3.2", "helm.sh/helm/v4", "go1.26.8"),
         buildinfo.Tool("kubectl", "v1.37.2", "k8s.io/kubernetes", "go1.26.8")),
    )  # fmt: skip
    path = tmp_path / "build-info.json"
    path.write_text(info.to_json())
    proc = hvconform("--version", env={buildinfo.ENV: str(path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"hvconform {installed_version()} (commit {info.commit})",
        "  helm     v4.3.2   (helm.sh/helm/v4, go1.26.8)",
        "  kubectl  v1.37.2  (k8s.io/kubernetes, go1.26.8)",
    ]
    path.write_text('{"schema": 1}')
    broken = hvconform("--version", env={buildinfo.ENV: str(path)})
    assert broken.returncode == 2 and broken.stdout == ""
    assert (
        broken.stderr.strip()
        == f"hvconform: {buildinfo.ENV}={path}: not build information: 'tools'"
    )


def test_version_outside_an_image_is_the_package_and_its_commit() -> None:
    env = {k: v for k, v in os.environ.items() if k != buildinfo.ENV}
    proc = subprocess.run([sys.executable, "-m", "hvconform.cli", "--version"],
                          capture_output=True, text=True, timeout=60, check=False, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1
    assert proc.stdout.startswith(f"hvconform {installed_version()} (commit ")


# -- live: the image itself ---------------------------------------------------------------


@pytest.fixture(scope="module")
def built(client: docker.DockerClient) -> tuple[str, buildinfo.BuildInfo, float]:
    if not LIVE:
        pytest.skip(
            "the suite image is built and run in `nox -s suite-image` (HV_SUITE_IMAGE_LIVE=1)"
        )
    from hvconform.manifests.chart import helm_binary

    image, info = suite_image.ensure_suite_image(client, helm=Path(helm_binary()))
    return image.id, info, image.seconds


def run(client: docker.DockerClient, image: str, args: list[str], **kw: object) -> str:
    out = client.containers.run(
        image, args, network_mode="none", read_only=True, cap_drop=["ALL"], remove=True,
        stdout=True, stderr=True, **kw,
    )  # fmt: skip
    return bytes(out).decode()


@pytest.mark.root
@pytest.mark.slow
def test_image_version_names_the_commit_and_every_pinned_tool(
    client: docker.DockerClient, built: tuple[str, buildinfo.BuildInfo, float]
) -> None:
    image, info, _ = built
    lines = run(client, image, ["--version"]).splitlines()
    assert lines[0] == f"hvconform {installed_version()} (commit {info.commit})"
    assert lines[1:] == info.lines()
    assert [t.name for t in info.tools] == ["helm", "kind", "kubectl", "crictl"]
    from hvconform.targets.cluster.kindbin import KIND_VERSION
    from hvconform.targets.realnode import CRICTL_VERSION, KUBERNETES_VERSION

    versions = {t.name: t.version for t in info.tools}
    assert versions["kind"] == KIND_VERSION and versions["kubectl"] == KUBERNETES_VERSION
    assert versions["crictl"] == CRICTL_VERSION and versions["helm"].startswith("v4.")
    # The tools run in the image, and are the binaries named.
    assert run(client, image, ["version"], entrypoint="kind").startswith(f"kind {KIND_VERSION} ")
    client_version = run(client, image, ["version", "--client"], entrypoint="kubectl")
    assert f"Client Version: {KUBERNETES_VERSION}" in client_version
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert info.commit.removesuffix("-dirty") == head


@pytest.mark.root
@pytest.mark.slow
def test_image_renders_and_compares_reports_offline(
    client: docker.DockerClient, built: tuple[str, buildinfo.BuildInfo, float], tmp_path: Path
) -> None:
    image, _, _ = built
    assert "GITHUB_STEP_SUMMARY" in run(client, image, ["report", "--help"])
    assert "usage: hvconform compare" in run(client, image, ["compare", "--help"])
    work = tmp_path / "run"
    work.mkdir()
    shutil.copyfile(RESULTS, work / "results.json")
    if (RESULTS.parent / "evidence").is_dir():
        shutil.copytree(RESULTS.parent / "evidence", work / "evidence")
    work.chmod(0o777)
    run(client, image, ["report", "/data/results.json"], volumes={str(work): {"bind": "/data", "mode": "rw"}},
        user=f"{os.getuid()}:{os.getgid()}")  # fmt: skip
    report = (work / "report.md").read_text()
    assert report.strip() and "passed" in report
    assert json.loads((work / "results.json").read_text()) == json.loads(RESULTS.read_text())


@pytest.mark.root
@pytest.mark.slow
def test_image_has_no_pip_wheelhouse_or_build_tools(
    client: docker.DockerClient, built: tuple[str, buildinfo.BuildInfo, float]
) -> None:
    image, _, _ = built
    script = "ls /wheelhouse /wheels 2>/dev/null; python3 -m pip --version 2>/dev/null; ls /usr/local/bin"
    out = run(client, image, ["-c", script], entrypoint="sh")
    assert out.split() == ["crictl", "helm", "kind", "kubectl"]
    config = client.images.get(image).attrs["Config"]
    assert config["Entrypoint"] == ["hvconform"]
    assert f"{buildinfo.ENV}={buildinfo.FILE}" in config["Env"]
