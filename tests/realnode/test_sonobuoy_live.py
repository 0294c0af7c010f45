"""Issue 39 LIVE: every node of a pool certified in one `sonobuoy run`, on real kubelets.

The pool is `node-up --nodes N` (a real API server; N kubelets, each with its own containerd
with CDI, its own pod network through the ptp CNI). On it, as an operator's pool would have it,
the plugin is already deployed (the shipped chart's render, its /dev view a tmpfs per node with
a real `kvm` node made from /dev/kvm's numbers: the host's /dev/kvm is never touched) and a
guest already runs on node 1. Sonobuoy v0.57.5, built here from its module with its aggregator
image, runs the suite's plugin (`hvconform sonobuoy-plugin`, the suite's own image) on every
node in validate mode; nothing is pulled (every image imported, IfNotPresent).

Asserted: `sonobuoy results` gives each node's check verdicts, all passed; the fleet report
names each node and check and passes the pool; a node whose device view lacks kvm is named with
validate-device failed while the others pass; nothing on the serving nodes changed (the guest
pod running with the same UID and no restart, the plugin pods the same, the CDI specs the same
bytes, the slot free again); `sonobuoy delete` leaves nothing of Sonobuoy's nor the suite's;
/dev/kvm unchanged (cluster_mode_nodes). Wall time of one node and of every node measured in the
same test (printed, and written to the test's output dir), with each node's CPU seconds.

Run by `nox -s sonobuoy-live` (HV_SONOBUOY_LIVE=1; HV_SONOBUOY_NODES, default 2): apart from
`tests` for CI's time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.wait import wait_for
from tests.realnode.live_runs import cluster_mode_nodes, live_module, skip_unless_live

ENV = "HV_SONOBUOY_LIVE"
USES_NODE_STACK = live_module(ENV)  # conftest: one node stack at a time on this machine
pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(5400)]
SONOBUOY_NS = "hvconform-sonobuoy"
SERVING_NS = "hv-serving"
DEV_VIEW = "/run/hv-serving-dev"  # a tmpfs inside each node's own mount namespace
RUN_TIMEOUT_S = 1800
WAIT_S = 300.0  # a rollout, a guest's start, a health change reaching the node status
# Sonobuoy's tarballs and the fleet reports, kept after the run for a look (pytest's own tmp
# dirs rotate away): the next run replaces them.
WORK = Path("/tmp/hv-sonobuoy-live")


def _sh(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    skip_unless_live(ENV, "sonobuoy-live")
    from hvconform.manifests.chart import helm_binary
    from hvconform.targets.container.engine import DockerEngine
    from hvconform.targets.kindnode import suite_image
    from hvconform.targets.realnode import node_images
    from hvconform.targets.realnode import sonobuoy as sonobuoy_build

    with DockerEngine(what="tests/realnode sonobuoy suite image") as engine:
        client = engine.client(timeout=1800)
        try:
            built, _ = suite_image.ensure_suite_image(client, helm=Path(helm_binary()))
        finally:
            client.close()
    binary = sonobuoy_build.build()
    shutil.rmtree(WORK, ignore_errors=True)  # the last run's tarballs, kept until this one
    WORK.mkdir(parents=True)
    count = int(os.environ.get("HV_SONOBUOY_NODES", "2"))
    try:
        with cluster_mode_nodes(count) as made:
            node_images.load([built.tag])
            sonobuoy_build.import_into_nodes()
            yield {**made, "suite": built.tag, "sonobuoy": str(binary), "count": count,
                   "work": WORK}  # fmt: skip
    finally:  # the views' mount point on the host (their tmpfs died with the nodes)
        if Path(DEV_VIEW).is_dir():
            Path(DEV_VIEW).rmdir()


def _api(kubeconfig: str) -> Any:
    from hvconform.targets.cluster.kube import KubeApi

    return KubeApi(kubeconfig)


def _slots(node: dict[str, Any]) -> int:
    from hvconform.contract.quantity import quantity
    from hvconform.targets.cluster.workloads import RESOURCE

    return quantity(str(node["status"].get("allocatable", {}).get(RESOURCE, "0")))


def _node_names(api: Any) -> list[str]:
    return sorted(n["metadata"]["name"] for n in api.list_objects("v1", "Node"))


def _device_views(nodes: list[str], faulty: str = "") -> None:
    """Each node's plugin sees DEV_VIEW: a tmpfs of the node's own with a kvm node made from
    /dev/kvm's numbers (the faulty node's stays empty: its device view without /dev/kvm)."""
    from hvconform.targets.cluster.access import DirectAccess

    Path(DEV_VIEW).mkdir(exist_ok=True)
    st = os.stat("/dev/kvm")
    for name in nodes:
        make = "" if name == faulty else (
            f'mknod -m 0666 {DEV_VIEW}/kvm c {os.major(st.st_rdev)} {os.minor(st.st_rdev)}; '
        )  # fmt: skip
        script = (f"mountpoint -q {DEV_VIEW} || mount -t tmpfs -o mode=0755 hv-serving "
                  f"{DEV_VIEW}; rm -f {DEV_VIEW}/kvm; {make}ls -A {DEV_VIEW}")  # fmt: skip
        result = DirectAccess(name).run(["sh", "-c", script])
        assert result.rc == 0, result.stderr
    assert not os.path.ismount(DEV_VIEW), "the views must stay inside the nodes"


def _deploy_plugin(api: Any, image: str) -> list[dict[str, Any]]:
    """The shipped profile's objects as an operator applied them (its /dev view per node)."""
    from hvconform.contract.cluster_options import ClusterOptions
    from hvconform.contract.plugin import resolve
    from hvconform.targets.cluster.run import render_objects

    options = ClusterOptions(target="cluster", image=image, namespace=SERVING_NS, run_id="serve")
    _, gated = render_objects(options, resolve())
    made = []
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SERVING_NS}})
    for obj in gated.objects:
        if obj.get("kind") == "Namespace":
            continue
        if obj.get("kind") == "DaemonSet":
            for vol in obj["spec"]["template"]["spec"].get("volumes", []):
                if vol.get("hostPath", {}).get("path", "").rstrip("/") == "/dev":
                    vol["hostPath"] = {"path": DEV_VIEW, "type": "Directory"}
        made.append(api.create(obj))
    return made


