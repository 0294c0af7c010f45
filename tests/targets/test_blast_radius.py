"""What a run may apply on a user's cluster, and that it deletes exactly what it created.

The gate is exercised on objects as profiles write them, the CLI as a user runs it (`--dry-run`,
exit codes, one line), and the deployer and `hvconform cleanup` against the recorded-contract
API stand-in (tests/targets/fake_kube.py: discovery, generated names and UID preconditions
answered as a real API server does). The live half is tests/realnode/test_cluster_safety_live.py.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.deploy import table_namespaced
from hvconform.manifests.blast import Refused, gate
from hvconform.targets.cluster.deploy import Deployer
from hvconform.targets.cluster.kube import KubeApi, ResourceInfo, UnsafePath, table_resource
from hvconform.targets.cluster.sweep import sweep
from hvconform.targets.cluster.workloads import MANAGED, RUN_ID_LABEL
from tests.targets.conftest import contract_options
from tests.targets.fake_kube import FakeKube
from tests.targets.fakes import CONTRACTS, load_rules

ROOT = Path(__file__).resolve().parents[2]
KUBECONFIG = ROOT / "fixtures" / "plans" / "kubeconfig.yaml"
GO_KVM = ROOT / "fixtures" / "plugins" / "go-kvm"
NS = "hvconform-run1"


def _obj(api_version: str, kind: str, name: str, **rest: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, **rest}


def _ds(name: str, **pod: Any) -> dict[str, Any]:
    spec = {"containers": [{"name": "c", "image": "x:1"}], **pod}
    return _obj("apps/v1", "DaemonSet", name, spec={"template": {"metadata": {}, "spec": spec}})


def _binding(role: str, *subjects: dict[str, str], name: str = "b") -> dict[str, Any]:
    return _obj(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        name,
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        subjects=list(subjects),
    )


SA = {"kind": "ServiceAccount", "name": "p", "namespace": "kube-system"}
OWN_ROLE = _obj(
    "rbac.authorization.k8s.io/v1",
    "ClusterRole",
    "own",
    rules=[{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get"]}],
)
WIDE = {
    "cluster-admin to system:authenticated": _binding(
        "cluster-admin", {"kind": "Group", "name": "system:authenticated"}
    ),
    "a built-in role": _binding("view", SA),
    "a mutating webhook": _obj(
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        "w",
        webhooks=[
            {
                "name": "w.example.com",
                "failurePolicy": "Fail",
                "clientConfig": {"url": "https://attacker.example.com/"},
            }
        ],
    ),
    "a CRD": _obj("apiextensions.k8s.io/v1", "CustomResourceDefinition", "ws.example.com"),
    "an APIService": _obj("apiregistration.k8s.io/v1", "APIService", "v1.example.com"),
    "a Node": _obj("v1", "Node", "n1"),
    "a PersistentVolume": _obj("v1", "PersistentVolume", "pv"),
    "hostPID": _ds("d", hostPID=True),
    "hostNetwork": _ds("d", hostNetwork=True),
    "hostPath /": _ds("d", volumes=[{"name": "r", "hostPath": {"path": "/"}}]),
    "hostPath //etc/": _ds("d", volumes=[{"name": "r", "hostPath": {"path": "//etc/"}}]),
    "a wildcard ClusterRole": _obj(
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        "star",
        rules=[{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    ),
    "a policy on pods": _obj(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "p",
        spec={"matchConstraints": {"resourceRules": [{"apiGroups": [""], "resources": ["pods"]}]}},
    ),
}


@pytest.mark.parametrize("case", list(WIDE))
def test_wider_objects_are_refused_unless_named(case: str) -> None:
    obj = WIDE[case]
    with pytest.raises(Refused) as refused:
        gate([copy.deepcopy(obj)], namespace=NS, namespaced=table_namespaced)
    line = str(refused.value)
    assert "\n" not in line and "--allow-object" in line and obj["kind"] in line
    key = f"{obj['kind']}/{obj['metadata']['name']}"
    allowed = gate([copy.deepcopy(obj)], namespace=NS, allowed=[key], namespaced=table_namespaced)
    assert [o["kind"] for o in allowed.objects] == [obj["kind"]]
    assert allowed.opted_in and allowed.opted_in[0].startswith(key + ": ")


def test_what_a_plugin_needs_passes_and_is_listed() -> None:
    objects = [
        OWN_ROLE,
        _binding("own", SA),
        _obj("resource.k8s.io/v1", "DeviceClass", "hv"),
        _ds("plugin", volumes=[{"name": "d", "hostPath": {"path": "/dev"}}]),
        _obj("v1", "ServiceAccount", "p"),
    ]
    gated = gate(copy.deepcopy(objects), namespace=NS, namespaced=table_namespaced)
    assert gated.opted_in == []
    assert gated.cluster_scoped == ["ClusterRole own", "ClusterRoleBinding b", "DeviceClass hv"]
    binding = next(o for o in gated.objects if o["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == NS, "its ServiceAccount moved with it"


@pytest.mark.parametrize("name", ["kube-system", "default", NS])
def test_a_profiles_namespace_is_replaced_never_applied(name: str) -> None:
    gated = gate(
        [_obj("v1", "Namespace", name), _ds("plugin")], namespace=NS, namespaced=table_namespaced
    )
    assert [o["kind"] for o in gated.objects] == ["DaemonSet"]
    assert any(f"Namespace {name}" in n and "replaced" in n for n in gated.notes)


def test_an_opt_in_that_names_nothing_is_refused() -> None:
    with pytest.raises(Refused, match="names no object"):
        gate(
            [_ds("plugin")], namespace=NS, allowed=["DaemonSet/plugn"], namespaced=table_namespaced
        )


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "%2e", "x\ny", "a" * 254])
def test_no_path_without_one_objects_name_can_be_built(name: str, tmp_path: Path) -> None:
    info = ResourceInfo(
        "rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False
    )
    with pytest.raises(UnsafePath):
        info.item(name)
    with pytest.raises(UnsafePath):
        table_resource("v1", "Pod").item("p", "")  # a namespaced kind without its namespace
    data = json.loads((CONTRACTS / "kube.json").read_text())
    with FakeKube({**data["kind"], "logs": data["logs"]}, load_rules("kind")) as kube:
        api = KubeApi(str(kube.kubeconfig(tmp_path / "kubeconfig")))
        try:
            with pytest.raises(UnsafePath):
                api.delete(info.api_version, info.kind, name, uid="u")
        finally:
            api.close()
    assert not [r for r in kube.requests if r.startswith("DELETE")], "no request was sent"


def _profile(tmp_path: Path, extra: list[dict[str, Any]]) -> Path:
    """The go-kvm fixture's profile, its cluster DaemonSet plus `extra` objects."""
    profile = tmp_path / "p"
    shutil.copytree(GO_KVM / "deploy", profile / "deploy")
    (profile / "deploy" / "extra.yaml").write_text(yaml.safe_dump_all(extra))
    data = yaml.safe_load((GO_KVM / "profile.yaml").read_text())
    data["command"] = ["/bin/true"]
    data["deploy"]["manifests"]["*"] = ["deploy/daemonset-cluster.yaml", "deploy/extra.yaml"]
    (profile / "profile.yaml").write_text(yaml.safe_dump(data))
    return profile / "profile.yaml"


