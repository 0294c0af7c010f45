"""The node's only container image, made offline: no registry is ever contacted.

An OCI image layout tar holding one layer: the locally built static `pause` binary (gobuild/pause),
empty mount points and the merged-/usr symlinks (bin, lib, lib64, sbin -> usr/...). Pod sandboxes
run /pause; workload containers run the host's /usr/bin/python3 from a read-only hostPath of
/usr, with the repository mounted read-only for the stdlib-only guest (hvconform.guest).
Deterministic: the same pause binary gives the same digest. Imported with `ctr images import`
into containerd's k8s.io namespace under PAUSE_IMAGE.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

from hvconform.targets.realnode import BIN, CONTAINERD_SOCKET, PAUSE_IMAGE

DIRS = ("usr", "tmp", "etc", "proc", "sys", "dev", "run", "repo", "state")
LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
FILES = {
    "etc/passwd": b"root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n",
    "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
}


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime = info.uid = info.gid = 0
    return info


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def layer(pause: bytes) -> bytes:
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for d in DIRS:
        entries.append((_info(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755), None))
    for name, target in LINKS.items():
        entries.append((_info(name, tarfile.SYMTYPE, 0o777, link=target), None))
    for name, data in FILES.items():
        entries.append((_info(name, tarfile.REGTYPE, 0o644, len(data)), data))
    entries.append((_info("pause", tarfile.REGTYPE, 0o755, len(pause)), pause))
    return _tar(entries)


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def image_archive(pause: bytes, name: str = PAUSE_IMAGE) -> bytes:
    """The pause image as an OCI image layout, as a tar, for `ctr images import`."""
    config = {"Entrypoint": ["/pause"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
    return oci_layout(layer(pause), config, name)


def oci_layout(layer_bytes: bytes, image_config: Mapping[str, object], name: str) -> bytes:
    """One single-layer image (`image_config`: its Entrypoint, Cmd, Env...) as an OCI image
    layout tar named `name`, deterministic, for `ctr images import`."""
    blobs: dict[str, bytes] = {}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": dict(image_config),
        # an uncompressed layer: its diff ID is its own digest
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()],
        },
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(blobs, json.dumps(config, sort_keys=True).encode()),
        },
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer_bytes)}
        ],
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(blobs, json.dumps(manifest, sort_keys=True).encode()),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    meta = {
        "oci-layout": b'{"imageLayoutVersion":"1.0.0"}',
        "index.json": json.dumps(index).encode(),
    }
    for fname, data in meta.items():
        entries.append((_info(fname, tarfile.REGTYPE, 0o644, len(data)), data))
    for dname in ("blobs", "blobs/sha256"):
        entries.append((_info(dname, tarfile.DIRTYPE, 0o755), None))
    for digest, data in sorted(blobs.items()):
        path = "blobs/sha256/" + digest.split(":", 1)[1]
        entries.append((_info(path, tarfile.REGTYPE, 0o644, len(data)), data))
    return _tar(entries)


def import_image(work: Path, socket: Path = CONTAINERD_SOCKET) -> str:
    """Write the archive and import it into containerd (k8s.io namespace); returns its name."""
    archive = work / "hv-node-image.tar"
    archive.write_bytes(image_archive((BIN / "pause").read_bytes()))
    proc = subprocess.run(
        [
            "ctr",
            "--address",
            str(socket),
            "--namespace",
            "k8s.io",
            "images",
            "import",
            str(archive),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ctr images import failed: {(proc.stdout + proc.stderr).strip()}")
    return PAUSE_IMAGE
