"""Differential test: the kubelet emulator against the real kubelet, same plugin, same steps.

Each scenario drives a fresh MinimalPlugin (its own resource name, so scenarios do not see each
other's checkpointed state on the real node) and returns its observable outcomes: the
capacity/allocatable pair after every step, the shapes of the Allocate and
GetPreferredAllocation calls the plugin received, and the admission result. The outcomes of
both sides are compared; every difference is recorded, with the kubelet's version, in
fixtures/realnode/differential-<version>.json (rewritten by each run), and the test fails on
any difference not listed in KNOWN (each entry says why it is accepted).

Needs the real node: the one `nox -s node-up` left up, else one brought up for the test (the
`tests` session runs it); skipped only where the node is not built.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hv_device_plugin.api import deviceplugin_pb2 as pb
from hvconform.targets.realnode import BIN, CDI_DIR, REPO, procs, stack
from hvconform.targets.realnode.configs import PKI
from tests.conformance.minimal_plugin import HEALTHY, UNHEALTHY, Faults
from tests.realnode.sides import EmulatorSide, PluginThread, RealSide, Side, settle, write_cdi_spec

USES_NODE_STACK = True  # conftest: one node stack at a time on this machine

# the first test waits for the machine's node lock inside its own timeout: the other node-stack
# modules hold it for up to 15 min on a loaded CI worker (300 s expired there once)
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1800)]

FIXTURES = REPO / "fixtures" / "realnode"
VENDOR = "hvdiff.example"
# (scenario, key) -> why a difference there is accepted; empty until a difference is understood.
KNOWN: dict[tuple[str, str], str] = {}

Outcome = dict[str, Any]


def _node_up() -> bool:
    kubelet = procs.recorded("kubelet")
    return bool(kubelet and kubelet.alive and (BIN / "kube-apiserver").exists() and PKI.exists())


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, RealSide]]:
    """The emulator and the real kubelet: the node `nox -s node-up` left up, else one brought
    up here and taken down (verified) after; skipped only when the node is not built."""
    own = not _node_up()
    if own:
        missing = [n for n in ("kubelet", "kube-apiserver", "etcd") if not (BIN / n).exists()]
        if missing:
            pytest.skip(f"the node is not built ({', '.join(missing)}): run `nox -s node-build`")
        if (kubelet := procs.recorded("kubelet")) is not None and kubelet.alive:
            pytest.skip("a node without an API server is up: `nox -s node-down` first")
        stack.up()
    try:
        emulator = EmulatorSide(tmp_path_factory.mktemp("emu"))
        real = RealSide(PKI)
        try:
            yield emulator, real
        finally:
            emulator.close()
            real.close()
            for spec in CDI_DIR.glob("hvdiff-*.json"):
                spec.unlink()
    finally:
        if own:
            left = stack.down()
            assert not left, f"node-down left: {left}"


def _shape_allocate(requests: list[pb.AllocateRequest]) -> list[list[int]]:
    return [[len(c.devices_ids) for c in r.container_requests] for r in requests]


def _shape_preferred(requests: list[pb.PreferredAllocationRequest]) -> list[list[list[int]]]:
    return [
        [
            [len(c.available_deviceIDs), len(c.must_include_deviceIDs), c.allocation_size]
            for c in r.container_requests
        ]
        for r in requests
    ]


def registration(side: Side, resource: str) -> Outcome:
    plugin = PluginThread(side.plugin_dir, resource)
    try:
        return {
            "counts_after_register": settle(side, resource, (2, 2)),
            "allocate_calls": _shape_allocate(plugin.plugin.allocate_requests),
        }
    finally:
        plugin.close()


def health(side: Side, resource: str) -> Outcome:
    plugin = PluginThread(side.plugin_dir, resource)
    steps: dict[str, Any] = {"registered": settle(side, resource, (2, 2))}
    try:
        plugin.sync(lambda: plugin.plugin.set_health("dev-1", False))
        steps["one_unhealthy"] = settle(side, resource, (2, 1))
        plugin.sync(lambda: plugin.plugin.set_devices({"dev-0": "healthy"}))
        steps["lowercase_healthy_string"] = settle(side, resource, (1, 0))
        plugin.sync(lambda: plugin.plugin.set_devices({}))
        steps["empty_list"] = settle(side, resource, (0, 0))
        plugin.sync(lambda: plugin.plugin.set_devices({"dev-0": HEALTHY, "dev-1": HEALTHY}))
        steps["recovered"] = settle(side, resource, (2, 2))
        plugin.sync(lambda: plugin.plugin.set_devices({"dev-0": HEALTHY, "dev-1": UNHEALTHY}))
        settle(side, resource, (2, 1))
        plugin.sync(plugin.plugin.end_streams)
        steps["stream_ended"] = settle(side, resource, (2, 0))
    finally:
        plugin.close()
    return steps


def allocation(side: Side, resource: str) -> Outcome:
    write_cdi_spec(resource, 2)
    options = pb.DevicePluginOptions(get_preferred_allocation_available=True)
    plugin = PluginThread(side.plugin_dir, resource, options=options)
    try:
        settle(side, resource, (2, 2))
        admitted = side.admit(resource)
        return {
            "admission": [admitted.phase, admitted.reason],
            "allocate_calls": _shape_allocate(plugin.plugin.allocate_requests),
            "preferred_calls": _shape_preferred(plugin.plugin.preferred_requests),
            "counts_while_allocated": side.counts(resource),
        }
    finally:
        side.release_all()
        plugin.close()


def admission_failure(side: Side, resource: str) -> Outcome:
    write_cdi_spec(resource, 2)
    plugin = PluginThread(side.plugin_dir, resource, faults=Faults(allocate_error="hvdiff boom"))
    try:
        settle(side, resource, (2, 2))
        admitted = side.admit(resource)
        return {
            "admission": [admitted.phase, admitted.reason, admitted.message],
            "allocate_calls": _shape_allocate(plugin.plugin.allocate_requests),
        }
    finally:
        side.release_all()
        plugin.close()


def kubelet_restart(side: Side, resource: str) -> Outcome:
    """A plugin that does NOT notice the restart, then one that registers again."""
    plugin = PluginThread(side.plugin_dir, resource)
    steps: dict[str, Any] = {"registered": settle(side, resource, (2, 2))}
    try:
        side.restart_kubelet(graceful=True)
        steps["after_graceful_restart"] = settle(side, resource, (0, 0))
        plugin.call(plugin.plugin.restart_and_register)
        steps["after_reregistration"] = settle(side, resource, (2, 2))
        side.restart_kubelet(graceful=False)
        steps["after_crash_restart"] = settle(side, resource, (0, 0))
    finally:
        plugin.close()
    return steps


def stream_ended_by_kubelet(side: Side, resource: str) -> Outcome:
    """The kubelet's side of the connection broken (a plugin that does NOT register again by
    itself): the endpoint disconnected, every device unhealthy; a new registration restores."""
    plugin = PluginThread(side.plugin_dir, resource)
    steps: dict[str, Any] = {"registered": settle(side, resource, (2, 2))}
    try:
        side.end_stream(resource, plugin.plugin.socket_path)
        steps["kubelet_ended_stream"] = settle(side, resource, (2, 0))
        plugin.call(plugin.plugin.restart_and_register)
        steps["after_reregistration"] = settle(side, resource, (2, 2))
    finally:
        plugin.close()
    return steps


SCENARIOS: dict[str, Callable[[Side, str], Outcome]] = {
    "registration": registration,
    "health": health,
    "allocation": allocation,
    "admission_failure": admission_failure,
    "kubelet_restart": kubelet_restart,
    "stream_ended_by_kubelet": stream_ended_by_kubelet,
}


def _normalise(value: Any) -> Any:
    return json.loads(json.dumps(value))  # tuples -> lists, so both sides compare alike


def test_emulator_matches_real_kubelet(sides: tuple[Side, RealSide]) -> None:
    emulator, real = sides
    results: dict[str, dict[str, Any]] = {}
    differences = []
    for name, scenario in SCENARIOS.items():
        emu = _normalise(scenario(emulator, f"{VENDOR}/emu-{name.replace('_', '-')}"))
        kub = _normalise(scenario(real, f"{VENDOR}/{name.replace('_', '-')}"))
        results[name] = {"emulator": emu, "kubelet": kub}
        for key in sorted(set(emu) | set(kub)):
            if emu.get(key) != kub.get(key):
                differences.append(
                    {
                        "scenario": name,
                        "key": key,
                        "emulator": emu.get(key),
                        "kubelet": kub.get(key),
                        "accepted": KNOWN.get((name, key), ""),
                    }
                )
    record = {"kubelet_version": real.version, "differences": differences, "outcomes": results}
    FIXTURES.mkdir(parents=True, exist_ok=True)
    out = FIXTURES / f"differential-{real.version}.json"
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    unexplained = [d for d in differences if not d["accepted"]]
    assert not unexplained, f"emulator and kubelet {real.version} differ (see {out}): {unexplained}"


def test_outcomes_file_names_the_version() -> None:
    for path in Path(FIXTURES).glob("differential-*.json"):
        data = json.loads(path.read_text())
        assert path.name == f"differential-{data['kubelet_version']}.json"
