"""`hvconform run --target cluster` over several nodes at once: a node pool certified in one run.

The plugin is deployed once, for every node (the cluster-level steps of the existing-cluster
target: namespaces, dry run, the DaemonSets, rollout); then each node runs the whole catalogue
in a suite process of its own, all at the same time (one worker per node), each with its own
results and report under OUT/<node>/; then the plugin is deleted once and that is verified
(OUT/cluster-cluster.json). OUT/nodes.md is the summary: one line per node.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.runcontext import ENV_CONTEXT, RunContext


def resolve(options: ClusterOptions) -> ClusterOptions:
    """--all-nodes: every node the KVM manifests select, named (nothing else reads them)."""
    if not options.all_nodes:
        return options
    from hvconform.targets.cluster.existing import kvm_nodes
    from hvconform.targets.cluster.kube import KubeApi

    api = KubeApi(options.kubeconfig, context=options.context)
    try:
        names = kvm_nodes(api)
    finally:
        api.close()
    if not names:
        raise ValueError("--all-nodes: the cluster has no node labelled for KVM")
    return options.with_(nodes=tuple(names), all_nodes=False)


def _node_argv(args: list[str], context: Path) -> list[str]:
    argv = list(args)
    argv[argv.index("--context") + 1] = str(context)
    return argv


def _counts(out: Path) -> dict[str, Any]:
    try:
        data = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return {}
    counts: dict[str, Any] = data["run"].get("counts", {})
    return counts


def run(
    ctx: RunContext, args: list[str], env: dict[str, str], render: Callable[[Path], None]
) -> int:
    """Deploy once, one suite process per node, delete once; the worst exit code."""
    from hvconform.targets.cluster.existing import ExistingLifecycle

    assert ctx.cluster is not None
    options, out, run_id = ctx.cluster, ctx.out, ctx.run_id
    controller = ExistingLifecycle(
        options.with_(scope="cluster", workdir=str(out / "cluster")),
        plugin=ctx.plugin,
    )
    codes: dict[str, int] = {}
    try:
        with controller.runbook().running():
            procs = {}
            for node in options.nodes:
                node_options = options.with_(
                    nodes=(node,),
                    scope="node",
                    workdir=str(out / node / "cluster"),
                )
                (out / node).mkdir(parents=True, exist_ok=True)
                node_ctx = ctx.with_(
                    options=node_options, out_dir=str(out / node), run_id=f"{run_id}-{node}"
                )
                path = node_ctx.write()
                procs[node] = subprocess.Popen(
                    _node_argv(args, path), env={**env, ENV_CONTEXT: str(path)}
                )
            for node, proc in procs.items():
                codes[node] = proc.wait()
    finally:
        controller.close_api()
        controller.report.write(out / "cluster-cluster.json")
    for node in options.nodes:
        if (out / node / "results.json").exists():
            render(out / node)
    cleanup_ok = controller.report.cleanup_ok
    lines = ["| node | exit | counts |", "| --- | --- | --- |"]
    for node in options.nodes:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(_counts(out / node).items()))
        lines.append(f"| {node} | {codes.get(node, 'not run')} | {counts or 'no results'} |")
    lines.append(f"\nplugin deployed once for {len(options.nodes)} nodes; cleanup verified: "
                 f"{'yes' if cleanup_ok else 'NO (see cluster-cluster.json)'}")  # fmt: skip
    (out / "nodes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(f"hvconform: {ln}" for ln in lines), flush=True)
    worst = max(codes.values(), default=1)
    return worst if cleanup_ok else max(worst, 1)
