"""The plugin and guest images into every node's containerd, with no registry.

`python -m hvconform.targets.realnode.node_images`: the images of `nox -s image` (built, or
found by their content key, in the private Docker engine) are saved as archives and imported into
the k8s.io namespace of each running cluster-mode node (`ctr images import`), so pods that name
them with `imagePullPolicy: Never` or `IfNotPresent` start without any pull. Prints the tags
(the `--image`/`--guest-image` of the cluster run) and writes them, the nodes and the cluster's
admin kubeconfig as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hv_device_plugin.api.names import default_guest_image, default_plugin_image
from hvconform.contract.plugin import ProfileError, resolve
from hvconform.targets.realnode import RUN
from hvconform.targets.realnode.nodes import ADMIN_KUBECONFIG, NodeLayout, recorded_nodes


def save(tags: list[str], work: Path) -> list[Path]:
    """Each tag as a `docker save` archive under work (streamed, never held in memory)."""
    from hvconform.targets.container.engine import DockerEngine

    work.mkdir(parents=True, exist_ok=True)
    archives = []
    with DockerEngine(what="node-images") as engine:
        client = engine.client(timeout=600)
        try:
            for tag in tags:
                path = work / (tag.replace("/", "_").replace(":", "_") + ".tar")
                with path.open("wb") as out:
                    for chunk in client.images.get(tag).save(named=tag):  # this tag exactly
                        out.write(chunk)
                archives.append(path)
        finally:
            client.close()
    return archives


def import_into(node: NodeLayout, archive: Path) -> None:
    argv = ["ctr", "--address", str(node.socket), "--namespace", "k8s.io", "images", "import",
            str(archive)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{node.name}: ctr images import {archive.name}: {proc.stderr.strip()}")


def build_images(base_image: str = "") -> dict[str, str]:
    """The plugin and guest tags of `nox -s image` (built only when their inputs changed)."""
    from hvconform.targets.container.engine import DockerEngine
    from hvconform.targets.container.images import ensure_images

    with DockerEngine(what="node-images") as engine:
        client = engine.client(timeout=1800)
        try:
            images = ensure_images(client, base_image=base_image)
            # Also under the documented builds' tags (`docker build -t hv-device-plugin:<version>`,
            # `-t hv-guest:<version>`): the shipped profile and --guest-image's default name them.
            for built, named in ((images.plugin, default_plugin_image()),
                                 (images.guest, default_guest_image())):  # fmt: skip
                repository, _, version = named.rpartition(":")
                client.images.get(built.tag).tag(repository, version)
        finally:
            client.close()
    return {
        "plugin": images.plugin.tag,
        "guest": images.guest.tag,
        "shipped": default_plugin_image(),
    }


def load(tags: list[str]) -> list[str]:
    """Import the tags into every running node; the node names."""
    nodes = recorded_nodes()
    if not nodes:
        raise RuntimeError("no cluster-mode node is up: nox -s node-up -- --nodes N")
    work = RUN / "images"
    try:
        for archive in save(tags, work):
            for node in nodes:
                import_into(node, archive)
    finally:
        for leftover in work.glob("*.tar"):
            leftover.unlink()
    return [n.name for n in nodes]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvconform.targets.realnode.node_images")
    parser.add_argument("--base-image", default="", help="as `nox -s image --base-image`")
    parser.add_argument("--json", type=Path, help="write the plugin and guest tags here")
    parser.add_argument(
        "--plugin-profile",
        default="",
        help="also import this profile's deploy.image (from the suite's Docker engine); "
        "default: the shipped profile, whose image is this repository's",
    )
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        plugin = resolve(args.plugin_profile)
        tags = build_images(args.base_image)
        if plugin.image:
            tags["profile"] = plugin.image
        names = load(sorted(set(tags.values())))
    except ProfileError as exc:
        print(f"node-images: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"node-images: {exc}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - t0
    print(f"node-images: {', '.join(tags.values())} in {', '.join(names)} ({seconds:.1f}s)")
    if args.json:
        facts = {**tags, "nodes": names, "kubeconfig": str(ADMIN_KUBECONFIG)}
        args.json.write_text(json.dumps({**facts, "seconds": round(seconds, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
