"""Container images made from binaries, with no registry and no Dockerfile: one OCI image layout
(as a tar) holding several named images, for `ctr images import` into the node's containerd.

A layer is either bytes made here (a binary plus the few directories and files a static Go
program needs) or an existing tar file (the node's debootstrap root filesystem, for kube-proxy,
which runs iptables). Deterministic: the same inputs give the same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from hvconform.targets.realnode.image import FILES, _info, _tar

DIRS = ("etc", "tmp", "var", "var/run", "run", "usr", "usr/local", "usr/local/bin", "proc",
        "sys", "dev")  # fmt: skip
PATH_ENV = "PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True)
class Image:
    name: str  # what kubeadm asks for, e.g. registry.k8s.io/kube-apiserver:v1.37.2
    layers: tuple[bytes | Path, ...]
    entrypoint: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)


def binary_layer(binary: Path, at: str) -> bytes:
    """The directories a static program expects, /etc/passwd and group, the binary at `at`."""
    data = binary.read_bytes()
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for d in DIRS:
        entries.append((_info(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755), None))
    for name, text in FILES.items():
        entries.append((_info(name, tarfile.REGTYPE, 0o644, len(text)), text))
    entries.append((_info(at.lstrip("/"), tarfile.REGTYPE, 0o755, len(data)), data))
    return _tar(entries)


def _digest(layer: bytes | Path) -> tuple[str, int]:
    h = hashlib.sha256()
    if isinstance(layer, bytes):
        h.update(layer)
        return "sha256:" + h.hexdigest(), len(layer)
    with layer.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest(), layer.stat().st_size


def write_archive(images: list[Image], out: Path) -> None:
    """One OCI layout tar with every image, each named by io.containerd.image.name."""
    blobs: dict[str, bytes | Path] = {}
    manifests = []
    for image in images:
        layers = []
        for layer in image.layers:
            digest, size = _digest(layer)
            blobs[digest] = layer
            layers.append({"mediaType": LAYER_TYPE, "digest": digest, "size": size})
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": [PATH_ENV],
                **({"Entrypoint": list(image.entrypoint)} if image.entrypoint else {}),
                **({"Labels": image.labels} if image.labels else {}),
            },
            # uncompressed layers: the diff ID is the layer's own digest
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
        }
        config_bytes = json.dumps(config, sort_keys=True).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                **_blob(blobs, config_bytes),
            },
            "layers": layers,
        }
        manifests.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(blobs, json.dumps(manifest, sort_keys=True).encode()),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": image.name,
                    "org.opencontainers.image.ref.name": image.name.rsplit(":", 1)[1],
                },
            }
        )
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": manifests}  # fmt: skip
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for fname, data in (
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
        ):
            tar.addfile(_info(fname, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        for dname in ("blobs", "blobs/sha256"):
            tar.addfile(_info(dname, tarfile.DIRTYPE, 0o755))
        for digest, blob in sorted(blobs.items(), key=lambda kv: kv[0]):
            path = "blobs/sha256/" + digest.split(":", 1)[1]
            if isinstance(blob, bytes):
                tar.addfile(_info(path, tarfile.REGTYPE, 0o644, len(blob)), io.BytesIO(blob))
            else:
                with blob.open("rb") as f:
                    tar.addfile(_info(path, tarfile.REGTYPE, 0o644, blob.stat().st_size), f)


def _blob(blobs: dict[str, bytes | Path], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}
