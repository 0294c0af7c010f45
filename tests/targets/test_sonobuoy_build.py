"""Sonobuoy v0.57.5 from its published Go module, and its offline image for the cluster nodes.

The build module and the image need no node: the image is made here from a tiny static
stand-in program (built with Go, a few seconds), read back and run with the layer's own mode. The
real binary is built (cached under /var/cache/hv-node after the first time, so root) and asked
for its version; its build information and Sonobuoy's own Dockerfile, read from the module
cache, are the references the binary and the image config are held to.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from hvconform.targets.kindnode.gobinary import read as build_info
from hvconform.targets.realnode import REPO
from hvconform.targets.realnode import sonobuoy as sb

MODULE_DIR = REPO / "gobuild" / "sonobuoy"
STAND_IN = """package main

import (
\t"fmt"
\t"os"
)

func main() { fmt.Println("stand-in", os.Args[1:]) }
"""


def go_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", **extra}


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny static Go program in place of the 80 MB sonobuoy."""
    src = tmp_path_factory.mktemp("stand-in")
    (src / "go.mod").write_text("module hv.local/standin\n\ngo 1.26.0\n")
    (src / "main.go").write_text(STAND_IN)
    out = src / "standin"
    subprocess.run(
        ["go", "build", "-p", "1", "-trimpath", "-o", str(out), "."],
        cwd=src,
        env=go_env(),
        check=True,
        timeout=300,
    )
    return out


