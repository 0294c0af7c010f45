"""Allocate's re-verification (Monitor.verify_for_allocate) on real parts: the probe helper on
/dev/kvm, a mknod'ed host view, the CDI reconciler on a real directory.

Probes are counted by the helper's request ids, which increase by one per exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hv_device_plugin.cdi import CdiReconciler
from hv_device_plugin.cdi_spec import desired_spec
from hv_device_plugin.config import ConfigError, parse_config
from hv_device_plugin.health import HealthState
from hv_device_plugin.monitor import Monitor
from hv_device_plugin.probe_worker import ProbeWorker

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/kvm"), reason="needs /dev/kvm")

KVM_RDEV = os.stat("/dev/kvm").st_rdev if os.path.exists("/dev/kvm") else 0


@dataclass
class Rig:
    monitor: Monitor
    worker: ProbeWorker
    health: HealthState
    reconciler: CdiReconciler
    host_dev: Path
    cdi_dir: Path

    @property
    def probes(self) -> int:
        return self.worker._next_id  # one id per request sent to the helper

    def remove_device(self) -> None:
        (self.host_dev / "kvm").unlink()

    def restore_device(self) -> None:
        os.mknod(self.host_dev / "kvm", 0o600 | stat.S_IFCHR, KVM_RDEV)


def _rig_factory(tmp_path: Path, max_age: str) -> Rig:
    host_dev, cdi_dir, plugins = tmp_path / "dev", tmp_path / "cdi", tmp_path / "dp"
    for d in (host_dev, cdi_dir, plugins):
        d.mkdir()
    cfg = parse_config(
        [
            *("--host-dev-dir", str(host_dev), "--cdi-dir", str(cdi_dir)),
            *("--device-plugin-dir", str(plugins), "--probe-max-age", max_age),
        ]
    )
    health = HealthState()
    worker = ProbeWorker(timeout_s=cfg.probe_timeout_s)
    desired = desired_spec(
        kind_name=cfg.resource_name, device_name="kvm", device_path="/dev/kvm", uid=65534, gid=65534
    )
    reconciler = CdiReconciler(cdi_dir, cfg.cdi_filename, desired)
    rig = Rig(
        Monitor(cfg, health, worker, reconciler), worker, health, reconciler, host_dev, cdi_dir
    )
    rig.restore_device()
    return rig


@contextlib.asynccontextmanager
async def _running(tmp_path: Path, max_age: str) -> AsyncIterator[Rig]:
    rig = _rig_factory(tmp_path, max_age)
    async with rig.worker:
        await rig.monitor.check_all()
        assert rig.health.healthy, rig.health.readiness_reasons()
        yield rig


Body = Callable[[Rig], Awaitable[None]]


@pytest.fixture
def long_window(tmp_path: Path) -> Callable[[Body], None]:
    """Runs a test body against a monitor whose window is a full second: every verify of a
    test lands inside it, however slow the machine."""

    def run(body: Body) -> None:
        async def main() -> None:
            async with _running(tmp_path, "1.0") as rig:
                await body(rig)

        asyncio.run(main())

    return run


def test_a_recent_pass_answers_a_burst_with_one_probe(long_window: Callable[[Body], None]) -> None:
    async def body(rig: Rig) -> None:
        before = rig.probes
        await asyncio.gather(*(rig.monitor.verify_for_allocate() for _ in range(16)))
        for _ in range(10):
            await rig.monitor.verify_for_allocate()
        assert rig.probes == before, "a pass younger than --probe-max-age is reused"

    long_window(body)


def test_a_host_dev_event_voids_the_pass(long_window: Callable[[Body], None]) -> None:
    async def body(rig: Rig) -> None:
        before = rig.probes
        rig.monitor._on_dir_event(rig.host_dev, "kvm")
        await rig.monitor.verify_for_allocate()
        assert rig.probes == before + 1, "after a host /dev event the next Allocate probes"

    long_window(body)


def test_own_cdi_dir_events_do_not_void_the_pass(long_window: Callable[[Body], None]) -> None:
    async def body(rig: Rig) -> None:
        before = rig.probes
        rig.monitor._on_dir_event(rig.cdi_dir, "hyperlight.json")
        await rig.monitor.verify_for_allocate()
        assert rig.probes == before

    long_window(body)


def test_an_allocate_sees_a_change_made_just_before_it(
    long_window: Callable[[Body], None],
) -> None:
    """/dev/null's node renamed onto the device's entry, then at once an Allocate: the loop
    has had no turn to read the event, yet the Allocate must not lean on the earlier pass (the
    bench caught one such Allocate granted in 20 before the monitor drained events first)."""

    async def body(rig: Rig) -> None:
        task = asyncio.ensure_future(rig.monitor.run())
        try:
            for _ in range(10_000):  # bounded: until the watches are in place
                watch = rig.monitor._dir_watch
                if watch is not None and watch._inotify is not None:
                    break
                await asyncio.sleep(0)
            else:
                raise AssertionError("the monitor never started watching")
            await rig.monitor.verify_for_allocate()  # a pass, recent for a whole second
            before = rig.probes
            tmp = rig.host_dev / ".kvm-swap"
            os.mknod(tmp, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
            tmp.rename(rig.host_dev / "kvm")
            await rig.monitor.verify_for_allocate()
            assert rig.probes == before + 1, "the Allocate leaned on a pass the rename voided"
            assert not rig.health.device.ok, "an unusable device passed"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    long_window(body)


def test_events_on_other_entries_are_ignored(long_window: Callable[[Body], None]) -> None:
    """A node's /dev sees many entries change; only the device's entry voids the pass."""

    async def body(rig: Rig) -> None:
        before = rig.probes
        rig.monitor._on_dir_event(rig.host_dev, "tty5")
        rig.monitor._on_dir_event(rig.host_dev, ".kvm-1a2b3c4d")  # a temp name before a rename
        rig.monitor._on_dir_event(rig.cdi_dir, "other-vendor.json")
        assert not rig.monitor._due and not rig.monitor._kick.is_set()
        await rig.monitor.verify_for_allocate()
        assert rig.probes == before, "no Allocate may probe again for an unrelated entry"

    long_window(body)


def test_each_event_rechecks_only_what_it_can_have_changed(
    long_window: Callable[[Body], None],
) -> None:
    async def body(rig: Rig) -> None:
        rig.monitor._on_dir_event(rig.cdi_dir, "hyperlight.json")
        assert rig.monitor._due == {"cdi"}
        rig.monitor._due.clear()
        rig.monitor._on_dir_event(rig.host_dev, "kvm")
        assert rig.monitor._due == {"device"}
        rig.monitor._due.clear()
        rig.monitor._on_dir_event(rig.host_dev, "")  # the directory itself (or a poll)
        assert rig.monitor._due == {"device"}
        rig.monitor._due.clear()
        rig.monitor._on_dir_event(Path("/dev"), "kvm")  # the node this process opens
        assert rig.monitor._due == {"device"} and rig.monitor._kick.is_set()

    long_window(body)


def test_a_removed_device_is_caught_by_the_next_allocate(
    long_window: Callable[[Body], None],
) -> None:
    async def body(rig: Rig) -> None:
        rig.remove_device()
        rig.monitor._on_dir_event(rig.host_dev, "kvm")
        await rig.monitor.verify_for_allocate()
        assert not rig.health.device.ok
        assert rig.health.readiness_reasons(), "the Allocate must be refused"
        # A failure is never reused: each further Allocate probes again until one passes.
        before = rig.probes
        await rig.monitor.verify_for_allocate()
        assert rig.probes == before + 1
        rig.restore_device()
        await rig.monitor.verify_for_allocate()
        assert rig.health.device.ok

    long_window(body)


def test_a_stale_spec_is_repaired_before_the_answer(long_window: Callable[[Body], None]) -> None:
    async def body(rig: Rig) -> None:
        spec = rig.cdi_dir / "hyperlight.json"
        spec.write_bytes(rig.reconciler.desired.replace(b"65534", b"65533"))
        await rig.monitor.verify_for_allocate()
        assert spec.read_bytes() == rig.reconciler.desired
        assert rig.health.cdi.ok

    long_window(body)


def test_max_age_zero_probes_for_every_allocate(tmp_path: Path) -> None:
    async def main() -> None:
        async with _running(tmp_path, "0") as rig:
            before = rig.probes
            for _ in range(5):
                await rig.monitor.verify_for_allocate()
            assert rig.probes == before + 5

    asyncio.run(main())


@pytest.mark.parametrize(("value", "message"), [("-0.1", "below the minimum"), ("1.5", "above")])
def test_probe_max_age_is_bounded(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(["--probe-max-age", value, "--cdi-dir", str(tmp_path)])


def test_probe_max_age_default_and_env() -> None:
    assert parse_config([]).probe_max_age_s == pytest.approx(0.02)
    assert parse_config([], {"HV_PROBE_MAX_AGE": "0"}).probe_max_age_s == 0.0
