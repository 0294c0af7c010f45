"""`nox -s kind-image`: the offline kind node image NODE_IMAGE, in the kind engine.

1. Binaries (build.py): the node target's, plus kind, kubeadm, kubectl, kube-proxy, etcd and
   CoreDNS; each cached by its version stamp.
2. The images kubeadm asks for (`kubeadm config images list`), each made from its binary
   (oci.py): kube-apiserver, kube-controller-manager, kube-scheduler, etcd and CoreDNS on a
   one-binary layer, kube-proxy on the node's own base (it runs iptables), pause from the node
   target's pause. A name whose version is not what this module builds is refused.
3. The root filesystem (rootfs.py): debootstrap bookworm + ROOTFS_PACKAGES (cached tarball,
   images/build-base.sh), containerd from trixie, the binaries, kind/node/, the images
   preloaded; `docker import`, then kind/node/Dockerfile (no network) adds the entrypoint.
The image is labelled with a key of every pin and recipe file: with the same key it is reused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import docker

from hvconform.targets.container.images import BASE_SCRIPT, MIRROR, SUITE, base_key
from hvconform.targets.kindnode import (
    CACHE,
    CONTAINERD_DEB,
    KEY_LABEL,
    NODE_RUNTIMES,
    RECIPE,
    ROOTFS_PACKAGES,
    node_image,
    oci,
    rootfs,
)
from hvconform.targets.kindnode import build as kbuild
from hvconform.targets.kindnode.engine import kind_engine
from hvconform.targets.realnode import KUBERNETES_VERSION
from hvconform.targets.realnode import build as node_build
from hvconform.targets.realnode.image import layer as pause_layer
from hvconform.targets.realnode.runtimes import runtime as node_runtime

# kubeadm's image name (without registry and tag) -> (binary, where it goes, entrypoint)
BINARY_IMAGES = {
    "kube-apiserver": ("kube-apiserver", "/usr/local/bin/kube-apiserver", ()),
    "kube-controller-manager": ("kube-controller-manager",
                                "/usr/local/bin/kube-controller-manager", ()),
    "kube-scheduler": ("kube-scheduler", "/usr/local/bin/kube-scheduler", ()),
    "kube-proxy": ("kube-proxy", "/usr/local/bin/kube-proxy", ()),
    "etcd": ("etcd", "/usr/local/bin/etcd", ()),
    "coredns": ("coredns", "/coredns", ("/coredns",)),
}  # fmt: skip


def log(msg: str, **fields: object) -> None:
    print(json.dumps({"event": "kind-image", "msg": msg, **fields}), flush=True)


def kubeadm_images(kubeadm: Path) -> list[str]:
    out = subprocess.run(
        [str(kubeadm), "config", "images", "list", "--kubernetes-version", KUBERNETES_VERSION],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    return out.split()


def image_plan(names: list[str], bins: dict[str, kbuild.Built], base: Path) -> list[oci.Image]:
    """One Image per name kubeadm lists; refuses a version this module does not build."""
    images = []
    for name in names:
        repo, _, tag = name.rpartition(":")
        short = repo.rsplit("/", 1)[1]
        if short == "pause":
            pause = bins["pause"].path.read_bytes()
            images.append(oci.Image(name, (pause_layer(pause),), ("/pause",)))
            continue
        if short not in BINARY_IMAGES:
            raise RuntimeError(f"kubeadm asks for {name}: no recipe for it")
        binary, at, entrypoint = BINARY_IMAGES[short]
        built = bins[binary]
        want = built.version.lstrip("v")
        if tag.lstrip("v").split("-")[0] != want:
            raise RuntimeError(f"kubeadm asks for {name}, this build makes {short} {want}")
        layers: tuple[bytes | Path, ...] = (oci.binary_layer(built.path, at),)
        if short == "kube-proxy":
            layers = (base, *layers)
        images.append(oci.Image(name, layers, entrypoint))
    return images


def node_key(rootfs_key: str, bins: dict[str, kbuild.Built], runtime: dict[str, str]) -> str:
    h = hashlib.sha256()
    pins = {
        "rootfs": rootfs_key,
        "containerd": CONTAINERD_DEB,
        "binaries": {n: b.version for n, b in sorted(bins.items())},
        "runtime": runtime,  # {} for the package's containerd 1.7
    }
    h.update(json.dumps(pins, sort_keys=True).encode())
    for f in sorted(RECIPE.iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    for module in ("image.py", "rootfs.py", "oci.py"):
        h.update((Path(__file__).parent / module).read_bytes())
    return h.hexdigest()[:16]


def base_tarball() -> tuple[str, Path]:
    key = base_key(SUITE, MIRROR, ROOTFS_PACKAGES)
    tarball = CACHE / "rootfs" / f"{SUITE}-{key}.tar"
    if not tarball.exists():
        tarball.parent.mkdir(parents=True, exist_ok=True)
        log("rootfs: debootstrap (cold cache)", packages=",".join(ROOTFS_PACKAGES))
        argv = [str(BASE_SCRIPT), str(tarball), SUITE, MIRROR, ",".join(ROOTFS_PACKAGES)]
        subprocess.run([*argv, str(CACHE / "debs")], check=True)
    return key, tarball


def runtime_programs(runtime: str) -> tuple[Path | None, dict[str, str]]:
    """The directory of the runtime's containerd, shim and runc (None: the package's 1.7) and
    their versions, built from their modules as the node target's (cached when built)."""
    if runtime in ("", NODE_RUNTIMES[0]):
        return None, {}
    found = node_runtime(runtime)
    built = [node_build.build_one(name) for name in node_build.RUNTIME_COMPONENTS]
    return found.bin_dir, {b.name: b.version for b in built}


