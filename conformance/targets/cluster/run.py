"""What kind and AKS runs share: rendered objects, node preparation, the node, `open_cluster`.

A lifecycle is built without touching anything (so its steps can print as the dry-run plan),
then executed by a Runbook whose cleanup always runs. `open_cluster` is what the target registry
calls: it yields a ready ClusterNode and, however the run ends, leaves a verified cleanup report.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hvconform.contract.deploy import Pods
from hvconform.contract.errors import Unhonoured
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.plugin import resolve as resolve_plugin
from hvconform.contract.results import NotApplicable
from hvconform.contract.runcontext import RunContext
from hvconform.manifests.blast import SUITE_OBJECTS, Gated, Refused, gate
from hvconform.manifests.profile import Rendered, render_deploy
from hvconform.targets.cluster.access import (
    EMPTY_SOCKETS,
    HOST_VIEW,
    STATE_DIR,
    CommandRunner,
    NodeAccess,
)
from hvconform.targets.cluster.deploy import TABLE_NOTE, Deployer, Resolve, deploy_steps
from hvconform.targets.cluster.dra_node import ClusterDraNode
from hvconform.targets.cluster.kube import KubeApi, Obj, table_resource
from hvconform.targets.cluster.lifecycle import Action, CleanupIncomplete, Runbook, RunReport
from hvconform.targets.cluster.node import ClusterNode
from hvconform.targets.cluster.plan import ClusterOptions, Step, render_plan
from hvconform.targets.cluster.preflight import cluster_facts, record_feature_gates
from hvconform.targets.cluster.workloads import (
    MANAGED,
    RUN_ID_LABEL,
    Layout,
    namespace,
    plugin_daemonset,
    prepare,
)

ApiFactory = Callable[[str], KubeApi]

DETECT = 'for d in /dev/kvm /dev/mshv; do [ -c "$d" ] && echo "$d"; done; exit 0'
# The node's state dir is the run's only when the run made it: made with a mark, refused when it
# exists without one (someone else's, or a symlink), removed only while the mark is there.
STATE_MARK = f"{STATE_DIR}/.made-by-hvconform"
PREPARE = (
    'set -eu; [ -c "$1" ] || { echo "$1 is not a character device" >&2; exit 4; }; '
    f"if [ -L {STATE_DIR} ] || {{ [ -e {STATE_DIR} ] && [ ! -f {STATE_MARK} ]; }}; then "
    f'echo "{STATE_DIR} exists and is not the suite\'s: left as it is" >&2; exit 5; fi; '
    f"mkdir -p {STATE_DIR}; : > {STATE_MARK}; "
    f'mkdir -p {HOST_VIEW} {EMPTY_SOCKETS}; rm -f "{HOST_VIEW}/$2"; '
    f'mknod -m 0600 "{HOST_VIEW}/$2" c $((0x$(stat -c %t "$1"))) $((0x$(stat -c %T "$1")))'
)
RESTORE = f"if [ ! -L {STATE_DIR} ] && [ -f {STATE_MARK} ]; then rm -rf {STATE_DIR}; fi"


def cluster_options(ctx: RunContext, target: str) -> ClusterOptions:
    """The cluster options the CLI validated into the run context."""
    if ctx.cluster is None:
        raise RuntimeError(f"the run context has no cluster options for target {target}")
    return ctx.cluster.with_(target=target).validate()


def values_key(options: ClusterOptions) -> str:
    """Which of a profile's per-target values (or manifests) a run renders: --values-for, else
    the target, -mshv for MSHV."""
    return options.values_for or options.target + ("-mshv" if options.hypervisor == "mshv" else "")


def render_objects(
    options: ClusterOptions, plugin: PluginUnderTest, resolve: Resolve = table_resource
) -> tuple[Rendered, Gated]:
    """The objects the plugin's profile deploys, for this run's target, namespace and image,
    through the blast-radius gate (Unhonoured, one line, for an object wider than the user
    allowed: nothing is created)."""
    if plugin.deploy is None:
        raise Unhonoured(
            f"deploy: the profile of {plugin.name!r} ({plugin.source}) has no deploy section; "
            f"the {options.target} target runs a plugin from its image and its objects"
        )
    keys = plugin.deploy.keys()
    if options.values_for and options.values_for not in keys:
        raise Unhonoured(
            f"--values-for {options.values_for}: the profile of {plugin.name!r} names no such "
            f"key (it has: {', '.join(keys) or 'none'})"
        )
    if options.values_files and plugin.deploy.chart is None:
        raise Unhonoured(
            f"--values: the profile of {plugin.name!r} deploys manifest files, not a chart; "
            "values files apply to a chart"
        )
    rendered = render_deploy(
        plugin.deploy,
        values_key(options),
        namespace=options.plugin_namespace,
        image=options.image,
        extra_values=options.values_files,
    )
    try:
        gated = gate(
            rendered.objects,
            namespace=options.plugin_namespace,
            allowed=options.allow_objects,
            namespaced=lambda api_version, kind: resolve(api_version, kind).namespaced,
        )
    except Refused as exc:
        raise Unhonoured(f"{plugin.name}: {exc}") from None
    return rendered, gated


def cleanup_hint(options: ClusterOptions, kubeconfig: str) -> str:
    """How to remove what a killed run left on the cluster: every object carries its label."""
    context = f" --context {shlex.quote(options.context)}" if options.context else ""
    return (
        f"hvconform cleanup --kubeconfig {shlex.quote(kubeconfig)}{context} "
        f"--run-id {options.run_label}"
    )


class ClusterLifecycle:
    """Base of KindLifecycle and AksLifecycle: objects, node steps, the node itself."""

    name = "cluster"
    taint = False

    def __init__(
        self,
        options: ClusterOptions,
        objects: list[Obj] | None = None,
        *,
        runner: CommandRunner | None = None,
        api_factory: ApiFactory | None = None,
        report: RunReport | None = None,
        plugin: PluginUnderTest | None = None,
        resolve: Resolve | None = None,
    ) -> None:
        self.options = options
        # scope and plural of each kind in the plan: the cluster's discovery when a plan was
        # made against a cluster, else the built-in table (the plan says which)
        self.resolve: Resolve = resolve or table_resource
        self.plugin = plugin or resolve_plugin()
        self.pods: Pods | None = None if self.plugin.deploy is None else self.plugin.deploy.pods
        self.deploy_notes: list[str] = []
        self.cluster_scoped: list[str] = []
        self.opted_in: list[str] = []
        self.namespace_labels: dict[str, str] = {}
        self.workdir = Path(options.workdir)
        self.kubeconfig = str(self.workdir / f"kubeconfig-{self.name}-{options.short_id}")
        self.runner = runner or CommandRunner(self.workdir / "commands.log")
        self.api_factory = api_factory or KubeApi
        self.report = report or RunReport(self.name, options.contract)
        if objects is None:
            made, gated = render_objects(options, self.plugin, self.resolve)
            objects, self.deploy_notes = gated.objects, [*made.notes, *gated.notes]
            self.cluster_scoped, self.opted_in = gated.cluster_scoped, gated.opted_in
            self.namespace_labels = gated.namespace_labels
        else:
            self.pods = None  # objects given by the caller: found as before (tests, recordings)
        self.rendered: list[Obj] = list(objects)
        rendered = list(objects)
        if not any(
            o["kind"] == "Namespace" and o["metadata"]["name"] == options.plugin_namespace
            for o in rendered
        ):
            own = namespace(options.plugin_namespace)
            own["metadata"]["labels"].update(self.namespace_labels)
            rendered.insert(0, own)
        extra_ns = [namespace(options.work_namespace, restricted=True), *self.extra_namespaces()]
        prepared, self.layout = self.prepare(rendered)
        self.objects: list[Obj] = [*prepared[:1], *extra_ns, *prepared[1:]]
        self.plugin_ds = plugin_daemonset(self.objects, self.pods)
        self._api: KubeApi | None = None
        self.deployer = Deployer(self.api, options, self.objects)
        self.node: ClusterNode | None = None
        self.node_name = ""

    # -- hooks for the subclasses ---------------------------------------------------------

    def prepare(self, rendered: list[Obj]) -> tuple[list[Obj], Layout]:
        return prepare(rendered, pods=self.pods, paths=self.plugin.paths)

    def extra_namespaces(self) -> list[Obj]:
        return []

    def extra_dry_run(self) -> list[Obj]:
        return []

    def gates_set(self) -> dict[str, Any]:
        """The feature gates this target sets on the cluster's components: none (a cluster the
        run did not make keeps its own; kind's config may set some)."""
        return {}

    def access(self) -> NodeAccess:
        raise NotImplementedError

    def node_cmd(self, argv: list[str]) -> str:
        """How a node command shows in the plan."""
        raise NotImplementedError

    def steps(self) -> list[Step]:
        raise NotImplementedError

    def actions(self) -> dict[str, Action]:
        return {
            "node-check": lambda s: self.check_hypervisor(),
            "node-prepare": lambda s: self.node_sh(
                PREPARE, self.options.device, self.options.hypervisor
            ),
            "node-restore": lambda s: self.node_sh(RESTORE),
            "namespaces": lambda s: self.deployer.create_namespaces([]),
            "dry-run": lambda s: self.deployer.dry_run(self.extra_dry_run()),
            "apply": lambda s: self.deployer.apply(),
            "rollout": lambda s: self.deployer.wait_rollout(),
            "baseline": lambda s: self.open_node(),
            "workloads": lambda s: self.close_node(),
            "delete-plugin": lambda s: self.deployer.delete_plugin(),
            "delete-objects": lambda s: self.deployer.delete_all(),
            "verify-objects": lambda s: self.deployer.verify(self.report),
        }

    # -- shared pieces --------------------------------------------------------------------

    def api(self) -> KubeApi:
        if self._api is None:
            self._api = self.api_factory(self.kubeconfig)
            self._api.stamp = {RUN_ID_LABEL: self.options.run_label, **MANAGED}
        return self._api

    def close_api(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    def shared_steps(self) -> dict[str, Step]:

        def sh(script: str, *args: str) -> str:
            return self.node_cmd(["sh", "-c", script, "sh", *args])

        steps = deploy_steps(self.objects, self.extra_dry_run(), self.resolve)
        dev, name = self.options.device, self.options.hypervisor
        steps["node-check"] = Step(
            "node-check",
            "setup",
            f"which hypervisor devices the node exposes ({dev} required; neither: not_applicable)",
            node=(sh(DETECT),),
        )
        steps["node-prepare"] = Step(
            "node-prepare",
            "setup",
            f"isolated host-device view {HOST_VIEW}/{name} with {dev}'s numbers (real /dev untouched)",
            node=(sh(PREPARE, dev, name),),
            arms="node-restore",
        )
        steps["node-restore"] = Step(
            "node-restore", "cleanup", f"remove {STATE_DIR} from the node", node=(sh(RESTORE),)
        )
        steps["baseline"] = Step(
            "baseline",
            "setup",
            "plugin ready, allocatable > 0, baseline CDI spec, sentinels planted, session guest",
            arms="workloads",
        )
        steps["workloads"] = Step(
            "workloads", "cleanup", "delete workload pods (wait until gone), remove sentinels"
        )
        return steps

    def node_sh(self, script: str, *args: str) -> None:
        result = self.access().run(["sh", "-c", script, "sh", *args], timeout=120)
        if result.rc != 0:
            raise RuntimeError(
                f"node command failed ({result.rc}): {result.stderr.decode()[-300:]}"
            )

    def check_hypervisor(self) -> None:
        found = self.access().run(["sh", "-c", DETECT, "sh"]).stdout.decode().split()
        self.report.environment["node_devices"] = found
        want = self.options.device
        if want in found:
            return
        if not found:
            raise NotApplicable(f"node {self.node_name} exposes neither /dev/kvm nor /dev/mshv")
        raise NotApplicable(
            f"node {self.node_name} exposes {', '.join(found)}, not {want}: "
            "a run tests one hypervisor and never mixes KVM and MSHV nodes"
        )

    def open_node(self) -> None:
        # a DRA driver's node observes slices and scheduled pods (honour lets only kind run one)
        node_class = ClusterNode if self.plugin.dra is None else ClusterDraNode
        self.node = node_class(
            name=self.name,
            api=self.api(),
            access=self.access(),
            options=self.options,
            node_name=self.node_name,
            layout=self.layout,
            plugin_ds=self.plugin_ds,
            deployer=self.deployer,
            taint=self.taint,
            plugin=self.plugin,
        )
        self.node.setup()
        self.report.environment.update(self.node.environment())
        self.report.environment.update(cluster_facts(self.api()))  # server + every Node
        self.report.notes += [*self.deploy_notes, *self.layout.notes]
        self.report.environment["capabilities"] = sorted(self.node.capabilities)

    def close_node(self) -> None:
        if self.node is not None:
            self.node.teardown()

    def runbook(self) -> Runbook:
        return Runbook(
            self.steps(), self.actions(), self.report, lambda argv: self.runner.run(argv)
        )


def plan_of(lifecycle: ClusterLifecycle, title: str) -> str:
    """The dry-run plan of a lifecycle: who is under test, the documented overrides made to its
    objects, the cluster-wide objects it brings and those the user opted in, the suite's own
    objects, how a killed run is cleaned up, then every step."""
    plugin = lifecycle.plugin
    head = [f"# plugin under test: {plugin.name} ({plugin.source})"]
    head += [f"# {note}" for note in lifecycle.deploy_notes]
    options = lifecycle.options
    chosen = " (--values-for)" if options.values_for else ""
    head.append(f"# rendered with the profile's values key {values_key(options)}{chosen}")
    head += [f"# values of yours on top (--values): {path}" for path in options.values_files]
    scoped = ", ".join(lifecycle.cluster_scoped) or "none"
    head.append(f"# cluster-scoped objects of the profile: {scoped}")
    head += [f"# opted in (--allow-object): {line}" for line in lifecycle.opted_in]
    head += [f"# the suite's own: {line}" for line in SUITE_OBJECTS]
    head.append(f"# every object created is labelled {RUN_ID_LABEL}={lifecycle.options.run_label}")
    head.append(f"# if the run is killed: {cleanup_hint(lifecycle.options, lifecycle.kubeconfig)}")
    if lifecycle.resolve is table_resource:
        head.append(f"# {TABLE_NOTE}")
    else:
        head.append("# paths and scopes in this plan are the cluster's own (its discovery)")
    text = render_plan(lifecycle.steps(), title)
    first, _, rest = text.partition("\n")
    return "\n".join([first, *head, rest])


def quote(argv: list[str]) -> str:
    return shlex.join(argv)


@contextlib.contextmanager
def open_cluster(lifecycle: ClusterLifecycle, *, out_dir: Path) -> Iterator[ClusterNode]:
    """Set the cluster up, yield its node, clean up always; the report goes to out_dir."""
    report_path = out_dir / f"cluster-{lifecycle.options.target}.json"
    body_failed = False
    hint = cleanup_hint(lifecycle.options, lifecycle.kubeconfig)
    report = lifecycle.report
    report.environment["run_label"] = {RUN_ID_LABEL: lifecycle.options.run_label}
    report.environment["opted_in"] = list(lifecycle.opted_in)
    report.environment["cluster_scoped_objects"] = list(lifecycle.cluster_scoped)
    report.notes.append(f"if this run did not finish, remove what it left with: {hint}")
    report.write(report_path)  # on disk before anything exists: a killed run's says how
    try:
        with lifecycle.runbook().running():
            assert lifecycle.node is not None
            record_feature_gates(
                lifecycle.api(), lifecycle.node_name, lifecycle.gates_set(), out_dir
            )
            try:
                yield lifecycle.node
            except BaseException:
                body_failed = True
                raise
    finally:
        lifecycle.close_api()
        lifecycle.report.write(report_path)
    if not lifecycle.report.cleanup_ok and not body_failed:
        raise CleanupIncomplete(f"cluster cleanup incomplete: see {report_path}; then: {hint}")
