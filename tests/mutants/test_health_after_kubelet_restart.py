"""`health-after-kubelet-restart` against a plugin that loses updates after a kubelet restart.

The mutant is go-kvm with `GOKVM_DEFECT=stale-stream-after-restart` (fixtures/plugins/go-kvm,
README "Defects"): health changes go only to the first ListAndWatch stream it ever served, so
the stream a restarted kubelet opens keeps its opening snapshot. It passes every check that
faults a plugin that never lived through a kubelet restart (identity-missing) and the restart
checks themselves (restart-kubelet: it re-registers at once); only the new check fails it. The
same check passes go-kvm unmodified and this repository's plugin, all on the local target (its
kubelet emulator opens a new stream at each re-registration, as the kubelet's client does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hvconform.contract.plugin import load_profile
from tests.conformance.test_hvconform import hvconform, statuses
from tests.fixture_plugins import GO_KVM_DIR, build_go_kvm

pytestmark = [pytest.mark.root, pytest.mark.kvm]

CHECK = "health-after-kubelet-restart"
# identity-missing first (catalogue order): the same fault, before any kubelet restart.
SELECTION = f"identity-missing or restart-kubelet or {CHECK}"


def _go_kvm(tmp_path: Path, defect: str) -> Path:
    """go-kvm's shipped profile run as a process, with GOKVM_DEFECT set (empty: correct)."""
    build_go_kvm()
    data = yaml.safe_load((GO_KVM_DIR / "profile.yaml").read_text())
    data["command"] = [str(GO_KVM_DIR / "bin" / "go-kvm"), "-v=2"]
    data["env"] = {"GOKVM_DEFECT": defect} if defect else {}
    data.pop("deploy", None)  # relative to the fixture's dir; a process needs none
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    load_profile(path)
    return path


def _by_id(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in data.get("checks", [])}


def test_the_lost_update_mutant_fails_exactly_the_new_check(tmp_path: Path) -> None:
    profile = _go_kvm(tmp_path, "stale-stream-after-restart")
    code, data, output = hvconform(
        tmp_path, "--plugin-profile", str(profile), "--recovery-timeout", "10",
        "--", "-k", SELECTION,
    )  # fmt: skip
    got = statuses(data)
    want = {"identity-missing": "passed", "restart-kubelet": "passed", CHECK: "failed"}
    assert {c: got.get(c) for c in want} == want, output[-3000:]
    reason = _by_id(data)[CHECK]["reason"]
    # It re-registered and was ready; what it lost is the device going away on the new stream.
    assert "the kubelet to see the device gone after its graceful restart" in reason, reason
    assert "still counted 4 allocatable" in reason, reason
    assert got["cleanup"] == "passed", "a failing plugin must not make the harness leak"
    assert code == 1


@pytest.mark.parametrize("plugin", ["go-kvm", "hv-device-plugin"])
def test_correct_plugins_pass_it_with_its_figures(tmp_path: Path, plugin: str) -> None:
    args = ["--plugin-profile", str(_go_kvm(tmp_path, ""))] if plugin == "go-kvm" else []
    code, data, output = hvconform(tmp_path, *args, "--", "-k", CHECK)
    check = _by_id(data).get(CHECK, {})
    assert check.get("status") == "passed", f"{check.get('reason')}\n{output[-3000:]}"
    assert code == 0, output[-3000:]
    figures = check["metrics"]
    for key in ("detected_graceful_s", "recovery_graceful_s", "detected_crash_s",
                "recovery_crash_s"):  # fmt: skip
        assert 0 < figures[key] < 60, (key, figures)
    assert figures["recovery_s"] == max(figures["recovery_graceful_s"], figures["recovery_crash_s"])
    print(plugin, {k: round(v, 3) for k, v in figures.items()})
