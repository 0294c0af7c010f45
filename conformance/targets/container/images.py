"""Build the plugin and workload images with no container registry.

1. Base: a Debian root filesystem from debootstrap (minbase + python3, images/build-base.sh),
   cached as a tarball under the cache dir keyed by suite, mirror, packages and the script,
   then `docker import`ed as hv-base:<suite>-<key>. On public CI a registry base
   (`--base-image python:3.11-slim`, present locally) replaces it.
2. Builder: the base plus a wheelhouse of pip, the build backend and the dependencies
   (`pip wheel` on the host, where PyPI is reachable; keyed by pyproject.toml's requirements),
   images/build/Dockerfile, tagged hv-build:<key>.
3. plugin/Dockerfile (BUILD_IMAGE = the builder: its build stage makes the wheel from the
   sources, as on public CI) and images/guest/Dockerfile, built with `network_mode=none` from a
   context holding what the top-level .dockerignore lets through.
Tags carry a content key, never `latest`: an existing tag is reused as is (the warm path).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker

from hv_device_plugin.api.names import (
    GUEST_IMAGE_REPOSITORY,
    PLUGIN_IMAGE_REPOSITORY,
    installed_version,
)

REPO = Path(__file__).resolve().parents[3]
CACHE_DIR = Path(os.environ.get("HV_IMAGE_CACHE", "/var/cache/hv-images"))
SUITE = "bookworm"
MIRROR = os.environ.get("HV_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = ("python3",)
BASE_SCRIPT = REPO / "images" / "build-base.sh"
PLUGIN_DOCKERFILE = "plugin/Dockerfile"
GUEST_DOCKERFILE = "images/guest/Dockerfile"
BUILDER_DOCKERFILE = "images/build/Dockerfile"
KEY_LABEL = "dev.hyperlight.hv.build-key"
STAGE_LABEL = "dev.hyperlight.hv.stage"  # set on build stages, so their leftovers can be pruned
KEEP = 3  # image versions kept per repository: enough for concurrent runs of nearby commits
# The source of the wheel: what a fresh clone has (nothing generated or cached), as
# plugin/Dockerfile copies it.
SOURCE_DIRS = ("plugin", "conformance")
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE")

Log = Callable[[str], None]


@dataclass(frozen=True)
class BuiltImage:
    role: str
    tag: str
    id: str
    cached: bool
    seconds: float


@dataclass(frozen=True)
class ImageSet:
    base: BuiltImage
    plugin: BuiltImage
    guest: BuiltImage

    def to_json(self) -> dict[str, dict[str, str | bool | float]]:
        return {img.role: asdict(img) for img in (self.base, self.plugin, self.guest)}


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


@contextmanager
def _cache_lock(cache_dir: Path) -> Iterator[None]:
    """One builder at a time per cache (xdist workers may all ask for the images at once)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _existing(client: docker.DockerClient, tag: str) -> str | None:
    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None


# -- the base -----------------------------------------------------------------------------


def base_key(
    suite: str = SUITE, mirror: str = MIRROR, packages: Sequence[str] = BASE_PACKAGES
) -> str:
    """The cache key of the base: everything that changes its content."""
    spec = json.dumps({"suite": suite, "mirror": mirror, "packages": sorted(packages)})
    return _sha(BASE_SCRIPT.read_bytes(), spec.encode())


def build_base(client: docker.DockerClient, cache_dir: Path, log: Log) -> BuiltImage:
    """hv-base:<suite>-<key>: debootstrap's minbase + python3, imported into the engine."""
    t0 = time.monotonic()
    key = base_key()
    tag = f"hv-base:{SUITE}-{key}"
    if image_id := _existing(client, tag):
        return BuiltImage("base", tag, image_id, True, time.monotonic() - t0)
    tarball = cache_dir / "base" / f"{SUITE}-{key}.tar"
    cached = tarball.exists()
    if not cached:
        tarball.parent.mkdir(parents=True, exist_ok=True)
        log(f"base: debootstrap {SUITE} minbase + {','.join(BASE_PACKAGES)} (cold cache)")
        argv = [str(BASE_SCRIPT), str(tarball), SUITE, MIRROR, ",".join(BASE_PACKAGES)]
        subprocess.run([*argv, str(cache_dir / "debs")], check=True)
    log(f"base: docker import {tarball.name} as {tag}")
    changes = [
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"LABEL {KEY_LABEL}={key}",
        'CMD ["/bin/sh"]',
    ]
    repo, _, version = tag.partition(":")
    client.api.import_image_from_file(str(tarball), repository=repo, tag=version, changes=changes)
    image_id = _existing(client, tag)
    if image_id is None:
        raise RuntimeError(f"docker import did not produce {tag}")
    return BuiltImage("base", tag, image_id, cached, time.monotonic() - t0)


def registry_base(client: docker.DockerClient, ref: str) -> BuiltImage:
    """A base already in the engine (python:3.11-slim on public CI); never pulled here."""
    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise RuntimeError(f"base image {ref} is not in the engine (pull it first)") from None
    return BuiltImage("base", ref, str(image.id), True, 0.0)


