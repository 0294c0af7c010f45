"""A rolling update of the plugin DaemonSet, as an operator's upgrade does it (issue 17, item 6).

The new pod template differs only by an annotation (`hyperlight.dev/rollout`): the same image and
code, so what is judged is the rollout itself, not a change of version. The DaemonSet's own
update strategy does the rest (the kubelet sees the old plugin go and the new one register).
Done means: the controller has observed the new generation, every scheduled pod is updated and
available, and this node runs a plugin pod other than the one before the rollout.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from hvconform.contract.results import NotApplicable
from hvconform.targets.cluster.kube import Obj

ROLLOUT_ANNOTATION = "hyperlight.dev/rollout"


def rolled(ds: Obj, stamp: str) -> Obj:
    """The DaemonSet with a pod template that differs by the rollout annotation only."""
    new = copy.deepcopy(ds)
    meta = new["spec"]["template"].setdefault("metadata", {})
    meta.setdefault("annotations", {})[ROLLOUT_ANNOTATION] = stamp
    return new


def complete(ds: Obj | None) -> bool:
    """The DaemonSet controller's own view: the new generation fully updated and available."""
    if ds is None:
        return False
    status, generation = ds.get("status", {}), ds["metadata"].get("generation", 0)
    desired = status.get("desiredNumberScheduled", -1)
    return bool(
        status.get("observedGeneration", 0) >= generation
        and status.get("updatedNumberScheduled", 0) == desired
        and status.get("numberAvailable", 0) == desired
        and desired > 0
    )


class Rollout:
    """Mixin for ClusterNode: start a rollout, tell when it is done on the cluster and here."""

    api: Any
    layout: Any
    options: Any
    plugin_ds: Obj
    _rollout_from: str = ""

    # ClusterNode's
    plugin_pod: Callable[[], Obj | None]
    replaced_by_running_pod: Callable[[str], bool]

    def start_rollout(self) -> None:
        if self.options.per_node:
            raise NotApplicable(
                "a rollout replaces the plugin on every node of the run, where other nodes' "
                "checks are running: not with several nodes at once"
            )
        pod = self.plugin_pod()
        assert pod is not None, "no plugin pod before the rollout"
        self._rollout_from = pod["metadata"]["uid"]
        current = self.api.get("apps/v1", "DaemonSet", self.plugin_ds["metadata"]["name"],
                               self.layout.namespace)  # fmt: skip
        assert current is not None, "the plugin DaemonSet is gone"
        self.api.replace(rolled(current, f"{time.time():.3f}"))

    def rollout_done(self) -> bool:
        ds = self.api.get("apps/v1", "DaemonSet", self.plugin_ds["metadata"]["name"],
                          self.layout.namespace)  # fmt: skip
        return complete(ds) and self.replaced_by_running_pod(self._rollout_from)
