"""The Docker engine kind runs under on this machine, and a wrapper that runs a command with it.

kind needs a bridge network (it creates one named "kind") and a published API server port; the
suite's own engine (hvconform.targets.container.engine) has neither, on purpose. So kind gets
an engine of its own roots (ENGINE_DATA_ROOT, ENGINE_EXEC_ROOT) with bridge networks and the
userland proxy, still with no iptables rules, NAT or default bridge. Never the host's
/var/run/docker.sock: the engine is this project's, started on demand and stopped by its last
user, like the suite's engine.

    python -m hvconform.targets.kindnode.engine [--image TAG ...] -- COMMAND ...

runs COMMAND with DOCKER_HOST set to the kind engine and the cache's kind on PATH when none is
there; each --image is copied from the suite's engine first when the kind engine lacks it (the
plugin and guest images `nox -s image` builds). The exit code is COMMAND's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

import docker

from hvconform.contract import settings
from hvconform.targets.cluster.kindbin import kind_env, kind_version
from hvconform.targets.container.engine import DockerEngine
from hvconform.targets.kindnode import ENGINE_DATA_ROOT, ENGINE_EXEC_ROOT, NODE_IMAGE
from hvconform.targets.realnode import REPO
from hvconform.targets.realnode.node_images import build_images

RUNTIME = "runc-bounded"


def kind_engine(what: str) -> DockerEngine:
    return DockerEngine(
        what=what,
        data_root=ENGINE_DATA_ROOT,
        exec_root=ENGINE_EXEC_ROOT,
        bridge=True,
        external=settings.current().kind_docker_host,
        # kind's nodes are privileged: runc-bounded drops the capabilities this machine's
        # bounding set lacks (CAP_SYS_RESOURCE), which runc could not grant anyway.
        dockerd_args=(
            "--add-runtime",
            f"{RUNTIME}={REPO / 'scripts' / 'runc-bounded'}",
            "--default-runtime",
            RUNTIME,
        ),
    )


def copy_image(tag: str, source: DockerEngine, target: DockerEngine) -> str:
    """`docker save | docker load` between the engines; returns what happened. A tag already in
    the target is kept only when it is the same image (same ID) as the source's: a mutable tag
    such as the shipped profile's `hv-device-plugin:<version>` is re-tagged on every build, and
    a stale copy would run an older plugin under the profile's name."""
    dst = target.client(timeout=600)
    src = source.client(timeout=600)
    try:
        try:
            image = src.images.get(tag)
        except docker.errors.ImageNotFound:
            image = None
        try:
            present = dst.images.get(tag)
        except docker.errors.ImageNotFound:
            present = None
        if image is None:
            if present is not None:
                return "present (not in the suite's engine)"
            raise RuntimeError(f"{tag} is in neither engine: run `nox -s image`")
        if present is not None and present.id == image.id:
            return "present"
        t0 = time.monotonic()
        dst.images.load(b"".join(image.save(named=tag)))  # this tag: an image may carry several
        what = "replaced a different image" if present is not None else "copied"
        return f"{what} in {time.monotonic() - t0:.1f}s"
    finally:
        src.close()
        dst.close()


def inventory(engine: DockerEngine) -> dict[str, set[str]]:
    """What the engine holds that a run could leave behind."""
    client = engine.client(timeout=60)
    try:
        return {
            "containers": {str(c.name) for c in client.containers.list(all=True)},
            "networks": {str(n.name) for n in client.networks.list()},
            "volumes": {v.name for v in client.volumes.list()},
        }
    finally:
        client.close()


def leftovers(engine: DockerEngine, before: dict[str, set[str]]) -> dict[str, list[str]]:
    """What COMMAND added and left. kind never removes its "kind" network (it is shared by every
    kind cluster of an engine): in this engine of ours it goes once no container uses it."""
    after = inventory(engine)
    if "kind" in after["networks"] - before["networks"]:
        client = engine.client(timeout=60)
        try:
            network = client.networks.get("kind")
            if not network.attrs.get("Containers"):
                network.remove()
                after["networks"].discard("kind")
        finally:
            client.close()
    return {kind: sorted(after[kind] - before[kind]) for kind in after}


def device_metadata(path: str = "/dev/kvm") -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"unavailable ({exc.strerror})"
    return f"{st.st_mode & 0o7777:o} {st.st_uid}:{st.st_gid} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def environment(host: str) -> dict[str, str]:
    return dict(kind_env() or os.environ, DOCKER_HOST=host)


def has_image(engine: DockerEngine, tag: str) -> bool:
    client = engine.client(timeout=60)
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    finally:
        client.close()
    return True


def log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kind-engine", description=__doc__.splitlines()[0])
    parser.add_argument("--image", action="append", default=[], help="copy into the engine")
    parser.add_argument(
        "--project-images",
        action="store_true",
        help="the plugin and guest images of `nox -s image` (built when stale): copied, the "
        "plugin also under the shipped profile's tag (hv-device-plugin:<version>), and the guest "
        "named to COMMAND as HV_GUEST_IMAGE. The plugin under test stays the profile's image: "
        "never named by this wrapper, so a third-party profile is never given ours",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("kind-engine: no command after --", file=sys.stderr)
        return 2
    engine = kind_engine("kind-engine " + command[0])
    host = engine.acquire()
    try:
        env = environment(host)
        if has_image(engine, NODE_IMAGE):  # built by `nox -s kind-image`: the run's default
            env["HV_KIND_NODE_IMAGE"] = NODE_IMAGE
        images = list(args.image)
        if args.project_images:
            tags = build_images()
            env.update(HV_GUEST_IMAGE=tags["guest"])
            images += [tags["plugin"], tags["guest"], tags["shipped"]]
        kind = shutil.which("kind", path=env["PATH"]) or "kind"
        log("kind-engine", host=host, started_here=engine.started_here, kind=kind,
            kind_version=kind_version(kind))  # fmt: skip
        if images:
            with DockerEngine(what="kind-engine image copy") as suite_engine:
                for tag in images:
                    log("image", tag=tag, result=copy_image(tag, suite_engine, engine))
        before, kvm_before = inventory(engine), device_metadata()
        rc = subprocess.run(command, env=env, check=False).returncode
        left, kvm_after = leftovers(engine, before), device_metadata()
        clean = not any(left.values()) and kvm_before == kvm_after
        log("kind-engine-after", rc=rc, left=left, kvm_before=kvm_before, kvm_after=kvm_after,
            clean=clean)  # fmt: skip
        if rc == 0 and not clean:
            print("kind-engine: the command left something behind (see kind-engine-after)",
                  file=sys.stderr)  # fmt: skip
            return 3
        return rc
    finally:
        engine.release()


if __name__ == "__main__":
    sys.exit(main())
