"""The KIND workflow's metadata steps (hvconform-plugin.yml), run as the runner runs them, on
every fixture case.

Each case of fixtures/metadata goes through the workflow's own steps (their `run:` text and
`env:`, expressions filled in as Actions would): the original snapshot, then the startup step
(the node's group lookup from a stand-in `docker`) or, for a final case, the final step with
`steps.metadata-startup.outcome` set to what the startup step would have reported. Snapshots of
the device come from a stand-in `hvconform metadata snapshot` that serves the case's snapshots;
every check is the real `hvconform`. The exit code and the verdict line must be the fixture's,
and the line must be exactly what the CLI prints for the same files: the YAML, the step script
and the Python checker cannot drift apart. One root test does the same on a real device node.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hvconform.metadata import cli as metadata_cli
from tests.workflows import actions

FIXTURES = actions.ROOT / "fixtures" / "metadata"
CASES = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}
EXIT = {"accepted": 0, "rejected": 1, "error": 2}
KIND = actions.load(actions.PLUGIN_WORKFLOW)  # the reusable KIND workflow conformance-kind calls
JOB_NAME, JOB = actions.only_job(KIND)
NODE = f"{JOB['env']['KIND_CLUSTER']}-control-plane"  # kind's name for the node container


def snapshot_text(value: object) -> str:
    """A fixture snapshot as file text: a string is raw (malformed on purpose), else JSON."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass
class Host:
    """A runner whose `hvconform metadata snapshot` and `docker exec` are stand-ins."""

    runner: actions.Runner
    snapshots: Path  # FILE here is what a snapshot --out .../FILE receives
    calls: Path  # one line per stand-in call

    @property
    def metadata_dir(self) -> Path:
        return self.runner.temp / "kvm-metadata"

    def serve(self, name: str, value: object) -> None:
        (self.snapshots / name).write_text(snapshot_text(value))

    def lookup(self, text: str | None) -> None:
        """What `docker exec NODE getent group kvm` prints; None: the command fails."""
        path = self.snapshots / "lookup"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)

    def step(
        self,
        step_id: str,
        outcomes: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        contexts = {f"steps.{k}.outcome": v for k, v in (outcomes or {}).items()}
        contexts.update(actions.plugin_call(self.runner.root / "workspace"))
        return self.runner.run(KIND, JOB, actions.step_by_id(JOB, step_id), contexts, env)

    def call_log(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def make_host(tmp: Path, *, fake_snapshots: bool = True) -> Host:
    tools = tmp / "tools"
    tools.mkdir()
    snapshots = tmp / "snapshots"
    snapshots.mkdir()
    calls = tmp / "calls.log"
    real = actions.venv_bin() / "hvconform"
    assert real.exists(), f"hvconform is not installed next to this interpreter ({real})"
    actions.write_tool(
        tools / "docker",
        f"""#!/usr/bin/env bash
echo "docker $*" >>'{calls}'
[[ "$*" == "exec {NODE} getent group kvm" ]] || {{ echo "unexpected: docker $*" >&2; exit 97; }}
[[ -f '{snapshots}/lookup' ]] || exit 2  # getent: no such group, or the exec failed
cat '{snapshots}/lookup'
""",
    )
    if fake_snapshots:
        actions.write_tool(
            tools / "hvconform",
            f"""#!/usr/bin/env bash
if [[ "${{1-}} ${{2-}}" == "metadata snapshot" ]]; then
  echo "hvconform $*" >>'{calls}'
  [[ $# -eq 6 && $3 == --device && $5 == --out ]] || {{ echo "unexpected: $*" >&2; exit 97; }}
  cp '{snapshots}'/"$(basename "$6")" "$6"
  exit
fi
exec '{real}' "$@"
""",
        )
    return Host(actions.Runner(tmp / "runner", [tools]), snapshots, calls)


def cli_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """What `hvconform metadata ...` prints for these arguments (in process)."""
    capsys.readouterr()
    code = metadata_cli.main_for_tests(argv)
    out, err = capsys.readouterr()
    return code, (out + err).rstrip("\n")


def verdict_line(stdout: str) -> str:
    lines = [
        line
        for line in stdout.splitlines()
        if line.startswith(("accepted:", "rejected:", "error:"))
    ]
    assert len(lines) == 1, stdout
    return lines[0]


def assert_reported(
    host: Host, result: subprocess.CompletedProcess[str], case: dict[str, Any]
) -> str:
    out = result.stdout + result.stderr
    assert result.returncode == EXIT[case["expect"]], out
    line = verdict_line(result.stdout)
    assert line.startswith(f"{case['expect']}: ") and case["message"] in line, line
    annotations = [x for x in result.stdout.splitlines() if x.startswith("::error ")]
    assert len(annotations) == (0 if case["expect"] == "accepted" else 1), out
    assert line in host.runner.summary.read_text()
    return line


def run_original(host: Host, original: object) -> None:
    host.serve("original.json", original)
    result = host.step("metadata-original")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (host.metadata_dir / "original.json").read_text() == snapshot_text(original)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["phase"] == "startup"])
