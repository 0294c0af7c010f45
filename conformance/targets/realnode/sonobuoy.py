"""Sonobuoy from its published Go module, and its image made offline, for the cluster-mode nodes.

`python -m hvconform.targets.realnode.sonobuoy [--json FILE]`: builds SONOBUOY_VERSION through
the build module gobuild/sonobuoy (the proxy refuses `go install ...@v0.57.5`: its version list
is forbidden, the version itself is served), cached like node-build's components (BIN/sonobuoy,
its stamp in STAMPS; rebuilt when either is missing or names another version), packs it into an
OCI image archive with no registry and imports that into every running cluster-mode node's
containerd (`nox -s node-up -- --nodes N`). Prints and writes the binary and the image ref.

The image is what Sonobuoy's own Dockerfile makes on its base (distroless static:nonroot): one
static binary at /sonobuoy, WORKDIR /, no entrypoint, the aggregator as the default command,
user 65532. Its pods name /sonobuoy themselves (`aggregator`, `worker single-node`, and
`sonobuoy retrieve` execs `/sonobuoy splat`: no shell, no tar); it writes below /tmp/sonobuoy,
as uid 1000 in the aggregator, hence /tmp with mode 1777.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from hvconform.targets.realnode import BIN, CACHE
from hvconform.targets.realnode.build import STAMPS, Built, _go, _stamp, _workdir
from hvconform.targets.realnode.image import FILES, _info, _tar, oci_layout
from hvconform.targets.realnode.node_images import import_into
from hvconform.targets.realnode.nodes import NodeLayout, recorded_nodes

SONOBUOY_VERSION = "v0.57.5"
SONOBUOY_MODULE = "github.com/vmware-tanzu/sonobuoy"
# The tag's commit, as the proxy's .info for the version records it (Origin.Hash): stamped as
# buildinfo.GitSHA, as Sonobuoy's release build does.
SONOBUOY_COMMIT = "310c51d9874a4d10d021ec8a19f8b42292ec0bfc"
SONOBUOY_IMAGE = f"hv-node.local/sonobuoy:{SONOBUOY_VERSION}"
BUILD_MODULE = "sonobuoy"  # gobuild/sonobuoy
BINARY = BIN / "sonobuoy"
ARCHIVE = CACHE / "images" / f"sonobuoy-{SONOBUOY_VERSION}.tar"
# The image's config, as Sonobuoy's Dockerfile and its base image set it.
BINARY_AT = "/sonobuoy"
CMD = ("/sonobuoy", "aggregator", "--no-exit", "-v", "3", "--logtostderr")
WORKDIR = "/"
USER = "65532"  # distroless static:nonroot's user; the aggregator's pod runs as 1000
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the base's
# Mount points and /tmp (1777: the aggregator, uid 1000, writes /tmp/sonobuoy); /etc holds
# image.FILES (passwd and group), as the pause image's does.
DIRS = ("dev", "etc", "proc", "sys", "tmp")
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"


def ldflags() -> str:
    """The source's buildinfo.Version is stale (v0.57.4 in v0.57.5): stamped, as upstream does."""
    pkg = f"{SONOBUOY_MODULE}/pkg/buildinfo"
    return f"-s -w -X {pkg}.Version={SONOBUOY_VERSION} -X {pkg}.GitSHA={SONOBUOY_COMMIT}"


