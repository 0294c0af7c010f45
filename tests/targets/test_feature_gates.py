"""The feature gates a run's environment names (hvconform.contract.featuregates): the parser
against the metric text a real v1.37.2 API server answered (fixtures/metrics), the cluster
family's reading (API server /metrics, the kubelet's through the node proxy, kind's config), the
report's rows, and a recorded-contract kind run whose components refuse: the run goes on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract import featuregates as fg
from hvconform.contract.results import FEATURE_GATES_FILE
from hvconform.report import env_facts
from hvconform.targets.cluster.kind import KindLifecycle, config_gates
from hvconform.targets.cluster.kube import ApiError
from hvconform.targets.cluster.preflight import record_feature_gates
from hvconform.targets.cluster.run import open_cluster
from tests.targets.conftest import FakeMetadata, Recorded, contract_options, recorded_objects

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = (ROOT / "fixtures" / "metrics" / "kubernetes_feature_enabled-v1.37.2.txt").read_text()
SAMPLES = [ln for ln in SAMPLE.splitlines() if ln.startswith(fg.METRIC + "{")]


def test_the_real_v1_37_2_sample_reads_as_the_defaults() -> None:
    gates = fg.enabled(SAMPLE)
    assert gates["DynamicResourceAllocation"] == "on (GA)"  # stage "" is GA
    assert gates["DRAExtendedResource"] == "on (GA)"
    assert gates["DRADeviceTaints"] == "on (GA)"
    assert gates["DRAConsumableCapacity"] == "on (BETA)"
    assert gates["ResourceHealthStatus"] == "on (BETA)"
    assert gates["DRADerivedAttributes"] == "off (ALPHA)"
    assert gates["DRAWorkloadResourceClaims"] == "off (BETA)"  # a beta gate off by default
    assert gates["KubeletPodResourcesListUseActivePods"] == "on (DEPRECATED)"
    assert "APIResponseCompression" not in gates  # not a gate the report names
    assert list(gates) == sorted(gates)
    wanted = [ln for ln in SAMPLES if ln.split('"')[1].startswith(fg.GATES_REPORTED)]
    assert len(gates) == len(wanted) == 26


def test_every_gate_of_the_sample_is_read_with_an_empty_prefix() -> None:
    assert len(fg.enabled(SAMPLE, ("",))) == len(SAMPLES) == 254


def test_label_order_extra_labels_timestamps_and_float_values() -> None:
    text = "\n".join([
        "# TYPE kubernetes_feature_enabled gauge",
        'kubernetes_feature_enabled{stage="BETA",name="DRAOne"} 1',
        'kubernetes_feature_enabled{name="DRATwo",stage="ALPHA",component="x"} 0.0 1700000000000',
        'kubernetes_feature_enabled{name="DRAThree",stage=""} 1e+00',
        'kubernetes_feature_enabled{name="DRANaN",stage="BETA"} not-a-number',
        'kubernetes_feature_enabled_other{name="DRAOther",stage="BETA"} 1',
        'apiserver_request_total{name="DRAFour",stage="BETA"} 1',
    ])  # fmt: skip
    assert fg.enabled(text) == {
        "DRAOne": "on (BETA)",
        "DRAThree": "on (GA)",
        "DRATwo": "off (ALPHA)",
    }


def test_text_without_the_metric_is_a_reason_never_an_empty_answer() -> None:
    with pytest.raises(fg.NoGateMetric):
        fg.enabled("ok\n")
    said = fg.read(lambda: "ok\n")
    assert set(said) == {fg.UNREAD} and fg.METRIC in said[fg.UNREAD]


def test_a_failed_read_is_one_bounded_line() -> None:
    def refused() -> str:
        raise ApiError(403, "Forbidden", 'nodes "n" is forbidden:\n' + "x" * 500)

    said = fg.read(refused)[fg.UNREAD]
    assert said.startswith("ApiError: 403 Forbidden") and "\n" not in said
    assert len(said) <= 200


def test_the_file_holds_the_kubelet_part_only_when_read(tmp_path: Path) -> None:
    fg.record(tmp_path, {}, {"DRAOne": "on (BETA)"})
    data = json.loads((tmp_path / FEATURE_GATES_FILE).read_text())
    assert data == {fg.SET_BY_TARGET: {}, fg.API_SERVER: {"DRAOne": "on (BETA)"}}
    fg.record(tmp_path / "new", {"DRAOne": True}, {}, fg.unread("gone"), "n1")
    data = json.loads((tmp_path / "new" / FEATURE_GATES_FILE).read_text())
    assert data[fg.KUBELET] == {fg.UNREAD: "gone"} and data[fg.KUBELET_NODE] == "n1"


class _Api:
    """KubeApi.text as the cluster family calls it: the API server refuses its /metrics."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def text(self, path: str) -> str:
        self.asked.append(path)
        if path == "/metrics":
            raise ApiError(403, "Forbidden", "forbidden: User cannot get path /metrics")
        return SAMPLE


