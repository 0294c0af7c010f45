"""The kind target end to end against RECORDED CONTRACTS (fake kind/docker, API stand-in).

These runs prove the harness's commands, their order and its cleanup; they are never live results
(the cluster report carries environment.contract = true).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.node import CAP_GUEST, CAP_READ_STORM, CAP_SOCKET_REDIRECT
from hvconform.targets import build_plan
from hvconform.targets.cluster.kind import KindLifecycle
from hvconform.targets.cluster.lifecycle import Terminated
from hvconform.targets.cluster.plan import Step
from hvconform.targets.cluster.run import open_cluster
from tests.targets.conftest import FakeMetadata, Recorded, contract_options, recorded_objects

NODE = "hvconform-control-plane"


def kind_run(recorded: Recorded, meta: FakeMetadata | None = None, **kw: Any) -> tuple[Any, ...]:
    options = contract_options("kind", recorded.tmp, **kw)
    objects = recorded_objects(options.plugin_namespace)
    out = recorded.tmp / "out"
    lifecycle = KindLifecycle(options.validate(), objects, metadata=meta or FakeMetadata())
    cm = open_cluster(lifecycle, out_dir=out)
    return options, objects, out, cm


def planned_commands(steps: list[Step]) -> list[str]:
    """Every executable and node command of a plan, in the order the run must issue them."""
    arming = [s.arms for s in steps if s.phase == "setup" and s.arms]
    cleanup = [next(s for s in steps if s.id == i) for i in reversed(arming)]
    ordered = (
        [s for s in steps if s.phase == "setup"]
        + cleanup
        + [s for s in steps if s.phase == "verify"]
    )
    return [c for s in ordered for c in ([shlex.join(s.argv)] if s.argv else []) + list(s.node)]


def issued(recorded: Recorded) -> list[str]:
    return [shlex.join(argv) for argv in recorded.log]


def report(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "cluster-kind.json").read_text())
    return data


def test_kind_run_end_to_end_exact_commands_and_cleanup(recorded: Recorded) -> None:
    meta = FakeMetadata()
    options, objects, out, cm = kind_run(recorded, meta)
    with cm as node:
        assert node.name == "kind" and node.node_name == NODE
        assert node.capacity() == 2000 and node.allocatable() == 2000
        assert node.plugin_ready() and node.plugin_live()
        assert b'"hyperlight.dev/hypervisor"' in node.baseline_spec
        assert node.session_guest and node.long_guest_counter(node.session_guest) == 246
        allocation = node.allocate()
        assert allocation.ok and allocation.cdi_devices == ["hyperlight.dev/hypervisor=kvm"]
        outcome = node.run_guest(allocation)
        assert outcome.ok and outcome.value == 55
        node.release(allocation)
        before = node.plugin_instance()
        node.restart_plugin()
        assert node.plugin_instance() != before
        back = node.restart_kubelet(graceful=True)
        registered = node.last_registration_at()
        assert registered is not None and registered - back == pytest.approx(0.75, abs=1e-3)
        assert node.plugin_cpu_seconds() == pytest.approx(0.49)
        node.redirect_plugin_sockets(empty=True)
        node.redirect_plugin_sockets(empty=False)
        meta_now = node.host_device_metadata()
        assert meta_now == {
            "type": "char",
            "major": 10,
            "minor": 232,
            "mode": 0o660,
            "uid": 0,
            "gid": 104,
        }
        assert CAP_GUEST in node.capabilities and CAP_SOCKET_REDIRECT in node.capabilities
        assert CAP_READ_STORM not in node.capabilities  # declared honestly: not_applicable there
    kubeconfig = f"{options.workdir}/kubeconfig-kind-c0ffee01"
    assert recorded.commands("kind") == [
        "create cluster --name hvconform --config kind/cluster.yaml --image kindest/node:v1.31.0"
        f" --kubeconfig {kubeconfig} --wait 120s --retain",
        "load docker-image hv-device-plugin:0.1.0 --name hvconform",
        f"delete cluster --name hvconform --kubeconfig {kubeconfig}",
        "get clusters",
    ]
    plan = planned_commands(build_plan("kind", options, objects=objects))
    assert [c for c in issued(recorded) if c in plan] == plan
    puts = [r for r in recorded.kube.requests if r.startswith("PUT ")]
    assert len(puts) == 2, "socket redirect and restore replace the plugin DaemonSet"
    assert meta.calls == [
        ("snapshot_original", None),
        ("check_startup", "kvm:x:104:\n"),
        ("check_final", None),
    ]
    data = report(out)
    assert data["environment"]["contract"] is True and data["cleanup_ok"] is True
    assert data["verification"]["kind cluster deleted"]["ok"]
    assert recorded.run_objects() == []


def test_keep_cluster_deletes_objects_not_the_cluster(recorded: Recorded) -> None:
    _, _, out, cm = kind_run(recorded, keep_cluster=True)
    with cm:
        pass
    assert not [c for c in recorded.commands("kind") if c.startswith("delete")]
    data = report(out)
    assert data["verification"]["objects deleted"]["ok"] and recorded.run_objects() == []
    assert any("cluster kept" in n for n in data["notes"])


# Where each setup step is made to fail once: a command (fake executable, also node commands
# through docker exec), an API request (the stand-in answers 500), or the metadata helper.
KIND_FAULTS = {
    "metadata-snapshot": ("meta", ""),
    "kind-create": ("cmd", r"^kind create cluster"),
    "metadata-startup": ("cmd", r"^node getent group kvm"),
    "kind-load": ("cmd", r"^kind load docker-image"),
    "node-check": ("cmd", r"for d in /dev/kvm"),
    "node-prepare": ("cmd", r'mknod -m 0600 "/var/lib/hvconform/host-dev'),
    "namespaces": ("api", r"^POST /api/v1/namespaces$"),
    "dry-run": ("api", r"dryRun=All"),
    "apply": ("api", r"^POST /apis/apps/v1/namespaces/[^/]+/daemonsets$"),
    "rollout": ("api", r"^GET /apis/apps/v1/namespaces/[^/]+/daemonsets/"),
    "baseline": ("cmd", r"zz-unrelated-vendor\.json \S+$"),
}


def test_every_setup_step_has_a_fault(tmp_path: Path) -> None:
    options = contract_options("kind", tmp_path)
    steps = build_plan("kind", options, objects=recorded_objects(options.plugin_namespace))
    assert {s.id for s in steps if s.phase == "setup"} == set(KIND_FAULTS)


@pytest.mark.parametrize("failing", list(KIND_FAULTS))
def test_cleanup_runs_after_a_failure_at_every_step(recorded: Recorded, failing: str) -> None:
    how, regex = KIND_FAULTS[failing]
    meta = FakeMetadata(fail="snapshot" if how == "meta" else "")
    if how == "cmd":
        recorded.fail_command(regex)
    elif how == "api":
        recorded.fail_request(regex)
    options, objects, out, cm = kind_run(recorded, meta)
    with pytest.raises(Exception), cm:  # noqa: B017 - each step fails its own way
        pytest.fail("setup should have failed")
    steps = build_plan("kind", options, objects=objects)
    setup = [s for s in steps if s.phase == "setup"]
    reached = setup[: [s.id for s in setup].index(failing) + 1]
    armed = [s.arms for s in reached if s.arms]
    data = report(out)
    ran = [s for s in data["steps"] if s["phase"] != "setup"]
    assert [s["id"] for s in data["steps"] if s["phase"] == "setup"] == [s.id for s in reached]
    assert data["steps"][len(reached) - 1]["status"] == "failed"
    assert [s["id"] for s in ran if s["phase"] == "cleanup"] == list(reversed(armed))
    assert all(s["status"] == "ok" for s in ran), ran
    deleted = any(c.startswith("delete cluster") for c in recorded.commands("kind"))
    assert deleted == ("kind-delete" in armed)
    assert ("check_final", None) in meta.calls, "the final metadata check always runs"
    assert recorded.run_objects() == []


def test_sigterm_during_the_run_cleans_up_then_propagates(recorded: Recorded) -> None:
    _, _, out, cm = kind_run(recorded)
    with pytest.raises(Terminated), cm as node:
        os.kill(os.getpid(), signal.SIGTERM)
        node.capacity()  # the handler raises here at the latest
    assert any(c.startswith("delete cluster") for c in recorded.commands("kind"))
    assert report(out)["cleanup_ok"] and recorded.run_objects() == []


def test_sigterm_during_cleanup_is_held_until_cleanup_is_done(recorded: Recorded) -> None:
    recorded.mp.setenv("HV_FAKE_SIGTERM", r"^kind delete cluster")
    _, _, out, cm = kind_run(recorded)
    with pytest.raises(Terminated), cm:
        pass
    assert recorded.commands("kind")[-1] == "get clusters", "verification ran after the signal"
    assert report(out)["cleanup_ok"]


def test_a_failing_check_still_cleans_up(recorded: Recorded) -> None:
    _, _, out, cm = kind_run(recorded)
    with pytest.raises(AssertionError, match="scenario failed"), cm:
        raise AssertionError("scenario failed")
    assert report(out)["cleanup_ok"] and recorded.run_objects() == []


def test_a_failed_create_exports_the_node_logs_before_deleting(recorded: Recorded) -> None:
    """kind create runs with --retain, so the failed node's logs can be exported; the error says
    where they are (the real failure is in the kubelet's log, not in kind's stack trace)."""
    recorded.fail_command(r"^kind create cluster")
    options, _, out, cm = kind_run(recorded)
    with pytest.raises(Exception, match=r"node logs (in|could not)"), cm:
        pytest.fail("setup should have failed")
    kind = recorded.commands("kind")
    export = next(i for i, c in enumerate(kind) if c.startswith("export logs"))
    delete = next(i for i, c in enumerate(kind) if c.startswith("delete cluster"))
    assert export < delete and f"--name {options.cluster_name}" in kind[export]
    assert report(out)["cleanup_ok"]
