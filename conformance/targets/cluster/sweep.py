"""`hvconform cleanup`: remove what a run that did not finish left on a cluster.

Every object a cluster run creates carries its label (`hvconform/run-id=<run>` beside
`app.kubernetes.io/managed-by=hvconform`), so what a killed run left is found without its
ledger: every kind the cluster serves (its discovery, CRDs included) that can be listed and
deleted is listed by both labels, and each object found is deleted by name with its UID as a
precondition (namespaces last: their content goes with them), waited gone, and listed again.
Nothing without both labels is ever touched.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hvconform.targets.cluster.kube import ApiError, KubeApi, ResourceInfo, UnsafePath
from hvconform.targets.cluster.workloads import MANAGED, RUN_ID_LABEL

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
EXIT_LEFT = 1
EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Found:
    info: ResourceInfo
    name: str
    namespace: str
    uid: str

    def describe(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.info.kind} {where}{self.name}"


@dataclass
class Swept:
    selector: str
    kinds_listed: int = 0
    found: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    unlisted: list[str] = field(default_factory=list)  # kinds the user may not list


def selector(run_id: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted({RUN_ID_LABEL: run_id, **MANAGED}.items()))


def _find(api: KubeApi, kinds: list[ResourceInfo], labels: str, swept: Swept) -> list[Found]:
    found: list[Found] = []
    for info in kinds:
        try:
            items = api.list_objects(info.api_version, info.kind, labels=labels)
        except ApiError as exc:
            if exc.status in (403, 404, 405):
                swept.unlisted.append(f"{info.kind} ({exc.status})")
                continue
            raise
        for obj in items:
            meta = obj.get("metadata") or {}
            found.append(
                Found(
                    info,
                    str(meta.get("name", "")),
                    str(meta.get("namespace", "")),
                    str(meta.get("uid", "")),
                )
            )
    return found


def sweep(api: KubeApi, run_id: str, *, dry_run: bool = False, timeout: float = 300.0) -> Swept:
    """Find, delete (unless dry_run), wait and verify what carries the run's labels."""
    labels = selector(run_id)
    swept = Swept(labels)
    kinds = [i for i in api.served() if {"list", "delete"} <= set(i.verbs)]
    swept.kinds_listed = len(kinds)
    found = _find(api, kinds, labels, swept)
    swept.found = [f.describe() for f in found]
    if dry_run:
        return swept
    ordered = sorted(found, key=lambda f: f.info.kind == "Namespace")  # namespaces last
    for item in ordered:
        try:
            if api.delete(item.info.api_version, item.info.kind, item.name, item.namespace,
                          uid=item.uid):  # fmt: skip
                swept.deleted.append(item.describe())
        except UnsafePath as exc:
            swept.left.append(f"{item.describe()} (not deleted: {exc})")
    deadline = time.monotonic() + timeout
    while True:
        left = _find(api, kinds, labels, Swept(labels))
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(1.0)  # polling the API for a condition, with the deadline above
    swept.left += [f.describe() for f in left]
    return swept


def cmd_cleanup(ns: argparse.Namespace) -> int:
    if not _LABEL_VALUE.fullmatch(ns.run_id):
        print(
            f"hvconform cleanup: --run-id {ns.run_id!r:.80} is not a run label value "
            "(the plan's 'labelled hvconform/run-id=...' line names it)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if not 1.0 <= ns.timeout <= 3600.0:  # nan fails both comparisons
        print(f"hvconform cleanup: --timeout {ns.timeout!r} is not 1-3600 seconds", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not Path(ns.kubeconfig).is_file():
        print(
            f"hvconform cleanup: --kubeconfig {ns.kubeconfig!r:.200} is not a file", file=sys.stderr
        )
        return EXIT_BAD_INPUT
    try:
        api = KubeApi(ns.kubeconfig, context=ns.context)
    except Exception as exc:  # the client's own errors for an unusable kubeconfig
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        print(f"hvconform cleanup: cannot use the kubeconfig: {first[:200]!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        swept = sweep(api, ns.run_id, dry_run=ns.dry_run, timeout=ns.timeout)
    except ApiError as exc:
        print(
            f"hvconform cleanup: the API server answered {exc.status} {exc.reason}: "
            f"{exc.message[:200]!r}",
            file=sys.stderr,
        )
        return EXIT_LEFT
    finally:
        api.close()
    print(
        json.dumps(
            {
                "selector": swept.selector,
                "kinds_listed": swept.kinds_listed,
                "found": swept.found,
                "deleted": swept.deleted,
                "left": swept.left,
                "unlisted": swept.unlisted,
                "dry_run": ns.dry_run,
            }
        )
    )
    return EXIT_LEFT if swept.left else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "cleanup",
        help="remove what a cluster run that did not finish left (by its run label)",
        description="List every kind the cluster serves for objects labelled "
        f"{RUN_ID_LABEL}=RUN and app.kubernetes.io/managed-by=hvconform, delete each by name "
        "with its UID as a precondition (namespaces last), wait until gone and list again. "
        "Prints one JSON line; exit 0 when nothing is left, 1 otherwise, 2 for bad input. "
        "A run prints this command with its run id when it starts.",
    )
    parser.add_argument("--kubeconfig", required=True, help="the cluster's kubeconfig")
    parser.add_argument("--context", default="", help="kubeconfig context (default: current)")
    parser.add_argument("--run-id", required=True, help="the run's label value")
    parser.add_argument("--dry-run", action="store_true", help="list only, delete nothing")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for the deletions"
    )
    parser.set_defaults(func=cmd_cleanup)