def read_image(archive: Path) -> dict[str, Any]:
    """The image's index, manifest, config and layer, each blob checked against its digest."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            assert member is not None, digest
            data = member.read()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
            return data

        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
        (entry,) = index["manifests"]
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        (layer,) = manifest["layers"]
        assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar"
        return {"index": index, "entry": entry, "config": config, "layer": blob(layer["digest"])}


def layer_files(layer: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    """Each entry of the layer: its header (type, mode, owner) and its bytes."""
    out = {}
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        for info in tar.getmembers():
            member = tar.extractfile(info) if info.isfile() else None
            out[info.name] = (info, member.read() if member is not None else b"")
    return out


def install(entry: tuple[tarfile.TarInfo, bytes], at: Path) -> Path:
    """A file of the layer written out with its own mode, to run it as the container would."""
    info, data = entry
    at.write_bytes(data)
    at.chmod(info.mode)
    return at


def test_the_build_module_pins_exactly_the_release() -> None:
    text = (MODULE_DIR / "go.mod").read_text()
    requires = re.findall(r"^require (\S+) (\S+)$", text, re.MULTILINE)
    assert requires == [("github.com/vmware-tanzu/sonobuoy", "v0.57.5")]
    assert requires == [(sb.SONOBUOY_MODULE, sb.SONOBUOY_VERSION)]
    assert "replace" not in text and "require (" not in text  # nothing else pinned by hand
    assert re.search(r"^module hv\.local/sonobuoybuild$", text, re.MULTILINE)
    # builds run in copies under /var/cache/hv-node/src: no go.sum, no binary in the repo
    assert sorted(p.name for p in MODULE_DIR.iterdir()) == ["go.mod", "tools.go"]
    tools = (MODULE_DIR / "tools.go").read_text()
    assert tools.startswith("//go:build tools\n")
    assert f'_ "{sb.SONOBUOY_MODULE}"' in tools
    assert "`sonobuoy/`" in (REPO / "gobuild" / "README.md").read_text()
    assert sb.SONOBUOY_IMAGE == "hv-node.local/sonobuoy:v0.57.5"
    assert f"buildinfo.Version={sb.SONOBUOY_VERSION}" in sb.ldflags()


def test_the_image_is_the_binary_at_sonobuoy_with_sonobuoys_config(
    stand_in: Path, tmp_path: Path
) -> None:
    archive = sb.image_archive(stand_in, tmp_path / "out" / "sonobuoy.tar")
    assert archive == tmp_path / "out" / "sonobuoy.tar"
    assert [p.name for p in archive.parent.iterdir()] == ["sonobuoy.tar"]  # no temporary left
    image = read_image(archive)
    annotations = image["entry"]["annotations"]
    assert annotations["io.containerd.image.name"] == "hv-node.local/sonobuoy:v0.57.5"
    assert annotations["org.opencontainers.image.ref.name"] == "v0.57.5"
    assert image["entry"]["platform"] == {"architecture": "amd64", "os": "linux"}
    config = image["config"]
    # Sonobuoy's Dockerfile: no ENTRYPOINT, its CMD, WORKDIR /; the base's nonroot user
    assert "Entrypoint" not in config["config"]
    assert config["config"]["Cmd"] == [
        "/sonobuoy", "aggregator", "--no-exit", "-v", "3", "--logtostderr"
    ]  # fmt: skip
    assert config["config"]["WorkingDir"] == "/"
    assert config["config"]["User"] == "65532"
    layer_digest = "sha256:" + hashlib.sha256(image["layer"]).hexdigest()
    assert config["rootfs"] == {"type": "layers", "diff_ids": [layer_digest]}
    # the same binary gives the same image
    again = sb.image_archive(stand_in, tmp_path / "again.tar")
    assert again.read_bytes() == archive.read_bytes()
    assert sb.digest_of(archive) == image["entry"]["digest"]

    files = layer_files(image["layer"])
    info, data = files["sonobuoy"]
    assert info.isfile() and info.mode == 0o755 and (info.uid, info.gid) == (0, 0)
    assert data == stand_in.read_bytes()
    tmp = files["tmp"][0]
    assert tmp.isdir() and tmp.mode == 0o1777
    assert files["etc/passwd"][1].startswith(b"root:x:0:0:")
    binary = install(files["sonobuoy"], tmp_path / "sonobuoy")
    # what Sonobuoy execs in its pods runs, with the layer's own mode
    said = subprocess.run(
        [str(binary), "splat", "/tmp/sonobuoy"], capture_output=True, text=True, timeout=30
    )
    assert said.returncode == 0 and said.stdout == "stand-in [splat /tmp/sonobuoy]\n", said


def test_bad_json_path_exits_2_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-dir" / "out.json"
    assert sb.main(["--json", str(missing), "--no-import"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-dir" in err
    assert not missing.parent.exists()


@pytest.mark.root  # the cache is /var/cache/hv-node, as node-build's
@pytest.mark.slow
@pytest.mark.timeout(1800)  # a cold build: minutes, one package at a time
def test_the_real_binary_is_v0_57_5_from_its_module(tmp_path: Path) -> None:
    binary = sb.build()
    assert binary == sb.BINARY
    built_at = binary.stat().st_mtime_ns
    # its own word, and the module the Go linker recorded (not just the stamped string)
    assert sb.version_of(binary) == "v0.57.5"
    info = build_info(binary)
    assert info.package == sb.SONOBUOY_MODULE
    assert info.release() == ("github.com/vmware-tanzu/sonobuoy", "v0.57.5")
    env = {**os.environ, "KUBECONFIG": os.devnull}
    full = subprocess.run(
        [str(binary), "version"], capture_output=True, text=True, timeout=60, env=env, check=True
    ).stdout
    assert "Sonobuoy Version: v0.57.5\n" in full
    assert f"GitSHA: {sb.SONOBUOY_COMMIT}\n" in full

    # the references, from the module cache: the tag's commit and Sonobuoy's own Dockerfile
    module = json.loads(
        subprocess.run(
            ["go", "mod", "download", "-json", f"{sb.SONOBUOY_MODULE}@{sb.SONOBUOY_VERSION}"],
            cwd=tmp_path,
            env=go_env(GOFLAGS="-mod=mod"),
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    )
    assert module["Origin"]["Hash"] == sb.SONOBUOY_COMMIT
    dockerfile = (Path(module["Dir"]) / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert tuple(json.loads(cmd)) == sb.CMD
    assert re.findall(r"^WORKDIR (\S+)$", dockerfile, re.MULTILINE) == [sb.WORKDIR]
    assert re.findall(r"^ADD BINARY (\S+)$", dockerfile, re.MULTILINE) == [sb.BINARY_AT]
    assert "ENTRYPOINT" not in dockerfile

    # cached: a second build compiles nothing and leaves the binary as it was
    again = sb.build_timed()
    assert again.cached and again.version == "v0.57.5"
    assert binary.stat().st_mtime_ns == built_at

    # the real image holds exactly that binary
    image = read_image(sb.image_archive(binary, tmp_path / "sonobuoy.tar"))
    in_image = install(layer_files(image["layer"])["sonobuoy"], tmp_path / "sonobuoy")
    assert in_image.read_bytes() == binary.read_bytes()
    assert sb.version_of(in_image) == "v0.57.5"
