"""Deploying the rendered manifests: server-side dry run, create, rollout wait, delete, verify.

Shared by kind and AKS. Only what this run created is deleted: a 409 on a cluster-scoped object
means someone else's, which is left alone (and a namespace we did not create is refused).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import yaml

from conformance.contract.deploy import CLUSTER_SCOPED
from conformance.contract.results import EnvironmentBlocked
from conformance.contract.wait import WaitExpired
from conformance.targets.cluster.kube import (
    ApiError,
    KubeApi,
    Obj,
    describe,
    object_path,
    resource_path,
)
from conformance.targets.cluster.lifecycle import RunReport
from conformance.targets.cluster.plan import ClusterOptions, Step

POLICY_WORDS = ("admission", "denied", "policy", "safeguard", "gatekeeper", "forbidden")


def manifest_yaml(objects: list[Obj]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False).rstrip()


def _post(obj: Obj, dry_run: bool) -> str:
    meta = obj.get("metadata", {})
    path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace", ""))
    return f"POST {path}{'?dryRun=All' if dry_run else ''}  ({describe(obj)})"


def _delete(obj: Obj) -> str:
    return f"DELETE {object_path(obj)}?propagationPolicy=Foreground  (then GET until 404)"


def split(objects: list[Obj]) -> tuple[list[Obj], list[Obj]]:
    """Namespaces first (they must exist before a namespaced dry run), then the rest."""
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    return namespaces, [o for o in objects if o["kind"] != "Namespace"]


def deploy_steps(objects: list[Obj], extra_dry_run: list[Obj]) -> dict[str, Step]:
    """The steps by id; the target puts them in order around its own."""
    namespaces, rest = split(objects)
    sets = [o for o in objects if o["kind"] == "DaemonSet"]
    return {
        "namespaces": Step(
            "namespaces",
            "setup",
            "create the run's namespaces (a namespaced dry run needs them)",
            api=tuple(_post(o, False) for o in namespaces),
            manifest=manifest_yaml(namespaces),
            arms="delete-objects",
        ),
        "dry-run": Step(
            "dry-run",
            "setup",
            "server-side dry run of every object: a policy refusal is environment_blocked",
            api=tuple(_post(o, True) for o in [*rest, *extra_dry_run]),
        ),
        "apply": Step(
            "apply",
            "setup",
            "create the plugin objects (harness wiring applied, see manifest)",
            api=tuple(_post(o, False) for o in rest),
            manifest=manifest_yaml(rest),
            arms="delete-plugin",
        ),
        "rollout": Step(
            "rollout",
            "setup",
            "wait for DaemonSet rollout (deadline --rollout-timeout)",
            api=tuple(
                f"GET {object_path(o)}  (until updated == available == desired >= 1)" for o in sets
            ),
        ),
        "delete-plugin": Step(
            "delete-plugin",
            "cleanup",
            "delete the plugin objects (DaemonSets first; foreground: their pods go first), "
            "wait until gone: nothing runs on the node when its state is removed",
            api=tuple(_delete(o) for o in sorted(reversed(rest), key=_daemonset_last)),
        ),
        "delete-objects": Step(
            "delete-objects",
            "cleanup",
            "delete what this run created (DaemonSets, then namespaces), wait until gone",
            api=tuple(_delete(o) for o in reversed(objects)),
        ),
        "verify-objects": Step(
            "verify-objects",
            "verify",
            "every object this run created answers 404",
            api=tuple(
                f"GET {object_path(o)}"
                for o in objects
                if o["kind"] == "Namespace" or o["kind"] in CLUSTER_SCOPED
            ),
        ),
    }


def _daemonset_last(obj: Obj) -> bool:
    """Sort key: DaemonSets before everything else."""
    return bool(obj["kind"] != "DaemonSet")


def blocked_by_policy(exc: ApiError) -> bool:
    text = f"{exc.reason} {exc.message}".lower()
    return exc.status == 403 or (exc.status in (400, 422) and any(w in text for w in POLICY_WORDS))


class Deployer:
    """Creates, waits for and deletes the objects of one run."""

    def __init__(
        self, api: Callable[[], KubeApi], options: ClusterOptions, objects: list[Obj]
    ) -> None:
        self.api = api
        self.options = options
        self.objects = objects
        self.created: list[Obj] = []

    def _create(self, obj: Obj) -> None:
        try:
            self.api().create(obj)
        except ApiError as exc:
            if exc.status == 409 and obj["kind"] in CLUSTER_SCOPED and obj["kind"] != "Namespace":
                return  # someone else's: used as is, never deleted by us
            raise
        self.created.append(obj)

    def create_namespaces(self, extra: list[Obj]) -> None:
        for obj in [*split(self.objects)[0], *extra]:
            self._create(obj)

    def dry_run(self, extra: list[Obj]) -> None:
        for obj in [*split(self.objects)[1], *extra]:
            try:
                self.api().create(obj, dry_run=True)
            except ApiError as exc:
                if blocked_by_policy(exc):
                    raise EnvironmentBlocked(
                        f"the cluster refuses {describe(obj)} (server-side dry run): "
                        f"{exc.status} {exc.reason}: {exc.message[:300]}"
                    ) from None
                raise

    def apply(self) -> None:
        for obj in split(self.objects)[1]:
            self._create(obj)

    def wait_rollout(self) -> None:
        for ds in (o for o in self.objects if o["kind"] == "DaemonSet"):
            meta = ds["metadata"]
            self.wait_daemonset(meta["name"], meta.get("namespace", ""))

    def wait_daemonset(self, name: str, namespace: str) -> None:
        deadline = time.monotonic() + self.options.rollout_timeout
        last: Any = None
        while time.monotonic() < deadline:
            obj = self.api().get("apps/v1", "DaemonSet", name, namespace)
            status = (obj or {}).get("status", {})
            meta = (obj or {}).get("metadata", {})
            last = {k: status.get(k) for k in _ROLLOUT_FIELDS}
            generation = int(meta.get("generation", 0))
            desired = int(status.get("desiredNumberScheduled", 0))
            if (
                obj is not None
                and int(status.get("observedGeneration", 0)) >= generation
                and desired >= 1
                and int(status.get("updatedNumberScheduled", 0)) == desired
                and int(status.get("numberAvailable", 0)) == desired
            ):
                return
            time.sleep(self.options.poll_interval)
        raise WaitExpired(
            f"wait 'DaemonSet {namespace}/{name} rolled out' expired after "
            f"{self.options.rollout_timeout:g}s (last: {last})"
        )

    def delete_plugin(self) -> None:
        """What `apply` created (DaemonSets first), waited gone; namespaces stay for later."""
        plugin = [o for o in self.created if o["kind"] != "Namespace"]
        for obj in sorted(reversed(plugin), key=_daemonset_last):
            meta = obj["metadata"]
            self.api().delete(
                obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace", "")
            )
        self.wait_gone(plugin)

    def delete_all(self) -> None:
        """DaemonSets first (their pods stop before the namespace goes), then the rest."""
        ordered = sorted(reversed(self.created), key=_daemonset_last)
        for obj in ordered:
            meta = obj["metadata"]
            self.api().delete(
                obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace", "")
            )
        self.wait_gone()

    def wait_gone(self, objects: list[Obj] | None = None) -> list[str]:
        left = []
        for obj in self.created if objects is None else objects:
            meta = obj["metadata"]
            if not self.api().wait_gone(
                obj["apiVersion"],
                obj["kind"],
                meta["name"],
                meta.get("namespace", ""),
                self.options.delete_timeout,
                self.options.poll_interval,
            ):
                left.append(describe(obj))
        if left:
            raise RuntimeError(f"still present after {self.options.delete_timeout:g}s: {left}")
        return left

    def verify(self, report: RunReport) -> None:
        left = []
        for obj in self.created:
            meta = obj["metadata"]
            if self.api().get(
                obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace", "")
            ):
                left.append(describe(obj))
        report.verify(
            "objects deleted",
            not left,
            f"{len(self.created)} created, still present: {left or 'none'}",
        )


_ROLLOUT_FIELDS = (
    "desiredNumberScheduled",
    "updatedNumberScheduled",
    "numberAvailable",
    "numberReady",
    "observedGeneration",
)
