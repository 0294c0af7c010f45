"""`hvconform sonobuoy-plugin`: the Sonobuoy plugin definition that runs the suite on every node.

A DaemonSet-driver plugin (one pod per selected node) whose container is the suite's image
running `hvconform sonobuoy-node`; Sonobuoy adds its worker beside it, which sends the results
to the aggregator once the done file names them. This definition is the one manifest that
declares the pod's host access: privileged and hostPID, as the diagnostic pod the cluster
targets make (node commands enter PID 1's namespaces), and nothing else of the host: no hostPath,
no host network. Result format `manual` (hvconform-sonobuoy.yaml, one item per check, rolled up
per node by `sonobuoy results`); the run's results.json, report and junit.xml travel with it.

    hvconform sonobuoy-plugin --image hvconform:TAG --deployed kube-system/hv-device-plugin > p.yaml
    sonobuoy run --plugin p.yaml --sonobuoy-image IMG --image-pull-policy IfNotPresent --wait
    sonobuoy retrieve; hvconform fleet-report ./*_sonobuoy_*.tar.gz
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml

from hv_device_plugin.api.names import HYPERVISOR_RESOURCE
from hvconform.contract import imageref
from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.runcontext import MODES
from hvconform.sonobuoy.results import MANUAL_FILE

PLUGIN_NAME = "hvconform"
# The nodes the shipped KVM manifests select; a pool labelled otherwise passes its own.
DEFAULT_SELECTOR = f"{HYPERVISOR_RESOURCE}=kvm"


def definition(
    *,
    image: str,
    mode: str = "validate",
    deployed: str = "",
    plugin_profile: str = "",
    guest_image: str = "",
    plugin_image: str = "",
    node_selector: dict[str, str] | None = None,
    allow_disruption: bool = False,
) -> dict[str, Any]:
    """The plugin definition, validated: a bad input raises ValueError with its one line."""
    if problem := imageref.problem(image, pinned=True):
        raise ValueError(f"--image {problem}")
    for flag, ref in (("--guest-image", guest_image), ("--plugin-image", plugin_image)):
        if ref and (problem := imageref.problem(ref, pinned=True)):
            raise ValueError(f"{flag} {problem}")
    if mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}")
    # --deployed and its mode by the cluster target's own rules, which each node's run applies
    ClusterOptions(mode=mode, deployed=deployed).validate()
    args = ["sonobuoy-node", "--mode", mode]
    for flag, value in (("--deployed", deployed), ("--plugin-profile", plugin_profile),
                        ("--guest-image", guest_image), ("--image", plugin_image)):  # fmt: skip
        if value:
            args += [flag, value]
    if allow_disruption:
        args.append("--allow-disruption")
    selector = node_selector if node_selector is not None else dict([DEFAULT_SELECTOR.split("=")])
    return {
        "sonobuoy-config": {
            "driver": "DaemonSet",
            "plugin-name": PLUGIN_NAME,
            "result-format": "manual",
            "result-files": [MANUAL_FILE],
            "description": "hvconform: hypervisor device plugin conformance, on every node",
            "skipCleanup": False,
        },
        "podSpec": {
            "hostPID": True,  # node commands enter PID 1's namespaces (the node's own)
            "nodeSelector": selector,
            "tolerations": [{"operator": "Exists"}],  # cordoned and tainted pool nodes too
            "serviceAccountName": "sonobuoy-serviceaccount",
            "terminationGracePeriodSeconds": 30,
            # Sonobuoy adds the "results" emptyDir and its worker container itself
            "containers": [],
        },
        "spec": {
            "name": "plugin",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["hvconform"],
            "args": args,
            "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
            ],
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "results", "mountPath": "/tmp/sonobuoy/results"}],
        },
    }


def _selector(text: str) -> dict[str, str]:
    pairs = [p for p in text.split(",") if p]
    if not all("=" in p for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: want KEY=VALUE[,KEY=VALUE]")
    return dict(p.split("=", 1) for p in pairs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", required=True,
                        help="the suite's image (nox -s suite-image), present on every node")  # fmt: skip
    parser.add_argument("--mode", choices=MODES, default="validate",
                        help="validate (default): disturbs nothing, for serving pools; full: "
                        "the whole catalogue, only on cordoned nodes")  # fmt: skip
    parser.add_argument("--deployed", default="", metavar="NAMESPACE/DAEMONSET",
                        help="the plugin as it runs on the nodes (validate mode)")  # fmt: skip
    parser.add_argument("--plugin-profile", default="", metavar="FILE",
                        help="the profile's path inside the suite's image (default: shipped)")  # fmt: skip
    parser.add_argument("--guest-image", default="", help="the workload image of validate-guest")
    parser.add_argument("--plugin-image", default="",
                        help="the image the plugin under test must run (plugin-identity judges "
                        "every node's plugin pod by it; default: the profile's)")  # fmt: skip
    parser.add_argument("--node-selector", type=_selector, default=None, metavar="K=V[,K=V]",
                        help=f"the nodes to certify (default {DEFAULT_SELECTOR})")  # fmt: skip
    parser.add_argument("--allow-disruption", action="store_true",
                        help="full mode on nodes that are not cordoned")  # fmt: skip


def run(ns: argparse.Namespace) -> int:
    try:
        plugin = definition(
            image=ns.image, mode=ns.mode, deployed=ns.deployed, plugin_profile=ns.plugin_profile,
            guest_image=ns.guest_image, plugin_image=ns.plugin_image,
            node_selector=ns.node_selector,
            allow_disruption=ns.allow_disruption,
        )  # fmt: skip
    except ValueError as exc:
        print(f"hvconform sonobuoy-plugin: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(plugin, sort_keys=False))
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "sonobuoy-plugin",
        help="print the Sonobuoy plugin that runs the suite on every node (sonobuoy run --plugin)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