def _dry_run(profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "hvconform.cli",
        "run",
        "--target",
        "cluster",
        "--kubeconfig",
        str(KUBECONFIG),
        "--node",
        "n1",
        "--plugin-profile",
        str(profile),
        "--dry-run",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


GENERATED_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "", "generateName": "go-kvm-"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
    "subjects": [{"kind": "ServiceAccount", "name": "go-kvm", "namespace": "hyperlight-system"}],
}


def test_the_issues_generate_name_binding_is_refused_then_deleted_by_its_own_name(
    tmp_path: Path,
) -> None:
    profile = _profile(tmp_path, [GENERATED_BINDING])
    refused = _dry_run(profile)
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert "ClusterRoleBinding/go-kvm-" in refused.stderr and refused.stdout == ""
    allowed = _dry_run(profile, "--allow-object", "ClusterRoleBinding/go-kvm-")
    assert allowed.returncode == 0, allowed.stderr
    deletes = [line for line in allowed.stdout.splitlines() if "DELETE " in line]
    assert deletes, allowed.stdout
    for line in deletes:
        path = line.split("DELETE ", 1)[1].split("?", 1)[0]
        assert not path.endswith(("/clusterrolebindings", "/daemonsets", "/namespaces")), line
    assert any("clusterrolebindings/<go-kvm-" in line for line in deletes)
    assert "# opted in (--allow-object): ClusterRoleBinding/go-kvm-" in allowed.stdout
    assert "/api/v1/namespaces/kube-system" not in allowed.stdout, "the profile's own namespace"


@pytest.mark.parametrize("ns", ["kube-system", "default"])
def test_a_profiles_system_namespace_is_never_planned_for_deletion(ns: str, tmp_path: Path) -> None:
    profile = _profile(
        tmp_path, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}]
    )
    done = _dry_run(profile)
    assert done.returncode == 0, done.stderr
    assert f"/api/v1/namespaces/{ns}?" not in done.stdout
    assert f"/api/v1/namespaces/{ns} " not in done.stdout


@pytest.fixture
def kube(tmp_path: Path) -> Any:
    data = json.loads((CONTRACTS / "kube.json").read_text())
    with FakeKube({**data["kind"], "logs": data["logs"]}, load_rules("kind")) as fake:
        api = KubeApi(str(fake.kubeconfig(tmp_path / "kubeconfig")))
        api.stamp = {RUN_ID_LABEL: "run-1", **MANAGED}
        yield fake, api
        api.close()


