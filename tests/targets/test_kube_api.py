"""KubeApi (the official client underneath) against the recorded-contract API stand-in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hvconform.targets.cluster.deploy import blocked_by_policy
from hvconform.targets.cluster.kube import ApiError, KubeApi, plural, resource_path
from tests.targets.fake_kube import FakeKube
from tests.targets.fakes import CONTRACTS, load_rules


@pytest.fixture
def api(tmp_path: Path) -> Any:
    data = json.loads((CONTRACTS / "kube.json").read_text())
    with FakeKube({**data["kind"], "logs": data["logs"]}, load_rules("kind")) as kube:
        client = KubeApi(str(kube.kubeconfig(tmp_path / "kubeconfig")))
        yield client, kube
        client.close()


def test_paths() -> None:
    assert resource_path("v1", "Namespace", "ignored", "a") == "/api/v1/namespaces/a"
    assert resource_path("apps/v1", "DaemonSet", "ns") == "/apis/apps/v1/namespaces/ns/daemonsets"
    assert (plural("PriorityClass"), plural("NetworkPolicy")) == (
        "priorityclasses",
        "networkpolicies",
    )


def test_create_get_list_replace_delete(
    api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, kube = api
    monkeypatch.setenv("HV_FAKE_LOG", str(tmp_path / "log"))
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}}
    assert client.create(ns, dry_run=True)["metadata"]["name"] == "t"
    assert client.get("v1", "Namespace", "t") is None, "a dry run stores nothing"
    created = client.create(ns)
    assert created["metadata"]["uid"] and client.get("v1", "Namespace", "t")
    with pytest.raises(ApiError) as conflict:
        client.create(ns)
    assert conflict.value.status == 409 and conflict.value.reason == "AlreadyExists"
    assert [
        n["metadata"]["name"]
        for n in client.list_objects("v1", "Node", labels="hyperlight.dev/hypervisor=kvm")
    ] == ["hvconform-control-plane"]
    assert client.replace({**ns, "metadata": {"name": "t", "labels": {"a": "b"}}})["metadata"][
        "labels"
    ] == {"a": "b"}
    assert client.delete("v1", "Namespace", "t") and not client.delete("v1", "Namespace", "t")
    assert "POST /api/v1/namespaces?dryRun=All" in kube.requests
    assert "DELETE /api/v1/namespaces/t?propagationPolicy=Foreground" in kube.requests


def test_exec_proxy_and_logs(api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client, kube = api
    monkeypatch.setenv("HV_FAKE_LOG", str(tmp_path / "log"))
    meta = {"name": "p", "namespace": "d", "labels": {"hvconform/role": "guest"}}
    spec = {"nodeName": "n", "containers": [{"name": "c"}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    client.create(pod)
    ok = client.exec("d", "p", ["getent", "group", "kvm"])
    assert (ok.rc, ok.stdout) == (0, b"kvm:x:104:\n")
    missing = client.exec("d", "p", ["nothing-recorded-for-this"])
    assert missing.rc == 97 and b"no recorded output" in missing.stderr, "exit codes travel"
    assert kube.execs[0] == ["getent", "group", "kvm"]
    assert client.pod_proxy("d", "p", 8080, "/readyz") == 200
    assert '"value": 55' in client.pod_log("d", "p", "c")


def test_policy_refusals_are_told_apart_from_broken_manifests() -> None:
    assert blocked_by_policy(ApiError(403, "Forbidden", 'admission webhook "x" denied the request'))
    assert blocked_by_policy(
        ApiError(422, "Invalid", "ValidatingAdmissionPolicy 'p' denied request")
    )
    assert not blocked_by_policy(
        ApiError(422, "Invalid", "spec.containers[0].image: Required value")
    )
