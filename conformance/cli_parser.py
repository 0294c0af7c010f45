"""hvconform's command line: every subcommand's options and help, in one place.

`run` is defined here with its runner passed in (hvconform.cli.cmd_run); each other subcommand
lives in its own module and adds itself (see `_subcommands`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from hv_device_plugin.api.names import default_guest_image
from hvconform import cli_inputs as inputs
from hvconform.contract.cluster_options import ClusterOptions
from hvconform.scenarios import CATALOGUE, CLEANUP
from hvconform.targets import RUNTIMES, TARGETS
from hvconform.targets.realnode.runtimes import RUNTIMES as NODE_RUNTIMES


class _RunHelp(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults shown, and the checks' list (the epilog) kept as written."""


def build_parser(cmd_run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """hvconform's parser; `cmd_run` runs `hvconform run` (hvconform.cli)."""
    # Each check with its marker, the APIs it judges and its requirement level (MUST: the
    # kubelet's contract; SHOULD: a practice, its failure shown apart in the report).
    checks = "\n".join(
        f"  {c.id:<33} -m {c.marker:<13} {'+'.join(c.apis):<17} {c.requirement_level or '-':<6} "
        f"{c.title}"
        for c in (*CATALOGUE, CLEANUP)
    )
    parser: argparse.ArgumentParser = inputs.OneLineParser(
        prog="hvconform",
        description="Conformance suite for Kubernetes hypervisor device plugins (v1beta1) and "
        "DRA drivers: each check judges the API it names (deviceplugin, dra or both).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"checks:\n{checks}\n\nexamples:\n  hvconform run\n  hvconform run -m cdi -n 2\n"
        "  hvconform run --plugin-cmd 'python -m my_plugin --flag'\n"
        "  hvconform run --target node --plugin-profile conformance/profiles/hv-dra-driver.yaml\n",
    )
    parser.add_argument("--version", action=inputs.VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for register in _subcommands():
        register(sub)
    run = sub.add_parser(
        "run",
        help="run the suite; exit 1 when any check failed",
        formatter_class=_RunHelp,
        epilog=f"checks (id, marker, API, level, title):\n{checks}\n",
    )
    run.add_argument(
        "--target",
        choices=tuple(TARGETS),
        default="local",
        help="; ".join(f"{name}: {t.about}" for name, t in TARGETS.items()),
    )
    run.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default=RUNTIMES[0],
        help="local target: plugin and workloads as sandboxed processes, or as "
        "containers (the plugin image under Docker, workloads under podman via CDI)",
    )
    run.add_argument(
        "--docker-host",
        default=os.environ.get("HV_DOCKER_HOST", ""),
        type=inputs.docker_host_arg,
        metavar="URL",
        help="--runtime container: the Docker engine that runs the plugin container (unix://, "
        "tcp:// or ssh://, and it must answer); default: a private dockerd the harness starts "
        "with roots of its own [HV_DOCKER_HOST]",
    )
    run.add_argument(
        "--node-runtime",
        choices=list(NODE_RUNTIMES),
        default="",
        help="--target node: the container runtime its node runs: "
        + "; ".join(f"{name}: {rt.about}" for name, rt in NODE_RUNTIMES.items())
        + " (default: containerd-1.7)",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="kind/aks: print the complete plan and exit; executes nothing",
    )
    run.add_argument(
        "--image",
        default=os.environ.get("HV_IMAGE", ""),
        type=inputs.image_arg(pinned=True, env="HV_IMAGE"),
        help="container runtime, kind, aks, cluster: override the profile's deploy.image "
        "(a fixed tag, never :latest, or a digest) [HV_IMAGE]",
    )
    run.add_argument(
        "--guest-image",
        default=os.environ.get("HV_GUEST_IMAGE") or default_guest_image(),
        type=inputs.image_arg(pinned=True, env="HV_GUEST_IMAGE"),
        help="kind/aks/cluster: the suite's workload image (python -m hvconform.guest; "
        "`nox -s image` builds it), never the plugin's; a fixed tag or a digest [HV_GUEST_IMAGE]",
    )
    run.add_argument("--cluster-name", default="hvconform", help="kind: cluster name")
    run.add_argument(
        "--node-image",
        default=os.environ.get("HV_KIND_NODE_IMAGE") or ClusterOptions.node_image,
        type=inputs.image_arg(pinned=False, env="HV_KIND_NODE_IMAGE"),
        help="kind: node image (`nox -s kind-image` builds one offline, hv-kind.local/node:TAG, "
        "and the kind engine names it when it holds it) [HV_KIND_NODE_IMAGE]",
    )
    run.add_argument("--kind-config", default=ClusterOptions.kind_config, help="kind: config")
    run.add_argument(
        "--keep-cluster",
        action="store_true",
        help="kind: keep the cluster (plugin objects are still deleted)",
    )
    run.add_argument(
        "--existing-cluster",
        action="store_true",
        help="kind: use the cluster --cluster-name made by the caller; never delete it",
    )
    run.add_argument("--kubeconfig", default="", help="cluster: the existing cluster's kubeconfig")
    run.add_argument("--context", default="", help="cluster: kubeconfig context (default: current)")
    run.add_argument(
        "--node", action="append", default=[], dest="nodes", help="cluster: a node to certify"
    )
    run.add_argument("--all-nodes", action="store_true", help="cluster: every KVM-labelled node")
    run.add_argument(
        "--node-access",
        choices=("pod", "direct"),
        default="pod",
        help="cluster: through a privileged diagnostic pod (as on AKS), or directly (the node "
        "runs on this machine)",
    )
    run.add_argument(
        "--allow-node-reboot",
        action="store_true",
        help="cluster: let the node-reboot check reboot the nodes named (it stops their kubelet "
        "and removes EVERY pod sandbox there, other workloads too); without it node-reboot is "
        "not_applicable there. kind and aks nodes the run creates are always rebooted",
    )
    run.add_argument(
        "--values-for",
        default="",
        metavar="KEY",
        type=inputs.values_key_arg,
        help="cluster/kind/aks: render the plugin with this key of its profile's per-target "
        "values (or manifests) instead of the target's own: a key of the profile's for a "
        "cluster of another kind (openshift, k3s, ...), so any conformant cluster is certified "
        "with --target cluster and its own values, no new target",
    )
    run.add_argument(
        "--values",
        dest="values_files",
        action="append",
        default=[],
        metavar="FILE",
        type=inputs.values_file_arg,
        help="cluster/kind/aks: a Helm values file of yours, on top of the profile's (a chart "
        "profile only; repeatable, later wins); read once, strictly, before anything runs",
    )
    run.add_argument(
        "--allow-object",
        dest="allow_objects",
        action="append",
        default=[],
        metavar="KIND/NAME",
        help="cluster/kind/aks: apply this object of the profile although it is wider than a "
        "plugin's deploy (a binding to a built-in role or to users or groups, a webhook, a CRD, "
        "an APIService, another cluster-scoped kind, hostPID/hostNetwork/hostIPC pods, a "
        "hostPath of the host's root or system trees); NAME as the profile writes it (or its "
        "generateName). Repeatable; each is printed in the plan and the report, and one that "
        "names nothing needing it is refused",
    )
    run.add_argument(
        "--diag-image",
        default="",
        type=inputs.image_arg(pinned=False),
        help="cluster/aks: diagnostic pod image (needs nsenter)",
    )
    run.add_argument("--resource-group", default="", help="aks: resource group (required)")
    run.add_argument("--cluster", default="", help="aks: existing cluster (required)")
    run.add_argument(
        "--hypervisor",
        choices=("kvm", "mshv"),
        default="kvm",
        help="aks: which pool; KVM and MSHV are never mixed in one run",
    )
    run.add_argument("--vm-size", default="Standard_D4ads_v5", help="aks: pool VM size")
    run.add_argument(
        "-m",
        dest="markexpr",
        default="",
        help="pytest marker expression choosing checks (e.g. 'cdi or identity')",
    )
    run.add_argument("--out", default="", help="results dir (default reports/<run-id>)")
    run.add_argument(
        "--plugin-profile",
        default=os.environ.get("HV_PLUGIN_PROFILE", ""),
        metavar="FILE",
        help="YAML profile of the plugin under test: command (run as is), env, paths, "
        "readiness/liveness probes; see README 'Testing your own plugin' [HV_PLUGIN_PROFILE] "
        "(default: this repository's shipped profile)",
    )
    run.add_argument(
        "--plugin-cmd",
        default=os.environ.get("HV_PLUGIN_CMD", ""),
        help="shortcut for a plugin with this repository's flags: the standard paths are "
        "passed as --device-plugin-dir/--cdi-dir/--host-dev-dir/--health-addr [HV_PLUGIN_CMD]",
    )
    run.add_argument(
        "-n",
        dest="workers",
        default="0",
        help="pytest-xdist workers ('auto' or a number; 0 = serial)",
    )
    run.add_argument(
        "--recovery-timeout",
        type=float,
        default=60.0,
        help="seconds a plugin may take to detect a fault or recover from it",
    )
    run.add_argument("--reports-root", default="reports", help="where reports/<run-id> live")
    run.add_argument("pytest_args", nargs="*", help="extra pytest arguments after --")
    run.set_defaults(func=cmd_run)
    return parser


Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _subcommands() -> list[Register]:
    """Each further subcommand lives in its own module and adds itself (func = its runner)."""
    from hvconform.bench.cli import register as bench_register
    from hvconform.manifests.cli import register as manifests_register
    from hvconform.metadata.cli import register as metadata_register
    from hvconform.profile_tool.cli import register as profile_register
    from hvconform.report.cli import register as report_register
    from hvconform.report.compare import register as compare_register
    from hvconform.targets.cluster.sweep import register as cleanup_register

    registers: list[Register] = [
        manifests_register,
        metadata_register,
        report_register,
        compare_register,
        bench_register,
        cleanup_register,
        profile_register,
    ]
    return registers
