"""Unit tests of the real-node helpers that need no running node."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from hvconform.contract.podresources import devices as _devices
from hvconform.contract.podresources import fields
from hvconform.targets.realnode import KUBERNETES_VERSION, REPO, STAGING_VERSION
from hvconform.targets.realnode.build import render_build_module
from hvconform.targets.realnode.configs import (
    containerd_config,
    containerd_config_v3,
    kubelet_config,
)
from hvconform.targets.realnode.image import image_archive
from hvconform.targets.realnode.kubeapi import quantity
from hvconform.targets.realnode.pki import kubeconfig, make_pki

RELEASE_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require k8s.io/api v0.0.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
)
"""


def test_build_module_pins_every_staging_module_to_the_release() -> None:
    text = render_build_module(RELEASE_GO_MOD)
    assert f"require k8s.io/kubernetes {KUBERNETES_VERSION}" in text
    assert f"\tk8s.io/api => k8s.io/api {STAGING_VERSION}" in text
    assert f"\tk8s.io/kubelet => k8s.io/kubelet {STAGING_VERSION}" in text
    assert "=> ./staging" not in text


def test_committed_build_module_names_the_pinned_release() -> None:
    text = (REPO / "gobuild" / "build" / "go.mod").read_text()
    assert f"require k8s.io/kubernetes {KUBERNETES_VERSION}" in text
    pins = [ln for ln in text.splitlines() if "=>" in ln]
    assert len(pins) > 20 and all(ln.endswith(STAGING_VERSION) for ln in pins)


def test_image_archive_is_deterministic_and_well_formed() -> None:
    archive = image_archive(b"\x7fELF fake pause")
    assert archive == image_archive(b"\x7fELF fake pause")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest_digest = index["manifests"][0]["digest"]
        blob = tar.extractfile("blobs/sha256/" + manifest_digest.split(":")[1])
        manifest_bytes = blob.read()  # type: ignore[union-attr]
    assert "oci-layout" in names
    assert "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == manifest_digest
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"].endswith(":1")
    manifest = json.loads(manifest_bytes)
    assert len(manifest["layers"]) == 1


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _ld(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def test_podresources_reader_decodes_container_devices() -> None:
    dev = _ld(1, b"hyperlight.dev/hypervisor") + _ld(2, b"kvm-0") + _ld(2, b"kvm-1")
    msg = _ld(1, dev) + _varint(2 << 3) + _varint(300)  # plus a varint cpu id
    assert fields(msg)[1] == (2, 300)
    assert _devices(msg, 1) == {"hyperlight.dev/hypervisor": ["kvm-0", "kvm-1"]}


def test_configs_keep_the_node_to_itself() -> None:
    cd = containerd_config()
    assert "enable_cdi = true" in cd and 'cdi_spec_dirs = ["/run/hv-node/cdi"]' in cd
    assert "restrict_oom_score_adj = true" in cd
    kc = kubelet_config()
    for line in ("address: 127.0.0.1", "readOnlyPort: 0", "makeIPTablesUtilChains: false"):
        assert line in kc


def test_containerd_2_gets_config_version_3_with_cdi_under_the_runtime_plugin() -> None:
    """containerd 2.x reads CDI from its CRI runtime plugin (config version 3); the same node's
    paths as version 2's, and runc named by path (the runtime's own, not PATH's)."""
    v3 = tomllib.loads(containerd_config_v3(runc="/opt/rt/runc"))
    assert v3["version"] == 3
    runtime = v3["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["enable_cdi"] is True and runtime["cdi_spec_dirs"] == ["/run/hv-node/cdi"]
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert runc == {"SystemdCgroup": False, "BinaryName": "/opt/rt/runc"}
    images = v3["plugins"]["io.containerd.cri.v1.images"]
    v2 = tomllib.loads(containerd_config())
    assert (
        images["pinned_images"]["sandbox"]
        == v2["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"]
    )
    assert v3["grpc"] == v2["grpc"] and v3["root"] == v2["root"]


@pytest.mark.skipif(subprocess.run(["which", "openssl"]).returncode != 0, reason="no openssl")
def test_pki_signs_clients_with_their_groups(tmp_path: Path) -> None:
    make_pki(tmp_path)
    subject = subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "kubelet.crt"), "-noout", "-subject"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "system:nodes" in subject and "system:node:hv-node" in subject
    assert (tmp_path / "ca.key").stat().st_mode & 0o777 == 0o600
    cfg = kubeconfig(tmp_path, "admin", tmp_path / "admin.kubeconfig").read_text()
    assert "client-certificate:" in cfg and "https://127.0.0.1:" in cfg


def test_quantities_as_the_api_writes_them() -> None:
    assert [quantity(q) for q in ("0", "2", "2k", "1Ki", "3M")] == [0, 2, 2000, 1024, 3_000_000]