# -- the wheelhouse -----------------------------------------------------------------------


def source_files(repo: Path = REPO) -> list[Path]:
    """The wheel's inputs, relative to repo, in a stable order."""
    files = [Path(f) for f in SOURCE_FILES if (repo / f).is_file()]
    for top in SOURCE_DIRS:
        for path in sorted((repo / top).rglob("*")):
            rel = path.relative_to(repo)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
                files.append(rel)
    return files


def requirements(repo: Path = REPO) -> list[str]:
    """What the image's build stage installs: pip, the build backend, the dependencies."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    return ["pip", *project["build-system"]["requires"], *project["project"]["dependencies"]]


def wheelhouse(
    cache_dir: Path, log: Log, repo: Path = REPO, reqs: Sequence[str] | None = None
) -> Path:
    """Wheels of pip, the build backend and the dependencies, built on the host once per set of
    requirements (the project's own wheel is made by the image's build stage); `reqs` instead of
    requirements(repo) for an image that needs more (the suite's: the conformance extra)."""
    reqs = list(reqs) if reqs is not None else requirements(repo)
    key = _sha(*(r.encode() for r in reqs))
    out = cache_dir / "wheelhouse" / key
    if (out / ".complete").exists():
        return out
    t0 = time.monotonic()
    log(f"wheelhouse: pip wheel (requirements key {key})")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        wheels = Path(tmp, "wheels")
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-cache-dir", *reqs,
             "-w", str(wheels)],
            check=True,
        )  # fmt: skip
        (wheels / ".complete").write_text(key + "\n")
        shutil.rmtree(out, ignore_errors=True)
        wheels.rename(out)
    _prune_dirs(out.parent, KEEP)
    log(f"wheelhouse: {len(list(out.glob('*.whl')))} wheels in {time.monotonic() - t0:.1f}s")
    return out


# -- the images ---------------------------------------------------------------------------