def _plugin_ds(objects: list[dict[str, Any]]) -> str:
    ds = [
        o for o in objects if o.get("kind") == "DaemonSet" and "access" not in o["metadata"]["name"]
    ]
    return f"{SERVING_NS}/{ds[0]['metadata']['name']}"


def _sonobuoy(pool: dict[str, Any], *args: str, timeout: float = RUN_TIMEOUT_S) -> str:
    from hvconform.targets.realnode.sonobuoy import SONOBUOY_IMAGE

    argv = [pool["sonobuoy"], *args, "--kubeconfig", pool["kubeconfig"], "--namespace", SONOBUOY_NS]
    if args[0] == "run":
        # these nodes run no cluster DNS (host-network API relay, no CoreDNS): its check is the
        # one preflight skipped; the version and namespace checks run
        argv += ["--sonobuoy-image", SONOBUOY_IMAGE, "--image-pull-policy", "IfNotPresent",
                 "--skip-preflight=dnscheck"]  # fmt: skip
    proc = _sh(argv, timeout=timeout)
    assert proc.returncode == 0, f"sonobuoy {args[0]}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return proc.stdout


def _certify(pool: dict[str, Any], plugin_yaml: Path, out: Path) -> tuple[float, Path]:
    """One `sonobuoy run --wait`, its tarball retrieved, Sonobuoy's objects deleted and gone."""
    t0 = time.monotonic()
    _sonobuoy(pool, "run", "--plugin", str(plugin_yaml), "--wait", "--wait-output", "silent")
    wall = time.monotonic() - t0
    out.mkdir(parents=True, exist_ok=True)
    tarball = Path(_sonobuoy(pool, "retrieve", str(out)).strip().splitlines()[-1])
    _sonobuoy(pool, "delete", "--wait", "--all")
    api = _api(pool["kubeconfig"])
    try:
        assert api.get("v1", "Namespace", SONOBUOY_NS) is None, "sonobuoy delete left its namespace"
        bindings = api.list_objects("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")
        roles = [r["metadata"]["name"] for r in bindings if "sonobuoy" in r["metadata"]["name"]]
        assert not roles, f"sonobuoy delete left {roles}"
        left = [n["metadata"]["name"] for n in api.list_objects("v1", "Namespace")
                if n["metadata"]["name"].startswith("hvconform-")]  # fmt: skip
        assert not left, f"the suite's namespaces left: {left}"
    finally:
        api.close()
    return wall, tarball


