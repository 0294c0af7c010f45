"""The plugin-under-test rule and the session-level verdicts of runs where nothing ran.

What ran (a PluginRan read back from the process or pod) is held to the profile: a process
whose command is not the profile's, a pod or container of another image, or an image ID that is
not the digest the profile pins, fails `plugin-identity`; a node that never came up blocks it
and `metadata-two-phase` (never `failed` for a phase that never started), and when the machine
lacked what the node needed every session-level check is `environment_blocked`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hvconform.contract.plugin import PluginUnderTest, resolve
from hvconform.contract.ran import PluginRan
from hvconform.contract.results import CheckRecord, validate_results
from hvconform.suite import identity, session_checks

OURS = (
    resolve()
)  # the shipped profile: {python} -m hv_device_plugin ... --health-addr {health_addr}
DIGEST = "sha256:" + "a" * 64
ARGV = (sys.executable, "-m", "hv_device_plugin", "--host-dev-dir", "/host-dev", "--health-addr")


def profile(command: tuple[str, ...], image: str = "") -> PluginUnderTest:
    plugin = replace(OURS, name="acme", command=command)
    return plugin.with_image(image) if image else plugin


def process(*argv: str) -> PluginRan:
    return PluginRan(how="process", argv=argv, exe="/usr/bin/x", pid=42, where="sandbox")


@pytest.mark.parametrize(
    ("ran", "command", "ok"),
    [
        (process(*ARGV, "10.231.7.2:8080"), OURS.command, True),
        # the harness appended or substituted nothing: any other argv is not the profile's
        (process(*ARGV, "10.231.7.2:8080", "--slots", "9"), OURS.command, False),
        (process("/usr/bin/python3", "-m", "hv_device_plugin"), OURS.command, False),
        (process("/opt/other/plugin", "-v=2"), ("/opt/acme/plugin", "-v=2"), False),
        (process("/opt/acme/plugin", "-v=2"), ("/opt/acme/plugin", "-v=2"), True),
        # a script runs under its #! interpreter, which the kernel puts first
        (process("/bin/sh", "/opt/acme/run.sh", "-v"), ("/opt/acme/run.sh", "-v"), True),
        (process("/bin/sh", "-e", "/opt/acme/run.sh", "-v"), ("/opt/acme/run.sh", "-v"), True),
        (process("/bin/sh", "/opt/evil.sh", "-v"), ("/opt/acme/run.sh", "-v"), False),
        # env exec's the rest of the profile's command: that is what runs
        (process("python3", "-m", "acme"), ("env", "A=1", "python3", "-m", "acme"), True),
        (process("python3", "-m", "evil"), ("env", "A=1", "python3", "-m", "acme"), False),
        (process(), ("/opt/acme/plugin",), False),
    ],
)
def test_a_process_is_the_profiles_only_with_its_command(
    ran: PluginRan, command: tuple[str, ...], ok: bool
) -> None:
    plugin = OURS if command == OURS.command else profile(command)
    problems = identity.mismatches(ran, plugin)
    assert (problems == []) == ok, problems
    if not ok:
        assert "is not the profile's command" in problems[0] and "/usr/bin/x" in problems[0]


@pytest.mark.parametrize(
    ("how", "image", "image_id", "want", "problem"),
    [
        ("pod", "acme:1.0", "docker.io/library/acme@sha256:" + "c" * 64, "acme:1.0", ""),
        ("pod", "docker.io/library/acme:1.0", "", "acme:1.0", ""),  # unpinned: the tag decides
        ("pod", "evil:1.0", "docker.io/library/evil@" + DIGEST, "acme:1.0", "ran image evil:1.0"),
        ("pod", f"acme@{DIGEST}", f"docker.io/library/acme@{DIGEST}", f"acme@{DIGEST}", ""),
        ("pod", f"acme@{DIGEST}", "docker.io/library/acme@sha256:" + "b" * 64, f"acme@{DIGEST}",
         "is not the pinned"),
        ("pod", f"acme@{DIGEST}", "", f"acme@{DIGEST}", "(not reported) is not the pinned"),
        # an engine's bare image ID is the config's digest: the pinned reference decides
        ("container", f"acme@{DIGEST}", "sha256:" + "e" * 64, f"acme@{DIGEST}", ""),
        ("container", "acme:2.0", "sha256:" + "e" * 64, "acme:1.0", "container ran image acme:2.0"),
    ],
    ids=["tag", "normalized", "other-image", "digest", "other-digest", "no-image-id",
         "container-digest", "container-other"],
)  # fmt: skip
def test_an_image_is_the_profiles_only_as_deployed_and_pinned(
    how: str, image: str, image_id: str, want: str, problem: str
) -> None:
    ran = PluginRan(how=how, argv=("/plugin",), image=image, image_id=image_id, where="ns/pod")
    problems = identity.mismatches(ran, profile(("/plugin",), want))
    if problem:
        assert len(problems) == 1 and problem in problems[0], problems
    else:
        assert problems == [], problems


def outcome(out: Path, worker: str, data: dict[str, Any]) -> None:
    path = out / identity.DIR / f"{worker}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    base = {"worker": worker, "target": "local", "node": "local", "up": True, "setup": None}
    path.write_text(json.dumps({**base, "reads": [], **data}))


def read(ran: PluginRan, phase: str = "setup") -> dict[str, Any]:
    return {"phase": phase, **ran.to_json()}


def test_the_run_fails_when_a_read_back_contradicts_the_profile(tmp_path: Path) -> None:
    good = process(*ARGV, "10.231.7.2:8080")
    outcome(tmp_path, "gw0", {"reads": [read(good), read(good, "end")]})
    outcome(tmp_path, "gw1", {"reads": [read(good), read(process("/bin/evil"), "end")]})
    record = identity.record(tmp_path, OURS)
    assert record is not None and record["status"] == "failed", record
    assert record["reason"].startswith("the plugin that ran is not the profile's: gw1 at end: ")
    assert record["metrics"] == {"nodes": 2, "read_backs": 4}
    assert record["evidence"] == ["plugin-ran/gw0.json", "plugin-ran/gw1.json"]
    assert any(n.startswith("gw0 at setup: process ") for n in record["notes"])


def test_a_node_up_without_a_read_back_cannot_pass(tmp_path: Path) -> None:
    outcome(tmp_path, "main", {"reads": [{"phase": "setup", "error": "AttributeError: no"}]})
    record = identity.record(tmp_path, OURS)
    assert record is not None and record["status"] == "failed"
    assert "could not be read back: main at setup: AttributeError: no" in record["reason"]


def test_a_run_whose_node_never_came_up_is_blocked_not_failed(tmp_path: Path) -> None:
    """The node target with a fixed-path plugin used to report metadata-two-phase FAILED."""
    why = {"status": "not_applicable", "reason": "the node target cannot bind /var/run/cdi"}
    outcome(tmp_path, "main", {"up": False, "node": "", "setup": why})
    (tmp_path / "metadata").mkdir()
    summary = {"startup": {"verdict": None}, "final": {"verdict": accepted("final")}}
    (tmp_path / "metadata" / "main.json").write_text(json.dumps(summary))
    records = {"cdi-missing": skipped("not_applicable", why["reason"])}
    _, line = session_checks.decide(tmp_path, records, OURS)
    assert line == ""
    meta, ident = records["metadata-two-phase"], records["plugin-identity"]
    assert meta["status"] == "blocked", meta
    assert meta["reason"] == (
        "main startup phase never ran: not_applicable: the node target cannot bind /var/run/cdi"
    )
    assert ident["status"] == "blocked" and "the node never came up" in ident["reason"]
    assert records["cleanup"]["status"] == "skipped"
    for raw in records.values():
        CheckRecord(**raw)  # the shape results.json takes


def skipped(status: str, reason: str) -> dict[str, Any]:
    """A catalogue check as the node fixture's skip left it."""
    return CheckRecord("cdi-missing", "cdi", "Missing CDI spec", status, reason).to_json()