def test_the_deployer_deletes_exactly_what_the_server_made(kube: Any, tmp_path: Path) -> None:
    fake, api = kube
    api.stamp = {}
    api.create(_binding("view", SA, name="theirs"))  # someone else's, before the run
    api.stamp = {RUN_ID_LABEL: "run-1", **MANAGED}
    theirs = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/theirs"
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {**copy.deepcopy(GENERATED_BINDING), "subjects": [{**SA, "namespace": NS}]},
        {**OWN_ROLE, "metadata": {"name": "", "generateName": "own-"}},
    ]
    options = contract_options("cluster", tmp_path, kubeconfig=str(tmp_path / "kubeconfig"))
    deployer = Deployer(lambda: api, options, objects)
    deployer.create_namespaces([])
    deployer.apply()
    made = {m.kind: m for m in deployer.created}
    assert made["ClusterRoleBinding"].name.startswith("go-kvm-") and made["ClusterRoleBinding"].uid
    ledger = [json.loads(line) for line in deployer.ledger.read_text().splitlines()]
    assert [entry["uid"] for entry in ledger] == [m.uid for m in deployer.created]
    # someone re-makes the role under the run's name: the UID precondition keeps it
    role_path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{made['ClusterRole'].name}"
    fake.state.objects[role_path]["metadata"]["uid"] = "someone-elses"
    deployer.delete_all()
    assert role_path in fake.state.objects, "an object under our name but not our UID is kept"
    assert f"/api/v1/namespaces/{NS}" not in fake.state.objects
    assert theirs in fake.state.objects
    deletes = [r for r in fake.requests if r.startswith("DELETE")]
    assert all(r.split("?")[0].rsplit("/", 1)[-1] for r in deletes)
    assert len(deletes) == 3


def test_cleanup_of_a_killed_run_removes_its_labelled_objects_only(kube: Any) -> None:
    fake, api = kube
    api.stamp = {}
    api.create(_obj("rbac.authorization.k8s.io/v1", "ClusterRole", "pre-existing"))
    api.create(_obj("v1", "Namespace", "other"))
    api.stamp = {RUN_ID_LABEL: "other-run", **MANAGED}
    api.create(_obj("v1", "Namespace", "other-run-ns"))
    before = set(fake.state.objects)
    api.stamp = {RUN_ID_LABEL: "run-1", **MANAGED}
    api.create(_obj("v1", "Namespace", NS))
    api.create({**OWN_ROLE, "metadata": {"name": "", "generateName": "own-"}})
    api.create(_obj("v1", "ConfigMap", "c", metadata={"name": "c", "namespace": NS}))
    assert len(set(fake.state.objects) - before) == 3
    listed = sweep(api, "run-1", dry_run=True)
    assert len(listed.found) == 3 and listed.kinds_listed >= 20
    swept = sweep(api, "run-1", timeout=5)
    assert swept.left == [] and len(swept.deleted) == 3
    assert set(fake.state.objects) == before, "only the run's labelled objects went"


WIDGET = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}


def test_a_dry_run_against_a_cluster_takes_scope_from_its_discovery(
    kube: Any, tmp_path: Path
) -> None:
    """Widget (a CRD's kind) is cluster-scoped on this cluster: the table would have moved it
    into the run's namespace; the cluster's own discovery makes it a cluster-wide object, which
    the gate refuses."""
    fake, _ = kube
    profile = _profile(tmp_path, [WIDGET])
    config = str(tmp_path / "kubeconfig")
    argv = [sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster",
            "--kubeconfig", config, "--node", "n1", "--plugin-profile", str(profile),
            "--dry-run"]  # fmt: skip
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr
    assert "cluster-scoped Widget" in refused.stderr and "Traceback" not in refused.stderr
    allowed = subprocess.run(
        [*argv, "--allow-object", "Widget/w"], capture_output=True, text=True, timeout=120
    )
    assert allowed.returncode == 0, allowed.stderr
    assert "the cluster's own (its discovery)" in allowed.stdout
    assert "DELETE /apis/example.com/v1/widgets/w?" in allowed.stdout
    assert not [r for r in fake.requests if not r.startswith("GET")], "a dry run only reads"
    # the table alone (no cluster) plans it namespaced; the real run refuses it at apply
    table = _dry_run(profile)
    assert table.returncode == 0 and "built-in table" in table.stdout
    assert "/namespaces/" in next(x for x in table.stdout.splitlines() if "widgets" in x)


def test_the_run_refuses_an_object_whose_scope_differs_from_the_plan(
    kube: Any, tmp_path: Path
) -> None:
    from hvconform.contract.results import EnvironmentBlocked

    _, api = kube
    options = contract_options("cluster", tmp_path, kubeconfig=str(tmp_path / "kubeconfig"))
    planned = {**WIDGET, "metadata": {"name": "w", "namespace": NS}}  # as the table placed it
    deployer = Deployer(lambda: api, options, [planned])
    with pytest.raises(EnvironmentBlocked, match="planned as namespaced"):
        deployer.apply()
    assert deployer.created == []
