"""Deploying the rendered manifests: server-side dry run, create, rollout wait, delete, verify.

Shared by every cluster target. Only what this run created is deleted, and only as the server
named it: each create's reply (name, namespace, UID) is written to the run's object ledger
before the run goes on, and every delete names one object with a UID precondition (an object
re-made under that name by someone else is never ours). A 409 on a cluster-scoped object means
someone else's, which is used as is and never deleted (a namespace we did not create is refused).
Every object carries the run's label (KubeApi.stamp); verification lists that label across the
kinds the run used, so whatever a kind's name or a generated name, nothing of the run is left.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from hvconform.contract.results import EnvironmentBlocked
from hvconform.contract.wait import WaitExpired
from hvconform.targets.cluster.kube import (
    ApiError,
    KubeApi,
    Obj,
    ResourceInfo,
    describe,
    table_resource,
)
from hvconform.targets.cluster.lifecycle import RunReport
from hvconform.targets.cluster.plan import ClusterOptions, Step

POLICY_WORDS = ("admission", "denied", "policy", "safeguard", "gatekeeper", "forbidden")
Resolve = Callable[[str, str], ResourceInfo]
TABLE_NOTE = (
    "paths and scopes in this plan are the built-in table's (no cluster answered discovery); "
    "the run checks each object against the cluster's discovery before applying it"
)


@dataclass(frozen=True)
class Created:
    """One object as the server made it: what cleanup deletes, by name and UID."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str

    def describe(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


def manifest_yaml(objects: list[Obj]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False).rstrip()


def _ns(obj: Obj, info: ResourceInfo) -> str:
    return str(obj.get("metadata", {}).get("namespace", "")) if info.namespaced else ""


def _name_shown(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    return str(meta.get("name") or f"<{meta.get('generateName', '')}... the server's name>")


def _post(obj: Obj, dry_run: bool, resolve: Resolve) -> str:
    info = resolve(obj["apiVersion"], obj["kind"])
    path = info.collection(_ns(obj, info))
    return f"POST {path}{'?dryRun=All' if dry_run else ''}  ({describe(obj)})"


def _shown_path(obj: Obj, resolve: Resolve) -> str:
    info = resolve(obj["apiVersion"], obj["kind"])
    meta = obj.get("metadata", {})
    if meta.get("name"):
        return info.item(str(meta["name"]), _ns(obj, info))
    return f"{info.collection(_ns(obj, info))}/{_name_shown(obj)}"


def _delete(obj: Obj, resolve: Resolve) -> str:
    return (
        f"DELETE {_shown_path(obj, resolve)}?propagationPolicy=Foreground  "
        "(precondition: the UID the server gave it; then GET until 404)"
    )


def split(objects: list[Obj]) -> tuple[list[Obj], list[Obj]]:
    """Namespaces first (they must exist before a namespaced dry run), then the rest."""
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    return namespaces, [o for o in objects if o["kind"] != "Namespace"]


def deploy_steps(
    objects: list[Obj], extra_dry_run: list[Obj], resolve: Resolve = table_resource
) -> dict[str, Step]:
    """The steps by id; the target puts them in order around its own."""
    namespaces, rest = split(objects)
    sets = [o for o in objects if o["kind"] == "DaemonSet"]
    return {
        "namespaces": Step(
            "namespaces",
            "setup",
            "create the run's namespaces (a namespaced dry run needs them)",
            api=tuple(_post(o, False, resolve) for o in namespaces),
            manifest=manifest_yaml(namespaces),
            arms="delete-objects",
        ),
        "dry-run": Step(
            "dry-run",
            "setup",
            "server-side dry run of every object: a policy refusal is environment_blocked",
            api=tuple(_post(o, True, resolve) for o in [*rest, *extra_dry_run]),
        ),
        "apply": Step(
            "apply",
            "setup",
            "create the plugin objects (harness wiring applied, see manifest); each reply's "
            "name and UID recorded before the next",
            api=tuple(_post(o, False, resolve) for o in rest),
            manifest=manifest_yaml(rest),
            arms="delete-plugin",
        ),
        "rollout": Step(
            "rollout",
            "setup",
            "wait for DaemonSet rollout (deadline --rollout-timeout)",
            api=tuple(
                f"GET {_shown_path(o, resolve)}  (until updated == available == desired >= 1)"
                for o in sets
            ),
        ),
        "delete-plugin": Step(
            "delete-plugin",
            "cleanup",
            "delete the plugin objects (DaemonSets first; foreground: their pods go first), "
            "wait until gone: nothing runs on the node when its state is removed",
            api=tuple(_delete(o, resolve) for o in sorted(reversed(rest), key=_daemonset_last)),
        ),
        "delete-objects": Step(
            "delete-objects",
            "cleanup",
            "delete what this run created (DaemonSets, then namespaces), wait until gone",
            api=tuple(_delete(o, resolve) for o in reversed(objects)),
        ),
        "verify-objects": Step(
            "verify-objects",
            "verify",
            "every object this run created answers 404 (or another UID), and a list of the "
            "run's label across the kinds it used finds nothing",
            api=tuple(
                f"GET {_shown_path(o, resolve)}"
                for o in objects
                if not resolve(o["apiVersion"], o["kind"]).namespaced
            ),
        ),
    }


def _daemonset_last(obj: Obj | Created) -> bool:
    """Sort key: DaemonSets before everything else."""
    kind = obj.kind if isinstance(obj, Created) else obj["kind"]
    return bool(kind != "DaemonSet")


def blocked_by_policy(exc: ApiError) -> bool:
    text = f"{exc.reason} {exc.message}".lower()
    return exc.status == 403 or (exc.status in (400, 422) and any(w in text for w in POLICY_WORDS))


class Deployer:
    """Creates, waits for and deletes the objects of one run."""

    def __init__(
        self,
        api: Callable[[], KubeApi],
        options: ClusterOptions,
        objects: list[Obj],
        ledger: Path | None = None,
    ) -> None:
        self.api = api
        self.options = options
        self.objects = objects
        self.created: list[Created] = []
        # the server's replies, one JSON line each, written before the run goes on: what a
        # killed run made is on disk (and labelled: `hvconform cleanup` finds it either way)
        self.ledger = ledger or Path(options.workdir) / "cluster-objects.jsonl"

    def _checked(self, obj: Obj) -> ResourceInfo:
        """The kind as this cluster serves it, against how the plan placed the object: a kind
        the table took for namespaced that the cluster serves cluster-wide (or the reverse) was
        never judged as such by the blast-radius gate, so it is refused here."""
        info = self.api().resource(obj["apiVersion"], obj["kind"])
        has_ns = bool(obj.get("metadata", {}).get("namespace"))
        if info.namespaced != has_ns and obj["kind"] != "Namespace":
            planned = "namespaced" if has_ns else "cluster-scoped"
            actual = "namespaced" if info.namespaced else "cluster-scoped"
            raise EnvironmentBlocked(
                f"{describe(obj)} was planned as {planned} but this cluster serves "
                f"{obj['kind']} ({obj['apiVersion']}) as {actual} (discovery): not applied"
            )
        return info

    def _create(self, obj: Obj) -> None:
        info = self._checked(obj)
        try:
            reply = self.api().create(obj)
        except ApiError as exc:
            if exc.status == 409 and not info.namespaced and obj["kind"] != "Namespace":
                return  # someone else's: used as is, never deleted by us
            raise
        meta = reply.get("metadata") or {}
        made = Created(
            obj["apiVersion"],
            obj["kind"],
            str(meta.get("name", "")),
            str(meta.get("namespace", "")) if info.namespaced else "",
            str(meta.get("uid", "")),
        )
        if not made.name or not made.uid:
            raise RuntimeError(f"the server's reply to creating {describe(obj)} names no object")
        self._record(made)
        self.created.append(made)

    def _record(self, made: Created) -> None:
        self.ledger.parent.mkdir(parents=True, exist_ok=True)
        with self.ledger.open("a") as f:
            f.write(json.dumps(asdict(made)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def create_namespaces(self, extra: list[Obj]) -> None:
        for obj in [*split(self.objects)[0], *extra]:
            self._create(obj)

    def dry_run(self, extra: list[Obj]) -> None:
        for obj in [*split(self.objects)[1], *extra]:
            self._checked(obj)
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
            self.wait_daemonset(self.created_name(ds), meta.get("namespace", ""))

    def created_name(self, obj: Obj) -> str:
        """The name the server gave an object of the plan (a generated one included)."""
        meta = obj.get("metadata", {})
        if meta.get("name"):
            return str(meta["name"])
        for made in self.created:
            if made.kind == obj["kind"] and made.name.startswith(meta.get("generateName", "")):
                return made.name
        raise RuntimeError(f"{describe(obj)} was not created by this run")

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

    def _delete(self, made: Created) -> None:
        self.api().delete(made.api_version, made.kind, made.name, made.namespace, uid=made.uid)

    def delete_plugin(self) -> None:
        """What `apply` created (DaemonSets first), waited gone; namespaces stay for later."""
        plugin = [o for o in self.created if o.kind != "Namespace"]
        for made in sorted(reversed(plugin), key=_daemonset_last):
            self._delete(made)
        self.wait_gone(plugin)

    def delete_all(self) -> None:
        """DaemonSets first (their pods stop before the namespace goes), then the rest."""
        for made in sorted(reversed(self.created), key=_daemonset_last):
            self._delete(made)
        self.wait_gone()

    def _present(self, made: Created) -> bool:
        """Still there as ours: the same name with the same UID."""
        obj = self.api().get(made.api_version, made.kind, made.name, made.namespace)
        return obj is not None and (obj.get("metadata") or {}).get("uid") == made.uid

    def wait_gone(self, objects: list[Created] | None = None) -> list[str]:
        left = []
        deadline = time.monotonic() + self.options.delete_timeout
        for made in self.created if objects is None else objects:
            while self._present(made):
                if time.monotonic() >= deadline:
                    left.append(made.describe())
                    break
                time.sleep(self.options.poll_interval)
        if left:
            raise RuntimeError(f"still present after {self.options.delete_timeout:g}s: {left}")
        return left

    def labelled_left(self) -> list[str]:
        """What still carries the run's label, listed across every kind the run created (and
        the pods its workloads made): a cluster-wide list, or each of the run's namespaces
        where the user may not list cluster-wide."""
        if not self.created:
            return []  # nothing made: no kind to list (and maybe no cluster to ask)
        api = self.api()
        selector = ",".join(f"{k}={v}" for k, v in sorted(api.stamp.items()))
        if not selector:
            return []
        kinds = sorted({(m.api_version, m.kind) for m in self.created} | {("v1", "Pod")})
        namespaces = sorted({m.name for m in self.created if m.kind == "Namespace"})
        left: list[str] = []
        for api_version, kind in kinds:
            try:
                found = api.list_objects(api_version, kind, labels=selector)
            except ApiError as exc:
                if exc.status != 403 or not api.resource(api_version, kind).namespaced:
                    raise
                found = [
                    o
                    for ns in namespaces
                    for o in api.list_objects(api_version, kind, ns, labels=selector)
                ]
            left += [describe({**o, "kind": kind}) for o in found]
        return left

    def verify(self, report: RunReport) -> None:
        left = [m.describe() for m in self.created if self._present(m)]
        labelled = self.labelled_left()
        stamp = sorted(self.api().stamp.items()) if self.created else []
        report.verify(
            "objects deleted",
            not left and not labelled,
            f"{len(self.created)} created, still present: {left or 'none'}; "
            f"labelled {stamp} and left: {labelled or 'none'}",
        )


_ROLLOUT_FIELDS = (
    "desiredNumberScheduled",
    "updatedNumberScheduled",
    "numberAvailable",
    "numberReady",
    "observedGeneration",
)