def accepted(phase: str) -> dict[str, str]:
    return {"status": "accepted", "message": f"accepted: {phase} unchanged"}


def test_a_final_phase_that_found_the_device_changed_still_fails(tmp_path: Path) -> None:
    outcome(tmp_path, "main", {"up": False, "setup": {"status": "error", "reason": "boom"}})
    (tmp_path / "metadata").mkdir()
    rejected = {"status": "rejected", "message": "rejected: mode 0o660 -> 0o666"}
    summary = {"startup": {"verdict": None}, "final": {"verdict": rejected}}
    (tmp_path / "metadata" / "main.json").write_text(json.dumps(summary))
    record = session_checks.metadata_record(tmp_path)
    assert record is not None and record["status"] == "failed"
    assert record["reason"] == "main final: rejected: mode 0o660 -> 0o666"


def test_a_node_whose_device_is_not_here_is_not_judged_never_blamed_on_its_coming_up(
    tmp_path: Path,
) -> None:
    """The suite in a container, or on another machine, judging a cluster node: the node came
    up, but its /dev/kvm is not where the suite runs. Not applicable, saying so; a node that is
    here beside it is still judged."""
    from hvconform.metadata.twophase import TwoPhase

    outcome(tmp_path, "main", {"up": True})
    (tmp_path / "metadata").mkdir()
    away = TwoPhase("/dev/kvm")
    away.skip("node n1's /dev/kvm is not on the machine the suite runs on")
    (tmp_path / "metadata" / "main.json").write_text(json.dumps(away.summary()))
    record = session_checks.metadata_record(tmp_path)
    assert record is not None and record["status"] == "not_applicable", record
    assert record["reason"] == "main: node n1's /dev/kvm is not on the machine the suite runs on"
    here = {"not_here": "", "startup": {"verdict": accepted("startup")},
            "final": {"verdict": accepted("final")}}  # fmt: skip
    (tmp_path / "metadata" / "gw1.json").write_text(json.dumps(here))
    record = session_checks.metadata_record(tmp_path)
    assert record is not None and record["status"] == "passed", record
    assert record["metrics"] == {"nodes": 1}