def _context(entries: dict[str, bytes]) -> io.BytesIO:
    """A build context tarball: fixed owner and mtime, so equal inputs give equal layers."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(entries):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(entries[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(entries[name]))
    buf.seek(0)
    return buf


def _build(
    client: docker.DockerClient,
    role: str,
    tag_prefix: str,
    dockerfile: str,
    files: dict[str, bytes],
    base: BuiltImage,
    log: Log,
    key_parts: dict[str, bytes] | None = None,
    buildargs: dict[str, str] | None = None,
) -> BuiltImage:
    t0 = time.monotonic()
    files = {dockerfile: (REPO / dockerfile).read_bytes(), **files}
    keyed = key_parts or files
    if key_parts is not None:
        keyed = {**key_parts, dockerfile: files[dockerfile]}
    args = {"BASE_IMAGE": base.tag, **(buildargs or {})}
    keyed = {**keyed, "buildargs": json.dumps(args, sort_keys=True).encode()}
    key = _sha(base.id.encode(), *(n.encode() + b"\0" + keyed[n] for n in sorted(keyed)))
    tag = f"{tag_prefix}{key}"
    if image_id := _existing(client, tag):
        return BuiltImage(role, tag, image_id, True, time.monotonic() - t0)
    log(f"{role}: docker build --network none -f {dockerfile} ({args})")
    image, _ = client.images.build(
        fileobj=_context(files), custom_context=True, dockerfile=dockerfile, tag=tag,
        buildargs=args, network_mode="none", labels={KEY_LABEL: key},
        rm=True, forcerm=True, pull=False,
    )  # fmt: skip
    return BuiltImage(role, tag, str(image.id), False, time.monotonic() - t0)


def build_builder(
    client: docker.DockerClient,
    base: BuiltImage,
    wheels: Path,
    log: Log,
    tag_prefix: str = "hv-build:",
) -> BuiltImage:
    """hv-build:<key>: the base, pip and the wheelhouse, pip pointed at it (no index)."""
    files = {f"wheels/{w.name}": w.read_bytes() for w in sorted(wheels.glob("*.whl"))}
    # Wheels are not byte-reproducible (zip timestamps): the key is the wheelhouse's own key,
    # i.e. the requirements, plus the wheel names (dependency versions).
    key_parts = {"wheelhouse": wheels.name.encode(), "wheels": "\n".join(sorted(files)).encode()}
    return _build(client, "builder", tag_prefix, BUILDER_DOCKERFILE, files, base, log, key_parts)


def build_plugin(
    client: docker.DockerClient, base: BuiltImage, builder: BuiltImage, log: Log
) -> BuiltImage:
    """hv-device-plugin:<version>-<key>: plugin/Dockerfile on the sources, as documented, with
    the builder as BUILD_IMAGE (the wheel is made in its build stage, offline)."""
    files = {str(rel): (REPO / rel).read_bytes() for rel in source_files()}
    prefix = f"{PLUGIN_IMAGE_REPOSITORY}:{installed_version()}-"
    return _build(client, "plugin", prefix, PLUGIN_DOCKERFILE, files, base, log,
                  buildargs={"BUILD_IMAGE": builder.tag})  # fmt: skip


def build_guest(client: docker.DockerClient, base: BuiltImage, log: Log) -> BuiltImage:
    """hv-guest:<key>: the hvconform.guest package (standard library only) on the base."""
    names = ["conformance/__init__.py"]
    names += [str(p.relative_to(REPO)) for p in sorted((REPO / "conformance/guest").glob("*.py"))]
    files = {name: (REPO / name).read_bytes() for name in names}
    return _build(client, "guest", f"{GUEST_IMAGE_REPOSITORY}:", GUEST_DOCKERFILE, files, base, log)


def export_rootfs(
    client: docker.DockerClient, image: BuiltImage, cache_dir: Path = CACHE_DIR
) -> Path:
    """The image's filesystem as a directory, for runtimes that take `--rootfs` (podman here:
    its image store would need a registry or a per-run `load`). Cached per image ID."""
    out = cache_dir / "rootfs" / image.id.split(":", 1)[-1][:16]
    if (out / ".hv-complete").exists():
        return out
    with _cache_lock(cache_dir):
        if (out / ".hv-complete").exists():
            return out
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        container = client.containers.create(image.id, labels={KEY_LABEL: "export"})
        try:
            tar = subprocess.Popen(
                ["tar", "-C", str(out), "-x", "--numeric-owner"], stdin=subprocess.PIPE
            )
            assert tar.stdin is not None
            for chunk in container.export():
                tar.stdin.write(chunk if isinstance(chunk, bytes) else chunk.encode())
            tar.stdin.close()
            if tar.wait() != 0:
                raise RuntimeError(f"tar -x of {image.tag} into {out} failed")
        finally:
            container.remove(force=True)
        (out / ".hv-complete").write_text(image.id + "\n")
        _prune_dirs(out.parent, KEEP)
    return out


def _prune_dirs(parent: Path, keep: int) -> None:
    """Keep the newest `keep` cache entries under parent (rootfs trees, wheelhouses)."""
    entries = sorted((d for d in parent.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for old in entries[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def image_config(client: docker.DockerClient, image: BuiltImage) -> dict[str, Any]:
    """Entrypoint, Cmd, Env, User and WorkingDir of an image (what `--rootfs` runs lack)."""
    config: dict[str, Any] = client.images.get(image.id).attrs["Config"]
    keys = ("Entrypoint", "Cmd", "Env", "User", "WorkingDir")
    return {k: config.get(k) for k in keys}


def _prune(client: docker.DockerClient, repo: str, keep: int) -> None:
    """Drop all but the newest `keep` tags of one repository, and dangling build stages."""
    images = [i for i in client.images.list(name=repo) if i.labels.get(KEY_LABEL)]
    images.sort(key=lambda i: str(i.attrs.get("Created", "")), reverse=True)
    for old in images[keep:]:
        for tag in old.tags:
            # In use by a container (another run): it goes next time.
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(tag, noprune=False)
    client.images.prune(filters={"dangling": True, "label": f"{STAGE_LABEL}=build"})


def ensure_images(
    client: docker.DockerClient,
    *,
    base_image: str = "",
    cache_dir: Path = CACHE_DIR,
    log: Log = lambda line: print(f"images: {line}", file=sys.stderr, flush=True),
) -> ImageSet:
    """The three images, built only when their inputs changed."""
    with _cache_lock(cache_dir):
        base = (
            registry_base(client, base_image) if base_image else build_base(client, cache_dir, log)
        )
        builder = build_builder(client, base, wheelhouse(cache_dir, log), log)
        plugin = build_plugin(client, base, builder, log)
        guest = build_guest(client, base, log)
        _prune(client, "hv-build", KEEP)
        _prune(client, PLUGIN_IMAGE_REPOSITORY, KEEP)
        _prune(client, GUEST_IMAGE_REPOSITORY, KEEP)
    return ImageSet(base, plugin, guest)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m hvconform.targets.container.images`: build (or find) the images; print tags,
    IDs and times."""
    from hvconform.targets.container.engine import DockerEngine

    parser = argparse.ArgumentParser(
        prog="python -m hvconform.targets.container.images", description=__doc__
    )
    parser.add_argument(
        "--base-image", default="", help="a local registry base instead of debootstrap"
    )
    parser.add_argument(
        "--cache-dir", type=Path, default=CACHE_DIR, help="base tarball, debs, wheels"
    )
    parser.add_argument("--json", type=Path, help="write the tags, IDs and timings here")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    with DockerEngine(what="images") as engine:
        client = engine.client(timeout=600)
        try:
            images = ensure_images(client, base_image=args.base_image, cache_dir=args.cache_dir)
        finally:
            client.close()
    total = time.monotonic() - t0
    for img in (images.base, images.plugin, images.guest):
        state = "cached" if img.cached else "built"
        print(f"{img.role:<7} {img.tag:<44} {img.id[:19]}  {state} in {img.seconds:.1f}s")
    built = [img.role for img in (images.base, images.plugin, images.guest) if not img.cached]
    state = f"built {', '.join(built)}" if built else "all cached"
    print(f"images ready in {total:.1f}s ({state}; cache {args.cache_dir})")
    if args.json:
        args.json.write_text(json.dumps({**images.to_json(), "seconds": round(total, 3)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
