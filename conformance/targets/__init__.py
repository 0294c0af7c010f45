"""The target registry: every target by name, the modules that implement it, and its traits.

Standard library only, and the only place that knows which family implements which target (the
Kubernetes e2e provider registry is the model): a family module is imported by name when its
target is chosen, so families never import each other through the registry, and adding a target
is one entry here plus its modules. Each family module exposes

    open_node(ctx, *, worker, metadata) -> context manager yielding a Node
    plan_text(options, plugin) -> what `--dry-run` prints (it executes nothing)

where ctx is the run's RunContext (hvconform.contract.runcontext): the plugin under test, the
out dir and the target's typed options, validated once by the CLI; a family reads nothing else.
Cluster families (created and deleted by the suite) also give `build_plan(options, objects)`
and may give `check_options(options)`, their own option rules. Each target's options module
(Target.options) adds its flags in groups named after the targets they belong to
(`add_options(group_for, env)`) and
builds its typed options from them (`options(ns, inputs)`); the CLI, its parser and the pytest
plugin name no target. Next to each family module, a `preflight` module gives the suite
`preconditions(target, runtime)` (checked before the first check) and
`environment(target, runtime)` (what the run ran on): see `preflight()`. Families by folder:
`local/` (processes on this machine, the kubelet emulator), `container/` (the plugin under
Docker, workloads under podman), `cluster/` (anything with an API server: an existing cluster,
kind, AKS), `realnode/` (a real kubelet on this machine); `host/` is the toolkit they share.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Target:
    module: str  # the family module implementing it
    about: str  # one line for --help
    runtimes: tuple[str, ...] = ("process",)  # how the plugin and workloads run (first: default)
    cluster: bool = False  # the suite creates and deletes it: it has a --dry-run plan
    # Traits the CLI and the suite act on, so that neither names a target:
    serial: bool = False  # one node at a time (a cluster per run, one real node per machine)
    # Who runs the host /dev/kvm two-phase check around the node: "suite" (the node's device
    # is this machine's: the suite snapshots and checks it), "target" (its lifecycle runs the
    # phases, e.g. kind takes the node's kvm group at startup), "none" (the device is not on
    # this machine: AKS).
    host_metadata: str = "suite"
    pool: bool = False  # several --node at once: one suite process per node, one deploy
    # The devices its nodes can offer (--hypervisor): kind's nodes get this machine's /dev/kvm.
    hypervisors: tuple[str, ...] = ("kvm", "mshv")
    # The plugin's namespace when --namespace is not given; "": one per run (hvconform-<run>),
    # so deleting it can never remove someone else's install. A throwaway cluster may use the
    # chart's own.
    plugin_namespace: str = ""
    # The module owning its flags and their typed object: `add_options(group_for, env)` and
    # `options(ns, inputs)`; targets of one family share it.
    options: str = "hvconform.targets.local.options"
    dra: bool = False  # it has a DRA node: it judges DRA drivers too


class OptionInputs(NamedTuple):
    """What a target's options are built with besides its flags."""

    run_id: str
    out: Path  # the run's directory
    plugin: Any  # the plugin under test (hvconform.contract.plugin.PluginUnderTest)


# How a runtime other than the default is implemented (local target only).
RUNTIME_MODULES: dict[str, str] = {"container": "hvconform.targets.container.node"}

TARGETS: dict[str, Target] = {
    "local": Target(
        "hvconform.targets.local.node",
        "this machine, no cluster: kubelet emulator, sandboxed plugin (default)",
        runtimes=("process", "container"),
    ),
    "cluster": Target(
        "hvconform.targets.cluster.entry",
        "an existing cluster (--kubeconfig, --node/--all-nodes): never created nor deleted",
        cluster=True,
        serial=True,
        host_metadata="target",
        pool=True,
        options="hvconform.targets.cluster.options",
        dra=True,
    ),
    "kind": Target(
        "hvconform.targets.cluster.kind",
        "a throwaway KIND cluster",
        cluster=True,
        serial=True,
        host_metadata="target",
        hypervisors=("kvm",),
        plugin_namespace="hyperlight-system",
        options="hvconform.targets.cluster.options",
        dra=True,
    ),
    "aks": Target(
        "hvconform.targets.cluster.aks",
        "a temporary AKS node pool",
        cluster=True,
        serial=True,
        host_metadata="none",
        options="hvconform.targets.cluster.options",
    ),
    "node": Target(
        "hvconform.targets.realnode.entry",
        "a real kubelet on this machine",
        serial=True,
        options="hvconform.targets.realnode.options",
        dra=True,
    ),
}
RUNTIMES: tuple[str, ...] = ("process", *RUNTIME_MODULES)


# Each group of flags and the targets it belongs to, as the options modules made them.
_GROUPS: list[tuple[frozenset[str], argparse._ArgumentGroup]] = []
GroupFor = Callable[..., "argparse._ArgumentGroup"]


