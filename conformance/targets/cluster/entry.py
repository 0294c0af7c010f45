"""The existing-cluster target's entry (the registry's): a run's plan and its node.

`--deployed NAMESPACE/DAEMONSET` (validate mode) judges the plugin as it runs on a serving node
(hvconform.targets.cluster.serving); otherwise the run deploys the profile's plugin itself
(hvconform.targets.cluster.existing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.runcontext import RunContext
from hvconform.targets.cluster.existing import ExistingLifecycle
from hvconform.targets.cluster.kube import KubeApi, Obj
from hvconform.targets.cluster.node import ClusterNode
from hvconform.targets.cluster.plan import NODE_NAME, ClusterOptions, Step
from hvconform.targets.cluster.run import cluster_options, open_cluster, plan_of
from hvconform.targets.cluster.serving import ServingLifecycle


def check_options(options: ClusterOptions) -> None:
    """This target's own rules: a cluster it never makes, so its kubeconfig, and the nodes."""
    if not options.kubeconfig:
        raise ValueError("the cluster target needs --kubeconfig FILE (it never makes a cluster)")
    if not Path(options.kubeconfig).is_file():
        raise ValueError(f"--kubeconfig {options.kubeconfig!r} is not a readable file")
    if bool(options.nodes) == options.all_nodes:
        raise ValueError("the cluster target needs --node NAME (repeatable) or --all-nodes")
    bad = [n for n in options.nodes if not NODE_NAME.fullmatch(n)]
    if bad:
        raise ValueError(f"--node {bad[0]!r} is not a Kubernetes node name")


def build_plan(
    options: ClusterOptions,
    objects: list[Obj] | None = None,
    plugin: PluginUnderTest | None = None,
) -> list[Step]:
    """The existing-cluster plan; builds the lifecycle without running anything."""
    if options.deployed:
        return ServingLifecycle(options, plugin=plugin).steps()
    return ExistingLifecycle(options, objects, plugin=plugin).steps()


def plan_text(options: ClusterOptions, plugin: PluginUnderTest | None = None) -> str:
    """What `--dry-run` prints for the cluster target."""
    where = ", ".join(options.nodes) or "every KVM node"
    title = f"hvconform plan: existing cluster, {where}, {options.node_access} node access"
    api = _discovery(options)
    try:
        resolve = None if api is None else api.resource
        if options.deployed:
            serving = ServingLifecycle(options, plugin=plugin, resolve=resolve)
            return plan_of(
                serving, f"{title}, validate mode, plugin as deployed ({options.deployed})"
            )
        lifecycle = ExistingLifecycle(options, None, plugin=plugin, resolve=resolve)
        return plan_of(lifecycle, f"{title}, image {options.image}")
    finally:
        if api is not None:
            api.close()


def _discovery(options: ClusterOptions) -> KubeApi | None:
    """The cluster's API when it answers discovery within a few seconds; None (the plan then
    uses the built-in table, and says so) when it cannot be reached or the kubeconfig is not
    usable from here: a dry run never fails for lack of a cluster."""
    try:
        api = KubeApi(options.kubeconfig, request_timeout=5.0, context=options.context)
    except Exception:  # the client's own errors for a kubeconfig it cannot load
        return None
    try:
        api.resource("v1", "Namespace")
    except Exception:  # unreachable, refused, not a Kubernetes API: the table, said so
        api.close()
        return None
    return api


@contextlib.contextmanager
def open_node(
    ctx: RunContext, *, worker: str, metadata: object | None = None
) -> Iterator[ClusterNode]:
    """The registry's entry: the plugin deployed on the caller's cluster, one node of it."""
    options = cluster_options(ctx, "cluster")
    out_dir = ctx.out
    extra = {"metadata": metadata} if metadata is not None else {}
    lifecycle = (
        ServingLifecycle(options, plugin=ctx.plugin, **extra)
        if options.deployed
        else ExistingLifecycle(options, None, plugin=ctx.plugin, **extra)  # type: ignore[arg-type]
    )
    with open_cluster(lifecycle, out_dir=out_dir) as node:
        yield node
