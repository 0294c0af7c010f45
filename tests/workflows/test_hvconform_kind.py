""".github/scripts/hvconform-kind.sh, the phases of the reusable KIND workflow, with stand-ins for
docker, kind and hvconform on PATH (each call logged): a node image the engine lacks is refused
in one line before anything is made (here: the offline hv-kind.local/node not built yet), a
digest-pinned one is pulled, the pinned kindest/node is the kind release's for the suite's
Kubernetes minor, and `all` keeps the workflow's if: rules (delete, final and summary always;
final against the startup outcome)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from hvconform.targets.kindnode import NODE_IMAGE
from hvconform.targets.realnode import KUBERNETES_VERSION
from tests.workflows import actions

SCRIPT = actions.SCRIPTS / "hvconform-kind.sh"
PINNED = re.compile(r"kindest/node:(v\d+\.\d+)\.\d+@sha256:[0-9a-f]{64}")


def stand_ins(tmp: Path, *, images: str = "", fail: str = "") -> tuple[list[Path], Path]:
    """docker (`image inspect` succeeds for the refs in `images`, `pull` fails), kind and
    hvconform (`fail`: the hvconform subcommand that exits 1), each logging its arguments."""
    tools, log = tmp / "tools", tmp / "calls.log"
    tools.mkdir()
    actions.write_tool(tools / "docker", f"""#!/usr/bin/env bash
echo "docker $*" >>'{log}'
case "$1 $2" in
"image inspect") [[ " {images} " == *" $3 "* ]] ;;
"exec "*) echo "kvm:x:993:" ;;
*) exit 1 ;;
esac
""")  # fmt: skip
    actions.write_tool(tools / "kind", f"#!/usr/bin/env bash\necho \"kind $*\" >>'{log}'\n")
    actions.write_tool(tools / "hvconform", f"""#!/usr/bin/env bash