def version_of(binary: Path) -> str:
    """What the binary says it is (`sonobuoy version --short`), with no cluster consulted."""
    env = {**os.environ, "KUBECONFIG": os.devnull}
    proc = subprocess.run(
        [str(binary), "version", "--short"], capture_output=True, text=True, timeout=60, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} version --short failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def build_timed(*, force: bool = False) -> Built:
    """BINARY at SONOBUOY_VERSION, compiled only when missing or stamped with another version.

    Serialised on a lock in STAMPS (parallel test workers, a second session); the new binary
    must say SONOBUOY_VERSION before it replaces the old one.
    """
    STAMPS.mkdir(parents=True, exist_ok=True)
    with (STAMPS / ".sonobuoy.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        stamp = _stamp(BUILD_MODULE)
        if not force and BINARY.exists() and stamp.get("version") == SONOBUOY_VERSION:
            return Built("sonobuoy", SONOBUOY_VERSION, float(str(stamp.get("seconds"))), True)
        if shutil.which("go") is None:
            raise RuntimeError("building sonobuoy needs the Go toolchain: no `go` on PATH")
        BIN.mkdir(parents=True, exist_ok=True)
        log = CACHE / "logs" / "build-sonobuoy.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        tmp = BIN / ".sonobuoy.new"
        start = time.monotonic()
        cwd = _workdir(BUILD_MODULE)  # a copy under CACHE/src: go.sum stays out of the repo
        _go(["mod", "tidy"], cwd, log)
        args = ["build", "-p", "1", "-ldflags", ldflags(), "-o", str(tmp), SONOBUOY_MODULE]
        _go(args, cwd, log)
        seconds = round(time.monotonic() - start, 1)
        tmp.chmod(0o755)
        said = version_of(tmp)
        if said != SONOBUOY_VERSION:
            tmp.unlink()
            raise RuntimeError(f"the built sonobuoy says {said!r}, not {SONOBUOY_VERSION}")
        tmp.replace(BINARY)
        stamp = {"version": SONOBUOY_VERSION, "seconds": seconds}
        (STAMPS / f"{BUILD_MODULE}.json").write_text(json.dumps(stamp))
        return Built("sonobuoy", SONOBUOY_VERSION, seconds, cached=False)


def build(*, force: bool = False) -> Path:
    """The path of the built (or cached) sonobuoy binary."""
    build_timed(force=force)
    return BINARY


def layer(binary: bytes) -> bytes:
    """The image's one layer: DIRS, image.FILES and the binary at BINARY_AT."""
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for d in DIRS:
        entries.append((_info(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755), None))
    for name, text in FILES.items():
        entries.append((_info(name, tarfile.REGTYPE, 0o644, len(text)), text))
    at = BINARY_AT.lstrip("/")
    entries.append((_info(at, tarfile.REGTYPE, 0o755, len(binary)), binary))
    return _tar(entries)


def write_image(binary: Path, out: Path, name: str = SONOBUOY_IMAGE) -> None:
    """One OCI image layout tar (image.oci_layout, as the pause image's, with Sonobuoy's
    config). Deterministic; written beside `out` and renamed, so an import never reads half a
    file."""
    config = {"Env": [PATH_ENV], "Cmd": list(CMD), "WorkingDir": WORKDIR, "User": USER}
    data = oci_layout(layer(binary.read_bytes()), config, name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.new")
    tmp.write_bytes(data)
    tmp.replace(out)


def image_archive(binary: Path | None = None, out: Path = ARCHIVE) -> Path:
    """The image's archive at `out`, made from `binary` (default: the built sonobuoy)."""
    write_image(binary if binary is not None else build(), out)
    return out


def _images_on(node: NodeLayout) -> set[str]:
    argv = ["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "images", "ls", "-q"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{node.name}: ctr images ls: {proc.stderr.strip()}")
    return set(proc.stdout.split())


def import_into_nodes(archive: Path | None = None) -> list[str]:
    """Import the image into every running cluster-mode node's containerd (k8s.io namespace),
    then read it back from each; the nodes' names."""
    nodes = recorded_nodes()
    if not nodes:
        raise RuntimeError("no cluster-mode node is up: nox -s node-up -- --nodes N")
    path = archive if archive is not None else image_archive()
    for node in nodes:
        import_into(node, path)
        if SONOBUOY_IMAGE not in _images_on(node):
            raise RuntimeError(f"{node.name}: {SONOBUOY_IMAGE} not listed after its import")
    return [n.name for n in nodes]


def digest_of(archive: Path) -> str:
    """The image's manifest digest, from the archive's index (what the nodes list it under)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return str(index["manifests"][0]["digest"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvconform.targets.realnode.sonobuoy")
    parser.add_argument("--json", type=Path, help="write the binary, image and nodes here")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--no-import", action="store_true", help="build the archive only")
    args = parser.parse_args(argv)
    if args.json is not None and not args.json.parent.is_dir():
        print(f"sonobuoy: --json: no directory {args.json.parent}", file=sys.stderr)
        return 2
    if not args.no_import and not recorded_nodes():
        # checked before a build, as node_images fails it (1): a missing node, not a bad input
        print("sonobuoy: no cluster-mode node is up: nox -s node-up -- --nodes N", file=sys.stderr)
        return 1
    try:
        built = build_timed(force=args.force)
        archive = image_archive(BINARY)
        names = [] if args.no_import else import_into_nodes(archive)
    except RuntimeError as exc:
        print(f"sonobuoy: {exc}", file=sys.stderr)
        return 1
    origin = "cached, built in" if built.cached else "built in"
    print(f"sonobuoy: {SONOBUOY_VERSION} {origin} {built.seconds:.0f}s -> {BINARY}")
    print(f"sonobuoy: {SONOBUOY_IMAGE} ({digest_of(archive)}) in {', '.join(names) or 'no node'}")
    facts = {
        "binary": str(BINARY),
        "image": SONOBUOY_IMAGE,
        "version": SONOBUOY_VERSION,
        "archive": str(archive),
        "digest": digest_of(archive),
        "sha256": "sha256:" + hashlib.sha256(BINARY.read_bytes()).hexdigest(),
        "nodes": names,
        "build_seconds": built.seconds,
    }
    print(json.dumps({"binary": facts["binary"], "image": facts["image"]}))
    if args.json is not None:
        args.json.write_text(json.dumps(facts, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