def test_startup_step_on_fixture(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[name]
    host = make_host(tmp_path)
    run_original(host, case["original"])
    host.serve("startup.json", case["current"])
    extra = {}
    if "node_kvm_gid" in case:
        extra["HV_NODE_KVM_GID"] = str(case["node_kvm_gid"])
    else:
        host.lookup(case["lookup"])
    result = host.step("metadata-startup", env=extra)
    line = assert_reported(host, result, case)

    meta = host.metadata_dir
    node = (
        ["--node-kvm-gid", extra["HV_NODE_KVM_GID"]]
        if extra
        else ["--group-lookup", str(meta / "lookup.txt")]
    )
    argv = ["metadata", "check-startup", "--original", str(meta / "original.json")]
    code, expected = cli_line([*argv, "--current", str(meta / "startup.json"), *node], capsys)
    assert (code, line) == (result.returncode, expected)
    # Only an accepted startup snapshot becomes the validated one.
    validated = meta / "validated.json"
    if case["expect"] == "accepted":
        assert validated.read_text() == snapshot_text(case["current"])
    else:
        assert not validated.exists()
    # A failed lookup leaves no file: "could not be read", never an empty lookup.
    assert (meta / "lookup.txt").exists() == (not extra and case["lookup"] is not None)
    docker = [c for c in host.call_log() if c.startswith("docker ")]
    assert docker == ([] if extra else [f"docker exec {NODE} getent group kvm"])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c["phase"] == "final"])
