"""The one workload pod spec of tests/realnode/test_migration_live.py (the cluster target's guest
pod, scheduled and pinned to a node by kubernetes.io/hostname only), how it ran (a KVM guest's
record, then its counter) and which path served it: the device plugin or DRA."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest

from hv_device_plugin.api.dra_wire import RESOURCE_API
from hv_device_plugin.api.names import DRA_DRIVER
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.guests import FAILED_WAITING, running
from hvconform.targets.cluster.kube import Obj
from hvconform.targets.cluster.workloads import workload_pod
from tests.realnode.pools import LIVE_S, WORK, Cluster


class Guests:
    """The one workload pod spec (the cluster target's: the guest's run, then its counter),
    scheduled, pinned to a node by kubernetes.io/hostname and unchanged otherwise."""

    def __init__(self, c: Cluster, image: str) -> None:
        self.c, self.image = c, image
        self.specs: list[Obj] = []

    def start(self, node: str) -> str:
        name = f"hv-work-{uuid.uuid4().hex[:6]}"
        pod = workload_pod(name, WORK, "", self.image, "/dev/kvm", taint=False, guest=True)
        del pod["spec"]["nodeName"]  # the scheduler's: it alone picks device plugin or DRA
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        unpinned = copy.deepcopy(pod["spec"])
        del unpinned["nodeSelector"]
        self.specs.append(unpinned)
        assert all(s == self.specs[0] for s in self.specs), "the pod spec changed"
        self.c.api.create(pod)
        return name

    def pod(self, name: str) -> Obj:
        found = self.c.api.get("v1", "Pod", name, WORK)
        assert found is not None, f"pod {name} gone"
        return found

    def ran(self, name: str) -> dict[str, Any]:
        """The guest's `run --json` record (a KVM guest computed in the pod), then its counter
        guest counting: the device works in the pod and stays usable."""

        def record() -> dict[str, Any] | None:
            pod = self.pod(name)
            status = pod.get("status") or {}
            stuck = [
                cs["state"]["waiting"]
                for cs in status.get("containerStatuses") or []
                if (cs.get("state", {}).get("waiting") or {}).get("reason") in FAILED_WAITING
            ]
            if status.get("phase") == "Failed" or stuck:
                log = self.c.api.pod_log(WORK, name, "guest")[-800:]
                pytest.fail(f"{name} cannot run: {json.dumps(status)[:1500]}\n{log}")
            if not running(pod, "guest"):
                return None
            for line in self.c.api.pod_log(WORK, name, "guest").splitlines():
                if line.startswith("{") and '"run"' in line:
                    found: dict[str, Any] = json.loads(line)
                    return found
            return None

        found = wait_for(record, LIVE_S, f"the KVM guest's record in {name}'s log", 0.5)
        assert found.get("ok") is True, found
        self.counting(name, "after its first run")
        return found

    def counter(self, name: str) -> int:
        pod = self.pod(name)
        assert (pod.get("status") or {}).get("phase") == "Running", pod.get("status")
        path = self.c.counter_file(pod["spec"]["nodeName"], pod["metadata"]["uid"])
        try:
            return int(json.loads(path.read_text())["counter"])
        except (OSError, ValueError, KeyError):
            return 0

    def counting(self, name: str, when: str) -> None:
        seen = self.counter(name)
        wait_for(lambda: self.counter(name) > seen + 2, LIVE_S,
                 f"{name}'s KVM guest counting ({when})", 0.2)  # fmt: skip

    def restarts(self, name: str) -> int:
        statuses = (self.pod(name).get("status") or {}).get("containerStatuses") or [{}]
        return int(statuses[0].get("restartCount", 0))


def via_device_plugin(c: Cluster, g: Guests, name: str) -> None:
    """Allocated by the kubelet's device manager: no claim for the extended resource."""
    pod = g.pod(name)
    assert not pod["status"].get("extendedResourceClaimStatus"), pod["status"]
    uid = pod["metadata"]["uid"]
    owned = [
        cl["metadata"]["name"]
        for cl in c.claims(WORK)
        if any(o.get("uid") == uid for o in cl["metadata"].get("ownerReferences") or [])
    ]
    assert owned == [], owned


def via_dra(c: Cluster, g: Guests, name: str, node: str) -> str:
    """Allocated by the scheduler from the node's ResourceSlice through the DeviceClass: the
    pod's extendedResourceClaimStatus names a claim allocated from this node's pool."""
    pod = g.pod(name)
    status = pod["status"].get("extendedResourceClaimStatus") or {}
    claim_name = status.get("resourceClaimName")
    assert claim_name, pod["status"]
    claim = c.api.get(RESOURCE_API, "ResourceClaim", claim_name, WORK)
    assert claim is not None, f"claim {claim_name} of {name} not found"
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"]) for r in results] == [(DRA_DRIVER, node)], results
    reserved = [r.get("uid") for r in claim["status"].get("reservedFor") or []]
    assert pod["metadata"]["uid"] in reserved, claim["status"]
    return str(claim_name)
