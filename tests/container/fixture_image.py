"""The go-kvm fixture plugin's image, built offline: `python -m tests.container.fixture_image`.

go-kvm is one static binary (CGO off), so its image is a root filesystem of its own holding just
that binary and the directories a container needs, imported into the harness's Docker engine as
this repository's base image is (`docker import`, no registry, no Dockerfile). The tag is the one
fixtures/plugins/go-kvm/profile.yaml names (deploy.image: read from there, defined once). The
tarball is made here with fixed owners, modes and mtimes, so its sha256 is the content key: the
image carries it as a label and is imported again only when the binary changed (the tag then
moves to the new image, the old one is removed when no container uses it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import docker

from hvconform.contract.plugin import load_profile
from hvconform.targets.container.images import CACHE_DIR, KEY_LABEL
from tests.fixture_plugins import GO_KVM_DIR, build_go_kvm

if TYPE_CHECKING:
    from hvconform.targets.container.engine import DockerEngine

PROFILE = GO_KVM_DIR / "profile.yaml"
BINARY_AT = "usr/local/bin/go-kvm"
# Mount points and the writable dirs a container expects; the plugin's own paths are bound.
DIRS = {"dev": 0o755, "proc": 0o555, "sys": 0o555, "etc": 0o755, "tmp": 0o1777,
        "usr": 0o755, "usr/local": 0o755, "usr/local/bin": 0o755}  # fmt: skip


@dataclass(frozen=True)
class FixtureImage:
    tag: str
    id: str
    key: str
    cached: bool


def image_ref() -> str:
    plugin = load_profile(PROFILE)
    if plugin.image is None:
        raise RuntimeError(f"{PROFILE} has no deploy.image")
    return plugin.image


def rootfs_tar(binary: Path) -> bytes:
    """The image's filesystem as a tarball, byte-identical for the same binary."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in sorted(DIRS.items()):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
            tar.addfile(info)
        data = binary.read_bytes()
        info = tarfile.TarInfo(BINARY_AT)
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ensure_go_kvm_image(client: docker.DockerClient) -> FixtureImage:
    """hv-fixture-go-kvm:<profile's tag> in the engine, built from the current binary."""
    ref = image_ref()
    tar = rootfs_tar(build_go_kvm())
    key = hashlib.sha256(tar).hexdigest()[:16]
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with (CACHE_DIR / ".fixture-image.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers may all ask at once
        old = None
        with contextlib.suppress(docker.errors.ImageNotFound):
            old = client.images.get(ref)
        if old is not None and old.labels.get(KEY_LABEL) == key:
            return FixtureImage(ref, str(old.id), key, True)
        repository, _, tag = ref.rpartition(":")
        changes = [f'ENTRYPOINT ["/{BINARY_AT}"]', f"LABEL {KEY_LABEL}={key}"]
        client.api.import_image_from_data(tar, repository=repository, tag=tag, changes=changes)
        new = client.images.get(ref)
        if old is not None and old.id != new.id:
            with contextlib.suppress(docker.errors.APIError):  # in use by a container: kept
                client.images.remove(str(old.id))
        return FixtureImage(ref, str(new.id), key, False)


def ensure_in_engine(engine: DockerEngine) -> FixtureImage:
    """ensure_go_kvm_image in the suite's engine (started by the caller)."""
    client = engine.client(timeout=300)
    try:
        return ensure_go_kvm_image(client)
    finally:
        client.close()


def ensure_in_suite_engine() -> FixtureImage:
    """ensure_go_kvm_image in the suite's engine, started and released here."""
    from hvconform.targets.container.engine import DockerEngine

    with DockerEngine(what="fixture image") as engine:
        return ensure_in_engine(engine)


def main() -> int:
    image = ensure_in_suite_engine()
    state = "cached" if image.cached else "imported"
    print(f"{image.tag} {image.id[:19]} (content {image.key}, {state})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
