"""`hvconform manifests`: print the Kubernetes manifests for a target."""

from __future__ import annotations

import argparse
import os
import sys

from hvconform.manifests.policy import check_policy
from hvconform.manifests.render import (
    CDI_DIR,
    DEFAULT_NAMESPACE,
    DEFAULT_POOL_TAINT,
    KUBELET_ROOT,
    TARGETS,
    ManifestError,
    default_image,
    render_manifests,
    render_objects,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `manifests` subcommand; its `func` is `run`."""
    parser = sub.add_parser(
        "manifests",
        help="print the plugin's Kubernetes manifests for a target (multi-document YAML)",
        description="Print the namespace, the bootstrap device-access DaemonSet and the plugin "
        "DaemonSet for a target. Exit 2 on a refused parameter (such as an image tagged latest).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--target", choices=TARGETS, required=True, default=argparse.SUPPRESS, help="cluster kind"
    )
    parser.add_argument(
        "--image",
        default=os.environ.get("HV_IMAGE") or default_image(),
        help="plugin image, pinned by a version tag or a digest; never latest [HV_IMAGE]",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("HV_NAMESPACE", DEFAULT_NAMESPACE),
        help="namespace of both DaemonSets [HV_NAMESPACE]",
    )
    parser.add_argument(
        "--pool-taint",
        default=os.environ.get("HV_POOL_TAINT", DEFAULT_POOL_TAINT),
        help="taint key of the node pool to tolerate (any value, any effect); "
        "empty: no toleration [HV_POOL_TAINT]",
    )
    parser.add_argument(
        "--kubelet-root-dir",
        default=KUBELET_ROOT,
        help="host path of the nodes' kubelet state (microk8s snap: "
        "/var/snap/microk8s/common/var/lib/kubelet): the plugin registers in <root>/device-plugins",
    )
    parser.add_argument(
        "--cdi-dir", default=CDI_DIR, help="the CDI dir the nodes' container runtime reads"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="also check the rendered objects against the security policy; exit 1 on a violation",
    )
    parser.set_defaults(func=run)


def run(ns: argparse.Namespace) -> int:
    """Print the manifests; 2 for a refused parameter, 1 for a policy violation (--check)."""
    target: str = ns.target
    image: str = ns.image
    namespace: str = ns.namespace
    taint: str | None = ns.pool_taint or None
    dirs = {"kubelet_root": ns.kubelet_root_dir, "cdi_dir": ns.cdi_dir}
    try:
        text = render_manifests(target, image=image, namespace=namespace, pool_taint=taint, **dirs)
        violations = []
        if ns.check:
            objects = render_objects(
                target, image=image, namespace=namespace, pool_taint=taint, **dirs
            )
            violations = check_policy(objects)
    except ManifestError as exc:
        print(f"hvconform manifests: {exc}", file=sys.stderr)
        return 2
    for violation in violations:
        print(f"hvconform manifests: policy violation: {violation}", file=sys.stderr)
    if violations:
        return 1
    sys.stdout.write(text)
    return 0