def test_nodes_blocked_by_the_environment_block_every_session_check(tmp_path: Path) -> None:
    line = "kind create cluster: node image x cannot be pulled (no such host); fix: ..."
    outcome(tmp_path, "main", {"up": False, "setup": {"status": "environment_blocked",
                                                      "reason": line}})  # fmt: skip
    (tmp_path / "metadata").mkdir()
    summary = {"startup": {"verdict": None}, "final": {"verdict": accepted("final")}}
    (tmp_path / "metadata" / "main.json").write_text(json.dumps(summary))
    # the cluster's deletion was verified: a pass on its own, never next to nothing that ran
    verified = {"kind cluster deleted": {"ok": True, "detail": "kind get clusters: []"}}
    report = {"cleanup_ok": True, "verification": verified, "environment": {}}
    (tmp_path / "cluster-kind.json").write_text(json.dumps(report))
    records = {"cdi-missing": skipped("environment_blocked", line)}
    _, got = session_checks.decide(tmp_path, records, OURS)
    assert got == line
    assert {r["status"] for r in records.values()} == {"environment_blocked"}, records
    assert {r["reason"] for r in records.values()} == {line}
    assert records["cleanup"]["notes"] == ["kind cluster deleted: kind get clusters: []"]


def test_results_record_what_ran_per_worker(tmp_path: Path) -> None:
    outcome(tmp_path, "gw0", {"reads": [read(process(*ARGV, "a:1"))]})
    outcome(tmp_path, "gw1", {"reads": [{"phase": "setup", "error": "gone"}]})
    ran = identity.plugin_ran(tmp_path)
    assert [(r["worker"], r["phase"]) for r in ran] == [("gw0", "setup"), ("gw1", "setup")]
    assert ran[0]["argv"] == [*ARGV, "a:1"] and ran[1]["error"] == "gone"
    run = {"id": "r", "target": "local", "started_at": "", "finished_at": "", "duration_s": 0,
           "exit_code": 0, "plugin_ran": ran}  # fmt: skip
    env = {"kernel": "k", "distribution": "d", "python": "3", "plugin_version": "0.1.0",
           "suite_version": "0.1.0", "source_commit": "c", "cgroup": {"version": "v2",
           "driver": "systemd"}}  # fmt: skip
    validate_results({"schema_version": "1.1", "run": run, "environment": env, "checks": []})