def build_image(
    client: docker.DockerClient, *, runtime: str = "", force: bool = False
) -> tuple[str, bool]:
    """The node image of `runtime` in the engine of `client`; returns (its key, whether it was
    reused)."""
    t0 = time.monotonic()
    tag = node_image(runtime)
    bins = kbuild.build_all(lambda m: log(m))
    runtime_dir, runtime_pins = runtime_programs(runtime)
    rootfs_key, base = base_tarball()
    key = node_key(rootfs_key, bins, runtime_pins)
    try:
        if not force and client.images.get(tag).labels.get(KEY_LABEL) == key:
            log("node image cached", image=tag, key=key)
            return key, True
    except docker.errors.ImageNotFound:
        pass
    names = kubeadm_images(bins["kubeadm"].path)
    images = image_plan(names, bins, base)
    pause = next(n for n in names if n.rpartition(":")[0].endswith("/pause"))
    deb = rootfs.containerd_deb(lambda m: log(m))
    archive = CACHE / "stage" / f"images-{key}.tar"
    node_tar = CACHE / "stage" / f"node-{key}.tar"
    try:
        with rootfs.staging() as root:
            paths = {n: b.path for n, b in bins.items()}
            rootfs.assemble(root, base, deb, paths, pause, runtime_dir)
            oci.write_archive(images, archive)
            loaded = rootfs.preload(root, archive, lambda m: log(m))
            missing = sorted(set(names) - set(loaded))
            if missing:
                raise RuntimeError(f"preloaded images missing after import: {missing}")
            log("preloaded", images=loaded)
            rootfs.pack(root, node_tar)
        repo = tag.rpartition(":")[0] + "-rootfs"
        client.api.import_image_from_file(str(node_tar), repository=repo, tag=key)
        client.images.build(
            path=str(RECIPE), dockerfile="Dockerfile", tag=tag, rm=True,
            network_mode="none", buildargs={"ROOTFS": f"{repo}:{key}"}, labels={KEY_LABEL: key},
        )  # fmt: skip
        client.images.remove(f"{repo}:{key}", noprune=True)  # the node image keeps its layer
    finally:
        archive.unlink(missing_ok=True)
        node_tar.unlink(missing_ok=True)
    _prune(client)
    log("node image built", image=tag, key=key, seconds=round(time.monotonic() - t0, 1))
    return key, False


def _prune(client: docker.DockerClient) -> None:
    """Earlier node images (same label, no tag left) go, unless a container still uses one."""
    for image in client.images.list(filters={"label": KEY_LABEL}):
        if image.id and not image.tags:
            try:
                client.images.remove(image.id)
            except docker.errors.APIError as exc:
                log("earlier node image kept", id=image.short_id, reason=str(exc)[:200])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kind-image", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even with the same key")
    parser.add_argument(
        "--runtime",
        choices=NODE_RUNTIMES,
        default=NODE_RUNTIMES[0],
        help="the node's container runtime: trixie's containerd 1.7 (the default image), or "
        "containerd 2.x and runc built from their modules (`node-build -- containerd2 runc`), "
        "tagged with containerd's version",
    )
    args = parser.parse_args(argv)
    tag = node_image(args.runtime)
    t0 = time.monotonic()
    engine = kind_engine("kind-image")
    engine.acquire()
    try:
        client = engine.client(timeout=1800)
        try:
            key, cached = build_image(client, runtime=args.runtime, force=args.force)
            image = client.images.get(tag)
        finally:
            client.close()
    except (RuntimeError, subprocess.CalledProcessError, docker.errors.DockerException) as exc:
        print(f"kind-image: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.release()
    size = image.attrs.get("Size", 0) / 1e6
    state = "reused" if cached else "built"
    print(f"kind-image: {tag} ({state}, key {key}, {size:.0f} MB) in "
          f"{time.monotonic() - t0:.0f}s; engine {engine.host}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