def add_options(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Every target's own flags, each family's once, in groups named after the targets they
    belong to (--help shows whose); `env` is the environment the CLI read once, for the flags'
    defaults. A family asks `group(name, ...)` for each group of its flags."""

    def group(*names: str) -> argparse._ArgumentGroup:
        unknown = [n for n in names if n not in TARGETS]
        if unknown:
            raise UnknownTarget(f"flags for unknown target(s) {unknown}")
        said = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        made = parser.add_argument_group(f"--target {said}")
        _GROUPS.append((frozenset(names), made))
        return made

    _GROUPS.clear()  # the groups of the parser built last: the one the CLI parses with
    for module_name in dict.fromkeys(t.options for t in TARGETS.values()):
        importlib.import_module(module_name).add_options(group, env)


def foreign_flags(name: str, ns: argparse.Namespace) -> list[str]:
    """The flags set on the command line (or by their environment variable) that belong only
    to other targets than `name`: a run refuses them rather than ignore them."""
    return [
        action.option_strings[0]
        for owners, made in _GROUPS
        if name not in owners
        for action in made._group_actions
        if getattr(ns, action.dest, action.default) != action.default
    ]


def target_options(name: str, ns: argparse.Namespace, inputs: OptionInputs) -> Any:
    """The typed options of target `name` from the parsed flags: its family builds them, a
    cluster target's then pass every cluster's rules and its own (`cluster_options`).
    ValueError names the flag to fix."""
    built = importlib.import_module(TARGETS[name].options).options(ns, inputs)
    return cluster_options(name, built) if TARGETS[name].cluster else built


class UnknownTarget(ValueError):
    """A target or runtime name that is not registered; the message lists the choices."""


def module_for(name: str, runtime: str = "process") -> Any:
    """Import and return the family module implementing `name` under `runtime`."""
    target = TARGETS.get(name)
    if target is None:
        raise UnknownTarget(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}")
    if runtime not in target.runtimes:
        raise UnknownTarget(
            f"runtime {runtime!r} is not available on target {name!r}: "
            f"choose one of {', '.join(target.runtimes)}"
        )
    return importlib.import_module(RUNTIME_MODULES.get(runtime, target.module))


def preflight(name: str, runtime: str = "process") -> Any:
    """The `preflight` module of the family implementing `name` under `runtime`."""
    family = module_for(name, runtime).__name__
    return importlib.import_module(family.rpartition(".")[0] + ".preflight")


def open_target(
    ctx: Any, *, worker: str, metadata: object | None = None
) -> AbstractContextManager[Any]:
    """A context manager yielding the target's Node for the run context `ctx`; its teardown
    always runs."""
    module = module_for(ctx.target, ctx.runtime)
    opener: Callable[..., AbstractContextManager[Any]] = module.open_node
    return opener(ctx, worker=worker, metadata=metadata)


def announce(name: str, options: Any) -> str:
    """What a cluster family says before its run starts (kind: which kind binary and node
    image), '' when it says nothing."""
    hook: Callable[[Any], str] | None = getattr(cluster_module(name), "announce", None)
    return hook(options) if hook is not None else ""


def cluster_module(name: str) -> Any:
    """The family module of a cluster target (one with a plan)."""
    if name not in TARGETS or not TARGETS[name].cluster:
        clusters = ", ".join(n for n, t in TARGETS.items() if t.cluster)
        raise UnknownTarget(f"target {name!r} has no plan: choose one of {clusters}")
    return module_for(name)


def cluster_options(name: str, options: Any) -> Any:
    """`options` (ClusterOptions) as target `name` runs them: its traits filled in (the plugin
    namespace), then checked by the rules of every cluster (ClusterOptions.validate) and by the
    target's own (its hypervisors; its family module's `check_options`). ValueError names the
    flag to fix."""
    module, target = cluster_module(name), TARGETS[name]
    resolved = options.with_(target=name, default_namespace=target.plugin_namespace).validate()
    if resolved.hypervisor not in target.hypervisors:
        offered = " or ".join(f"/dev/{h}" for h in target.hypervisors)
        raise ValueError(
            f"the {name} target's nodes offer {offered} only: --hypervisor {target.hypervisors[0]}"
        )
    rules: Callable[[Any], None] | None = getattr(module, "check_options", None)
    if rules is not None:
        rules(resolved)
    return resolved


def build_plan(
    name: str, options: Any, *, objects: list[dict[str, Any]] | None = None, plugin: Any = None
) -> Any:
    """Every step of a cluster run in order, cleanup included; executes nothing."""
    return cluster_module(name).build_plan(cluster_options(name, options), objects, plugin)


def plan_text(name: str, options: Any, plugin: Any = None) -> str:
    """What `--dry-run` prints: a cluster target's plan deploying `plugin` (its profile's
    objects), or what a machine target would start, make and remove for it."""
    if TARGETS[name].cluster:
        text: str = cluster_module(name).plan_text(cluster_options(name, options), plugin)
        return text
    runtime = getattr(options, "runtime", "process")
    planned: str = module_for(name, runtime).plan_text(options, plugin)
    return planned
