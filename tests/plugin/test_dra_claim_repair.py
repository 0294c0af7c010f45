"""The DRA driver keeps every prepared claim's CDI spec exact, as the device plugin keeps its one
spec (issue 28: "the claim's CDI spec written with the same atomic, exact, repaired writer").

Real files, real inotify: the daemon's own Monitor watches the CDI dir with the claim specs as
its keeper; a spec deleted, made stale or malformed is repaired on the event; a spec whose
claim was unprepared is never brought back (a repair and an unprepare are serialised); storage
where a spec cannot be kept makes the driver unready and taints its device in the slice.
"""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from pathlib import Path

import pytest

from hv_device_plugin.api.names import CDI_KIND
from hv_device_plugin.config import parse_config
from hv_device_plugin.dra.claim_specs import PREFIX, ClaimSpecs
from hv_device_plugin.dra.daemon import unusable_reason
from hv_device_plugin.health import HealthState
from hv_device_plugin.monitor import Monitor

KVM_RDEV = os.makedev(10, 232)


def _specs(cdi: Path) -> ClaimSpecs:
    return ClaimSpecs(cdi, CDI_KIND, "kvm", "/dev/kvm", 65534, 65534, "0.5.0")


def test_the_keeper_repairs_kept_specs_and_forgets_unprepared_ones(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    kept, gone = str(uuid.uuid4()), str(uuid.uuid4())
    specs.write(kept)
    specs.write(gone)
    exact = (tmp_path / specs.filename(kept)).read_bytes()
    (tmp_path / specs.filename(kept)).unlink()
    assert specs.inspect().state == "missing"
    specs.remove(gone)
    status = specs.reconcile()
    assert status.ok and status.repaired and status.cause == "missing"
    assert (tmp_path / specs.filename(kept)).read_bytes() == exact
    assert not (tmp_path / specs.filename(gone)).exists(), "an unprepared claim's spec came back"
    (tmp_path / specs.filename(kept)).write_bytes(exact.replace(b"65534", b"65533"))
    assert specs.reconcile().cause == "stale"
    assert specs.watches(specs.filename(kept)) and not specs.watches("hyperlight.json")


def test_the_claims_of_the_state_file_are_kept_from_the_start(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    uid = str(uuid.uuid4())
    specs.keep([uid])
    assert specs.reconcile().repaired, "a prepared claim's missing spec is written at start"
    assert (tmp_path / f"{PREFIX}{uid}.json").is_file()


@pytest.mark.root
def test_the_monitor_repairs_a_claim_spec_on_the_event_and_taints_when_it_cannot(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (mknod of the host-device view)")
    host_dev, cdi, plugins = tmp_path / "dev", tmp_path / "cdi", tmp_path / "dp"
    for d in (host_dev, cdi, plugins):
        d.mkdir()
    os.mknod(host_dev / "kvm", 0o600 | stat.S_IFCHR, KVM_RDEV)
    cfg = parse_config(["--host-dev-dir", str(host_dev), "--cdi-dir", str(cdi),
                        "--device-plugin-dir", str(plugins)])  # fmt: skip
    specs = _specs(cdi)
    uid = str(uuid.uuid4())
    specs.write(uid)
    path = cdi / specs.filename(uid)
    exact = path.read_bytes()

    async def main() -> None:
        health = HealthState(streams_required=False)
        monitor = Monitor(cfg, health, None, specs)
        await monitor.check_all()
        assert unusable_reason(health) == ""
        task = asyncio.ensure_future(monitor.run())
        try:
            # An event before run() has set its watches is still caught by the periodic re-check
            # (the waits allow for it): what is asserted is the repair, not its latency.
            path.unlink()
            await _until(lambda: path.is_file() and path.read_bytes() == exact, "repaired")
            path.write_bytes(b'{"cdiVersion": ')
            await _until(lambda: path.read_bytes() == exact, "malformed spec repaired")
            path.unlink()
            path.mkdir()  # an obstruction the driver must not remove
            await _until(lambda: not health.cdi.ok, "unready while the spec cannot be kept")
            assert unusable_reason(health).startswith("CDI: "), "no taint while unusable"
            path.rmdir()
            await _until(lambda: health.cdi.ok and path.is_file(), "recovered")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


async def _until(pred: object, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15.0  # 3 periodic re-checks: an event missed is still caught
    while not pred():  # type: ignore[operator]
        assert loop.time() < deadline, f"wait expired: {what}"
        await asyncio.sleep(0.01)
