"""Allocate under the largest requests: bounded answers, bounded logs, a responsive event loop.

The plugin runs with the most slots it accepts, so the largest valid Allocate names
MAX_SLOTS IDs. /healthz is answered by the event loop itself: its latency while Allocates are
served (or refused) is the measure of whether a request blocks the loop.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hv_device_plugin.config import MAX_SLOTS
from tests.plugin.kubelet_stub import KubeletStub
from tests.plugin.plugin_process import Node, PluginProcess, Stream, wait_for

HEALTHZ_BOUND_S = 0.050
SAMPLES = 60
ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
# The bound every refusal message and every log line must keep, whatever the request held.
MAX_MESSAGE_CHARS = 600
MAX_LOG_LINE_BYTES = 2048


def _request(ids: list[str]) -> bytes:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
    ).SerializeToString()


@pytest.fixture
def busy_plugin(node: Node, kubelet: KubeletStub) -> Iterator[tuple[PluginProcess, Stream]]:
    proc = PluginProcess(node, kubelet, "--slots", str(MAX_SLOTS))
    stream: Stream | None = None
    try:
        kubelet.wait_registrations(1, 30)
        stream = Stream(proc.socket())
        wait_for(proc.ready, 30, "readiness with the most slots")
        yield proc, stream
    finally:
        if stream is not None:
            stream.cancel()
        code = proc.stop()
        assert code == 0, proc.log_path.read_text()[-4000:]
    lines = proc.log_path.read_bytes().splitlines()
    assert all(json.loads(line) for line in lines), "every log line is JSON"
    longest = max(len(line) for line in lines)
    assert longest <= MAX_LOG_LINE_BYTES, f"a log line of {longest} bytes"


def _under_load(port: int, call: Callable[[], None], workers: int = 2) -> tuple[list[float], int]:
    """/healthz latencies sampled while `workers` threads repeat `call`; and how many calls."""
    stop = threading.Event()
    done = [0] * workers
    errors: list[BaseException] = []

    def pump(slot: int) -> None:
        try:
            while not stop.is_set():
                call()
                done[slot] += 1
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=pump, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: all(done) or errors, 60, "every load thread to finish a call")
        sampler = subprocess.run(
            [sys.executable, "-m", "tests.plugin.healthz_sampler", str(port), str(SAMPLES)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        samples = [float(s) for s in json.loads(sampler.stdout)]
        served = sum(done)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors[0]
    return samples, served


def _rank(samples: list[float], fraction: float) -> float:
    """Nearest-rank percentile: an observed sample, never an interpolation."""
    ordered = sorted(samples)
    return ordered[max(int(len(ordered) * fraction + 0.999999) - 1, 0)]


def _assert_fast(what: str, samples: list[float], served: int) -> None:
    line = (
        f"{what}: /healthz median {statistics.median(samples) * 1000:.1f} ms, "
        f"p90 {_rank(samples, 0.9) * 1000:.1f} ms, p95 {_rank(samples, 0.95) * 1000:.1f} ms, "
        f"max {max(samples) * 1000:.1f} ms over {len(samples)} samples, "
        f"{served} requests answered meanwhile"
    )
    print(line)
    # p90, not max: the CPUs are shared (the suite runs on two workers beside other jobs), and
    # a sample can lose its time slice to another process. A request that blocks the loop
    # delays every sample taken meanwhile: the 4.3 s stall before the fix failed them all.
    assert _rank(samples, 0.9) < HEALTHZ_BOUND_S, line
    assert served > 0, line


def test_the_largest_accepted_allocate_keeps_the_loop_responsive(
    busy_plugin: tuple[PluginProcess, Stream],
) -> None:
    proc, _ = busy_plugin
    ids = [f"kvm-{i}" for i in range(MAX_SLOTS)]
    body = _request(ids)
    channel = grpc.insecure_channel(f"unix:{proc.socket()}")
    with channel:
        call = channel.unary_unary(ALLOCATE, response_deserializer=pb.AllocateResponse.FromString)
        answer = call(body, timeout=30)
        (container,) = answer.container_responses
        assert [d.name for d in container.cdi_devices] == ["hyperlight.dev/hypervisor=kvm"]
        samples, served = _under_load(proc.port, lambda: call(body, timeout=30))
    _assert_fast(f"largest accepted Allocate ({MAX_SLOTS} IDs)", samples, served)


@pytest.mark.parametrize(
    ("name", "ids", "says"),
    [
        ("300k known-looking", [f"kvm-{i}" for i in range(300_000)], "larger than any valid"),
        ("300k unknown", [f"x{i}" for i in range(300_000)], "larger than any valid"),
        ("slots+1 IDs", [f"kvm-{i}" for i in range(MAX_SLOTS + 1)], "10001 device IDs"),
        ("slots unknown", [f"x{i}" for i in range(MAX_SLOTS)], "unknown device IDs: x0, x1"),
        ("unknown, long", [f"{i:0300d}" for i in range(3)], "unknown device IDs: '000"),
        ("slots duplicates", ["kvm-7"] * MAX_SLOTS, "duplicate device IDs: kvm-7"),
    ],
)
def test_oversized_or_bad_allocate_is_refused_briefly(
    busy_plugin: tuple[PluginProcess, Stream], name: str, ids: list[str], says: str
) -> None:
    proc, _ = busy_plugin
    body = _request(ids)
    channel = grpc.insecure_channel(f"unix:{proc.socket()}")
    with channel:
        call = channel.unary_unary(ALLOCATE, response_deserializer=pb.AllocateResponse.FromString)

        def refused() -> None:
            with pytest.raises(grpc.RpcError) as err:
                call(body, timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            details = err.value.details() or ""
            assert says in details and len(details) <= MAX_MESSAGE_CHARS, details[:1000]

        refused()
        samples, served = _under_load(proc.port, refused)
    _assert_fast(f"{name} refused ({len(body)} bytes)", samples, served)
    assert proc.http("/healthz")[0] == 200


def test_preferred_allocation_beyond_capacity_is_refused(
    busy_plugin: tuple[PluginProcess, Stream],
) -> None:
    proc, _ = busy_plugin
    channel, stub = proc.stub()
    with channel:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[f"kvm-{i}" for i in range(300_000)], allocation_size=1
                )
            ]
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.GetPreferredAllocation(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.value.details() or "") <= MAX_MESSAGE_CHARS
        within = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[f"kvm-{i}" for i in range(MAX_SLOTS)],
                    must_include_deviceIDs=["kvm-9"],
                    allocation_size=2,
                )
            ]
        )
        answer = stub.GetPreferredAllocation(within, timeout=30)
        assert list(answer.container_responses[0].deviceIDs) == ["kvm-9", "kvm-0"]


WIRE_IDS = st.one_of(
    st.sampled_from([f"kvm-{i}" for i in (0, 1, MAX_SLOTS - 1, MAX_SLOTS)]), st.text(max_size=20)
)


# One plugin for every example, on purpose: it must survive them all in a row.
@settings(
    max_examples=60,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.lists(st.lists(WIRE_IDS, max_size=5), max_size=3).map(
            lambda cs: pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in cs]
            ).SerializeToString()
        ),
    )
)
def test_allocate_answers_any_bytes_ok_or_invalid_argument(
    busy_plugin: tuple[PluginProcess, Stream], body: bytes
) -> None:
    proc, _ = busy_plugin
    with grpc.insecure_channel(f"unix:{proc.socket()}") as channel:
        call = channel.unary_unary(ALLOCATE, response_deserializer=pb.AllocateResponse.FromString)
        try:
            answer = call(body, timeout=30)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
            assert len(err.details() or "") <= MAX_MESSAGE_CHARS
            return
    request = pb.AllocateRequest.FromString(body)
    ids = [i for c in request.container_requests for i in c.devices_ids]
    assert ids and len(set(ids)) == len(ids) and all(i.startswith("kvm-") for i in ids)
    assert len(answer.container_responses) == len(request.container_requests)