echo "hvconform $* STARTUP_OUTCOME=${{STARTUP_OUTCOME-}}" >>'{log}'
if [[ "$1 $2" == "metadata snapshot" ]]; then echo '{{}}' >"$6"; fi
[[ "$1" != "{fail}" ]]
""")  # fmt: skip
    return [tools], log


def script(
    tmp: Path, args: list[str], tools: list[Path], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    runner = actions.Runner(tmp / "runner", tools)
    full = {**runner.base_env(), "HV_GUEST_IMAGE": "hv-guest:test", **(env or {})}
    return subprocess.run(["bash", str(SCRIPT), *args], env=full, cwd=tmp, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("phase", ["create", "all"])
def test_an_absent_offline_node_image_is_refused_in_one_line(tmp_path: Path, phase: str) -> None:
    (tmp_path / "profile.yaml").write_text("name: x\n")
    tools, log = stand_ins(tmp_path, images="hv-device-plugin:0.1.0 hv-guest:test")
    args = ["--node-image", NODE_IMAGE, "--profile", "profile.yaml", phase]
    result = script(tmp_path, args, tools)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"hvconform-kind: node image {NODE_IMAGE} is not in the engine (the default docker): "
        "build it with `nox -s kind-image` (hv-kind.local/node), or pass a kindest/node pinned "
        "by digest"
    ]
    # refused before anything: no pull of a tag, no cluster, no snapshot
    assert calls(log) == [f"docker image inspect {NODE_IMAGE}"]
    assert not (tmp_path / "runner" / "runner-temp" / "kvm-metadata").exists()


def test_a_digest_pinned_node_image_is_pulled_and_a_failed_pull_refused(tmp_path: Path) -> None:
    tools, log = stand_ins(tmp_path)
    result = script(tmp_path, ["create"], tools, {"KUBERNETES_VERSION": "v1.37"})
    assert result.returncode == 2
    pinned = PINNED.search(result.stderr)
    assert pinned and result.stderr.strip().endswith("is not in the engine and could not be pulled")
    assert calls(log) == [f"docker image inspect {pinned.group(0)}",
                          f"docker pull --quiet {pinned.group(0)}"]  # fmt: skip


def test_the_pinned_node_image_is_the_suites_kubernetes_minor(tmp_path: Path) -> None:
    tools, _ = stand_ins(tmp_path)
    result = script(tmp_path, ["node-image"], tools)
    assert result.returncode == 0, result.stderr
    pinned = PINNED.fullmatch(result.stdout.strip())
    assert pinned, result.stdout
    assert pinned.group(1) == KUBERNETES_VERSION.rsplit(".", 1)[0]  # v1.37: built offline here
    other = script(tmp_path, ["node-image"], tools, {"KUBERNETES_VERSION": "v1.30"})
    assert other.returncode == 2 and other.stdout == ""
    assert other.stderr.strip() == (
        "hvconform-kind: no kindest/node pinned for Kubernetes v1.30 (v1.37 is): "
        "pass node-image explicitly"
    )


def test_unknown_phase_and_option_are_refused(tmp_path: Path) -> None:
    tools, log = stand_ins(tmp_path)
    refusals = [
        (["middle"], "unknown phase middle"),
        (["--nope", "x", "run"], "unknown option --nope"),
        ([], "no phase"),
    ]
    for args, says in refusals:
        result = script(tmp_path, args, tools)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert says in result.stderr
    assert calls(log) == []


@pytest.mark.parametrize(("fail", "startup"), [("run", "success"), ("metadata", "failure")])
def test_all_keeps_the_workflows_if_rules(tmp_path: Path, fail: str, startup: str) -> None:
    """A failed run: the cluster is still deleted, the final check still made (against the
    validated snapshot), the summary still written. A failed startup check: no run, and the
    final check compares with the original."""
    (tmp_path / "profile.yaml").write_text("name: x\n")
    images = f"{NODE_IMAGE} hv-device-plugin:0.1.0 hv-guest:test"
    tools, log = stand_ins(tmp_path, images=images, fail=fail)
    if fail == "metadata":  # every check fails: startup first (snapshots still succeed)
        (tools[0] / "hvconform").write_text(
            (tools[0] / "hvconform")
            .read_text()
            .replace('[[ "$1" != "metadata" ]]', '[[ "$2" == snapshot || "$1" != metadata ]]')
        )
    args = ["--node-image", NODE_IMAGE, "--image", "hv-device-plugin:0.1.0",
            "--profile", "profile.yaml", "--cluster", "c1", "all"]  # fmt: skip
    result = script(tmp_path, args, tools)
    assert result.returncode == 1, result.stderr
    log_lines = calls(log)
    kinds = [c for c in log_lines if c.startswith("kind ")]
    assert kinds[0].startswith("kind create cluster --name c1 --config ")
    assert f"--image {NODE_IMAGE}" in kinds[0]
    assert kinds[-1] == "kind delete cluster --name c1"
    runs = [c for c in log_lines if c.startswith("hvconform run ")]
    checks = [c.split(" STARTUP")[0].split()[2] for c in log_lines if " check-" in c]
    final = next(c for c in log_lines if " check-final " in c)
    if fail == "run":
        assert len(runs) == 1 and "--existing-cluster --cluster-name c1" in runs[0]
        assert (
            "--plugin-profile profile.yaml" in runs[0]
            and "--image hv-device-plugin:0.1.0" in runs[0]
        )
        assert "--validated" in final
    else:
        assert runs == [] and "--validated" not in final
    assert checks == ["check-startup", "check-final"]
    assert f"STARTUP_OUTCOME={startup}" in final
    phases = [
        line.split()[1]
        for line in result.stderr.splitlines()
        if line.endswith(("exit 0", "exit 1"))
    ]
    expected = ["image", "original", "create", "startup", "run", "delete", "final", "summary"]
    assert phases == [p for p in expected if fail == "run" or p != "run"]
    summary = (tmp_path / "runner" / "step-summary.md").read_text()
    assert "No conformance results" in summary
