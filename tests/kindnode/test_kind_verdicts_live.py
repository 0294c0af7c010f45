"""Issue 35 on KIND, LIVE: verdicts that hold for plugins this repository did not write.

A real kind cluster per run (the offline node image, the kind engine), made and deleted by
`hvconform run --target kind`:
- health-after-kubelet-restart passes this repository's plugin and go-kvm and fails go-kvm's
  stale-stream-after-restart defect (old streams alive after a kubelet restart swallow health
  updates);
- go-kvm deployed with exec probes only (no HTTP port, an image holding only its binary:
  profile-exec.yaml) is never judged dead while the kubelet keeps its container running;
- a plugin that never recovers from stream-lost (go-kvm's never-back-after-stream-lost) leaves
  every later check `blocked`, never failed.
Run by `nox -s kind-live` (HV_KIND_LIVE=1; the engine fixture skips otherwise, with the reason).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.container.gokvm import NEVER_BACK_SELECTION, NEVER_BACK_VERDICTS, variant_profile
from tests.fixture_plugins import GO_KVM_DIR
from tests.kindnode.live import run_kind, statuses

pytestmark = [pytest.mark.root, pytest.mark.kvm, pytest.mark.slow, pytest.mark.timeout(2400)]
EXEC_PROFILE = GO_KVM_DIR / "profile-exec.yaml"


@pytest.mark.parametrize("plugin", ["ours", "go-kvm", "go-kvm stale-stream-after-restart"])
def test_health_after_kubelet_restart(
    plugin: str, tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    if plugin == "ours":
        profile = ["--image", engine["tags"]["plugin"]]
    else:
        defect = plugin.partition(" ")[2]
        profile = ["--plugin-profile", str(variant_profile(tmp_path, defect))]
    data = run_kind(engine, tmp_path / "out", *profile, "--", "-k", "health-after-kubelet-restart")
    got = statuses(data)["health-after-kubelet-restart"]
    assert got == ("failed" if "stale" in plugin else "passed"), data["_output"]


def test_exec_probe_plugin_is_never_judged_dead(
    tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    data = run_kind(engine, tmp_path / "out", "--plugin-profile", str(EXEC_PROFILE))
    failed = {c["id"]: c["reason"] for c in data["checks"] if c["status"] == "failed"}
    assert not failed, data["_output"]
    notes = [n for c in data["checks"] for n in c.get("notes", []) if "liveness" in n]
    assert not notes, notes
    passed = {i for i, s in statuses(data).items() if s == "passed"}
    assert {"cdi-missing", "registration-failure", "registration-dir-replaced", "stream-lost",
            "restart-kubelet"} <= passed, data["_output"]  # fmt: skip


def test_a_plugin_that_never_recovers_leaves_the_rest_blocked(
    tmp_path: Path, engine: dict[str, Any], go_kvm: str
) -> None:
    profile = variant_profile(tmp_path, "never-back-after-stream-lost", base=EXEC_PROFILE)
    data = run_kind(engine, tmp_path / "out", "--plugin-profile", str(profile),
                "--recovery-timeout", "20", "--", "-k", NEVER_BACK_SELECTION)  # fmt: skip
    assert statuses(data) == NEVER_BACK_VERDICTS, data["_output"]
    for check in data["checks"]:
        if check["status"] == "blocked":
            assert "stream-lost left the node dirty" in check["reason"], check["reason"]
