"""Issue 26 on cluster targets without a cluster: node-reboot on a cluster the run did not create
only with --allow-node-reboot (named in the plan, carried typed in the run context,
not_applicable with that reason otherwise), and the kubelet's records read typed (pod-resources
protobuf, the device checkpoint).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hvconform.contract.node import CAP_NODE_REBOOT, require
from hvconform.contract.plugin import resolve as resolve_plugin
from hvconform.contract.results import NotApplicable
from hvconform.contract.runcontext import RunContext
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.access import (
    CommandRunner,
    DirectAccess,
    DockerExecAccess,
    PodExecAccess,
)
from hvconform.targets.cluster.kube import ExecResult
from hvconform.targets.cluster.podresources import NodePodResources, _devices, checkpoint_pods
from hvconform.targets.cluster.reboot import KUBELET_FDS, AllocatableSampler, ClusterNodeFaults
from tests.targets.conftest import RUN_ID
from tests.targets.test_cluster_target import KUBECONFIG, options

RESOURCE = "hyperlight.dev/hypervisor"


def _plan(*extra: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "hvconform.cli", "run", "--target", "cluster", "--node",
         "hv-node-7", "--kubeconfig", str(KUBECONFIG), "--dry-run", *extra],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


def test_the_dry_run_plan_names_the_node_a_reboot_is_allowed_on() -> None:
    allowed = [ln for ln in _plan("--allow-node-reboot").splitlines() if "node-reboot" in ln]
    assert len(allowed) == 1, allowed
    assert "hv-node-7" in allowed[0] and "EVERY pod sandbox" in allowed[0]
    assert "node-reboot" not in _plan()  # without the flag: nothing of the kind planned


def test_the_opt_in_travels_typed_in_the_run_context(tmp_path: Path) -> None:
    ctx = RunContext(
        run_id=RUN_ID,
        out_dir=str(tmp_path),
        target="cluster",
        plugin=resolve_plugin(),
        options=options(allow_node_reboot=True),
    )
    back = RunContext.from_json(json.loads(json.dumps(ctx.to_json())))
    assert back.cluster is not None and back.cluster.allow_node_reboot is True
    assert options().allow_node_reboot is False  # off unless asked for


def _node(access: Any, **kw: Any) -> Any:
    return SimpleNamespace(options=options(**kw), node_name="hv-node-7", access=access, inside=None)


def _reason(node: Any) -> str:
    return ClusterNodeFaults.reboot_reason(node)


def test_a_cluster_the_run_did_not_create_is_rebooted_only_when_the_user_opted_in() -> None:
    direct = DirectAccess("hv-node-7")
    refused = _reason(_node(direct))
    assert "--allow-node-reboot" in refused and "hv-node-7" in refused
    assert _reason(_node(direct, allow_node_reboot=True)) == ""
    # the nodes kind creates are rebooted without asking
    docker = DockerExecAccess(CommandRunner(), "hvt-control-plane")
    assert _reason(_node(docker, target="kind")) == ""


def test_a_reboot_is_not_made_through_an_exec_the_reboot_would_cut() -> None:
    pod = PodExecAccess(api=None, namespace="hvconform-diag-x", pod="hvconform-diag")  # type: ignore[arg-type]
    reason = _reason(_node(pod, allow_node_reboot=True))
    assert "rides on the kubelet" in reason


def test_a_capability_left_out_says_why_in_the_not_applicable_reason() -> None:
    node = SimpleNamespace(
        name="cluster",
        capabilities=frozenset(),
        capability_notes={CAP_NODE_REBOOT: "opt in with --allow-node-reboot"},
    )
    with pytest.raises(NotApplicable, match=r"lacks node-reboot \(node-reboot: opt in with"):
        require(node, CAP_NODE_REBOOT)
    bare = SimpleNamespace(name="local", capabilities=frozenset())
    with pytest.raises(NotApplicable, match=r"lacks node-reboot$"):
        require(bare, CAP_NODE_REBOOT)


def _ld(num: int, payload: bytes) -> bytes:
    return bytes([num << 3 | 2, len(payload)]) + payload


def test_pod_resources_devices_are_read_for_the_resource_only() -> None:
    ours = _ld(1, RESOURCE.encode()) + _ld(2, b"dev-1") + _ld(2, b"dev-0")
    other = _ld(1, b"example.com/gpu") + _ld(2, b"gpu-0")
    answer = _ld(1, ours) + _ld(1, other)
    assert _devices(answer, 1, RESOURCE) == ("dev-0", "dev-1")


def test_the_checkpoint_names_the_pods_holding_the_resource() -> None:
    data = {
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": "u1", "ContainerName": "guest", "ResourceName": RESOURCE},
                {"PodUID": "u2", "ContainerName": "c", "ResourceName": "example.com/gpu"},
            ],
            "RegisteredDevices": {RESOURCE: ["a", "b"]},
        },
        "Checksum": 1,
    }
    assert checkpoint_pods(json.dumps(data).encode(), RESOURCE) == {"u1"}
    assert checkpoint_pods(None, RESOURCE) == set()


def test_the_kubelets_connections_to_the_plugins_socket_are_found_by_inode(
    tmp_path: Path,
) -> None:
    """KUBELET_FDS on `ss -xpn` as the v1.37.2 kind node prints it: the plugin's accepted
    socket (its path, its peer's inode) names the kubelet's fd; another plugin's (the
    device-access one, another process) and the kubelet's other sockets do not."""
    me = os.getpid()  # the "plugin": a process of this PID namespace
    ss = tmp_path / "ss"
    lines = [
        'u_str ESTAB 0 0 * 3739793 * 3739794 users:(("kubelet",pid=583,fd=11))',
        "u_str ESTAB 0 0 /var/lib/kubelet/device-plugins/hyperlight-access-f6.sock 3787761 "
        '* 3787760 users:(("hv-device-plugi",pid=999999,fd=22))',
        "u_str ESTAB 0 0 /var/lib/kubelet/device-plugins/hyperlight-10.sock 3789133 * 3788715 "
        f'users:(("hv-device-plugi",pid={me},fd=24))',
        'u_str ESTAB 0 0 * 3788715 * 3789133 users:(("kubelet",pid=583,fd=26))',
        'u_str ESTAB 0 0 * 3787760 * 3787761 users:(("kubelet",pid=583,fd=24))',
    ]
    ss.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    ss.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["sh", "-c", KUBELET_FDS, "sh", str(me), "/var/lib/kubelet/device-plugins"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout  # fmt: skip
    assert out.split() == ["583", "26"]


class _Allocatable:
    def __init__(self) -> None:
        self.answers = [("a", "b"), ("a", "b"), (), ("a", "b")]

    def allocatable(self) -> tuple[str, ...]:
        if len(self.answers) > 1:
            return self.answers.pop(0)
        return self.answers[0]


def test_the_sampler_records_each_change_of_the_kubelets_count() -> None:
    sampler = AllocatableSampler(_Allocatable())  # type: ignore[arg-type]
    try:
        wait_for(lambda: len(sampler.changes) >= 3, 10, "three changes sampled", 0.01)
    finally:
        sampler.stop()
    counts = [n for _, n in sampler.changes]
    assert counts == [2, 0, 2]
    times = [t for t, _ in sampler.changes]
    assert times == sorted(times)


def test_the_stdlib_grpc_call_reads_what_a_grpc_server_answers(tmp_path: Path) -> None:
    """H2_CALL (what the node or the diagnostic pod runs when this machine cannot reach the
    kubelet's socket) against a real gRPC server: the answer's bytes, exactly; a method the
    server refuses is an error, never an empty answer."""
    from concurrent import futures

    import grpc

    ours = _ld(1, RESOURCE.encode()) + b"".join(
        _ld(2, f"dev-{i:04d}".encode()) for i in range(8000)
    )
    answer = b"\x0a" + _varint_bytes(len(ours)) + ours  # field 1, length-delimited

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        return answer

    rpc = grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=lambda b: b, response_serializer=lambda b: b
    )
    service = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister", {"GetAllocatableResources": rpc}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[service])
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:

        def run(argv: list[str]) -> ExecResult:
            proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, timeout=30)
            return ExecResult(proc.returncode, proc.stdout, proc.stderr)

        client = NodePodResources(run, str(sock), RESOURCE)
        assert client.allocatable() == tuple(f"dev-{i:04d}" for i in range(8000))
        with pytest.raises(RuntimeError, match="List on the node"):
            client.pods()
    finally:
        server.stop(None)


def _varint_bytes(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        out += bytes([low | (0x80 if n else 0)])
        if not n:
            return out


def test_in_container_faults_refuse_a_reboot_only_where_they_remap_the_device() -> None:
    """The remap of a host /dev view is made inside the running container, which a reboot
    replaces before it could be made again; a plugin mounting its device itself (go-kvm: a
    CharDevice hostPath at /dev/kvm) gets no remap there, so its reboot still runs."""
    docker = DockerExecAccess(CommandRunner(), "hvt-control-plane")
    node = _node(docker, target="kind")
    node.inside = object()
    node.layout = SimpleNamespace(mounts={"device": "/dev/kvm", "cdi": "/var/run/cdi"})
    assert _reason(node) == ""
    node.layout = SimpleNamespace(mounts={"host_dev": "/host/dev"})
    assert "starts in a new one" in _reason(node)