def test_the_cluster_family_reads_the_kubelet_through_the_node_proxy(tmp_path: Path) -> None:
    api = _Api()
    record_feature_gates(api, "n1", {"DRAOne": True}, tmp_path)  # type: ignore[arg-type]
    assert api.asked == ["/api/v1/nodes/n1/proxy/metrics", "/metrics"]
    data = json.loads((tmp_path / FEATURE_GATES_FILE).read_text())
    assert data[fg.SET_BY_TARGET] == {"DRAOne": True}
    assert "403 Forbidden" in data[fg.API_SERVER][fg.UNREAD]
    assert data[fg.KUBELET]["DRAExtendedResource"] == "on (GA)"
    assert data[fg.KUBELET_NODE] == "n1"
    record_feature_gates(api, "", {}, tmp_path)  # type: ignore[arg-type]
    data = json.loads((tmp_path / FEATURE_GATES_FILE).read_text())
    assert data[fg.KUBELET] == fg.unread("no node under test named")


def test_kind_sets_what_its_config_sets(tmp_path: Path) -> None:
    assert config_gates(str(ROOT / "kind" / "cluster.yaml")) == {}  # the shipped config: none
    config = tmp_path / "gates.yaml"
    config.write_text("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n"
                      "featureGates:\n  DRADeviceTaints: false\n  DRAAdminAccess: true\n")  # fmt: skip
    assert config_gates(str(config)) == {"DRADeviceTaints": False, "DRAAdminAccess": True}
    said = config_gates(str(tmp_path / "gone.yaml"))
    assert set(said) == {fg.UNREAD} and "cannot read" in said[fg.UNREAD]


def test_the_report_names_each_component_and_why_one_is_unread() -> None:
    rows = dict(
        env_facts.rows({
            "feature_gates": {
                fg.SET_BY_TARGET: {},
                fg.API_SERVER: fg.unread("ApiError: 403 Forbidden"),
                fg.KUBELET: {"DRAExtendedResource": "on (GA)"},
                fg.KUBELET_NODE: "n1",
            }
        })
    )  # fmt: skip
    assert rows["Feature gates set"] == "none: the Kubernetes version's defaults"
    assert rows["Feature gates (API server)"] == "not read: ApiError: 403 Forbidden"
    assert rows["Feature gates (kubelet of n1)"] == "DRAExtendedResource on (GA)"


def test_a_kind_run_whose_components_refuse_still_runs(recorded: Recorded) -> None:
    """The API stand-in answers 403 to /metrics and "ok" through the node proxy: both reasons
    are recorded, the node comes up and its cleanup is verified as ever."""
    recorded.fail_request(r"^GET /metrics$", 403)
    options = contract_options("kind", recorded.tmp).validate()
    objects = recorded_objects(options.plugin_namespace)
    lifecycle = KindLifecycle(options, objects, metadata=FakeMetadata())
    out = recorded.tmp / "out"
    with open_cluster(lifecycle, out_dir=out) as node:
        assert node.allocatable() > 0
    data: dict[str, Any] = json.loads((out / FEATURE_GATES_FILE).read_text())
    assert data[fg.SET_BY_TARGET] == {}  # kind/cluster.yaml sets none
    assert data[fg.API_SERVER][fg.UNREAD].startswith("ApiError: 403")
    assert fg.METRIC in data[fg.KUBELET][fg.UNREAD]
    assert data[fg.KUBELET_NODE] == lifecycle.node_name
    assert lifecycle.report.cleanup_ok