def _plugin_file(pool: dict[str, Any], deployed: str, selector: dict[str, str]) -> Path:
    path = Path(pool["work"]) / f"plugin-{'-'.join(sorted(selector.values()))}.yaml"
    proc = _sh([sys.executable, "-m", "hvconform.cli", "sonobuoy-plugin", "--image", pool["suite"],
                "--deployed", deployed, "--guest-image", pool["guest"],
                "--plugin-image", pool["plugin"],
                "--node-selector", ",".join(f"{k}={v}" for k, v in selector.items())])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    path.write_text(proc.stdout)
    return path


def _results(pool: dict[str, Any], tarball: Path) -> dict[str, dict[str, str]]:
    """`sonobuoy results --mode detailed`: each node's check verdicts, as Sonobuoy read them."""
    proc = _sh([pool["sonobuoy"], "results", str(tarball), "--plugin", "hvconform",
                "--mode", "detailed"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    verdicts: dict[str, dict[str, str]] = {}
    errors = [ln for ln in proc.stdout.splitlines() if not ln.startswith("{")]
    assert not errors, (
        "Sonobuoy recorded errors (its pods' logs are in the tarball):\n"
        + "\n".join(e[:600] for e in errors)
    )
    for line in proc.stdout.splitlines():
        item = json.loads(line)  # a leaf: its path is plugin|node|file
        node = item["meta"]["path"].split("|")[1]
        verdicts.setdefault(node, {})[item["name"]] = item["status"]
    return verdicts


def _costs(pool: dict[str, Any], tarball: Path) -> dict[str, dict[str, float]]:
    """Each node's wall and CPU seconds, as its pod wrote them (`sonobuoy results --mode dump`:
    the file item keeps the details of the plugin's document)."""
    proc = _sh([pool["sonobuoy"], "results", str(tarball), "--plugin", "hvconform",
                "--mode", "dump"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tree = yaml.safe_load(proc.stdout)
    costs = {}
    for node in tree.get("items", []):
        for file in node.get("items", []):
            details = file.get("details") or {}
            if "cpu_s" in details:
                costs[node["name"]] = {k: details[k] for k in ("wall_s", "cpu_s")}
    return costs


def _serving_state(api: Any, guest_uid: str) -> dict[str, Any]:
    pods = api.list_objects("v1", "Pod", SERVING_NS)

    def restarts(pod: dict[str, Any]) -> int:
        statuses = pod.get("status", {}).get("containerStatuses", [])
        return sum(int(c.get("restartCount", 0)) for c in statuses)

    return {
        "pods": sorted((p["metadata"]["uid"], restarts(p)) for p in pods),
        "guest": [p["status"].get("phase") for p in pods if p["metadata"]["uid"] == guest_uid],
        "specs": _specs(),
    }


def _specs() -> dict[str, bytes]:
    from hvconform.targets.cluster.access import DirectAccess
    from hvconform.targets.realnode.nodes import NODE_CDI, recorded_nodes

    specs = {}
    for node in recorded_nodes():
        path = DirectAccess(node.name).local_path(str(NODE_CDI))
        assert path is not None
        for f in sorted(Path(path).glob("*")):
            specs[f"{node.name}/{f.name}"] = f.read_bytes()
    return specs


def test_sonobuoy_certifies_every_node_of_the_pool(pool: dict[str, Any]) -> None:
    api = _api(pool["kubeconfig"])
    nodes = _node_names(api)
    assert len(nodes) == pool["count"], nodes
    _device_views(nodes)
    objects = _deploy_plugin(api, pool["plugin"])
    deployed = _plugin_ds(objects)
    wait_for(lambda: all(_slots(n) > 0 for n in api.list_objects("v1", "Node")), WAIT_S,
             "the serving plugin ready with a slot on every node", interval=1.0)  # fmt: skip
    # a guest already serving on node 1, holding one slot
    from hvconform.targets.cluster.workloads import workload_pod

    guest = api.create(workload_pod("serving-guest", SERVING_NS, nodes[0], pool["guest"],
                                    "/dev/kvm", taint=False, guest=True))  # fmt: skip
    assert guest["metadata"]["uid"]
    guest_uid = guest["metadata"]["uid"]
    wait_for(lambda: (api.get("v1", "Pod", "serving-guest", SERVING_NS) or {}).get("status", {})
             .get("phase") == "Running", WAIT_S, "the serving guest running", interval=1.0)  # fmt: skip
    before = _serving_state(api, guest_uid)
    work = Path(pool["work"])
    times: dict[str, Any] = {}

    # one node, then every node: the same plugin, the same mode, measured in this test
    one = _plugin_file(pool, deployed, {"kubernetes.io/hostname": nodes[0]})
    times["one_node_s"], _ = _certify(pool, one, work / "one")
    every = _plugin_file(pool, deployed, {"hyperlight.dev/hypervisor": "kvm"})
    times["all_nodes_s"], tarball = _certify(pool, every, work / "all")
    times["nodes"] = len(nodes)

    verdicts = _results(pool, tarball)
    assert set(verdicts) >= set(nodes), verdicts
    for node in nodes:
        assert verdicts[node].get("validate-device") == "passed", verdicts[node]
        assert verdicts[node].get("validate-cdi-spec") == "passed", verdicts[node]
    report = work / "fleet"
    proc = _sh([sys.executable, "-m", "hvconform.cli", "fleet-report", str(tarball), "--out",
                str(report), "--expect-nodes", str(len(nodes))])  # fmt: skip
    fleet = json.loads((report / "fleet.json").read_text())
    assert {n["name"] for n in fleet["nodes"]} == set(nodes), fleet["nodes"]
    assert fleet["verdict"] == "passed" and proc.returncode == 0, fleet.get("verdict_reasons")
    costs = _costs(pool, tarball)
    assert set(costs) == set(nodes), costs
    times["per_node"] = costs

    after = _serving_state(api, guest_uid)
    assert after == before, "the validate mode changed the serving nodes"
    allocatable = {n["metadata"]["name"]: _slots(n) for n in api.list_objects("v1", "Node")}

    # a faulty node: its device view without kvm; named, and the others pass
    faulty = nodes[-1]
    _device_views([faulty], faulty=faulty)
    wait_for(lambda: _slots(api.get("v1", "Node", faulty) or {"status": {}}) == 0, WAIT_S,
             f"{faulty} reports no healthy device", interval=1.0)  # fmt: skip
    _, bad_tarball = _certify(pool, every, work / "faulty")
    bad = _results(pool, bad_tarball)
    assert bad[faulty].get("validate-device") == "failed", bad[faulty]
    for node in nodes[:-1]:
        assert bad[node].get("validate-device") == "passed", bad[node]
    proc = _sh([sys.executable, "-m", "hvconform.cli", "fleet-report", str(bad_tarball), "--out",
                str(work / "fleet-faulty")])  # fmt: skip
    failed = json.loads((work / "fleet-faulty" / "fleet.json").read_text())
    assert failed["verdict"] == "failed" and proc.returncode == 1
    assert {(f["node"], f["check"]) for f in failed["failures"]} >= {(faulty, "validate-device")}
    _device_views([faulty])
    times["ratio_all_to_one"] = round(times["all_nodes_s"] / times["one_node_s"], 3)
    times["allocatable_after"] = allocatable
    (work / "scale.json").write_text(json.dumps(times, indent=2))
    print("sonobuoy scale:", json.dumps(times))
    api.delete("v1", "Pod", "serving-guest", SERVING_NS, uid=guest_uid)
    api.delete("v1", "Namespace", SERVING_NS)
    api.close()
    for spec in yaml.safe_load_all(every.read_text()):
        assert spec["spec"]["imagePullPolicy"] == "IfNotPresent"