def test_final_step_on_fixture(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[name]
    host = make_host(tmp_path)
    run_original(host, case["original"])
    meta = host.metadata_dir
    # What the startup step left: validated.json and success, or nothing and failure.
    outcome = "failure"
    if "validated" in case:
        (meta / "validated.json").write_text(snapshot_text(case["validated"]))
        outcome = "success"
    host.serve("final.json", case["current"])
    outcomes = {"metadata-startup": outcome, "metadata-original": "success"}
    result = host.step("metadata-final", outcomes)
    line = assert_reported(host, result, case)

    argv = ["metadata", "check-final", "--original", str(meta / "original.json")]
    if "validated" in case:
        argv += ["--validated", str(meta / "validated.json")]
    code, expected = cli_line([*argv, "--current", str(meta / "final.json")], capsys)
    assert (code, line) == (result.returncode, expected)


def test_every_fixture_runs_through_the_workflow() -> None:
    assert len(CASES) >= 24
    assert {c["phase"] for c in CASES.values()} == {"startup", "final"}


@pytest.mark.parametrize("outcome", ["failure", "skipped", "cancelled"])
def test_final_ignores_a_validated_snapshot_unless_startup_succeeded(
    outcome: str, tmp_path: Path
) -> None:
    """A validated.json left behind never stands in for a startup step that did not succeed."""
    case = CASES["final-validated-unchanged"]  # gid 108 -> 993, validated 993
    host = make_host(tmp_path)
    run_original(host, case["original"])
    (host.metadata_dir / "validated.json").write_text(snapshot_text(case["validated"]))
    host.serve("final.json", case["current"])
    result = host.step("metadata-final", {"metadata-startup": outcome})
    assert result.returncode == 1, result.stdout + result.stderr
    line = verdict_line(result.stdout)
    assert "gid changed 108 -> 993 at final" in line and "did not complete" in line


def startup_then_final(host: Host, case: dict[str, Any], final: object) -> tuple[int, int, str]:
    """Startup as the fixture says, then final with the outcome the startup step really had."""
    run_original(host, case["original"])
    host.serve("startup.json", case["current"])
    host.lookup(case["lookup"])
    startup = host.step("metadata-startup")
    outcome = "success" if startup.returncode == 0 else "failure"
    host.serve("final.json", final)
    result = host.step("metadata-final", {"metadata-startup": outcome})
    return startup.returncode, result.returncode, verdict_line(result.stdout)


def test_chain_gid_change_validated_then_preserved(tmp_path: Path) -> None:
    case = CASES["startup-gid-to-node-kvm-993"]
    startup, final, line = startup_then_final(make_host(tmp_path), case, case["current"])
    assert (startup, final) == (0, 0)
    assert line.startswith("accepted: identical to the validated snapshot at final")


def test_chain_gid_restored_after_validation_is_a_change(tmp_path: Path) -> None:
    case = CASES["startup-gid-to-node-kvm-993"]
    startup, final, line = startup_then_final(make_host(tmp_path), case, case["original"])
    assert (startup, final) == (0, 1)
    assert "gid changed 993 -> 108 at final" in line


def test_chain_failed_startup_compares_with_the_original(tmp_path: Path) -> None:
    case = CASES["startup-mode-changed"]
    startup, final, line = startup_then_final(make_host(tmp_path), case, case["current"])
    assert (startup, final) == (1, 1)
    assert "startup validation did not complete" in line


def test_a_new_run_starts_from_no_snapshot(tmp_path: Path) -> None:
    """The original step removes an earlier run's files, so none can stand in for this run's."""
    host = make_host(tmp_path)
    meta = host.metadata_dir
    meta.mkdir(parents=True)
    for stale in ("startup.json", "validated.json", "final.json", "lookup.txt"):
        (meta / stale).write_text("stale")
    run_original(host, CASES["startup-unchanged"]["original"])
    assert sorted(p.name for p in meta.iterdir()) == ["original.json"]


def test_unknown_phase_is_unusable(tmp_path: Path) -> None:
    script = actions.SCRIPTS / "kvm-metadata.sh"
    env = {**make_host(tmp_path).runner.base_env()}
    result = subprocess.run(
        ["bash", str(script), "middle"], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and "unknown phase" in result.stderr


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, chgrp of a device node)")
def test_steps_on_a_real_device_node(tmp_path: Path) -> None:
    """No snapshot stand-in: the real `hvconform metadata snapshot` of a character device that
    the test changes the way KIND's udev does, then restores the way a bad cleanup would."""
    device = tmp_path / "kvm"
    os.mknod(device, 0o660 | 0o020000, os.makedev(10, 232))  # S_IFCHR
    os.chown(device, 0, 1234)
    device.chmod(0o660)
    (tmp_path / "host").mkdir()
    host = make_host(tmp_path / "host", fake_snapshots=False)
    env = {"HV_DEVICE": str(device)}
    assert host.step("metadata-original", env=env).returncode == 0
    os.chown(device, 0, 4242)  # the node's udev: chgrp to its kvm group
    host.lookup("kvm:x:4242:\n")
    startup = host.step("metadata-startup", env=env)
    assert startup.returncode == 0, startup.stdout + startup.stderr
    assert "gid changed 1234 -> 4242 at startup" in verdict_line(startup.stdout)
    final = host.step("metadata-final", {"metadata-startup": "success"}, env=env)
    assert final.returncode == 0, final.stdout + final.stderr
    os.chown(device, 0, 1234)
    final = host.step("metadata-final", {"metadata-startup": "success"}, env=env)
    assert final.returncode == 1
    assert "gid changed 4242 -> 1234 at final" in verdict_line(final.stdout)
    device.unlink()
    final = host.step("metadata-final", {"metadata-startup": "success"}, env=env)
    assert final.returncode == 1 and "missing" in verdict_line(final.stdout)
