"""A serving node's plugin, judged as it runs: `--mode validate --deployed NAMESPACE/DAEMONSET`.

The existing-cluster target, minus everything that would disturb a node that runs workloads:
the plugin's DaemonSet is read (its layout found from the live object, as `prepare` finds it
from rendered ones) and never applied, restarted nor deleted; no state dir nor host-device view
is made on the node. The run creates only its own work namespace (the one guest of
validate-guest runs there), plus the diagnostic pod with `--node-access pod`, and deletes exactly
those, by UID, verified.
"""

from __future__ import annotations

from typing import Any

from hvconform.contract.results import EnvironmentBlocked
from hvconform.targets.cluster.deploy import Deployer
from hvconform.targets.cluster.diag import diag_steps
from hvconform.targets.cluster.existing import ExistingLifecycle
from hvconform.targets.cluster.kube import Obj
from hvconform.targets.cluster.lifecycle import Action
from hvconform.targets.cluster.plan import ClusterOptions, Step
from hvconform.targets.cluster.workloads import Layout, namespace, prepare

# The steps of a serving node's run, in order; the shared ones keep their meaning.
ORDER = ("metadata-snapshot", "cluster-check", "adopt", "namespaces", "diag-pod", "node-check",
         "metadata-startup", "baseline", "workloads", "diag-delete", "delete-objects",
         "verify-objects", "verify-diag-gone", "metadata-final")  # fmt: skip


def _placeholder(ref: str) -> Obj:
    """The deployed DaemonSet by name only, until the adopt step reads it from the API."""
    ns, name = ref.split("/", 1)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {}}, "template": {"spec": {"containers": []}}},
    }


class ServingLifecycle(ExistingLifecycle):
    """The plugin already deployed on the node, in validate mode."""

    def __init__(self, options: ClusterOptions, **kw: Any) -> None:
        assert options.deployed and options.mode == "validate", "validated by ClusterOptions"
        super().__init__(options, [_placeholder(options.deployed)], **kw)
        self.text = ""  # nothing rendered, nothing applied
        # only the run's own namespaces: the plugin's namespace is the caller's
        self.objects = [
            namespace(options.work_namespace, restricted=True),
            *self.extra_namespaces(),
        ]
        self.deployer = Deployer(self.api, options, self.objects)
        self.deploy_notes = [f"plugin judged as deployed: DaemonSet {options.deployed}, never "
                             "applied, restarted nor deleted (validate mode)"]  # fmt: skip

    def prepare(self, rendered: list[Obj]) -> tuple[list[Obj], Layout]:
        return rendered, Layout()  # the live object's layout is read by the adopt step

    def steps(self) -> list[Step]:
        o = self.options
        where = self.node_name or "the node"
        shared = self.shared_steps()  # the deploy steps of the run's own namespaces only
        own = {s.id: s for s in super().steps()}
        adopt = Step(
            "adopt",
            "setup",
            f"read DaemonSet {o.deployed} and its pod on {where}: the plugin under test as it "
            "runs (never applied, restarted nor deleted)",
            api=(f"GET DaemonSet {o.deployed}",),
        )
        diag = diag_steps(o, where, f"node {where}") if o.node_access == "pod" else {}
        by_id = {**shared, **own, **diag, "adopt": adopt}
        return [by_id[i] for i in ORDER if i in by_id]

    def actions(self) -> dict[str, Action]:
        return {**super().actions(), "adopt": lambda s: self._adopt()}

    def open_node(self) -> None:
        super().open_node()
        # the image the serving plugin really runs, read from its DaemonSet (the options' is
        # the profile's default: nothing here was deployed from it)
        containers = self.plugin_ds["spec"]["template"]["spec"].get("containers", [])
        ran = [c.get("image", "") for c in containers if c.get("name") == self.layout.container]
        self.report.environment["plugin_image"] = ran[0] if ran else ""

    def _adopt(self) -> None:
        ns, name = self.options.deployed.split("/", 1)
        live = self.api().get("apps/v1", "DaemonSet", name, ns)
        if live is None:
            raise EnvironmentBlocked(
                f"no DaemonSet {self.options.deployed}: --deployed names the plugin as it runs"
            )
        # the profile's deploy.pods names the plugin's container when its labels match the
        # live pods; a plugin deployed another way is found as rendered objects are
        declared = None if self.plugin.deploy is None else self.plugin.deploy.pods
        try:
            _, self.layout = prepare(
                [live], isolate_host_view=False, pods=declared, paths=self.plugin.paths
            )
        except (ValueError, StopIteration):
            _, self.layout = prepare([live], isolate_host_view=False, paths=self.plugin.paths)
        self.plugin_ds = live
        self.report.environment["plugin_daemonset"] = {
            "name": self.options.deployed,
            "uid": live["metadata"].get("uid", ""),
            "generation": live["metadata"].get("generation", 0),
        }
