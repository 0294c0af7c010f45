"""Every rendered object validates, offline, against the OpenAPI schemas of recent Kubernetes."""

from __future__ import annotations

import copy
import socket
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from tests.manifests.common import ALL_TARGETS, daemonset, objects, pod_spec

# 1.31 is the kindest/node the KIND target starts; AKS ran 1.35 and 1.36 in the seed reports.
VERSIONS = ("1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket opened while validating fails the test: the schemas must ship in the package."""

    def refuse(*args: Any, **kwargs: Any) -> socket.socket:
        raise AssertionError("schema validation tried to open a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def validate(obj: dict[str, Any], version: str) -> str:
    result: str = kubernetes_validate.validate(obj, version, strict=True)
    return result


def test_every_version_is_shipped() -> None:
    # validate() silently falls back to an older schema set; the versions must really be there.
    shipped = {v.rsplit(".", 1)[0] for v in all_versions()}
    assert set(VERSIONS) <= shipped, sorted(shipped)
    assert len(VERSIONS) >= 3


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("target", ALL_TARGETS)
def test_every_object_validates(target: str, version: str) -> None:
    objs = objects(target)
    assert [o["kind"] for o in objs] == ["Namespace", "Service", "DaemonSet", "DaemonSet"]
    for obj in objs:
        assert validate(obj, version) == version, f"{obj['kind']} used another schema version"


@pytest.mark.parametrize("version", VERSIONS)
def test_strict_schemas_reject_a_misspelt_field(version: str) -> None:
    """The check is not vacuous: an unknown field (a typo a reviewer could miss) fails."""
    ds = daemonset(objects("kind"), "hypervisor-plugin")
    sc = pod_spec(ds)["containers"][0]["securityContext"]
    sc["readOnlyRootFileSystem"] = sc.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        validate(ds, version)


def test_wrong_types_are_rejected() -> None:
    ds = copy.deepcopy(daemonset(objects("aks"), "device-access"))
    pod_spec(ds)["automountServiceAccountToken"] = "false"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(ds, VERSIONS[-1])


def test_older_clusters_lack_recursive_read_only() -> None:
    """recursiveReadOnly came in 1.30: older API servers refuse the manifests (strict apply)."""
    ds = daemonset(objects("kind"), "device-access")
    with pytest.raises(kubernetes_validate.ValidationError, match="recursiveReadOnly"):
        validate(ds, "1.29")
